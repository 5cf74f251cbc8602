"""One SSH session channel: feed it stdin, pump its output until the command exits.

Used by the direct path (:meth:`opsctl.remote.transport.Remote.run`) and by the mux server
(:mod:`opsctl.remote.mux_server`), so both see the same end-of-command rule: exit status
received *and* EOF *and* nothing left to read.
"""

from __future__ import annotations

import select
import threading
import typing as t

from opsctl.remote import stdinfeed

Output = t.Callable[[bytes], None]
CHUNK = 65536
POLL_S = 0.25


class ConnectionDropped(Exception):
    """The SSH connection under the channel is no longer active."""


def pump(chan: t.Any, on_stdout: Output, on_stderr: Output, *,
         before_poll: t.Callable[[], None] | None = None, stop_on_close: bool = False) -> int | None:
    """Forward output until the command exits; its exit status (``-1``: none was sent).

    ``before_poll`` runs before each wait (it may raise, e.g. a local deadline). With
    ``stop_on_close``, a channel closed by someone else (the mux's client hung up) ends the
    pump with None.

    Raises:
        ConnectionDropped: the SSH connection went away first.
    """
    transport = chan.get_transport()
    while True:
        if before_poll is not None:
            before_poll()
        select.select([chan], [], [], POLL_S)
        while chan.recv_ready():
            on_stdout(chan.recv(CHUNK))
        while chan.recv_stderr_ready():
            on_stderr(chan.recv_stderr(CHUNK))
        if chan.exit_status_ready() and chan.eof_received and not (
                chan.recv_ready() or chan.recv_stderr_ready()):
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
