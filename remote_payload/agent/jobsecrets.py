"""A job's secrets: stored root-only in its job dir, put in its environment, redacted from its output.

``deploy`` reads the playbook's ``secrets: [NAME, ...]`` from the local environment (or
``--env-file``) and sends the values to ``launch`` on **stdin** (never argv: any user of the
host or container can read another process's command line). The agent stores them in
``jobs/<id>/secrets.json``, mode 0600, and never in ``spec.json`` (which has the names only); the
wrapper reads them into memory, adds them to every attempt's environment, and deletes the file
when the job ends. Everything the job prints passes through :class:`Redactor` before it reaches
``output.log``, the pane, events or status, so an echoed value shows as ``***``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import typing as t

from remote_payload import boundedread, wire

FILE = "secrets.json"
#: the largest secrets file read (a playbook's env values; a link or FIFO there is refused)
MAX_BYTES = 1 << 20
MASK = b"***"
#: Shorter values would mask ordinary text everywhere (and cannot be told from it): refused.
MIN_LEN = wire.SECRET_MIN_LEN
NAME_RE = re.compile(wire.ENV_NAME_PATTERN)


def check(values: t.Any, names: t.Sequence[str]) -> dict[str, str]:
    """The secrets sent to ``launch``: exactly ``names``, string values of at least :data:`MIN_LEN`.

    Raises ``ValueError`` naming the variable (never its value).
    """
    if not isinstance(values, dict):
        raise ValueError("secrets on stdin must be a JSON object {NAME: value}")
    missing = [n for n in names if n not in values]
    if missing:
        raise ValueError(f"secret(s) not sent: {', '.join(missing)}")
    extra = sorted(set(values) - set(names))
    if extra:
        raise ValueError(f"secret(s) sent that the spec does not name: {', '.join(extra)}")
    for name, value in values.items():
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"secret {name} must be a string without NUL bytes")
        if len(value.encode()) < MIN_LEN:
            raise ValueError(f"secret {name} is shorter than {MIN_LEN} bytes: too short to redact")
    return dict(values)


def valid_name(name: t.Any) -> bool:
    return isinstance(name, str) and NAME_RE.fullmatch(name) is not None


def store(job_dir: str, values: dict[str, str]) -> None:
    """Write ``secrets.json`` readable by its owner only (created 0600, never widened)."""
    path = os.path.join(job_dir, FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(values, f)


def load(job_dir: str) -> dict[str, str]:
    try:
        values = json.loads(boundedread.read_regular(os.path.join(job_dir, FILE), MAX_BYTES))
    except FileNotFoundError:
        return {}
    return {str(k): str(v) for k, v in values.items()} if isinstance(values, dict) else {}


def remove(job_dir: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(job_dir, FILE))


class Redactor:
    """Replaces each secret value with ``***`` in a byte stream cut at arbitrary points.

    A chunk's tail that could be the start of a secret is held back until the next chunk
    (or :meth:`flush`) decides it, so a value split across two reads is still masked.
    """

    def __init__(self, values: t.Iterable[str]):
        self.secrets = sorted({v.encode() for v in values if len(v.encode()) >= MIN_LEN},
                              key=len, reverse=True)  # longest first: one that contains another
        self.held = b""

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def feed(self, chunk: bytes) -> bytes:
        if not self.secrets:
            return chunk
        data = self.held + chunk
        for s in self.secrets:
            data = data.replace(s, MASK)
        keep = 0
        for k in range(min(len(data), len(self.secrets[0]) - 1), 0, -1):
            tail = data[-k:]
            if any(s.startswith(tail) for s in self.secrets):
                keep = k
                break
        self.held = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep]

    def flush(self) -> bytes:
        out, self.held = self.held, b""
        return out

    def text(self, s: str) -> str:
        """One complete string, masked (for text the wrapper builds itself)."""
        for v in self.secrets:
            s = s.replace(v.decode(), MASK.decode())
        return s
