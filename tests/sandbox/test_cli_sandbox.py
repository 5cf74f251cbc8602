"""opsctl end to end through the real sandbox: loopback sshd -> pct -> LXC -> agent -> tmux.

These are the user's workflows; every remote effect is checked in the
container itself, never through a mock.
"""

from __future__ import annotations

import json
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from tests.cli_runner import run_cli as run
from tests.paths import FIXTURES
from tests.sandbox_plugin import use_private_root
from tests.waiting import wait_for_value

pytestmark = pytest.mark.sandbox

# A job that looks like a trainer: events on stdout, a few steps, then exit 0.
TRAINER_LIKE = textwrap.dedent("""
    import json, sys, time
    def ev(**k): print(json.dumps(k), flush=True)
    ev(event="phase", phase="loading"); print("loading model", flush=True)
    ev(event="phase", phase="training")
    for step in range(1, STEPS + 1):
        ev(event="step", step=step, loss=1.0 / step, acc=0.1 * step, tok_s=1234.0, eta_s=STEPS - step,
           lr=1e-3)
        time.sleep(SLEEP)
    print("done", flush=True)
""")


def trainer_like(steps: int, sleep: float) -> str:
    return TRAINER_LIKE.replace("STEPS", str(steps)).replace("SLEEP", str(sleep))


CRASHER = textwrap.dedent("""
    import time
    print("starting", flush=True)
    time.sleep(1.0)
    def load_model():
        raise RuntimeError("boom: simulated crash at model load")
    load_model()
""")


@pytest.fixture(autouse=True, params=["direct", "mux"])
def transport_mode(request: pytest.FixtureRequest, isolated_env: Path, monkeypatch: pytest.MonkeyPatch):
    """Each workflow twice (but the :data:`ONE_TRANSPORT` ones): each command on its own SSH
    connection, and through the connection multiplexer users run with (on by default)."""
    monkeypatch.setenv("OPSCTL_MUX", "1" if request.param == "mux" else "0")
    yield request.param
    if request.param == "mux":
        from opsctl.remote import mux_client

        mux_client.stop_all()


#: A job-state behaviour (what the agent decides and records) reads the same through either
#: transport: it runs once, through the multiplexer users run with. Both transports stay on
#: what a connection can change: deploying, refusals, streaming, the host check.
ONE_TRANSPORT = pytest.mark.parametrize("transport_mode", ["mux"], indirect=True)


@pytest.fixture
def target(stopping_target: str) -> str:
    """The sandbox in this test's inventory, and a cleanup that stops any job left running."""
    return stopping_target


def playbook(tmp_path: Path, name: str, script: str, **extra: object) -> Path:
    doc = {"name": name, "command": ["python3", "-c", script], "timeout_s": 60, **extra}
    p = tmp_path / f"{name}.yaml"
    p.write_text(json.dumps(doc))  # JSON is YAML
    return p


def cexec(*argv: str) -> str:
    res = run("exec", "--host", "sandbox", "--ct", "200", "--", *argv)
    return res.stdout


class TestDeploy:
    def test_deploy_waits_until_healthy_then_status_shows_running_with_metrics(self, target, tmp_path):
        book = playbook(tmp_path, "healthy", trainer_like(steps=40, sleep=0.25),
                        healthy_when={"event": "step"})
        res = run("deploy", "--host", target, "--ct", "200", "--playbook", str(book), "--json",
                  "--replace")
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert doc["outcome"] == "healthy"
        st = json.loads(run("status", "--json").stdout)
        assert st["state"] == "RUNNING"
        assert st["last_step"]["event"] == "step" and st["last_step"]["tok_s"] == 1234.0
        assert any("loading model" in line for line in st["pane_tail"] + st["output_tail"])

    @ONE_TRANSPORT
    def test_a_job_that_exits_zero_ends_succeeded(self, target, tmp_path):
        book = playbook(tmp_path, "quick", trainer_like(steps=3, sleep=0.05))
        res = run("deploy", "--host", target, "--ct", "200", "--playbook", str(book), "--json",
                  "--replace")
        assert res.exit_code == 0, res.output
        res = run("status", "--follow", "--json", "--poll", "0.5")
        st = json.loads(res.stdout)
        assert (st["state"], st["exit_code"], res.exit_code) == ("SUCCEEDED", 0, 0)

    @ONE_TRANSPORT
    def test_an_unchanged_payload_is_not_sent_again(self, target, tmp_path):
        book = playbook(tmp_path, "quick", trainer_like(steps=1, sleep=0.01))
        run("deploy", "--host", target, "--ct", "200", "--playbook", str(book), "--replace", "--no-wait")
        res = run("deploy", "--host", target, "--ct", "200", "--playbook", str(book), "--json",
                  "--replace", "--no-wait")
        assert json.loads(res.stdout)["payload"]["sent"] is False

    @ONE_TRANSPORT
    def test_a_second_launch_is_refused_while_a_job_runs(self, target, tmp_path):
        book = playbook(tmp_path, "long", trainer_like(steps=100, sleep=0.5))
        assert run("deploy", "--host", target, "--ct", "200", "--playbook", str(book),
                   "--no-wait", "--replace").exit_code == 0
        res = CliRunner().invoke(cli, ["deploy", "--host", target, "--ct", "200", "--playbook",
                                       str(book), "--no-wait"])
        assert res.exit_code == errors.REMOTE_FAILED
        assert "is RUNNING; stop it or launch with --replace" in res.output


class TestFailures:
    @ONE_TRANSPORT
    def test_a_crash_is_reported_failed_with_traceback_within_the_detection_bound(self, target, tmp_path):
        book = playbook(tmp_path, "crash", CRASHER, healthy_when={"event": "step"})
        res = CliRunner().invoke(cli, ["deploy", "--host", target, "--ct", "200", "--playbook",
                                       str(book), "--json", "--replace"])
        reported_at = time.time()
        assert res.exit_code == errors.JOB_FAILED, res.output
        doc = json.loads(res.stdout)
        st = doc["status"]
        assert st["state"] == "FAILED" and st["exit_code"] == 1
        assert any("boom: simulated crash" in line for line in st["output_tail"])
        # The bound is on detection, from the crash (the container's own record; LXC shares the
        # host's clock) to the report: the default 2 s poll plus one round trip. Launch overhead
        # is not part of it: on a loaded 2-core machine it alone varies by seconds.
        detected_after = reported_at - st["ended_at"]
        assert 0 <= detected_after < 2.0 + 3.0, f"reported {detected_after:.1f} s after the crash"

    @ONE_TRANSPORT
    def test_a_job_killed_by_a_signal_is_failed_with_the_signal(self, target, tmp_path):
        script = ("import os, signal, time; print('x', flush=True); time.sleep(0.5); "
                  "os.kill(os.getpid(), signal.SIGKILL)")
        book = playbook(tmp_path, "killed", script, healthy_when={"event": "step"})
        res = CliRunner().invoke(cli, ["deploy", "--host", target, "--ct", "200", "--playbook",
                                       str(book), "--json", "--replace"])
        assert res.exit_code == errors.JOB_FAILED
        st = json.loads(res.stdout)["status"]
        assert (st["state"], st["signal"]) == ("FAILED", "SIGKILL")

    @ONE_TRANSPORT
    def test_killing_the_tmux_server_makes_the_job_lost(self, target, tmp_path):
        book = playbook(tmp_path, "lost", trainer_like(steps=200, sleep=0.5))
        assert run("deploy", "--host", target, "--ct", "200", "--playbook", str(book),
                   "--replace").exit_code == 0
        cexec("tmux", "-L", "opsctl", "kill-server")
        st = wait_for_value(lambda: json.loads(run("status", "--json").stdout),
                            lambda st: st["state"] == "LOST", 10, interval=0.5)
        assert st["state"] == "LOST", st
        assert st["evidence"]

    @ONE_TRANSPORT
    def test_stop_cancels_the_job_and_leaves_no_process(self, target, tmp_path):
        marker = f"opsctl-stop-marker-{time.time_ns()}"
        script = trainer_like(steps=500, sleep=0.5) + f"\n# {marker}\n"
        book = playbook(tmp_path, "stoppable", script)
        assert run("deploy", "--host", target, "--ct", "200", "--playbook", str(book),
                   "--replace").exit_code == 0
        res = run("stop", "--json", "--grace", "5")
        doc = json.loads(res.stdout)
        assert doc["state"] == "CANCELLED" and doc["remaining_pids"] == []
        st = json.loads(run("status", "--json").stdout)
        assert st["state"] == "CANCELLED"
        assert marker not in cexec("ps", "-eo", "args")


class TestRefusals:
    def test_a_missing_container_is_a_clear_error(self, target, missing_ct, tmp_path):
        res = CliRunner().invoke(cli, ["status", "--host", target, "--ct", str(missing_ct)])
        assert res.exit_code == errors.CONTAINER_MISSING
        assert f"container {missing_ct} does not exist" in res.output

    def test_a_stopped_container_is_a_clear_error(self, target, stopped_ct, tmp_path):
        book = playbook(tmp_path, "quick", trainer_like(steps=1, sleep=0.01))
        res = CliRunner().invoke(cli, ["deploy", "--host", target, "--ct", str(stopped_ct),
                                       "--playbook", str(book)])
        assert res.exit_code == errors.CONTAINER_NOT_RUNNING
        assert f"container {stopped_ct} is not running" in res.output

    def test_an_unreachable_host_is_a_clear_error(self, isolated_env):
        res = CliRunner().invoke(cli, ["status", "--host", "root@127.0.0.1:9", "--ct", "200"])
        assert res.exit_code == errors.TRANSPORT
        assert "cannot connect to root@127.0.0.1:9" in res.output

    def test_a_changed_host_key_is_refused(self, target, sandbox, isolated_env, tmp_path):
        fake_known = tmp_path / "known_hosts"
        other_key = "AAAAC3NzaC1lZDI1NTE5AAAAIB7n5vY9cXjJ0p0Jp6mJ5bJjvN6Zr3c2oUuE1t0b3Ijd"
        fake_known.write_text(f"[127.0.0.1]:{sandbox.port} ssh-ed25519 {other_key}\n")
        inv = isolated_env / "inventory" / "sandbox.yaml"
        text = inv.read_text().replace(str(sandbox.known_hosts_file), str(fake_known))
        text = "\n".join(x for x in text.splitlines() if "host_key_fingerprint" not in x) + "\n"
        inv.write_text(text)
        res = CliRunner().invoke(cli, ["status", "--host", "sandbox", "--ct", "200"])
        assert res.exit_code == errors.HOST_KEY
        assert "CHANGED" in res.output

    def test_an_unknown_host_key_is_refused_unless_accept_new(self, target, sandbox, isolated_env, tmp_path):
        empty_known = tmp_path / "known_hosts"
        inv = isolated_env / "inventory" / "sandbox.yaml"
        text = inv.read_text().replace(str(sandbox.known_hosts_file), str(empty_known))
        text = "\n".join(x for x in text.splitlines() if "host_key_fingerprint" not in x) + "\n"
        inv.write_text(text)
        res = CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--", "true"])
        assert res.exit_code == errors.HOST_KEY
        res = CliRunner().invoke(cli, ["exec", "--accept-new-host-key", "--host", "sandbox", "--ct",
                                       "200", "--", "true"])
        assert res.exit_code == 0
        assert sandbox.host_key_fingerprint  # recorded; next time strict checking passes
        assert CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--",
                                        "true"]).exit_code == 0

    def test_a_pinned_fingerprint_is_trusted_and_a_wrong_pin_refused(self, target, sandbox,
                                                                      isolated_env, tmp_path):
        inv = isolated_env / "inventory" / "sandbox.yaml"
        empty_known = tmp_path / "known_hosts"  # the pin alone must be enough
        text = inv.read_text().replace(str(sandbox.known_hosts_file), str(empty_known))
        inv.write_text(text)
        assert CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--",
                                        "true"]).exit_code == 0
        wrong = "SHA256:" + "A" * 43
        inv.write_text(text.replace(sandbox.host_key_fingerprint, wrong))
        res = CliRunner().invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--", "true"])
        assert res.exit_code == errors.HOST_KEY
        assert f"but the inventory pins {wrong}" in res.output

    @ONE_TRANSPORT
    def test_a_malformed_playbook_changes_nothing_remotely(self, target, tmp_path):
        before = cexec("sh", "-c", "ls /opt/opsctl/jobs 2>/dev/null | sort")
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: bad\ncommand: [python3]\nhealthy_when: {event: step, regex: x}\n")
        res = CliRunner().invoke(cli, ["deploy", "--host", target, "--ct", "200", "--playbook", str(bad)])
        assert res.exit_code == errors.USAGE
        assert f"{bad}:3: healthy_when" in res.output
        assert cexec("sh", "-c", "ls /opt/opsctl/jobs 2>/dev/null | sort") == before


class TestObserving:
    def test_logs_follow_streams_the_whole_output_until_the_job_ends(self, target, tmp_path):
        script = "import sys\nfor i in range(300):\n    print(f'line {i:04d} ' + 'x' * 50, flush=True)\n"
        book = playbook(tmp_path, "chatty", script)
        assert run("deploy", "--host", target, "--ct", "200", "--playbook", str(book),
                   "--replace", "--no-wait").exit_code == 0
        res = run("logs", "-f")
        lines = [x for x in res.stdout.splitlines() if x.startswith("line ")]
        assert [x.split()[1] for x in lines] == [f"{i:04d}" for i in range(300)]

    def test_hosts_check_reports_reachability_and_the_hosts_containers(self, target):
        res = run("hosts", "--check", "--json")
        rows = {r["name"]: r for r in json.loads(res.stdout)["hosts"]}
        assert rows["sandbox"]["reachable"] is True
        assert {"vmid": "200", "status": "running"}.items() <= rows["sandbox"]["remote_containers"][0].items()

    @ONE_TRANSPORT
    def test_status_without_flags_uses_the_last_deploys_target(self, target, tmp_path):
        book = playbook(tmp_path, "quick", trainer_like(steps=1, sleep=0.01))
        run("deploy", "--host", target, "--ct", "200", "--playbook", str(book), "--replace")
        res = run("status", "--json")
        assert json.loads(res.stdout)["name"] == "quick"


class TestDiagnostics:
    @ONE_TRANSPORT
    def test_stacks_shows_every_thread_of_a_live_job(self, target, tmp_path):
        script = textwrap.dedent("""
            import threading, time
            def drafter_worker_compiling():
                time.sleep(600)
            threading.Thread(target=drafter_worker_compiling, name="drafter-1", daemon=True).start()
            def main_loop_waiting():
                print("started", flush=True)
                time.sleep(600)
            main_loop_waiting()
        """)
        book = playbook(tmp_path, "stuck", script, healthy_when={"regex": "started"})
        assert run("deploy", "--host", target, "--ct", "200", "--playbook", str(book),
                   "--replace").exit_code == 0
        doc = json.loads(run("stacks", "--json").stdout)
        assert doc["threads"] >= 2
        assert "drafter_worker_compiling" in doc["dump"] and "main_loop_waiting" in doc["dump"]
        human = run("stacks")
        assert "drafter_worker_compiling" in human.stdout

    @ONE_TRANSPORT
    def test_a_probe_without_torch_in_the_container_still_says_what_happened(self, target, sandbox,
                                                                             isolated_env):
        # a root with no torch build: the container's own python3, which has no torch (the real
        # compile race is tests/trainer/test_probe.py's; whether this worker's /opt/opsctl holds
        # the real CPU build must not decide what this test runs)
        root = f"/opt/opsctl-test-notorch-{uuid.uuid4().hex[:8]}"
        use_private_root(sandbox, isolated_env, root)
        try:
            res = CliRunner().invoke(cli, ["probe", "compile-race", "--host", target, "--ct", "200",
                                           "--timeout", "20", "--json"])
        finally:
            cexec("rm", "-rf", root)
        report = json.loads(res.stdout)
        assert report["status"] == "crashed", report
        assert res.exit_code == errors.REMOTE_FAILED
        assert "No module named 'torch'" in report["verdict"]
        assert "No module named 'torch'" in res.stderr

    @ONE_TRANSPORT
    def test_status_names_the_fx_race_from_a_real_captured_crash(self, target, tmp_path):
        fixture = (FIXTURES / "h200-torch-2.11.0-cu130"
                   / "fx-race-error-forward.txt")
        script = f"import sys\nsys.stderr.write({fixture.read_text()!r})\nsys.exit(1)\n"
        book = playbook(tmp_path, "fxrace", script, healthy_when={"event": "step"})
        res = CliRunner().invoke(cli, ["deploy", "--host", target, "--ct", "200", "--playbook",
                                       str(book), "--json", "--replace"])
        assert res.exit_code == errors.JOB_FAILED
        st = json.loads(res.stdout)["status"]
        assert st["diagnosis"][0]["cause"] == "fx_tracing_race"
        human = run("status")
        assert "fx_tracing_race" in human.stdout and "one process per GPU" in human.stdout
