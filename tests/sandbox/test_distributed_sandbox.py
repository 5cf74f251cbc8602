"""A two-rank trainer job in the sandbox: real CPU torch (gloo) in the container, launched by deploy.

The never-silent contract for multi-process jobs: a deadlock is named as a hang by
``status --json`` with every rank's stacks, taken by the agent itself (nobody ran ``stacks``);
``stacks --json`` returns each process's whole dump; a rank that raises takes the other down
and the job ends FAILED with that rank's error. The real CPU torch build goes into container
200's default opsctl root, as for the README demo in ``tests/sandbox/test_torch_sandbox.py``.
The first module of the session to need the real build installs it with ``swap-torch``; every
other sandbox links that install (``tests/shared_torch.py``), and the deploys find it current.
"""

from __future__ import annotations

import json
import time
import typing as t
from pathlib import Path

import pytest
import yaml

from tests.cli_runner import run_cli as run
from tests.paths import REPO
from tests.shared_torch import real_cpu_build_in_default_root
from tests.waiting import wait_for_value
from tests.xdist_plugin import REAL_TORCH_GROUP

pytestmark = [pytest.mark.sandbox, pytest.mark.slow, pytest.mark.xdist_group(REAL_TORCH_GROUP)]

SMOKE = REPO / "opsctl" / "bundled" / "playbooks" / "dflash-cpu-smoke.yaml"
TWO_RANKS = ["python3", "-m", "remote_payload.trainer", "--preset", "tiny", "--device", "cpu",
             "--attn", "sdpa", "--compile", "off", "--nproc", "2", "--steps", "200",
             "--warmup-steps", "1", "--token-budget", "768", "--seq-buckets", "48,96",
             "--log-every", "1"]


@pytest.fixture(scope="module")
def real_build(sandbox, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The real CPU build current in ct 200's /opt/opsctl: installed once per session, linked
    into every other sandbox that needs it (tests/shared_torch.py)."""
    real_cpu_build_in_default_root(sandbox, tmp_path_factory.mktemp("real-build-home"))


@pytest.fixture
def target(real_build: None, stopping_target: str) -> str:
    return stopping_target


def two_rank_book(tmp_path: Path, name: str, *fault: str, **fields: t.Any) -> Path:
    smoke = yaml.safe_load(SMOKE.read_text())
    doc = {"name": name, "command": [*TWO_RANKS, "--out-dir", f"/tmp/{name}", *fault],
           "env": {"OMP_NUM_THREADS": "1"}, "healthy_when": {"event": "step"}, "timeout_s": 300,
           "torch": smoke["torch"], "requirements": smoke["requirements"], **fields}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(doc))
    return path


def poll_status(until: t.Callable[[dict[str, t.Any]], bool], within_s: float) -> dict[str, t.Any]:
    st = wait_for_value(lambda: json.loads(run("status", "--json").stdout), until, within_s,
                        interval=2)
    assert until(st), json.dumps(st)[-3000:]
    return st


#: the deadlocked job's collectives time out after this: long enough for the hang to be named
#: and every stack taken first (~15-30 s on a loaded 2-core machine), short enough to wait for
PG_TIMEOUT_S = 75


def test_a_deadlock_is_named_with_every_ranks_stacks_then_the_pg_timeout_ends_the_job(target,
                                                                                     tmp_path):
    """One two-rank job shows the whole never-silent story of a deadlock: named as a hang with
    every rank's stacks while it lasts (the job left alone), then ended by the process group's
    timeout, FAILED, with each rank's timeout error in its log (a hang never runs forever)."""
    book = two_rank_book(tmp_path, "deadlock", "--debug-fault", "hang", "--debug-fault-rank", "1",
                         "--debug-fault-step", "3", "--pg-timeout", str(PG_TIMEOUT_S),
                         phase_budgets_s={"training": 15})
    deployed = run("deploy", "--host", target, "--ct", "200", "--playbook", str(book), "--replace")
    assert deployed.exit_code == 0, deployed.output[-3000:]
    quiet_from = time.monotonic()

    st = poll_status(lambda s: bool(s.get("hang")) and any(
        d["cause"] == "hang" for d in s["diagnosis"]), within_s=90)
    assert time.monotonic() - quiet_from < 90
    hang = next(d for d in st["diagnosis"] if d["cause"] == "hang")
    ranks = {p["rank"]: p for p in st["hang"]["processes"] if p["rank"] is not None}
    assert sorted(ranks) == [0, 1]
    assert ranks[1]["collective"] == "recv" and ranks[0]["collective"] == "all_reduce", ranks
    assert "all ranks in collectives: rank 1 in recv (dist.py:" in hang["summary"]
    assert st["state"] == "RUNNING" and st["alive"], "a hang is reported, the job is left alone"

    doc = json.loads(run("stacks", "--json").stdout)
    dumps = {p["rank"]: p["dump"] for p in doc["processes"] if p["rank"] is not None}
    assert sorted(dumps) == [0, 1]
    for rank, dump in dumps.items():
        lines = dump.splitlines()
        assert lines[0].startswith(("Current thread 0x", "Thread 0x")), (rank, lines[:2])
        assert lines[-1].endswith("in <module>"), f"rank {rank}'s dump is cut short"
        assert "hang_forever" in dump if rank == 1 else "all_drafters_max" in dump
    assert "all ranks in collectives" in doc["summary"]

    # --pg-timeout: the blocked collectives fail, and with them the job (no stop needed)
    st = poll_status(lambda s: s["state"] in ("FAILED", "SUCCEEDED", "LOST"),
                     within_s=PG_TIMEOUT_S + 60)
    assert st["state"] == "FAILED", json.dumps(st["diagnosis"])[-2000:]
    errors = [json.loads(line) for line in run("logs").stdout.splitlines()
              if line.startswith('{"event":"error"')]
    assert errors and all(isinstance(e["rank"], int) for e in errors), errors
    assert any("timed out" in e["message"].lower() for e in errors), errors


def test_a_rank_that_raises_fails_the_job_with_its_error_and_leaves_no_rank(target, tmp_path):
    book = two_rank_book(tmp_path, "raiser", "--debug-fault", "raise", "--debug-fault-rank", "1",
                         "--debug-fault-step", "3")
    launched = run("deploy", "--host", target, "--ct", "200", "--playbook", str(book), "--replace",
                   "--no-wait")
    assert launched.exit_code == 0, launched.output[-3000:]
    st = poll_status(lambda s: s["state"] in ("FAILED", "SUCCEEDED", "LOST"), within_s=120)
    assert st["state"] == "FAILED"
    first = st["diagnosis"][0]
    assert first["cause"] == "rank_failed", st["diagnosis"]
    assert first["summary"].startswith("Rank 1 failed: RuntimeError: --debug-fault raise on rank 1")
    ps = run("exec", "--host", target, "--ct", "200", "--", "ps", "-eo", "args").stdout
    assert "debug-fault" not in ps, ps
