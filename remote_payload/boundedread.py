"""The one way opsctl and the agent read a file whose content someone else may have placed.

A job's record in the container, ``jobs/current``, a playbook, ``known_hosts``, ``/proc``'s
files: each is read as *a regular file of at most N bytes*, and nothing else:

- **Never waiting.** The file is opened ``O_NONBLOCK``: a FIFO planted at the path would
  otherwise block the open (and the verb, until its deadline) for a writer that never comes.
  It is then refused, as is a device (``/dev/zero`` would fill memory) or a directory: the
  descriptor's ``fstat`` must say regular file, so a swap after a check changes nothing.
- **Never more than the cap.** At most ``limit + 1`` bytes are read; more is an error naming
  the cap (or, with ``cut=True``, the first ``limit`` bytes: ``/proc`` files whose tail
  carries nothing the caller needs).
- **Links: the caller says.** ``follow_links=False`` opens with ``O_NOFOLLOW``: files the
  agent writes itself are renamed into place, never links, so a link there was planted (and
  may name ``/etc/shadow`` or another job's record) and is refused, its target never read.
  The user's own files (a playbook, ``known_hosts``) may be links they made.

Every refusal is an :class:`OSError` (a :class:`Refused` carrying ``errno`` ``ELOOP``,
``EINVAL``, ``EISDIR`` or ``EFBIG`` and a reason in words), so a caller that already survives
an unreadable file survives these too, and can tell them apart by :attr:`Refused.why`.
Stdlib only (``os``, ``stat``, ``errno``): both sides import it, the agent on every poll.
"""

from __future__ import annotations

import errno as errno_mod
import os
import stat
import typing as t

#: :attr:`Refused.why` values, one per reason a file is not read
LINK = "link"
NOT_REGULAR = "not-regular"
DIRECTORY = "directory"
TOO_LARGE = "too-large"

_CHUNK = 1 << 20


class Refused(OSError):
    """The path holds something that is not read: a link (when links are refused), a FIFO,
    device or socket, a directory, or a file over the cap. ``str()`` is one line: the path
    and the reason."""

    def __init__(self, path: str, why: str, reason: str, code: int) -> None:
        super().__init__(code, reason, path)
        self.path = path
        self.why = why
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = False) -> int:
    """A read-only descriptor of the regular file at ``path`` (the caller closes it).

    Raises:
        FileNotFoundError: nothing there.
        Refused: a link (unless ``follow_links``), a directory, a FIFO, a device, a socket.
        OSError: it cannot be opened (permission, ...).
    """
    where = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(where, flags)
    except OSError as exc:
        if exc.errno == errno_mod.ELOOP and not follow_links:
            raise Refused(where, LINK, "a symbolic link; not followed, its target not read",
                          errno_mod.ELOOP) from None
        if exc.errno == errno_mod.EISDIR:
            raise Refused(where, DIRECTORY, "a directory, not a file", errno_mod.EISDIR) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise Refused(where, DIRECTORY, "a directory, not a file", errno_mod.EISDIR)
        if not stat.S_ISREG(mode):
            raise Refused(where, NOT_REGULAR, "not a regular file (a FIFO, device or socket "
                          "is never read)", errno_mod.EINVAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int, *, where: str = "", cut: bool = False) -> bytes:
    """At most ``limit`` bytes of the open file ``fd``, read in chunks (``/proc`` files say
    size 0, so ``st_size`` is never trusted).

    Raises:
        Refused: more than ``limit`` bytes (unless ``cut``: then the first ``limit``).
        OSError: a read failed.
    """
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    if size > limit:
        if cut:
            return data[:limit]
        raise Refused(where, TOO_LARGE, f"larger than {limit} bytes; not read", errno_mod.EFBIG)
    return data


def read_regular(path: str | os.PathLike[str], limit: int, *, follow_links: bool = False,
                 cut: bool = False) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them
    (:func:`open_regular`, then :func:`read_fd`).

    Raises:
        FileNotFoundError: nothing there.
        Refused: a link (unless ``follow_links``), not a regular file, over ``limit``
            (unless ``cut``).
        OSError: it cannot be opened or read.
    """
    fd = open_regular(path, follow_links=follow_links)
    try:
        return read_fd(fd, limit, where=os.fspath(path), cut=cut)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], limit: int, *, follow_links: bool = False,
              errors: str = "strict") -> str:
    """:func:`read_regular` decoded as UTF-8.

    Raises:
        as :func:`read_regular`; UnicodeDecodeError (a ValueError) with ``errors="strict"``.
    """
    return read_regular(path, limit, follow_links=follow_links).decode("utf-8", errors)


def open_binary(path: str | os.PathLike[str], *, follow_links: bool = False) -> t.BinaryIO:
    """The regular file at ``path`` as a binary file object (:func:`open_regular`), for a
    reader that seeks and reads bounded pieces itself (a log's tail, an offset index).

    Raises:
        as :func:`open_regular`.
    """
    return os.fdopen(open_regular(path, follow_links=follow_links), "rb")


def read_at(path: str | os.PathLike[str], offset: int, limit: int, *,
            follow_links: bool = False) -> bytes:
    """At most ``limit`` bytes of the regular file at ``path`` from ``offset`` on.

    Raises:
        as :func:`open_regular`.
    """
    with open_binary(path, follow_links=follow_links) as f:
        f.seek(max(0, offset))
        return f.read(max(0, limit))


def read_tail(path: str | os.PathLike[str], limit: int, *,
              follow_links: bool = False) -> tuple[bytes, int, bool]:
    """The last ``limit`` bytes of the regular file at ``path``: ``(data, file_size,
    starts_at_file_start)``.

    Raises:
        as :func:`open_regular`.
    """
    with open_binary(path, follow_links=follow_links) as f:
        size = f.seek(0, os.SEEK_END)
        start = max(0, size - max(0, limit))
        f.seek(start)
        return f.read(size - start), size, start == 0


def lines(path: str | os.PathLike[str], max_line: int, *, max_lines: int | None = None,
          follow_links: bool = False) -> t.Iterator[bytes]:
    """The lines of the regular file at ``path`` (with their newline), each at most
    ``max_line`` bytes: the rest of a longer line is read and dropped, so one line of a
    gigabyte costs ``max_line`` of memory. ``max_lines`` stops after that many.

    Raises:
        as :func:`open_regular` (when the iteration starts).
    """
    with open_binary(path, follow_links=follow_links) as f:
        count = 0
        while max_lines is None or count < max_lines:
            line = f.readline(max_line)
            if not line:
                return
            if len(line) == max_line and not line.endswith(b"\n"):
                while (rest := f.readline(_CHUNK)) and not rest.endswith(b"\n"):
                    pass
            count += 1
            yield line
