"""Every ``--json`` document a real command prints validates against ``opsctl schema``'s
schema for it, on the sandbox: deploy, status, jobs, stop, envs, hosts (and --check),
``status --all``, doctor, a failure document, and the trainer-like job's events."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from opsctl import errors
from opsctl.cli import cli

pytestmark = pytest.mark.sandbox

JOB = textwrap.dedent("""
    import json, time
    def ev(**k): print(json.dumps(k), flush=True)
    ev(event="phase", phase="loading", budget_s=60.0)
    ev(event="phase", phase="training")
    for step in range(1, 400):
        ev(event="step", step=step, loss=1.0 / step, acc=0.5, tok_s=1000.0, eta_s=1.0, lr=1e-3)
        time.sleep(0.2)
""")


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def schema_of(name: str) -> Draft202012Validator:
    res = run("schema", *name.split())
    assert res.exit_code == 0, res.output
    return Draft202012Validator(json.loads(res.stdout))


def assert_valid(name: str, stdout: str) -> dict:
    doc = json.loads(stdout)
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in schema_of(name).iter_errors(doc)]
    assert problems == [], problems
    return doc


@pytest.fixture
def target(sandbox, isolated_env: Path, tmp_path: Path):
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    book = tmp_path / "schema-job.yaml"
    book.write_text(json.dumps({"name": "schema-job", "command": ["python3", "-c", JOB],
                                "timeout_s": 60, "healthy_when": {"event": "step"}}))
    yield book
    run("stop", "--host", "sandbox", "--ct", "200", "--grace", "1")


def test_every_json_document_of_a_jobs_life_validates_against_its_schema(target):
    res = run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(target), "--json",
              "--replace")
    assert res.exit_code == 0, res.output
    deployed = assert_valid("deploy", res.stdout)
    status = assert_valid("status", run("status", "--json").stdout)
    assert status["job_id"] == deployed["job_id"] and status["state"] == "RUNNING"
    events = schema_of("event")
    seen = [status["last_step"], *status["events_tail"]]
    assert all(list(events.iter_errors(ev)) == [] for ev in seen), seen
    assert {ev["event"] for ev in seen} >= {"step"}
    assert_valid("jobs", run("jobs", "--json").stdout)
    assert_valid("envs", run("envs", "--json").stdout)
    assert_valid("hosts", run("hosts", "--json").stdout)
    assert_valid("hosts", run("hosts", "--check", "--json").stdout)
    fleet = run("status", "--all", "--json")
    assert fleet.exit_code == 0, fleet.output
    assert_valid("status --all", fleet.stdout)
    doctor = run("doctor", "--host", "sandbox", "--ct", "200", "--json")
    assert doctor.exit_code == 0, doctor.output
    rows = assert_valid("doctor", doctor.stdout)["rows"]
    assert {r["name"] for r in rows} >= {"ssh", "pct", "container-running", "dev-shm"}
    stopped = run("stop", "--json", "-y", "--grace", "1")
    assert stopped.exit_code == 0, stopped.output
    assert assert_valid("stop", stopped.stdout)["state"] == "CANCELLED"


def test_a_failure_document_validates_too(target):
    res = run("status", "--host", "sandbox", "--ct", "200", "no-such-job-xyz", "--json")
    assert res.exit_code == errors.UNKNOWN_JOB
    assert assert_valid("status", res.stdout)["ok"] is False
