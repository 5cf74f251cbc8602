"""A long run babysat in the container with no client connected: restarts, the wall-clock limit,
webhooks and secrets, end to end through the real sandbox (sshd -> pct -> LXC -> agent -> tmux).

Jobs are tiny shell/python commands; a webhook is a local ``http.server`` on 127.0.0.1, which
the sandbox containers reach because they share the host's network (``opsctl/sandbox/host.py``).
Every test deploys into one opsctl root private to this module (the payload is shipped once).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import textwrap
import threading
import time
import typing as t
import uuid
from pathlib import Path

import pytest

from opsctl import errors
from tests.cli_runner import run_cli as run
from tests.sandbox_plugin import use_private_root
from tests.waiting import wait_for, wait_for_value

pytestmark = pytest.mark.sandbox

ROOT = f"/tmp/opsctl-babysit-{uuid.uuid4().hex[:8]}"


class Webhook:
    """A local HTTP server that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, t.Any]] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.bodies.append(json.loads(data))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: t.Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, job: str) -> list[tuple[str, str]]:
        return [(b["event"], b["state"]) for b in self.bodies if b["job"] == job]

    def wait_for(self, job: str, event: str, timeout: float = 15.0) -> dict[str, t.Any]:
        found = wait_for(lambda: [b for b in self.bodies if b["job"] == job and b["event"] == event],
                         timeout)
        if found:
            return found[-1]
        raise AssertionError(f"no {event!r} notification for {job}: got {self.events(job)}")


@pytest.fixture(scope="module")
def webhook() -> t.Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.server.shutdown()


@pytest.fixture
def target(sandbox, isolated_env: Path) -> t.Iterator[str]:
    use_private_root(sandbox, isolated_env, ROOT)
    yield "sandbox"
    run("stop", "--host", "sandbox", "--ct", "200", "--grace", "1")


@pytest.fixture(scope="module", autouse=True)
def remove_root_at_the_end(sandbox) -> t.Iterator[None]:
    yield
    from opsctl.config import inventory
    from opsctl.remote.transport import Remote

    spec = inventory.load([Path(sandbox.inventory_file).parent]).resolve("sandbox")
    with Remote(spec) as remote:
        remote.pct_exec(200, ["rm", "-rf", ROOT], timeout=30)


def cexec(*argv: str) -> t.Any:
    return run("exec", "--host", "sandbox", "--ct", "200", "--", *argv)


def deploy(tmp_path: Path, name: str, command: list[str], *extra_args: str,
           **keys: t.Any) -> t.Any:
    book = tmp_path / f"{name}.yaml"
    book.write_text(json.dumps({"name": name, "command": command, "timeout_s": 60, **keys}))
    return run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(book), "--replace",
               "--poll", "0.3", "--json", *extra_args)


def follow(job: str) -> dict[str, t.Any]:
    """``status --follow --json`` until the job ends: its final status document."""
    res = run("status", "--host", "sandbox", "--ct", "200", "--job", job, "--follow", "--poll",
              "0.3", "--json")
    return json.loads(res.stdout)


def agent_jobs() -> dict[str, t.Any]:
    from opsctl.ops import jobs

    with jobs.open_target("sandbox", 200) as tgt:
        return {r["job_id"]: r for r in tgt.agent.call("jobs")["jobs"]}


def py(code: str) -> list[str]:
    return ["python3", "-c", textwrap.dedent(code)]


# attempt N prints its number; attempts 1 and 2 fail, attempt 3 trains a step and succeeds
FLAKY = """
    import json, os, sys
    path = sys.argv[1]
    n = int(open(path).read()) + 1 if os.path.exists(path) else 1
    open(path, "w").write(str(n))
    print(f"attempt {n} here", flush=True)
    if n < 3:
        sys.exit(1)
    print(json.dumps({"event": "step", "step": 1, "loss": 1.0}), flush=True)
"""


def test_a_job_that_fails_twice_then_succeeds_under_max_restarts_3_ends_SUCCEEDED_with_3_attempts(
        target, tmp_path, webhook):
    counter = f"{ROOT}/flaky-{uuid.uuid4().hex[:6]}"
    res = deploy(tmp_path, "flaky", [*py(FLAKY), counter], restart={"max_restarts": 3},
                 healthy_when={"event": "step"}, notify=[webhook.url])
    assert res.exit_code == 0, res.output  # deploy waited through two restarts until healthy
    job = json.loads(res.stdout)["job_id"]
    end = follow(job)
    assert (end["state"], end["exit_code"], end["attempt"]) == ("SUCCEEDED", 0, 3)
    assert [(r["attempt"], r["reason"], r["decision"]) for r in end["restarts"]] == [
        (1, "exit 1", "restart"), (2, "exit 1", "restart")]
    assert agent_jobs()[job]["attempt"] == 3
    log = run("logs", "--job", job).stdout
    for n in (1, 2, 3):  # every attempt's output is kept, after a separator line
        assert f"attempt {n} here" in log
    assert log.count("[opsctl] ===== attempt ") == 2
    events = cexec("cat", f"{ROOT}/jobs/{job}/events.jsonl").stdout
    restarts = [json.loads(ln) for ln in events.splitlines() if '"restart"' in ln]
    assert [(e["attempt"], e["reason"]) for e in restarts] == [(2, "exit 1"), (3, "exit 1")]
    webhook.wait_for(job, "finished")
    assert webhook.events(job) == [("restart", "SETTING_UP"), ("restart", "SETTING_UP"),
                                   ("healthy", "RUNNING"), ("finished", "SUCCEEDED")]
    done = webhook.wait_for(job, "finished")
    assert (done["host"], done["ct"], done["attempt"], done["max_restarts"]) == (
        "sandbox", 200, 3, 3)


def test_a_usage_error_never_restarts_and_the_webhook_gets_FAILED(target, tmp_path, webhook):
    res = deploy(tmp_path, "usage", ["sh", "-c", "echo 'usage: train [--resume auto]' >&2; exit 2"],
                 restart={"max_restarts": 3}, healthy_when={"event": "step"}, notify=[webhook.url])
    assert res.exit_code == errors.JOB_FAILED, res.output
    job = json.loads(res.stdout)["job_id"]
    end = follow(job)
    assert (end["state"], end["exit_code"], end["attempt"]) == ("FAILED", 2, 1)
    assert [(r["decision"], r["reason"]) for r in end["restarts"]] == [("give up", "exit 2")]
    failed = webhook.wait_for(job, "failed")
    assert (failed["state"], failed["exit_code"], failed["attempt"]) == ("FAILED", 2, 1)
    assert failed["diagnosis"]


# trains until SIGINT, then checkpoints and exits 0 (what the bundled trainer does)
CHECKPOINTING = """
    import json, signal, time
    def ev(**k): print(json.dumps(k), flush=True)
    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    step = 0
    while not stop:
        step += 1
        ev(event="step", step=step, loss=1.0 / step)
        time.sleep(0.2)
    ev(event="checkpoint", step=step, path=f"ckpt-{step}")
    ev(event="done", step=step, reason="SIGINT")
"""


def test_max_duration_s_stops_the_job_like_stop_and_it_ends_CANCELLED_by_time_limit(
        target, tmp_path, webhook):
    res = deploy(tmp_path, "limited", py(CHECKPOINTING), max_duration_s=5,
                 healthy_when={"event": "step"}, notify=[webhook.url],
                 restart={"max_restarts": 2})
    assert res.exit_code == 0, res.output
    job = json.loads(res.stdout)["job_id"]
    end = follow(job)
    assert (end["state"], end["end_reason"], end["exit_code"]) == ("CANCELLED", "time limit", 0)
    assert 5 <= end["ended_at"] - end["started_at"] < 15
    assert end["restarts"] == [] or end["restarts"][0]["decision"] == "give up"
    assert agent_jobs()[job]["end_reason"] == "time limit"
    events = [json.loads(ln) for ln in
              cexec("cat", f"{ROOT}/jobs/{job}/events.jsonl").stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.index("time_limit") < kinds.index("checkpoint")  # SIGINT first: it saved
    assert next(e for e in events if e["event"] == "time_limit")["max_duration_s"] == 5
    assert webhook.wait_for(job, "finished")["end_reason"] == "time limit"


HANGS_ONCE = """
    import os, sys, time
    path = sys.argv[1]
    first = not os.path.exists(path)
    open(path, "w").write("x")
    print("started", "first" if first else "again", flush=True)
    if first:
        time.sleep(600)  # silent: the hang watch fires
"""


def test_a_hang_named_in_restart_on_is_stopped_and_run_again(target, tmp_path, webhook):
    marker = f"{ROOT}/hang-{uuid.uuid4().hex[:6]}"
    res = deploy(tmp_path, "hangs", [*py(HANGS_ONCE), marker], hang_after_s=1,
                 restart={"max_restarts": 1, "on": ["hang"]}, notify=[webhook.url],
                 healthy_when={"regex": "started"})
    assert res.exit_code == 0, res.output
    job = json.loads(res.stdout)["job_id"]
    end = follow(job)
    assert (end["state"], end["attempt"]) == ("SUCCEEDED", 2)
    assert [(r["reason"], r["decision"]) for r in end["restarts"]] == [("hang", "restart")]
    assert webhook.wait_for(job, "hang")["state"] == "RUNNING"
    assert [e for e, _ in webhook.events(job)].count("restart") == 1


def test_a_job_whose_wrapper_died_is_reported_lost_by_the_next_status_once(
        target, tmp_path, webhook):
    res = deploy(tmp_path, "doomed", ["sh", "-c", "echo up; sleep 600"], notify=[webhook.url],
                 healthy_when={"regex": "up"})
    assert res.exit_code == 0, res.output
    job = json.loads(res.stdout)["job_id"]
    pid = json.loads(cexec("cat", f"{ROOT}/jobs/{job}/pid").stdout)
    cexec("kill", "-9", str(pid["wrapper_pid"]))  # the job dies with it (PDEATHSIG)
    end = follow(job)
    assert end["state"] == "LOST"
    run("status", "--job", job, "--json")  # reconciled again: no second notification
    lost = webhook.wait_for(job, "lost")
    assert (lost["state"], lost["host"]) == ("LOST", "sandbox")
    time.sleep(0.5)  # scenario: a window for a second notification that must never come
    assert [e for e, _ in webhook.events(job)].count("lost") == 1


ECHOES_SECRET = """
    import hashlib, json, os, sys, time
    token = os.environ["OPSCTL_TEST_TOKEN"]
    print("token is", token, flush=True)
    print("half", token[:3], flush=True, end="")
    sys.stdout.flush(); time.sleep(0.2)
    print(token[3:], "end", flush=True)
    print(json.dumps({"event": "step", "step": 1, "note": token}), flush=True)
    print("error:", token, file=sys.stderr, flush=True)
    print("sha", hashlib.sha256(token.encode()).hexdigest(), flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.1)
"""


def test_a_secret_reaches_the_job_and_appears_in_no_file_and_no_output(
        target, tmp_path, webhook, monkeypatch, isolated_env):
    value = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPSCTL_TEST_TOKEN", value)
    release = f"{ROOT}/release-{uuid.uuid4().hex[:6]}"
    res = deploy(tmp_path, "secretive", [*py(ECHOES_SECRET), release], notify=[webhook.url],
                 secrets=["OPSCTL_TEST_TOKEN"], healthy_when={"event": "step"})
    assert res.exit_code == 0, res.output
    job = json.loads(res.stdout)["job_id"]
    job_dir = f"{ROOT}/jobs/{job}"
    # while it runs: root's alone, 0600
    assert cexec("stat", "-c", "%a %U", f"{job_dir}/secrets.json").stdout.split() == ["600", "root"]
    live = run("status", "--job", job, "--json").stdout
    cexec("touch", release)
    end = follow(job)
    assert end["state"] == "SUCCEEDED"
    log = run("logs", "--job", job).stdout
    assert f"sha {hashlib.sha256(value.encode()).hexdigest()}" in log  # the job had the value
    assert "token is ***" in log and "half ***" in log and "error: ***" in log
    assert value not in log + live + json.dumps(end) + res.stdout
    assert value[3:] not in log  # the part printed after a pause was masked too
    assert value not in json.dumps(webhook.bodies)
    # nowhere in the container (the secrets file went with the job) ...
    assert cexec("test", "-e", f"{job_dir}/secrets.json").exit_code == 1
    found = cexec("grep", "-rl", "--", value, ROOT)
    assert (found.exit_code, found.stdout) == (1, "")
    # ... and nowhere opsctl writes locally
    hits = [str(p) for p in isolated_env.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
    assert hits == []


MLFLOW_JOB = """
    import hashlib, os, sys
    for name in ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI"):
        print(name, os.environ[name], hashlib.sha256(os.environ[name].encode()).hexdigest(),
              flush=True)
    print("user", os.environ["MLFLOW_TRACKING_USERNAME"], flush=True)
"""


def test_mlflow_credentials_in_a_playbooks_env_travel_as_secrets_and_land_in_no_file(
        target, tmp_path, isolated_env):
    """The attack: MLflow credentials put in ``env`` (not ``secrets``) landed in a
    world-readable spec.json. They travel as secrets: on stdin, 0600, removed, masked."""
    password = f"pw-{uuid.uuid4().hex}"
    uri = f"https://trainer:{password}@mlflow.invalid/"
    res = deploy(tmp_path, "mlflowish", py(MLFLOW_JOB),
                 env={"MLFLOW_TRACKING_PASSWORD": password, "MLFLOW_TRACKING_URI": uri,
                      "MLFLOW_TRACKING_USERNAME": "trainer"})
    assert res.exit_code == 0, res.output
    job = json.loads(res.stdout)["job_id"]
    job_dir = f"{ROOT}/jobs/{job}"
    assert follow(job)["state"] == "SUCCEEDED"
    modes = cexec("stat", "-c", "%a", f"{job_dir}/spec.json", f"{job_dir}/launch.json").stdout
    assert modes.split() == ["600", "600"]
    spec = json.loads(cexec("cat", f"{job_dir}/spec.json").stdout)
    assert sorted(spec["secrets"]) == ["MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI"]
    assert spec["env"]["MLFLOW_TRACKING_USERNAME"] == "trainer"  # not a credential: kept
    log = run("logs", "--job", job).stdout
    for value in (password, uri):
        assert f"{hashlib.sha256(value.encode()).hexdigest()}" in log  # the job had it
        found = cexec("grep", "-rlF", "--", password, ROOT)
        assert (found.exit_code, found.stdout) == (1, ""), found.stdout
    assert password not in log + res.stdout and "user trainer" in log
    hits = [str(p) for p in isolated_env.rglob("*") if p.is_file()
            and password.encode() in p.read_bytes()]
    assert hits == []


def test_a_missing_secret_is_a_usage_error_before_anything_remote(target, tmp_path, monkeypatch):
    monkeypatch.delenv("OPSCTL_TEST_MISSING", raising=False)
    env_file = tmp_path / "secrets.env"
    env_file.write_text("OTHER=value-1234\n")
    res = deploy(tmp_path, "nosecret", ["true"], "--env-file", str(env_file),
                 secrets=["OPSCTL_TEST_MISSING"])
    assert res.exit_code == errors.USAGE, res.output
    assert "OPSCTL_TEST_MISSING" in json.loads(res.stdout)["error"]["message"]


STEPS_THEN_FAILS = """
    import json
    print(json.dumps({"event": "step", "step": 1, "loss": 1.0}), flush=True)
    raise SystemExit(3)
"""


def test_one_silent_webhook_never_blocks_the_others_in_a_real_job(target, tmp_path, webhook):
    """End to end: the first URL accepts and never answers; the answering
    one still gets ``healthy`` and ``failed`` at once, and once the wrapper ends (its bounded
    wait spent) every event the silent URL never got is a give-up line in notify.log."""
    import socket

    silent = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nobody answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/never/{uuid.uuid4().hex}"
        res = deploy(tmp_path, "silenthook", py(STEPS_THEN_FAILS), notify=[url, webhook.url],
                     healthy_when={"event": "step"})
        job = json.loads(res.stdout)["job_id"]
        webhook.wait_for(job, "failed", timeout=10)
        assert [e for e, _ in webhook.events(job)] == ["healthy", "failed"]
        log_path = f"{ROOT}/jobs/{job}/notify.log"
        lines = wait_for_value(lambda: cexec("cat", log_path).stdout.splitlines(),
                               lambda lines: sum("gave up on" in ln for ln in lines) >= 2,
                               40, interval=1)  # the wrapper's 15 s wait, plus a loaded machine
        for event in ("healthy", "failed"):
            assert any(f"gave up on {event} to webhook 1 (http://127.0.0.1:" in ln for ln in lines), lines
            assert any(f"sent {event} to webhook 2" in ln for ln in lines), lines
        assert "/never/" not in "\n".join(lines)  # the URL's path is not logged
    finally:
        silent.close()
