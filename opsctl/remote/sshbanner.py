"""Open the TCP connection to a host's sshd and wait, within one deadline, for its SSH banner.

Why: paramiko reads the server's identification line by line (up to 100 lines, 2 s for each
after the first, a line of any length), so a peer that accepts the connection and then says
nothing useful (the wrong port, a web server, a tarpit trickling bytes) can hold a command
for minutes, and one that answers garbage is reported as "Indecipherable protocol version".
Here the first bytes are looked at with ``MSG_PEEK`` (nothing is consumed: paramiko then
reads the very same bytes) until a line starts with ``SSH-`` (RFC 4253, 4.2), within the
host's ``connect_timeout_s`` and :data:`BANNER_LIMIT` bytes; otherwise the host is named as
one that accepted the connection but never spoke SSH (:class:`~opsctl.errors.TransportError`,
exit 10).

Our own few lines because paramiko has no bound on the banner as a whole and no way to tell
"not SSH" from "a slow network"; the connection itself is still paramiko's (the socket is
handed to it as ``sock``).
"""

from __future__ import annotations

import select
import socket
import time

from opsctl.errors import TransportError

#: Bytes a server may send before its ``SSH-`` line (RFC 4253 allows other lines first).
BANNER_LIMIT = 8192
#: Pause between looks while a partial line is there (peeked bytes stay readable, so
#: ``select`` alone would spin).
_PAUSE_S = 0.02
_PREVIEW = 48


def is_banner(seen: bytes) -> bool:
    """Whether ``seen`` (the first bytes a server sent) holds a line starting ``SSH-``."""
    return seen.startswith(b"SSH-") or b"\nSSH-" in seen


def _never_spoke(where: str, why: str, seen: bytes) -> TransportError:
    sent = f"; it sent {seen[:_PREVIEW]!r}" if seen else ""
    return TransportError(f"host {where} accepted the connection but never spoke SSH ({why}{sent})",
                          hint="check that the inventory's address and port are the host's sshd")


def wait_for_banner(sock: socket.socket, timeout_s: float, where: str) -> None:
    """Return once ``sock``'s peer has sent a line starting ``SSH-`` (nothing is consumed).

    Raises:
        TransportError: no such line within ``timeout_s`` or :data:`BANNER_LIMIT` bytes, the
            peer closed the connection first, or the socket failed.
    """
    deadline = time.monotonic() + timeout_s
    seen = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _never_spoke(where, f"no SSH banner within {timeout_s:g} s", seen)
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            continue
        try:
            now = sock.recv(BANNER_LIMIT, socket.MSG_PEEK)
        except OSError as exc:
            raise TransportError(f"cannot connect to {where}: {exc.strerror or exc}") from None
        if not now:
            raise _never_spoke(where, "it closed the connection", seen)
        seen = now
        if is_banner(seen):
            return
        if len(seen) >= BANNER_LIMIT:
            raise _never_spoke(where, f"no SSH banner in its first {len(seen)} bytes", seen)
        time.sleep(min(_PAUSE_S, max(left, 0.0)))


def connect(address: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP connection to ``address:port`` whose peer has sent its SSH banner.

    Raises:
        OSError: the TCP connection failed (refused, unreachable, timed out, unresolvable);
            the caller words it as it words paramiko's.
        TransportError: the peer accepted but never spoke SSH (:func:`wait_for_banner`).
    """
    sock = socket.create_connection((address, port), timeout=timeout_s)
    try:
        wait_for_banner(sock, timeout_s, f"[{address}]:{port}" if ":" in address else f"{address}:{port}")
    except BaseException:
        sock.close()
        raise
    return sock
