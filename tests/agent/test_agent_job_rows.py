"""The agent's ``jobs`` verb lists at most ``wire.JOB_ROWS_MAX`` rows (the newest; ``total``
counts every job), and its ``--limit`` is a whole number within that: the reply the CLI
takes (tests/unit/test_reply_bounds.py holds the CLI's side)."""

from __future__ import annotations

import json

import pytest

from remote_payload import wire


def test_the_agent_lists_at_most_the_rows_a_reply_may_hold(tmp_path, monkeypatch):
    from remote_payload.agent.verbs import jobs

    monkeypatch.setattr(wire, "JOB_ROWS_MAX", 3)
    for i in range(5):
        d = tmp_path / "jobs" / f"job-{i}"
        d.mkdir(parents=True)
        (d / "status.json").write_text(json.dumps({"state": "SUCCEEDED", "created_at": 1000.0 + i}))
    doc = jobs.list_jobs(str(tmp_path), limit=0)
    assert [r["job_id"] for r in doc["jobs"]] == ["job-4", "job-3", "job-2"]
    assert doc["total"] == 5


@pytest.mark.parametrize("limit", [str(wire.JOB_ROWS_MAX + 1), "-1", "1e3", "²"])
def test_the_agent_refuses_a_limit_past_what_a_reply_may_hold(tmp_path, limit):
    from tests.agent_helper import run_agent

    reply = run_agent(tmp_path, "jobs", "--limit", limit, timeout=30).reply
    assert reply["ok"] is False and reply["error"]["type"] == wire.ErrorType.UsageError.value
