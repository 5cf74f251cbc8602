"""A reply carries at most what was asked: ``jobs --limit 20`` answered with 200,000 rows,
``status --lines 5`` with 100,000 output lines or ``history --points 10`` with 512 rows is
refused at the agent client (one line, exit 25, the output saved), in bounded time, before
anything renders it. The checks are ``opsctl.remote.agent_client.REQUEST_BOUNDS``; every
agent flag that bounds a count is held by one of them (the walk below)."""

from __future__ import annotations

import argparse
import base64
import importlib
import time
import typing as t
from pathlib import Path

import pytest

from opsctl import errors
from opsctl.remote import agent_client
from remote_payload import wire
from remote_payload.agent.__main__ import VERBS
from tests.replies import _STATUS, envelope, scripted_agent

#: every agent flag whose number bounds how much a reply carries
COUNT_FLAGS = ("--limit", "--lines", "--points", "--max-bytes", "--tail")


def _jobs(rows: list[dict[str, t.Any]], limit: int = 20, **extra: t.Any) -> bytes:
    return envelope("jobs", {"current": None, "jobs": rows, "total": len(rows), "limit": limit,
                             "damaged": [], **extra})


def _rows(n: int, state: str = "SUCCEEDED") -> list[dict[str, t.Any]]:
    return [{"job_id": f"j{i}", "name": "x", "state": state} for i in range(n)]


def _refused(answer: bytes, verb: str, *args: str, within_s: float = 20) -> errors.ReplyShapeError:
    agent = scripted_agent(lambda v, a: answer)
    start = time.monotonic()
    with pytest.raises(errors.ReplyShapeError) as info:
        agent.call(verb, *args)  # type: ignore[call-overload]
    assert time.monotonic() - start < within_s
    exc = info.value
    assert exc.exit_code == errors.REMOTE_FAILED and "\n" not in exc.message
    assert exc.log_path and Path(exc.log_path).is_file()  # the whole reply is kept
    return exc


def test_a_jobs_reply_with_far_more_rows_than_any_reply_may_hold_is_refused_fast(isolated_env):
    exc = _refused(_jobs(_rows(200_000)), "jobs", "--limit", "20")
    assert f"at most {wire.JOB_ROWS_MAX}" in exc.message


def test_a_jobs_reply_with_more_finished_jobs_than_the_limit_asked_is_refused(isolated_env):
    exc = _refused(_jobs(_rows(21)), "jobs", "--limit", "20")
    assert "21 finished jobs where the newest 20 were asked" in exc.message


def test_a_jobs_reply_that_echoes_another_limit_is_refused(isolated_env):
    exc = _refused(_jobs(_rows(3), limit=0), "jobs", "--limit", "20")
    assert "--limit 20 was asked" in exc.message


def test_a_jobs_reply_with_more_rows_than_its_total_is_refused(isolated_env):
    exc = _refused(_jobs(_rows(3), total=2), "jobs", "--limit", "20")
    assert "more than the 2 jobs it counts" in exc.message


def test_live_jobs_past_the_window_are_what_was_asked(isolated_env):
    """``--limit N`` is the newest N plus every job still live: live rows past N are taken."""
    rows = _rows(20) + _rows(30, state="RUNNING")
    for i, r in enumerate(rows):
        r["job_id"] = f"j{i}"
    doc = scripted_agent(lambda v, a: _jobs(rows)).call("jobs", "--limit", "20")
    assert len(doc["jobs"]) == 50


def test_status_with_more_output_lines_than_asked_is_refused(isolated_env):
    answer = envelope("status", {**_STATUS, "output_tail": ["x"] * 100_000})
    exc = _refused(answer, "status", "--lines", "5")
    assert "100000 output lines where 5 were asked" in exc.message


def test_history_with_more_rows_than_points_asked_is_refused(isolated_env):
    hist = {"format": 1, "bucket_s": 1.0, "t": [float(i) for i in range(50)],
            "loss": [1.0] * 50}
    answer = envelope("history", {"job_id": "j1", "name": None, "state": "RUNNING",
                                  "phase": None, "created_at": None, "started_at": None,
                                  "ended_at": None, "now": 100.0, "source": "history.json",
                                  "diagnosis": [], "history": hist})
    exc = _refused(answer, "history", "--points", "10")
    assert "50 rows of plot data where 10 were asked" in exc.message


def test_logs_with_more_bytes_than_asked_is_refused(isolated_env):
    data = base64.b64encode(b"x" * 4096).decode()
    answer = envelope("logs", {"job_id": "j1", "offset": 0, "next_offset": 4096, "data_b64": data,
                               "eof": True, "size": 4096, "state": "RUNNING", "terminal": False,
                               "exit_code": None, "signal": None, "since_indexed": None})
    exc = _refused(answer, "logs", "--offset", "0", "--max-bytes", "100")
    assert "where 100 bytes were asked" in exc.message


def test_a_reply_within_what_was_asked_is_taken(isolated_env):
    doc = scripted_agent(lambda v, a: _jobs(_rows(20))).call("jobs", "--limit", "20")
    assert len(doc["jobs"]) == 20
    doc = scripted_agent(lambda v, a: _jobs(_rows(40), limit=0)).call("jobs", "--limit", "0")
    assert len(doc["jobs"]) == 40


def test_the_clients_defaults_are_the_agents():
    from remote_payload.agent.verbs import jobs

    assert agent_client._DEFAULT_STATUS_LINES == jobs.DEFAULT_LINES
    assert agent_client._DEFAULT_LOGS_BYTES == jobs.LOGS_MAX_BYTES


def _count_flags(verb: str) -> set[str]:
    parser = argparse.ArgumentParser()
    importlib.import_module(VERBS[verb]).add_arguments(verb, parser)
    return {s for a in parser._actions for s in a.option_strings} & set(COUNT_FLAGS)


#: verbs with a count flag whose reply carries no list that the flag sizes, and why
UNBOUNDED: dict[str, str] = {}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_whose_request_bounds_its_reply_has_a_bound_check(verb):
    if _count_flags(verb) and verb not in UNBOUNDED:
        assert verb in agent_client.REQUEST_BOUNDS, (
            f"`{verb}` takes {sorted(_count_flags(verb))}: add its check to REQUEST_BOUNDS")


def test_the_walk_over_count_flags_finds_the_bounded_verbs():
    assert {v for v in VERBS if _count_flags(v)} >= {"jobs", "status", "logs", "history"}


def test_opsctl_jobs_over_a_200k_row_reply_is_one_error_line_at_once(tmp_path, monkeypatch):
    from tests.cli_runner import run_cli
    from tests.replies import ScriptedContainer, write_inventory

    home = tmp_path / ".opsctl"
    monkeypatch.setenv("OPSCTL_HOME", str(home))
    monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", str(home / "inventory"))
    write_inventory(home)
    reply = _jobs(_rows(200_000))
    ScriptedContainer(lambda verb, args: reply).install(monkeypatch)
    start = time.monotonic()
    res = run_cli("jobs", "--host", "pve1", "--ct", "200")
    assert time.monotonic() - start < 30
    assert res.exit_code == errors.REMOTE_FAILED, res.output
    assert res.stdout == "" and res.stderr.startswith("error: ") and len(res.output.splitlines()) <= 3
    assert "Traceback" not in res.output
