"""A finished test session leaves no tmux server behind (``tests/leftovers.py``): servers on a
test socket whose owning process is gone are killed, and nothing else is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import leftovers


@pytest.mark.parametrize("name, pid", [
    ("opsctl-test-queue-21958-fe5aaf", 21958), ("opsctl-test-agent-13421-760b52", 13421),
    ("opsctl-test-agent-lost-7-abcdef", 7), ("opsctl-test-42", 42), ("opsctl-torchswap-9", 9),
    ("opsctl-test-history-123456", None),  # no owner in the name: never touched
    ("opsctl-test-py310-0a0a33", None), ("opsctl", None), ("default", None),
    ("opsctl-test-queue-12-fe5aaf-extra", None), ("opsctl-test-queue--fe5aaf", None),
])
def test_only_the_tests_own_socket_names_have_an_owner(name, pid):
    assert leftovers.owner_pid(name) == pid


@given(st.text(max_size=80))
def test_any_socket_name_reads_as_an_owner_or_none(name):
    pid = leftovers.owner_pid(name)
    assert pid is None or (isinstance(pid, int) and str(pid) in name)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_the_servers_of_gone_test_processes_stop_and_the_others_keep_running(tmp_path: Path):
    folder = tmp_path / "t"
    folder.mkdir()
    names = {"orphan": f"opsctl-test-queue-{_dead_pid()}-abcdef",
             "live": f"opsctl-test-queue-{os.getpid()}-abcdef", "other": "someone-else"}
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}

    def alive(name: str) -> bool:
        return subprocess.run(["tmux", "-S", str(folder / name), "list-sessions"], env=env,
                              capture_output=True, check=False).returncode == 0

    try:
        for name in names.values():
            subprocess.run(["tmux", "-S", str(folder / name), "new-session", "-d", "sleep", "120"],
                           env=env, check=True)
        assert leftovers.stop_orphaned_tmux_servers(folder) == [names["orphan"]]
        assert not alive(names["orphan"])
        assert alive(names["live"]) and alive(names["other"])
    finally:
        for name in names.values():
            subprocess.run(["tmux", "-S", str(folder / name), "kill-server"], env=env,
                           capture_output=True, check=False)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_session_at_its_end_stops_the_servers_named_after_its_own_process(tmp_path: Path):
    folder = tmp_path / "t"
    folder.mkdir()
    mine, other = f"opsctl-test-agent-{os.getpid()}-abcdef", f"opsctl-test-agent-{os.getppid()}-abcdef"
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    try:
        for name in (mine, other):
            subprocess.run(["tmux", "-S", str(folder / name), "new-session", "-d", "sleep", "120"],
                           env=env, check=True)
        assert leftovers.stop_tmux_servers_of(os.getpid(), folder) == [mine]
        assert subprocess.run(["tmux", "-S", str(folder / other), "list-sessions"], env=env,
                              capture_output=True, check=False).returncode == 0
    finally:
        for name in (mine, other):
            subprocess.run(["tmux", "-S", str(folder / name), "kill-server"], env=env,
                           capture_output=True, check=False)


def test_a_missing_socket_folder_stops_nothing(tmp_path: Path):
    assert leftovers.stop_orphaned_tmux_servers(tmp_path / "none") == []


def test_a_mute_server_on_a_test_socket_costs_the_kill_timeout_then_the_rest_are_still_stopped(
        tmp_path, monkeypatch):
    import socket
    import time

    monkeypatch.setattr(leftovers, "KILL_TIMEOUT_S", 1.0)
    dead = _dead_pid()
    mute = socket.socket(socket.AF_UNIX)  # accepts connections, never answers
    mute.bind(str(tmp_path / f"opsctl-test-{dead}"))
    mute.listen(8)
    try:
        start = time.monotonic()
        leftovers.stop_orphaned_tmux_servers(tmp_path)  # never a TimeoutExpired
        assert time.monotonic() - start < 10
    finally:
        mute.close()
