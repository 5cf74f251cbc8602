"""Read what a remote command gets on stdin, from a thread, without Python's buffered stdio.

Why: a thread that forwards ``opsctl exec``'s stdin with ``sys.stdin.buffer.read()`` is
still blocked inside the ``BufferedReader``, holding its lock, when the remote command ends
first (``sleep 3 | opsctl exec … -- echo hello``), and interpreter shutdown then aborts with
``Fatal Python error: _enter_buffered_busy`` (exit 134) instead of passing the exit code
through. Here a real file descriptor is read with ``os.read``
after ``select`` — no lock that shutdown needs — and the loop stops as soon as the caller sets
``stop`` (the command has ended), so the thread is gone before the interpreter is.

Streams without a file descriptor (``io.BytesIO`` in tests) are read directly; they have no
shutdown hazard.
"""

from __future__ import annotations

import os
import select
import threading
import typing as t

CHUNK = 1 << 16
#: How often a blocked reader looks at ``stop`` (seconds).
POLL_S = 0.1

StdinSource = bytes | t.BinaryIO


def _fileno(stream: t.BinaryIO) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return None


def chunks(stdin: StdinSource, stop: threading.Event) -> t.Iterator[bytes]:
    """Yield ``stdin`` in chunks until EOF or until ``stop`` is set.

    A real descriptor is read with ``select`` + ``os.read`` (never the buffered object, so
    a thread still reading at interpreter exit cannot abort the process).
    """
    if isinstance(stdin, bytes):
        for i in range(0, len(stdin), CHUNK):
            if stop.is_set():
                return
            yield stdin[i:i + CHUNK]
        return
    fd = _fileno(stdin)
    if fd is None:
        while not stop.is_set() and (chunk := stdin.read(CHUNK)):
            yield chunk
        return
    while not stop.is_set():
        try:
            ready, _, _ = select.select([fd], [], [], POLL_S)
        except (OSError, ValueError):  # fd closed under us
            return
        if not ready:
            continue
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:  # an inherited O_NONBLOCK descriptor: wait again
            continue
        except OSError:
            return
        if not chunk:
            return
        yield chunk
