"""The saved output of a failed step (``~/.opsctl/logs``), kept within bounds.

What a remote command printed is the container's to choose, and a broken or hostile agent
can answer every poll of ``opsctl dashboard`` with 64 MiB. So each saved log, and the folder
as a whole, has a cap (``remote_payload/limits.py``; docs/input-limits.md):

- **One log** keeps the first and the last half of each stream within ``LOG_FILE_BYTES``,
  with a line naming how many bytes were cut between them (the start says what the command
  was doing; the end says how it failed).
- **The same output again** (the step, command, exit status and both streams hashed) is not
  written again: the log already saved holds it, and its path is returned (its time set to
  now, so it is the last one rotated away).
- **The folder** keeps at most ``LOGS_TOTAL_BYTES`` and :data:`MAX_FILES` of these logs; the
  oldest are removed first, and only files whose name is one this module writes
  (:data:`NAME_RE`): whatever else is there (a user's notes, another tool's files, a link)
  is never touched.
- **Written safely**: through :mod:`remote_payload.safe_write` (a temporary sibling renamed
  into place, created 0600), so a link planted at the name is refused, never followed, and
  the log goes to another name.
- **Never in the way of the error it serves**: a log is saved while an error is being built
  (the reply was not JSON, the step ran past its deadline). When this machine cannot keep
  it (``~/.opsctl/logs`` is a file, a full or read-only disk), :func:`save` returns an
  :class:`UnsavedLog` that reads as that note where the error shows its log path, and the
  error itself is raised as it would have been: the real failure is never hidden by the
  log's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
import time
from pathlib import Path, PosixPath

from opsctl.config import paths
from remote_payload import limits, safe_write

#: the saved logs' names: ``<date>-<time>-<step>-<pid>-<digest>.log`` (the digest names the
#: content, so a repeat finds its earlier log by name)
NAME_RE = re.compile(r"\d{8}-\d{6}-[A-Za-z0-9_.-]{1,60}-\d{1,10}-[0-9a-f]{16}(?:-[0-9a-f]{8})?\.log")
#: the most saved logs the folder keeps (a cap of its own: 100,000 tiny logs are no use)
MAX_FILES = 500
_STEP_RE = re.compile(r"[^A-Za-z0-9_.-]+")


def cut_middle(data: bytes, limit: int) -> bytes:
    """``data`` whole when it has at most ``limit`` bytes, else its first and last
    ``limit // 2`` bytes with a line between them naming how many were cut."""
    if len(data) <= limit:
        return data
    half = max(limit // 2, 1)
    dropped = len(data) - 2 * half
    return (data[:half] + f"\n{limits.cut_marker(dropped)}\n".encode() + data[-half:])


def _digest(step: str, command: str, rc: int, streams: tuple[bytes, ...]) -> str:
    h = hashlib.sha256()
    for part in (step.encode("utf-8", "replace"), command.encode("utf-8", "replace"),
                 str(rc).encode(), *streams):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


def _ours(directory: Path) -> list[tuple[float, int, Path]]:
    """(mtime, size, path) of every saved log in ``directory``: a regular file (never a
    link: ``lstat``) whose name this module writes."""
    found = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        if not NAME_RE.fullmatch(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append((st.st_mtime, st.st_size, Path(entry.path)))
    return found


def prune(directory: Path, keep: Path | None = None) -> list[Path]:
    """Remove the oldest saved logs until the rest hold at most ``LOGS_TOTAL_BYTES`` and
    :data:`MAX_FILES`; ``keep`` (the log just written) is never removed. Returns what was
    removed. A file removed meanwhile by another opsctl is no error."""
    logs = sorted(_ours(directory), key=lambda row: (row[0], row[2].name))
    total = sum(size for _, size, _ in logs)
    count = len(logs)
    budget = limits.cap("LOGS_TOTAL_BYTES")
    removed = []
    for _, size, path in logs:
        if total <= budget and count <= MAX_FILES:
            break
        if keep is not None and path.name == keep.name:
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        removed.append(path)
        total -= size
        count -= 1
    return removed


class UnsavedLog(PosixPath):
    """What :func:`save` returns when the log could not be written: no file; its text (what
    an error shows as its log path) is the note that says so and why."""

    note: str

    def __str__(self) -> str:
        return self.note


def unsaved(why: str) -> UnsavedLog:
    """The :class:`UnsavedLog` of ``why`` (one line, control characters shown as codes)."""
    text = " ".join(why.split())[:300]
    note = "not saved: " + "".join(
        c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        for c in text)
    log = UnsavedLog("/nonexistent")  # never a file: its text is the note
    log.note = note
    return log


def _why(directory: Path, exc: OSError) -> str:
    if isinstance(exc, safe_write.DestinationError):
        return str(exc)
    if isinstance(exc, FileExistsError) or (directory.is_symlink() and not directory.is_dir()):
        return f"{directory} is not a directory"
    return f"{exc.filename or directory}: {exc.strerror or exc}"


def save(step: str, command: str, rc: int, elapsed_s: float, stdout: bytes,
         stderr: bytes) -> Path:
    """Save one failed command's output (cut to the cap) and return its path; an
    :class:`UnsavedLog` (the note, never an exception) when this machine cannot keep it:
    the caller is building an error, and that error is the one the user must see."""
    try:
        return _save(step, command, rc, elapsed_s, stdout, stderr)
    except OSError as exc:  # safe_write's errors are OSErrors too
        return unsaved(_why(paths.home() / "logs", exc))


def _save(step: str, command: str, rc: int, elapsed_s: float, stdout: bytes,
          stderr: bytes) -> Path:
    directory = paths.logs_dir()
    safe = _STEP_RE.sub("-", step)[:60].strip("-.") or "command"
    digest = _digest(step, command, rc, (stdout, stderr))
    for _, _, path in _ours(directory):
        if path.name.endswith(f"-{digest}.log") or f"-{digest}-" in path.name:
            with contextlib.suppress(OSError):
                os.utime(path, follow_symlinks=False)
                prune(directory, keep=path)
                return path
    stream_cap = max(limits.cap("LOG_FILE_BYTES") // 2, 64)
    text = (f"$ {cut_middle(command.encode('utf-8', 'replace'), 4096).decode('utf-8', 'replace')}\n"
            f"# rc={rc} elapsed={elapsed_s:.3f}s\n").encode("utf-8", "replace")
    body = (b"--- stdout ---\n" + cut_middle(stdout, stream_cap) + b"\n--- stderr ---\n"
            + cut_middle(stderr, stream_cap))
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{os.getpid()}-{digest}"
    path = directory / f"{name}.log"
    try:
        safe_write.write_bytes(path, text + body, mode=0o600, durable=False)
    except safe_write.DestinationRefused:  # a link or a directory planted at the name
        path = directory / f"{name}-{secrets.token_hex(4)}.log"
        safe_write.write_bytes(path, text + body, mode=0o600, durable=False)
    prune(directory, keep=path)
    return path
