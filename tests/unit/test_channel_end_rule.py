"""When a command counts as ended (:func:`opsctl.remote.channel.pump`, shared by the direct
path and the mux server): exit status and EOF, or exit status and then
:data:`~opsctl.remote.channel.EXIT_GRACE_S` of quiet output; output after the exit status
restarts the grace, and the grace's end is said on stderr."""

from __future__ import annotations

import os
import time

from opsctl.remote import channel


class _Transport:
    def is_active(self) -> bool:
        return True


class _Chan:
    """A channel whose exit status arrived; EOF never does. ``drip``: stdout chunks that
    arrive one per ``every`` seconds after the exit status."""

    closed = False
    eof_received = False

    def __init__(self, drip: int = 0, every: float = 0.0, eof: bool = False) -> None:
        self.drip, self.every, self.next_at = drip, every, time.monotonic() + every
        self.eof_received = eof
        self._r, self._w = os.pipe()  # never written: select() on it waits its timeout

    def close_pipe(self) -> None:
        os.close(self._r)
        os.close(self._w)

    def get_transport(self) -> _Transport:
        return _Transport()

    def fileno(self) -> int:
        return self._r

    def recv_ready(self) -> bool:
        return self.drip > 0 and time.monotonic() >= self.next_at

    def recv(self, n: int) -> bytes:
        self.drip -= 1
        self.next_at = time.monotonic() + self.every
        return b"more\n"

    def recv_stderr_ready(self) -> bool:
        return False

    def exit_status_ready(self) -> bool:
        return True

    def recv_exit_status(self) -> int:
        return 3


def test_an_exit_status_without_eof_ends_the_command_after_the_grace_and_says_so():
    out: list[bytes] = []
    err: list[bytes] = []
    chan = _Chan()
    start = time.monotonic()
    assert channel.pump(chan, out.append, err.append) == 3
    chan.close_pipe()
    took = time.monotonic() - start
    assert channel.EXIT_GRACE_S <= took < channel.EXIT_GRACE_S + 1, took
    assert err == [channel.LINGERED] and out == []


def test_output_after_the_exit_status_restarts_the_grace():
    out: list[bytes] = []
    err: list[bytes] = []
    every = channel.EXIT_GRACE_S / 2
    chan = _Chan(drip=3, every=every)
    start = time.monotonic()
    assert channel.pump(chan, out.append, err.append) == 3
    chan.close_pipe()
    took = time.monotonic() - start
    assert out == [b"more\n"] * 3
    assert took >= 3 * every + channel.EXIT_GRACE_S - 0.1, took


def test_an_exit_status_with_eof_ends_the_command_at_once_with_no_note():
    err: list[bytes] = []
    chan = _Chan(eof=True)
    start = time.monotonic()
    assert channel.pump(chan, lambda b: None, err.append) == 3
    chan.close_pipe()
    assert time.monotonic() - start < channel.POLL_S + 0.2
    assert err == []
