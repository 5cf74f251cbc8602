"""The parsers of a job dir's records (``status.json``, ``spec.json``): read back from disk,
never trusted.

``jobs/<id>/`` is the only record of a job (docs/contracts.md), and every reader of it goes
through :func:`read_status` and :func:`read_spec`. A record that does not parse (not JSON, not
UTF-8, cut short, a directory where the file belongs, a state that is no state, a
``created_at`` that is no number, a ``gpus`` that is no GPU request) raises
:class:`DamagedRecord` with the file's path and the reason. ``jobs`` and ``queue`` list such a
job dir under ``damaged`` and go on with the others; nothing here writes, moves or deletes a
file, so the evidence stays on disk for a human to read.

Hand-written rather than pydantic: the agent runs on the container's python with the stdlib
only (docs/architecture.md), and these checks are a few lines each.
"""

from __future__ import annotations

import json
import math
import os
import re
import typing as t

from remote_payload import boundedread, wire

#: a record larger than this is damaged (the agent writes a few KiB; a status.json that grew
#: past this would cost every ``jobs`` call its memory)
MAX_RECORD_BYTES = 8 * 2**20
_STATES = frozenset(s.value for s in wire.JobState)
_REASON_CHARS = 200  # a JSON error quotes the document: keep the reply one short line


class DamagedRecord(ValueError):
    """A job dir's record that does not parse; ``path`` and ``reason`` say which and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def to_doc(self) -> dict[str, str]:
        """The ``damaged`` row of a ``jobs`` or ``queue`` reply (``DamagedRecordDoc``)."""
        return {"path": self.path, "reason": self.reason}


# --- the parsers (pure: a decoded JSON value in, a checked dict out) ------------------------


def parse_status(raw: t.Any) -> dict[str, t.Any]:
    """``status.json``: an object with a known ``state``; the fields readers compute with
    (``created_at``, ``queue_rank``, ``transitions``, ``evidence``) have their types.

    Raises:
        ValueError: the first field that is wrong, named.
    """
    if not isinstance(raw, dict):
        raise ValueError("status.json is not a JSON object")
    state = raw.get("state")
    if not (isinstance(state, str) and state in _STATES):
        raise ValueError(f"state {_short(state)} is not a job state"
                         if "state" in raw else "state is missing")
    for key in ("created_at", "queue_rank", "started_at", "ended_at"):
        if raw.get(key) is not None and not _finite(raw[key]):
            raise ValueError(f"{key} {_short(raw[key])} is not a number")
    for key in ("transitions", "evidence"):
        if raw.get(key) is not None and not isinstance(raw[key], list):
            raise ValueError(f"{key} is not a list")
    return raw


def parse_spec(raw: t.Any) -> dict[str, t.Any]:
    """``spec.json``: an object whose queue fields (``gpus``, ``gpu_slots``, ``after``,
    ``torch_build``, ``job_id``) have the shapes the agent wrote.

    Raises:
        ValueError: the first field that is wrong, named.
    """
    if not isinstance(raw, dict):
        raise ValueError("spec.json is not a JSON object")
    try:
        wire.validate_gpu_request(raw.get("gpus"))
    except ValueError as exc:
        raise ValueError(f"gpus: {exc}") from None
    slots = raw.get("gpu_slots")
    if slots is not None and not (isinstance(slots, list) and all(
            isinstance(g, int) and not isinstance(g, bool) and 0 <= g < wire.MAX_GPU_SLOTS
            for g in slots)):
        raise ValueError(f"gpu_slots {_short(slots)} is not a list of GPU slots")
    for key in ("after", "job_id"):
        value = raw.get(key)
        if value is not None and not (isinstance(value, str)
                                      and re.fullmatch(wire.JOB_ID_PATTERN, value)):
            raise ValueError(f"{key} {_short(value)} is not a job id")
    build = raw.get("torch_build")
    if build is not None and not isinstance(build, str):
        raise ValueError(f"torch_build {_short(build)} is not a build name")
    command = raw.get("command")
    if command is not None and not (isinstance(command, list)
                                    and all(isinstance(a, str) for a in command)):
        raise ValueError("command is not a list of strings")
    return raw


def decode(data: bytes) -> t.Any:
    """A record's bytes as JSON.

    Raises:
        ValueError: not UTF-8, not JSON (a cut-short file), nested past the parser's depth.
    """
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    except ValueError as exc:
        what = "empty" if not data.strip() else f"not JSON ({exc})"
        raise ValueError(what[:_REASON_CHARS]) from None


# --- the readers ------------------------------------------------------------------------


def read(path: str, parse: t.Callable[[t.Any], dict[str, t.Any]],
         missing: dict[str, t.Any] | None = None) -> dict[str, t.Any] | None:
    """The record at ``path``, parsed; ``missing`` when there is no file.

    Raises:
        DamagedRecord: the file cannot be read or does not parse.
    """
    try:
        data = read_bounded(path)
    except FileNotFoundError:
        return missing
    except ValueError as exc:
        raise DamagedRecord(path, str(exc)) from None
    except OSError as exc:
        raise DamagedRecord(path, f"unreadable: {exc.strerror or exc}") from None
    try:
        return parse(decode(data))
    except ValueError as exc:
        raise DamagedRecord(path, str(exc)[:_REASON_CHARS]) from None


def read_bounded(path: str, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, never following a symbolic link there (the
    agent writes its records with rename, never as links: a link is someone else's, and may
    name ``/etc/shadow`` or another job's record), never blocking on a FIFO or reading a
    device, never more than ``limit`` bytes (:func:`remote_payload.boundedread.read_regular`).

    Raises:
        FileNotFoundError: no file.
        ValueError: a link, a directory, not a regular file, larger than ``limit``.
        OSError: it cannot be read.
    """
    try:
        return boundedread.read_regular(path, limit)
    except boundedread.Refused as exc:
        raise ValueError(_REFUSALS.get(exc.why, exc.reason)) from None


_REFUSALS = {
    boundedread.LINK: "a symbolic link, not the agent's file",
    boundedread.DIRECTORY: "a directory, not a file",
    boundedread.NOT_REGULAR: "not a regular file",
}


def read_status(job_path: str, missing: dict[str, t.Any] | None = None) -> dict[str, t.Any] | None:
    """``<job dir>/status.json`` (``missing`` while a launch has not written it yet).

    Raises:
        DamagedRecord: it does not parse.
    """
    return read(os.path.join(job_path, "status.json"), parse_status, missing)


def read_spec(job_path: str) -> dict[str, t.Any]:
    """``<job dir>/spec.json`` (``{}`` when there is none).

    Raises:
        DamagedRecord: it does not parse.
    """
    return read(os.path.join(job_path, "spec.json"), parse_spec, {}) or {}


def read_queued_spec(job_path: str) -> dict[str, t.Any]:
    """A queued job's ``spec.json``: what its start needs is there (``queue add`` wrote the
    whole launch spec; a queued job dir made by hand, or whose spec was cut or copied from
    another job, never starts: it is set aside as damaged).

    Raises:
        DamagedRecord: no spec, or one its start could not use.
    """
    path = os.path.join(job_path, "spec.json")
    spec = read(path, parse_spec)
    if spec is None:
        raise DamagedRecord(path, "missing (a queued job needs its spec)")
    if spec.get("job_id") != os.path.basename(job_path):
        raise DamagedRecord(path, f"job_id {_short(spec.get('job_id'))} is not the job dir's "
                                  "name")
    if not spec.get("command"):
        raise DamagedRecord(path, "command is missing")
    for key in ("workdir", "name"):
        if not isinstance(spec.get(key), str):
            raise DamagedRecord(path, f"{key} is missing")
    env = spec.get("env")
    if env is not None and not (isinstance(env, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise DamagedRecord(path, "env is not a map of strings")
    return spec


def _finite(x: t.Any) -> bool:
    try:  # an integer of 400 digits parses, and is too large for a float: no number here
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:
        return False


def _short(x: t.Any) -> str:
    return repr(x)[:60]
