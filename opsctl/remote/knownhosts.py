"""Read a ``known_hosts`` file safely: the one reader behind every host-key check.

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
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostKeyError(f"cannot read known_hosts {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostKeyError(f"known_hosts {path} is not a regular file",
                               hint="point known_hosts in the inventory at a plain file")
        chunks: list[bytes] = []
        size = 0
        while size <= LIMIT and (chunk := os.read(fd, 1024 * 1024)):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise HostKeyError(f"cannot read known_hosts {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > LIMIT:
        raise HostKeyError(f"known_hosts {path} is larger than {LIMIT // (1024 * 1024)} MiB",
                           hint="is it the right file? a known_hosts line is about 100 bytes")
    return data
