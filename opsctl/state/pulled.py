"""The local paths ``opsctl pull`` wrote, so a later pull replaces those and nothing else.

A pull into an existing, non-empty DEST that opsctl did not pull there (a model directory, a
file the user wrote) is refused unless ``--force``: rsync and the tar stream would otherwise
overwrite it in place. The record lives in opsctl's home (``pulled.json``), not in the copy: a
marker file inside a pulled tree would show up in the user's diff and be removed by the next
``--delete``. Written through :mod:`remote_payload.safe_write` under a lock (concurrent pulls).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import typing as t
from pathlib import Path

from opsctl.config import paths
from opsctl.errors import LocalWriteError
from remote_payload import safe_write

#: Paths remembered at most (the oldest are forgotten: a pull there then asks for --force).
LIMIT = 10_000


def path() -> Path:
    return paths.home() / "pulled.json"


def key(dest: str | Path) -> str:
    """A DEST as remembered: absolute, its parent's links resolved (DEST itself is never a
    link: :func:`opsctl.ops.files.check_pull_dest` refuses one)."""
    p = os.path.abspath(os.path.expanduser(str(dest)))
    return os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))


#: the record's size at most (``LIMIT`` paths of up to 4096 bytes, JSON-quoted)
MAX_BYTES = 64 << 20


def _load() -> list[str]:
    """The remembered paths; a missing, damaged, oversized or planted record (a link, a FIFO)
    remembers nothing, so a pull there asks for ``--force`` (it never hangs or follows)."""
    try:
        doc = json.loads(safe_write.read_regular(path(), MAX_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        return []
    got = doc.get("paths") if isinstance(doc, dict) else None
    return [p for p in got if isinstance(p, str)] if isinstance(got, list) else []


def was_pulled(dest: str | Path) -> bool:
    return key(dest) in _load()


@contextlib.contextmanager
def _locked() -> t.Iterator[None]:
    """The record's lock file, never through a link (``O_NOFOLLOW``) and never a FIFO or a
    device (opened non-blocking, checked to be a regular file).

    Raises:
        OSError: the lock cannot be made or is not a regular file.
    """
    lock = path().with_name(".pulled.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(lock))
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remember(dest: str | Path) -> None:
    """Record ``dest`` as written by a pull.

    Raises:
        LocalWriteError: opsctl's home cannot be written.
    """
    try:
        with _locked():
            known = [p for p in _load() if p != key(dest)]
            safe_write.write_json(path(), {"paths": [*known, key(dest)][-LIMIT:]})
    except safe_write.DestinationError as exc:
        raise LocalWriteError.of(exc) from None
    except OSError as exc:
        why = "is a symbolic link; not followed" if exc.errno == errno.ELOOP else \
            f"cannot write: {exc.strerror or exc}"
        raise LocalWriteError(f"{exc.filename or path()}: {why}",
                              path=str(exc.filename or path())) from None
