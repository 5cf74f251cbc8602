"""The agent's ``probe`` verb: one JSON reply with a report, whatever the probe process does."""

from __future__ import annotations

import stat
import sys
import typing as t
from pathlib import Path

from tests.agent_helper import run_agent


def agent(root: Path, *args: str) -> dict[str, t.Any]:
    data: dict[str, t.Any] = run_agent(root, "probe", *args, timeout=120).data
    return data


def fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_probe_verb_returns_the_probes_report_and_keeps_raw_output_under_root(
        tmp_path: Path) -> None:
    data = agent(tmp_path, "--python", sys.executable, "--simulate", "error", "--timeout", "10",
                 "--threads", "2")
    assert data["status"] == "affected"
    assert data["modes"]["unguarded"]["status"] == "error"
    raw = Path(data["raw_output"])
    assert raw.parent.parent == tmp_path / "probes" and raw.name == "raw.log"
    assert "===== report" in raw.read_text()
    assert data["probe_rc"] == 1 and data["deadline_hit"] is False
    assert Path(data["probe_output"]).exists()


def test_default_python_is_the_current_env_when_present(tmp_path: Path) -> None:
    bindir = tmp_path / "envs" / "current" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python").symlink_to(sys.executable)
    data = agent(tmp_path, "--simulate", "import-error", "--timeout", "5", "--modes", "unguarded")
    assert data["env"]["python_executable"] == str(bindir / "python")


def test_a_probe_process_that_dies_by_a_signal_is_reported_crashed_with_it(
        tmp_path: Path) -> None:
    python = fake_python(tmp_path, 'echo "loading torch"; echo "oops" >&2; kill -9 $$')
    data = agent(tmp_path, "--python", python)
    assert data["status"] == "crashed" and data["affected"] is None
    assert data["signal"] == "SIGKILL" and data["rc"] == -9 and data["deadline_hit"] is False
    assert data["stdout_tail"] == ["loading torch"] and data["stderr_tail"] == ["oops"]
    assert "exited without printing a report" in data["verdict"]


def test_a_probe_that_prints_no_report_is_crashed_with_its_exit_code(tmp_path: Path) -> None:
    data = agent(tmp_path, "--python", fake_python(tmp_path, "echo 'Illegal instruction' >&2; "
                                                              "exit 132"))
    assert (data["status"], data["rc"], data["signal"]) == ("crashed", 132, None)
    assert "exit code 132" in data["verdict"]


def test_a_missing_python_is_crashed_not_an_agent_error(tmp_path: Path) -> None:
    data = agent(tmp_path, "--python", str(tmp_path / "nope" / "python"))
    assert data["status"] == "crashed"
    assert "cannot start the probe" in data["error"]


def test_the_verb_deadline_stops_a_hung_probe_and_still_returns_a_report(tmp_path: Path) -> None:
    # the deadline's SIGTERM reaches the probe twice (its group, and it as a marked process)
    data = agent(tmp_path, "--python", sys.executable, "--simulate", "hang-hard",
                 "--timeout", "60", "--modes", "unguarded", "--deadline", "5")
    assert data["deadline_hit"] is True, data
    assert data["status"] == "crashed" and "SIGTERM" in data["error"], data


def test_a_probe_killed_at_the_deadline_before_any_report_says_the_deadline_hit(
        tmp_path: Path) -> None:
    python = fake_python(tmp_path, "trap '' TERM; echo starting; exec sleep 60")
    data = agent(tmp_path, "--python", python, "--deadline", "1")
    assert data["status"] == "crashed" and data["deadline_hit"] is True, data
    assert "deadline" in data["error"]
