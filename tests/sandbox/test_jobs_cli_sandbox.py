"""Jobs as first-class objects, and logs that survive: ``opsctl jobs``, positional JOB (ids and
unique prefixes), ``logs --tail/--since/-f``, and ``logs -f`` across a killed and restarted
sshd with a byte-exact result. Against the real sandbox, in private opsctl roots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from opsctl.sandbox import host as sandbox_mod
from tests.cli_runner import run_cli as run
from tests.sandbox_plugin import private_home, sandbox_home, use_private_root
from tests.second_sshd import sshd_serving

pytestmark = pytest.mark.sandbox

ROOT = "/opt/opsctl-test-jobs"  # this module's job history, away from other tests' jobs
T = ["--host", "sandbox", "--ct", "200"]

QUICK = "import json\nprint('hello', flush=True)\nprint(json.dumps({'event': 'step', 'step': 7, " \
        "'loss': 0.5, 'tok_s': 2500.0}), flush=True)\nprint('bye', flush=True)\n"
CRASH = "print('starting', flush=True)\nraise RuntimeError('boom: crashed on purpose')\n"
TICK = textwrap.dedent("""
    import json, time
    for i in range(600):
        print(f"tick {i:04d}", flush=True)
        print(json.dumps({"event": "step", "step": i, "loss": 1.0, "tok_s": 1500.0}), flush=True)
        time.sleep(0.2)
""")


def book(directory: Path, name: str, script: str, **extra: object) -> str:
    p = directory / f"{name}.json"
    p.write_text(json.dumps({"name": name, "command": ["python3", "-u", "-c", script],
                             "timeout_s": 60, **extra}))
    return str(p)


@pytest.fixture(scope="module")
def history(sandbox, tmp_path_factory: pytest.TempPathFactory):
    """Four deploys in one container: SUCCEEDED twice, FAILED, and one still RUNNING (newest)."""
    home = tmp_path_factory.mktemp("jobs-home")
    with private_home(sandbox, home, ROOT):
        run("exec", *T, "--", "rm", "-rf", ROOT)
        ids = {}
        for key, name, script, extra in (
                ("first", "quick", QUICK, {}), ("quick", "quick", QUICK, {}),
                ("crash", "crash", CRASH, {}), ("tick", "tick", TICK, {"healthy_when": {"event": "step"}})):
            res = run("deploy", *T, "--playbook", book(home, name, script, **extra), "--json",
                      "--replace", *(["-d"] if name != "tick" else []))
            ids[key] = json.loads(res.stdout)["job_id"]
            if name != "tick":
                run("status", ids[key], "--follow", "--poll", "0.3")
        yield ids
        run("stop", *T, ids["tick"], "--grace", "1")


@pytest.fixture
def target(sandbox, history, isolated_env: Path) -> dict[str, str]:
    use_private_root(sandbox, isolated_env, ROOT)
    return history


def test_jobs_lists_every_deploy_newest_first_with_state_exit_step_and_diagnosis(target):
    res = run("jobs", *T, "--json")
    doc = json.loads(res.stdout)
    assert doc["ok"] is True and res.exit_code == 0
    rows = {r["job_id"]: r for r in doc["jobs"]}
    assert [r["job_id"] for r in doc["jobs"]] == [target[k] for k in ("tick", "crash", "quick", "first")]
    quick, crash, tick = rows[target["quick"]], rows[target["crash"]], rows[target["tick"]]
    assert (quick["state"], quick["exit_code"], quick["last_step"]) == (
        "SUCCEEDED", 0, {"step": 7, "loss": 0.5, "tok_s": 2500.0})
    assert (crash["state"], crash["exit_code"]) == ("FAILED", 1)
    assert "boom: crashed on purpose" in crash["headline"]["summary"]
    assert (tick["state"], tick["current"], tick["ended_at"]) == ("RUNNING", True, None)
    assert quick["started_at"] <= quick["ended_at"] and quick["elapsed_s"] >= 0


def test_the_jobs_table_shows_each_job_on_a_line(target):
    res = run("jobs", *T)
    lines = {ln.split()[1 if ln.startswith("*") else 0]: ln for ln in res.stdout.splitlines()[2:]}
    assert "SUCCEEDED" in lines[target["quick"]] and "FAILED" in lines[target["crash"]]
    assert lines[target["tick"]].startswith("*") and "RUNNING" in lines[target["tick"]]


def test_status_and_logs_take_a_job_id_or_a_unique_prefix_as_argument(target):
    crash = target["crash"]
    st = json.loads(run("status", *T, crash[:len("crash-") + 4], "--json").stdout)
    assert (st["ok"], st["job_id"], st["state"]) == (True, crash, "FAILED")
    assert run("logs", *T, target["quick"]).stdout == "hello\n" + json.dumps(
        {"event": "step", "step": 7, "loss": 0.5, "tok_s": 2500.0}) + "\nbye\n"


@pytest.mark.parametrize("job, words", [("nosuchjob", "does not exist"), ("quick", "ambiguous")])
def test_an_unknown_or_ambiguous_job_exits_26_naming_it(target, job, words):
    res = CliRunner().invoke(cli, ["status", *T, job, "--json"])
    assert res.exit_code == errors.UNKNOWN_JOB == 26
    err = json.loads(res.stdout)["error"]
    assert err["type"] == "UnknownJob" and words in err["message"] and job in err["message"]


def test_logs_tail_is_the_last_lines_and_since_cuts_by_time(target):
    full = run("logs", *T, target["quick"]).stdout
    assert run("logs", *T, target["quick"], "--tail", "2").stdout == "".join(
        full.splitlines(keepends=True)[-2:])
    assert run("logs", *T, target["quick"], "--since", "1h").stdout == full
    assert run("logs", *T, target["quick"], "--since", "0.01s").stdout == ""  # ended earlier
    recent = run("logs", *T, target["tick"], "--since", "3s").stdout.splitlines()
    assert 0 < len(recent) < 70 and recent[0].startswith(("tick", "{"))  # 10 lines a second


def test_logs_follow_of_a_failed_job_ends_with_its_state_and_the_job_failed_code(target):
    res = run("logs", *T, target["crash"], "-f")
    assert res.exit_code == errors.JOB_FAILED
    assert "boom: crashed on purpose" in res.stdout
    assert f"job {target['crash']} ended: FAILED (exit code 1)" in res.stderr


def test_job_ids_complete_from_the_targets_container(target):
    env = {"_OPSCTL_COMPLETE": "bash_complete", "COMP_WORDS": "opsctl logs --host sandbox --ct 200 cr",
           "COMP_CWORD": "6", "OPSCTL_COMPLETE_TIMEOUT_S": "30"}  # a loaded test machine
    res = CliRunner().invoke(cli, [], prog_name="opsctl", env=env)
    assert res.output.splitlines() == [f"plain,{target['crash']}"]


# --- logs -f across a killed sshd ---------------------------------------------------------

# Output with bytes a text pipe would mangle: invalid UTF-8, CR, no final newline. Halfway it
# waits for GO to exist, so the follower is still following when the test cuts its connection
# (on a loaded machine a job that just ran through could end before the follower connected).
GO = "/tmp/opsctl-test-logs-f-go"
CHATTY = textwrap.dedent(f"""
    import os, sys, time
    out = sys.stdout.buffer
    for i in range(60):
        out.write(b"line %04d \\xff\\xfe\\r\\x1b[0m " % i + bytes(range(32, 127)) + b"\\n")
        out.flush()
        time.sleep(0.05)
        deadline = time.monotonic() + 120
        while i == 29 and not os.path.exists({GO!r}) and time.monotonic() < deadline:
            time.sleep(0.05)
    out.write(b"the end, no newline")
    out.flush()
""")


@pytest.mark.skipif(not os.path.exists("/usr/bin/ss"), reason="needs ss (iproute2)")
def test_logs_follow_survives_a_killed_sshd_and_is_byte_exact(sandbox, isolated_env, tmp_path):
    use_private_root(sandbox, isolated_env, "/opt/opsctl-test-logs-f")
    run("exec", *T, "--", "rm", "-f", GO)
    res = run("deploy", *T, "--playbook", book(tmp_path, "chatty", CHATTY), "--replace", "-d",
              "--json")
    job = json.loads(res.stdout)["job_id"]
    follower = subprocess.Popen([sys.executable, "-m", "opsctl", "logs", *T, job, "-f"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = os.read(follower.stdout.fileno(), 1 << 20)  # following (the first read is done)
        listener = int((sandbox.state_dir / "sshd.pid").read_text())
        os.kill(sshd_serving(follower.pid), signal.SIGKILL)  # its connection is gone...
        os.kill(listener, signal.SIGTERM)  # ...and no new one is accepted
        time.sleep(1.5)  # scenario: the follower's retries are refused meanwhile
        assert sandbox_mod.up(sandbox_home(), containers=(200,)).port == sandbox.port
        assert run("exec", *T, "--", "touch", GO).exit_code == 0  # the job's second half
        rest, err = follower.communicate(timeout=60)
        out = first + rest
    finally:
        if follower.poll() is None:
            follower.kill()
    text = err.decode()
    assert follower.returncode == 0, text
    assert "connection lost" in text and "reconnected; resuming at byte" in text
    assert f"job {job} ended: SUCCEEDED (exit code 0)" in text
    inside = subprocess.run([sys.executable, "-m", "opsctl", "exec", *T, "--", "cat",
                             f"/opt/opsctl-test-logs-f/jobs/{job}/output.log"],
                            capture_output=True, check=True).stdout
    assert out == inside and out.endswith(b"the end, no newline") and out.count(b"\n") == 60
