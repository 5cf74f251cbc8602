"""Read a ``known_hosts`` file (or another file of the user's) safely: the one reader behind
every host-key check.

Why not ``Path.read_bytes``: the path is the user's (inventory ``known_hosts``, ~/.ssh), and
a clumsy or hostile one can be a FIFO (the read blocks forever, before any connect timeout
starts), a link to ``/dev/zero`` (the read never ends, memory runs out) or a device. Here
the file is opened without blocking, must be a regular file, and is read up to
:data:`LIMIT` bytes; anything else is a :class:`~opsctl.errors.HostKeyError` naming it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from opsctl.errors import HostKeyError

#: Largest known_hosts read (a line is ~100 bytes: hundreds of thousands of hosts).
LIMIT = 64 * 1024 * 1024


def read(path: Path) -> bytes | None:
    """``path``'s bytes, or None when it does not exist (a dangling link included).

    Raises:
        HostKeyError: it cannot be opened, is not a regular file, or is over :data:`LIMIT`.
    """
    try:
        return read_regular(path, LIMIT)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise HostKeyError(f"known_hosts {path} {exc}",
                           hint="point known_hosts in the inventory at a plain file") from None
    except OSError as exc:
        raise HostKeyError(f"cannot read known_hosts {path}: {exc.strerror}") from None


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, opened without blocking (a FIFO never waits).

    Raises:
        FileNotFoundError: it does not exist.
        ValueError: it is not a regular file ("is not a regular file") or is over ``limit``
            bytes ("is larger than N MiB").
        OSError: it cannot be opened or read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit and (chunk := os.read(fd, 1024 * 1024)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise ValueError(f"is larger than {max(1, limit // (1024 * 1024))} MiB")
    return b"".join(chunks)
