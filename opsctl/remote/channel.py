"""One SSH session channel: feed it stdin, pump its output until the command exits.

Used by the direct path (:meth:`opsctl.remote.transport.Remote.run`) and by the mux server
(:mod:`opsctl.remote.mux_server`), so both see the same end-of-command rule: exit status
received *and* EOF *and* nothing left to read, or exit status received and the output quiet
for :data:`EXIT_GRACE_S` without EOF.

Why the second half: a command that answered and exited can leave a child holding its stdout
(an agent verb that forked; the child inherited the pipe through ``pct exec``). sshd then sends
the exit status but never EOF, and waiting for EOF made a verb that *had* answered look like
one that "did not answer" at its deadline. After the grace the channel is closed; what still
runs in the container is past the host side's reach once ``pct exec`` has exited (the
host-side ``timeout`` ends ``pct exec``'s group only while it runs), and is left to the
container-side deadline of whatever it is. The command's stderr then ends with
:data:`LINGERED` (opsctl's words, in every saved log of the command), so it is said.
"""

from __future__ import annotations

import select
import threading
import time
import typing as t

from opsctl.remote import stdinfeed

Output = t.Callable[[bytes], None]
CHUNK = 65536
POLL_S = 0.25
#: Seconds of quiet output, after the exit status arrived without EOF, before the command
#: counts as ended. An ordinary command's EOF comes with its exit status (milliseconds), so
#: this never delays one; output that still arrives restarts the wait.
EXIT_GRACE_S = 1.0
GRACE_POLL_S = 0.05
#: Added to a command's stderr when the grace, not EOF, ended it.
LINGERED = (f"opsctl: the command exited, but a process it started still held its output "
            f"{EXIT_GRACE_S:g} s later; the channel was closed, and that process is left to "
            "its own deadline (out of the host side's reach once pct exec has exited)\n").encode()


class ConnectionDropped(Exception):
    """The SSH connection under the channel is no longer active."""


def pump(chan: t.Any, on_stdout: Output, on_stderr: Output, *,
         before_poll: t.Callable[[], None] | None = None, stop_on_close: bool = False) -> int | None:
    """Forward output until the command exits; its exit status (``-1``: none was sent).
The command has exited when its exit status and EOF arrived, or its exit status and then
:data:`EXIT_GRACE_S` without output (:data:`LINGERED` goes to ``on_stderr``; module docstring).

    ``before_poll`` runs before each wait (it may raise, e.g. a local deadline). With
    ``stop_on_close``, a channel closed by someone else (the mux's client hung up) ends the
    pump with None.

    Raises:
        ConnectionDropped: the SSH connection went away first.
    """
    transport = chan.get_transport()
    quiet_since: float | None = None  # exit status in, no EOF: when output last arrived
    while True:
        if before_poll is not None:
            before_poll()
        select.select([chan], [], [], POLL_S if quiet_since is None else GRACE_POLL_S)
        moved = False
        while chan.recv_ready():
            on_stdout(chan.recv(CHUNK))
            moved = True
        while chan.recv_stderr_ready():
            on_stderr(chan.recv_stderr(CHUNK))
            moved = True
        pending = chan.recv_ready() or chan.recv_stderr_ready()
        if chan.exit_status_ready() and not pending:
            if chan.eof_received:
                return int(chan.recv_exit_status())
            now = time.monotonic()
            if quiet_since is None or moved:
                quiet_since = now
            elif now - quiet_since >= EXIT_GRACE_S:
                on_stderr(LINGERED)
                return int(chan.recv_exit_status())
        if stop_on_close and chan.closed:
            return None
        if not transport.is_active():
            raise ConnectionDropped("SSH connection dropped")


def feed(chan: t.Any, stdin: stdinfeed.StdinSource, stop: threading.Event) -> None:
    """Copy ``stdin`` into the channel (from a thread), then close the channel's write side."""
    try:
        for chunk in stdinfeed.chunks(stdin, stop):
            chan.sendall(chunk)
    except (OSError, EOFError):  # remote closed early; its exit status tells the story
        pass
    finally:
        try:
            chan.shutdown_write()
        except (OSError, EOFError):
            pass
