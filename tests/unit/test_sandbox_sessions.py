"""A test session stops the sandbox it used when it ends, unless another live session still
uses it (``tests/sandbox_plugin.py``); ``./scripts/test`` stops every idle one on its way out.
The stop itself (``sandbox.down``) is the real one in tests/sandbox/; here it is recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import sandbox_plugin


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    monkeypatch.setattr(sandbox_plugin.sandbox_mod, "down", calls.append)
    return calls


@pytest.fixture
def other_session(tmp_path: Path):
    """Another live process registered as a session of ``tmp_path``'s sandbox."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    folder = sandbox_plugin._sessions_dir(tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(proc.pid)).write_text(f"{sandbox_plugin._started_at(proc.pid)}\n")
    yield proc
    proc.kill()
    proc.wait()


def test_the_last_session_to_end_stops_the_sandbox(tmp_path, stops):
    sandbox_plugin.register_session(tmp_path)
    assert sandbox_plugin.release_session(tmp_path) is True
    assert stops == [tmp_path]
    assert not (sandbox_plugin._sessions_dir(tmp_path) / str(os.getpid())).exists()


def test_a_session_leaves_the_sandbox_running_while_another_live_one_uses_it(tmp_path, stops,
                                                                              other_session):
    sandbox_plugin.register_session(tmp_path)
    assert sandbox_plugin.release_session(tmp_path) is False
    assert stops == []
    other_session.kill()
    other_session.wait()
    sandbox_plugin.register_session(tmp_path)
    assert sandbox_plugin.release_session(tmp_path) is True  # a dead session counts for nothing
    assert stops == [tmp_path]


def test_a_registration_whose_pid_was_reused_by_another_process_does_not_count(tmp_path, stops):
    folder = sandbox_plugin._sessions_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / str(os.getppid())).write_text("1\n")  # a live pid, but not started then
    (folder / "999999999").write_text("1\n")  # no such process
    (folder / "not-a-pid").write_text("x")  # ignored, kept
    sandbox_plugin.register_session(tmp_path)
    assert sandbox_plugin.release_session(tmp_path) is True
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "not-a-pid"]


def test_the_end_of_scripts_test_stops_every_idle_sandbox_of_the_home_and_its_workers(
        tmp_path, stops, other_session):
    for home in (tmp_path / "workers" / "gw1", tmp_path / "workers" / "gw2"):
        (home / "sandbox").mkdir(parents=True)
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "workers" / "gw3").mkdir()  # never brought up: nothing to stop
    # other_session uses the session home's sandbox: that one stays up
    assert sandbox_plugin.stop_idle_sandboxes(tmp_path) == [
        tmp_path / "workers" / "gw1", tmp_path / "workers" / "gw2"]
    assert stops == [tmp_path / "workers" / "gw1", tmp_path / "workers" / "gw2"]


def test_stopping_with_no_sandbox_in_the_home_does_nothing(tmp_path, stops):
    assert sandbox_plugin.stop_idle_sandboxes(tmp_path) == []
    assert stops == []


def test_a_fifo_under_a_live_pid_name_neither_hangs_the_end_nor_counts_as_a_session(tmp_path, stops):
    folder = sandbox_plugin._sessions_dir(tmp_path)
    folder.mkdir(parents=True)
    os.mkfifo(folder / str(os.getppid()))  # opening it for reading would block for ever
    (folder / "1").symlink_to(Path("/proc/1/stat"))  # a link is never followed
    sandbox_plugin.register_session(tmp_path)
    assert sandbox_plugin.release_session(tmp_path) is True
    assert stops == [tmp_path]
    assert sorted(p.name for p in folder.iterdir()) == [".lock"]


def test_a_directory_under_a_pid_name_is_left_alone_and_counts_for_nothing(tmp_path, stops):
    folder = sandbox_plugin._sessions_dir(tmp_path)
    (folder / str(os.getppid())).mkdir(parents=True)
    (folder / str(os.getppid()) / "kept").write_text("x")
    sandbox_plugin.register_session(tmp_path)
    assert sandbox_plugin.release_session(tmp_path) is True
    assert (folder / str(os.getppid()) / "kept").read_text() == "x"


@pytest.mark.parametrize("damage", ["file", "link"])
def test_a_registry_that_is_not_a_directory_is_set_aside_and_sessions_still_register(
        tmp_path, stops, damage):
    folder = sandbox_plugin._sessions_dir(tmp_path)
    if damage == "file":
        folder.write_text("kept")
    else:
        (tmp_path / "elsewhere").mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
    sandbox_plugin.register_session(tmp_path)
    assert folder.is_dir() and not folder.is_symlink()
    assert sandbox_plugin.release_session(tmp_path) is True
    aside = list(tmp_path.glob("test-sessions.damaged-*"))
    assert len(aside) == 1
    if damage == "file":
        assert aside[0].read_text() == "kept"
    else:
        assert list((tmp_path / "elsewhere").iterdir()) == []  # nothing written through it
