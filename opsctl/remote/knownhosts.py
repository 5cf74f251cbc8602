"""Read and append to a ``known_hosts`` file safely: the one reader behind every host-key
check (:func:`read`) and the one appender behind every recorded key (:func:`append`:
``opsctl host trust`` and ``--accept-new-host-key``).

Why not ``Path.read_bytes``: the path is the user's (inventory ``known_hosts``, ~/.ssh), and
a clumsy or hostile one can be a FIFO (the read blocks forever, before any connect timeout
starts), a link to ``/dev/zero`` (the read never ends, memory runs out) or a device. Here
the file is opened without blocking, must be a regular file, and is read up to
:data:`LIMIT` bytes; anything else is a :class:`~opsctl.errors.HostKeyError` naming it.
"""

from __future__ import annotations

from pathlib import Path

from opsctl.errors import HostKeyError
from remote_payload import boundedread, safe_write

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
    """The bytes of the regular file ``path`` (:func:`remote_payload.boundedread.read_regular`;
    a link the user made is followed, a FIFO never waits).

    Raises:
        FileNotFoundError: it does not exist.
        ValueError: it is not a regular file ("is not a regular file") or is over ``limit``
            bytes ("is larger than N MiB").
        OSError: it cannot be opened or read.
    """
    try:
        return boundedread.read_regular(path, limit, follow_links=True)
    except boundedread.Refused as exc:
        if exc.why == boundedread.TOO_LARGE:
            raise ValueError(f"is larger than {max(1, limit // (1024 * 1024))} MiB") from None
        raise ValueError("is not a regular file") from None


def append(path: Path, line: str, *, what: str, then: str = "nothing was recorded") -> None:
    """Record one known_hosts ``line`` (``what``: the key, as the error names it) at the
    end of ``path``, its folder made 0700 when missing, as ssh makes ~/.ssh:
    :func:`remote_payload.safe_write.append_line`, so a last line without its newline gets
    one first and the other host's entry stays whole, nothing is written through a link,
    and the file keeps its inode and mode.

    Raises:
        HostKeyError: it could not be written (a link, not a regular file, no permission,
            a full disk); the message ends with ``then``.
    """
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        safe_write.append_line(path, line)
    except OSError as exc:
        why = exc.reason if isinstance(exc, safe_write.DestinationError) else \
            str(exc.strerror or exc)
        raise HostKeyError(f"cannot record {what} in {path}: {why}; {then}",
                           hint="point known_hosts in the inventory at a writable plain "
                                "file") from None
