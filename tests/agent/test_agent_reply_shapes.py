"""The real agent's replies pass their verbs' shapes, bounds and patterns included: the
verbs a container answers without a job (``tests/agent_helper.py`` :func:`run_agent` checks
every ``ok`` reply against its shape; the job verbs are exercised by the other agent tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.remote.agent_client import check_reply
from tests.agent_helper import run_agent

VERBS_WITHOUT_A_JOB = [
    ("env",), ("net",), ("net", "--ifname", "lo"), ("doctor", "--no-torch", "--ct", "200"),
    ("abort", "--job", "never-launched-1"), ("jobs",), ("queue",), ("envs",), ("cache-info",),
]


@pytest.mark.parametrize("argv", VERBS_WITHOUT_A_JOB, ids=" ".join)
def test_the_real_agents_reply_passes_its_verbs_shape(tmp_path: Path, argv: tuple[str, ...]) -> None:
    reply = run_agent(tmp_path / "root", *argv, timeout=120).reply
    assert reply["ok"] is True, reply
    check_reply(argv[0], reply["data"], where=f"agent {argv[0]}")  # run_agent did too


def test_abort_of_a_job_never_launched_says_so_in_its_shape(tmp_path: Path) -> None:
    data = run_agent(tmp_path / "root", "abort", "--job", "j-1").reply["data"]
    assert data == {"job_id": "j-1", "launched": False, "state": None, "old_job": None,
                    "old_state": None, "old_cancel_requested": False}
