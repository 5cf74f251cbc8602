"""Small helpers every agent verb uses: the failure type, job-record writes, ``which``."""

from __future__ import annotations

import json
import os
import typing as t

from remote_payload import boundedread, safe_write, wire
from remote_payload.wire import ErrorType


class AgentFailure(Exception):
    """A verb failed in a way the caller should see as a typed error document."""

    def __init__(self, type_: ErrorType, message: str, **fields: t.Any):
        super().__init__(message)
        self.type = type_
        self.message = message
        self.fields = fields


def _dumps(obj: t.Any, **kwargs: t.Any) -> str:
    return (wire.dumps_strict(obj, **kwargs) if isinstance(obj, dict)
            else json.dumps(obj, allow_nan=False, **kwargs))


def write_json_atomic(path: str, obj: t.Any, *, durable: bool = True, mode: int = 0o644) -> None:
    """A job record as the wire's strict JSON, through :func:`safe_write.write_json` (temp
    beside, fsync, rename, never through a link): readers never see half a file. ``mode``:
    0600 for a record only its owner may read (a job's spec: its environment).

    Raises:
        OSError: :class:`safe_write.WriteFailed` (full disk…) or ``DestinationRefused``.
    """
    safe_write.write_json(path, obj, dumps=_dumps, durable=durable, mode=mode)


def which(name: str) -> str | None:
    """The program ``name`` on PATH, as ``shutil.which`` finds it. Ours because importing
    shutil (which loads zlib, bz2 and lzma) was ~1 ms of every ``status`` poll, which needs
    only this (tmux, nvidia-smi)."""
    for d in os.get_exec_path():
        path = os.path.join(d, name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


#: the largest JSON file the agent reads (its own are a few KiB): a file grown past it, a
#: device or a FIFO put in its place never costs a call its memory or blocks it
MAX_JSON_BYTES = 8 * 2**20


def read_json(path: str, default: t.Any = None) -> t.Any:
    """The JSON document at ``path`` (``default`` when there is none), read by
    :func:`remote_payload.boundedread.read_regular`: the agent renames its files into place
    and never makes them links, so a link there was planted and is refused, not followed.

    Raises:
        ValueError: not JSON, a link, not a regular file, larger than :data:`MAX_JSON_BYTES`.
        OSError: unreadable.
    """
    try:
        data = boundedread.read_regular(path, MAX_JSON_BYTES)
    except FileNotFoundError:
        return default
    except boundedread.Refused as exc:
        raise ValueError(str(exc)) from None
    return json.loads(data.decode("utf-8"))
