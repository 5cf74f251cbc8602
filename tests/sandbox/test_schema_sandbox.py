"""Every ``--json`` document a real command prints validates against ``opsctl schema``'s
schema for it, on the sandbox: deploy, status, jobs, stop, envs, hosts (and --check),
``status --all``, doctor, a failure document, and the trainer-like job's events; then, in a
container root of the test's own, stacks, plot, queue (add, move, rm), push and pull (and
their dry runs), cache info and clear, playbooks, mux status and sandbox up and status.
(swap-torch and cache seed are validated in ``tests/sandbox/test_torch_sandbox.py``, which
installs a torch build; probe compile-race's report, minutes of compiling, only by the CLI's
own check of the reply against its shape, ``opsctl/remote/shapes.py``.)"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from opsctl import errors
from opsctl.cli import cli
from tests.cli_runner import run_cli as run
from tests.sandbox_plugin import sandbox_home, use_private_root
from tests.waiting import wait_for

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
def target(stopping_target: str, tmp_path: Path) -> Path:
    book = tmp_path / "schema-job.yaml"
    book.write_text(json.dumps({"name": "schema-job", "command": ["python3", "-c", JOB],
                                "timeout_s": 60, "healthy_when": {"event": "step"}}))
    return book


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


@pytest.fixture
def own_root(sandbox, isolated_env: Path, tmp_path: Path):
    """The sandbox host with an opsctl root of this test's own in container 200 (so clearing
    its caches or queueing jobs touches no other test's), and a running job's playbook."""
    import subprocess
    import uuid

    root = f"/opt/opsctl-test-schema-{uuid.uuid4().hex[:8]}"
    use_private_root(sandbox, isolated_env, root)
    book = tmp_path / "schema-job.yaml"
    book.write_text(json.dumps({"name": "schema-job", "command": ["python3", "-c", JOB],
                                "timeout_s": 60, "healthy_when": {"event": "step"}}))
    yield book
    run("stop", "--host", "sandbox", "--ct", "200", "--grace", "1")
    subprocess.run(["lxc-attach", "-P", str(sandbox.lxc_path), "-n", "200", "--", "rm", "-rf", root],
                   check=False)


def test_every_other_commands_json_document_validates_against_its_schema(
        own_root, sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    target = ["--host", "sandbox", "--ct", "200"]
    res = run("deploy", *target, "--playbook", str(own_root), "--json")
    assert res.exit_code == 0, res.output
    job = json.loads(res.stdout)["job_id"]
    wait_for(lambda: len(json.loads(run("status", "--json").stdout)["events_tail"]) >= 3,
             timeout=30, what="three step events")

    stacks = run("stacks", "--json", "--timeout", "20")
    assert stacks.exit_code == 0, stacks.output
    assert assert_valid("stacks", stacks.stdout)["processes"]
    plot = run("plot", "--json")
    assert plot.exit_code == 0, plot.output
    assert assert_valid("plot", plot.stdout)["job_id"] == job

    queued = []  # the job holds the whole container: these wait for it
    for _ in range(2):
        added = run("queue", "add", *target, "--playbook", str(own_root), "--json")
        assert added.exit_code == 0, added.output
        queued += [j["job_id"] for j in assert_valid("queue add", added.stdout)["jobs"]]
    listed = run("queue", *target, "--json")
    assert [j["job_id"] for j in assert_valid("queue", listed.stdout)["jobs"]] == queued
    moved = run("queue", "move", *target, queued[1], "--before", queued[0], "--json")
    assert moved.exit_code == 0, moved.output
    assert [j["job_id"] for j in assert_valid("queue move", moved.stdout)["jobs"]] == queued[::-1]
    for jid in queued:
        removed = run("queue", "rm", *target, jid, "--json")
        assert removed.exit_code == 0, removed.output
        assert assert_valid("queue rm", removed.stdout)["state"] == "CANCELLED"

    src = tmp_path / "payload.bin"
    src.write_bytes(b"x" * 4096)
    plan = run("push", *target, str(src), "schema/payload.bin", "--dry-run", "--json")
    assert plan.exit_code == 0, plan.output
    assert assert_valid("push", plan.stdout)["dry_run"] is True
    pushed = run("push", *target, str(src), "schema/payload.bin", "--json")
    assert pushed.exit_code == 0, pushed.output
    assert assert_valid("push", pushed.stdout)["files"] == 1
    back = tmp_path / "back.bin"
    pulled = run("pull", *target, "schema/payload.bin", str(back), "--json")
    assert pulled.exit_code == 0, pulled.output
    assert assert_valid("pull", pulled.stdout)["direction"] == "pull"
    assert back.read_bytes() == src.read_bytes()

    info = run("cache", "info", *target, "--json")
    assert info.exit_code == 0, info.output
    assert_valid("cache info", info.stdout)
    assert_valid("playbooks", run("playbooks", "--json").stdout)

    monkeypatch.setenv("OPSCTL_MUX", "1")
    monkeypatch.setenv("OPSCTL_MUX_IDLE_S", "20")
    from opsctl.remote import mux_client

    try:
        assert run("jobs", *target, "--json").exit_code == 0  # a direct call leaves a mux
        wait_for(lambda: json.loads(run("mux", "status", "--json").stdout)["muxes"],
                 timeout=20, what="a live mux")
        assert assert_valid("mux status", run("mux", "status", "--json").stdout)["muxes"]
    finally:
        mux_client.stop_all()
    monkeypatch.setenv("OPSCTL_MUX", "0")

    stopped = run("stop", *target, "--json", "-y", "--grace", "1")
    assert stopped.exit_code == 0, stopped.output
    cleared = run("cache", "clear", *target, "--all", "--json")
    assert cleared.exit_code == 0, cleared.output
    assert_valid("cache clear", cleared.stdout)

    home = {"OPSCTL_HOME": str(sandbox_home())}  # the running sandbox: reused, never rebuilt
    up = CliRunner().invoke(cli, ["sandbox", "up", "--json"], catch_exceptions=False, env=home)
    assert up.exit_code == 0, up.output
    assert 200 in assert_valid("sandbox up", up.stdout)["containers"]
    state = CliRunner().invoke(cli, ["sandbox", "status", "--json"], catch_exceptions=False, env=home)
    assert assert_valid("sandbox status", state.stdout)["healthy"] is True, state.stdout


def test_a_sandbox_that_was_never_set_up_says_so_in_its_schema(tmp_path: Path):
    res = CliRunner().invoke(cli, ["sandbox", "status", "--json"], catch_exceptions=False,
                             env={"OPSCTL_HOME": str(tmp_path)})
    assert assert_valid("sandbox status", res.stdout) == {"ok": True, "set_up": False}
