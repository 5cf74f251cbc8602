"""pytest plugin: no tmux server of a finished test session keeps running on this machine.

The agent tests run the real agent with a tmux server of their own, on a socket named after the
test process (``opsctl-test-queue-<pid>-<hex>``, …), and kill it when their fixture ends. A
queued job started by the queue after the fixture's kill starts the server again, and a
session cut short (SIGKILL, a lost worker) skips the kill. So each test process, when its
session ends, kills the servers on the sockets named after itself
(:func:`stop_tmux_servers_of`), and ``./scripts/test``, once pytest has ended however it
ended, kills those whose owning process is gone (:func:`stop_orphaned_tmux_servers`). Only
those names: a server of a session still running is never touched.
"""

from __future__ import annotations

import os
import re
import subprocess
import typing as t
from pathlib import Path

import pytest

#: Socket names the tests give their tmux servers, with the owning test process's pid.
OWNED_SOCKET = re.compile(r"opsctl-test-agent-(\d+)-[0-9a-f]{6}|opsctl-test-agent-lost-(\d+)-[0-9a-f]{6}"
                          r"|opsctl-test-queue-(\d+)-[0-9a-f]{6}|opsctl-test-(\d+)|opsctl-torchswap-(\d+)")


#: Seconds one ``tmux kill-server`` may take; a socket whose server never answers costs this.
KILL_TIMEOUT_S = 10.0


def socket_dir() -> Path:
    """Where tmux keeps this user's sockets (``$TMUX_TMPDIR`` or ``/tmp``, then ``tmux-<uid>``)."""
    return Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"


def owner_pid(socket_name: str) -> int | None:
    """The pid of the test process a socket belongs to; None for any other name."""
    m = OWNED_SOCKET.fullmatch(socket_name)
    return next((int(g) for g in m.groups() if g), None) if m else None


def _stop(folder: Path | None, which: t.Callable[[int], bool]) -> list[str]:
    folder = folder or socket_dir()
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    stopped = []
    for name in names:
        pid = owner_pid(name)
        if pid is None or not which(pid):
            continue
        try:
            subprocess.run(["tmux", "-S", str(folder / name), "kill-server"], capture_output=True,
                           check=False, timeout=KILL_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # a mute server (or no tmux behind the socket): next
            continue
        stopped.append(name)
    return stopped


def stop_tmux_servers_of(pid: int, folder: Path | None = None) -> list[str]:
    """Kill the tmux servers on the test sockets named after process ``pid``; returns their
    socket names."""
    return _stop(folder, lambda owner: owner == pid)


def stop_orphaned_tmux_servers(folder: Path | None = None) -> list[str]:
    """Kill every tmux server on a test socket whose owning process is gone; returns their
    socket names. A pid that now belongs to another process counts as alive (nothing killed)."""
    return _stop(folder, lambda owner: not Path(f"/proc/{owner}").exists())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    stop_tmux_servers_of(os.getpid())  # this process's tests named their sockets after it
