"""The container's job queue on the real sandbox: order, ``--after`` success and
failure, removal, two jobs side by side on disjoint GPU slots, the queue moving on with no
client connected, and a container restart with a queue (its boot hook moves it on).

One container of its own (ct 207, ``gpus: 8`` in this module's inventory: the sandbox has no
GPUs, the slots come from that count) and a private opsctl root. The jobs wait on gate files
the test creates in the container with a bare ``pct exec`` (no agent call), so what moves the
queue on is the container's own wrappers. Waits poll.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import typing as t
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from opsctl import errors
from opsctl.sandbox import host as sandbox_mod
from remote_payload.agent import boothook
from tests.cli_runner import run_cli as run
from tests.sandbox_plugin import private_home, sandbox_home, use_private_root
from tests.waiting import wait_for

pytestmark = pytest.mark.sandbox

CT = 207  # only this module uses it (it restarts it)
ROOT = "/opt/opsctl-test-queue"
T = ["--host", "sandbox", "--ct", str(CT)]
GATES = "/tmp/opsctl-queue-gates"


def ok_json(*args: str) -> dict[str, t.Any]:
    res = run(*args, "--json")
    assert res.exit_code == 0, res.output
    return t.cast(dict[str, t.Any], json.loads(res.stdout))


def valid(name: str, doc: dict[str, t.Any]) -> dict[str, t.Any]:
    schema = Draft202012Validator(json.loads(run("schema", *name.split()).stdout))
    assert [e.message for e in schema.iter_errors(doc)] == []
    return doc


class Queue:
    def __init__(self, sandbox: sandbox_mod.SandboxInfo, home: Path):
        self.sandbox, self.home = sandbox, home

    def book(self, name: str, *, gate: str | None = None, rc: int = 0, **extra: t.Any) -> str:
        """A playbook: print CUDA_VISIBLE_DEVICES, wait for the gate file (if any), exit ``rc``."""
        code = ("import os,sys,time\nprint('CVD=' + os.environ.get('CUDA_VISIBLE_DEVICES', '-'),"
                " flush=True)\n")
        if gate:
            code += f"while not os.path.exists({GATES + '/' + gate!r}): time.sleep(0.1)\n"
        code += f"sys.exit({rc})\n"
        p = self.home / f"{name}.json"
        p.write_text(json.dumps({"name": name, "command": ["python3", "-u", "-c", code],
                                 "timeout_s": 60, **extra}))
        return str(p)

    def add(self, book: str, *args: str) -> dict[str, t.Any]:
        return valid("queue add", ok_json("queue", "add", *T, "--playbook", book, *args))

    def pct(self, *argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """A bare command in the container through the sandbox's pct (no opsctl agent)."""
        return subprocess.run(self.sandbox.ssh_argv(shlex.join(["pct", *argv])), input=stdin,
                              capture_output=True, timeout=60, check=False)

    def open_gate(self, name: str) -> None:
        assert self.pct("exec", str(CT), "--", "sh", "-c",
                        f"mkdir -p {GATES} && touch {GATES}/{name}").returncode == 0

    def file_state(self, job: str) -> dict[str, t.Any]:
        """The job's status.json read in the container (no agent call: nothing advances)."""
        out = self.pct("exec", str(CT), "--", "cat", f"{ROOT}/jobs/{job}/status.json")
        return t.cast(dict[str, t.Any], json.loads(out.stdout)) if out.returncode == 0 else {}

    def wait_file_state(self, job: str, *states: str, timeout: float = 30) -> dict[str, t.Any]:
        wait_for(lambda: self.file_state(job).get("state") in states, timeout,
                 what=f"job {job} in {states}", interval=0.3)
        return self.file_state(job)


def _inventory(sandbox: sandbox_mod.SandboxInfo, home: Path) -> None:
    """The sandbox host with this module's root and its container, ``gpus: 8``."""
    use_private_root(sandbox, home, ROOT)
    inv = home / "inventory" / "sandbox.yaml"
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["sandbox"]["containers"] = {CT: {"gpus": 8}}
    inv.write_text(yaml.safe_dump(doc))


@pytest.fixture(scope="module")
def module_queue(sandbox: sandbox_mod.SandboxInfo, tmp_path_factory: pytest.TempPathFactory
                 ) -> t.Iterator[Queue]:
    home = tmp_path_factory.mktemp("queue-home")
    sandbox_mod.ensure_container(CT, running=True, home=sandbox_home())
    with private_home(sandbox, home, ROOT):
        _inventory(sandbox, home)
        queue = Queue(sandbox, home)
        queue.pct("exec", str(CT), "--", "rm", "-rf", ROOT, GATES)
        yield queue
        queue.open_gate("all")  # nothing of this module keeps running
        listed = run("jobs", *T, "--json")  # exit 25 when no test shipped a payload
        for job in json.loads(listed.stdout)["jobs"] if listed.exit_code == 0 else []:
            if job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED", "LOST"):
                run("stop", *T, job["job_id"], "--grace", "1")


@pytest.fixture
def q(sandbox: sandbox_mod.SandboxInfo, module_queue: Queue, isolated_env: Path) -> Queue:
    _inventory(sandbox, isolated_env)  # each test's own OPSCTL_HOME (tests/conftest.py)
    return module_queue


def test_two_jobs_run_side_by_side_on_disjoint_gpu_slots(q: Queue) -> None:
    a = q.add(q.book("left", gate="sides", gpus=4))
    b = q.add(q.book("right", gate="sides"), "--gpus", "4")
    ids = [a["jobs"][0]["job_id"], b["jobs"][0]["job_id"]]
    assert a["started"] == ids[:1] and b["started"] == ids[1:]
    for job, want in zip(ids, ("CVD=0,1,2,3", "CVD=4,5,6,7"), strict=True):
        wait_for(lambda j=job: "CVD=" in run("logs", *T, j).output, 15, what=f"{job}'s output")
        assert want in run("logs", *T, job).output
    listed = valid("queue", ok_json("queue", *T))
    assert {h["job_id"]: h["gpu_slots"] for h in listed["holders"]} == {
        ids[0]: [0, 1, 2, 3], ids[1]: [4, 5, 6, 7]}
    st = ok_json("status", *T, ids[1])
    assert st["gpu_slots"] == [4, 5, 6, 7]
    q.open_gate("sides")
    for job in ids:
        q.wait_file_state(job, "SUCCEEDED")


def test_order_after_success_and_failure_and_removal(q: Queue) -> None:
    first = q.add(q.book("first", gate="order"))["jobs"][0]["job_id"]  # the whole container
    after = q.add(q.book("after-ok"), "--after", first)["jobs"][0]["job_id"]
    removed = q.add(q.book("removed"))["jobs"][0]["job_id"]
    fails = q.add(q.book("fails", rc=3))["jobs"][0]["job_id"]
    dep = q.add(q.book("after-fail"), "--after", fails)["jobs"][0]["job_id"]
    assert [r["job_id"] for r in ok_json("queue", *T)["jobs"]] == [after, removed, fails, dep]
    assert run("queue", "rm", *T, first).exit_code == 25  # running: refused, `opsctl stop` named
    assert ok_json("queue", "rm", *T, removed)["end_reason"] == "removed"
    rows = {r["job_id"]: r for r in ok_json("jobs", *T)["jobs"]}
    assert rows[dep]["state"] == "QUEUED" and rows[dep]["after"] == fails
    shown = run("status", *T, dep)
    assert shown.exit_code == 0 and "QUEUED" in shown.output and f"after job {fails}" in shown.output
    q.open_gate("order")
    assert q.wait_file_state(dep, "CANCELLED")["end_reason"] == f"dependency {fails} FAILED"
    assert q.wait_file_state(after, "SUCCEEDED")["started_at"] < \
        q.file_state(fails)["started_at"]  # in queue order
    assert q.file_state(removed)["state"] == "CANCELLED" and "started_at" not in \
        q.file_state(removed)


def test_the_queue_moves_on_with_no_client_connected(q: Queue) -> None:
    a = q.add(q.book("night-a", gate="night"))["jobs"][0]["job_id"]
    b = q.add(q.book("night-b"), "--after", a)["jobs"][0]["job_id"]
    # every opsctl command has ended: from here only bare pct (no agent) until b is done
    q.open_gate("night")
    q.wait_file_state(b, "SUCCEEDED")


def test_a_container_restart_moves_the_queue_on_with_no_client(q: Queue) -> None:
    added = q.add(q.book("reboot-a", gate="never", gpus=8))
    assert added["boot_hook"]["kind"] == "systemd"  # the container runs systemd: a unit
    a = added["jobs"][0]["job_id"]
    b = q.add(q.book("reboot-b"), "--after", a)["jobs"][0]["job_id"]
    c = q.add(q.book("reboot-c", gpus=1))["jobs"][0]["job_id"]  # waits for a's GPU slots
    assert q.file_state(c)["state"] == "QUEUED"
    assert q.pct("stop", str(CT)).returncode == 0
    assert q.pct("start", str(CT)).returncode == 0
    # no opsctl call from here: the container's boot hook runs the queue's advance
    q.wait_file_state(a, "LOST")
    assert q.wait_file_state(b, "CANCELLED")["end_reason"] == f"dependency {a} LOST"
    q.wait_file_state(c, "SUCCEEDED")
    assert ok_json("status", *T, a)["state"] == "LOST"


def test_the_real_systemd_reads_a_hostile_root_as_one_argument(q: Queue) -> None:
    root = "/opt/my \"root\" it's 100%n $HOME ${X} $$ back\\slash ; \u00fc"
    code = "import json,sys; open('/tmp/opsctl-argv.json','w').write(json.dumps(sys.argv[1:]))"
    unit = "/etc/systemd/system/opsctl-queue-quoting-test.service"
    text = boothook.unit_text(root, ["/usr/bin/python3", "-c", code, "--root", root])
    ran = q.pct("exec", str(CT), "--", "sh", "-c", f"cat > {unit} && systemctl daemon-reload && "
                "systemctl start opsctl-queue-quoting-test && cat /tmp/opsctl-argv.json; "
                f"rm -f {unit} /tmp/opsctl-argv.json; systemctl daemon-reload", stdin=text.encode())
    assert json.loads(ran.stdout) == ["--root", root], ran.stderr


# --- refusals and damaged records (one record of job state: the job dirs) --------------------


def _no_gpu_count(sandbox: sandbox_mod.SandboxInfo, home: Path) -> None:
    """This module's container with no ``gpus:`` in the inventory."""
    _inventory(sandbox, home)
    inv = home / "inventory" / "sandbox.yaml"
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"]["sandbox"]["containers"] = {CT: {}}
    inv.write_text(yaml.safe_dump(doc))


@pytest.mark.parametrize(("gpus", "why"), [
    ("9", "gpus 9: more GPUs than exist (the container has 8 GPU slot(s))"),
    ("0,9", "gpus: index 9 does not exist (the container has 8 GPU slot(s))"),
])
def test_queue_add_refuses_gpus_the_container_does_not_have_and_queues_nothing(
        q: Queue, gpus: str, why: str) -> None:
    before = ok_json("queue", *T)["jobs"]
    res = run("queue", "add", *T, "--playbook", q.book("too-many"), "--gpus", gpus)
    assert res.exit_code == errors.USAGE, res.output
    assert why in res.output.replace("\n", " ") and "Traceback" not in res.output
    assert ok_json("queue", *T)["jobs"] == before


def test_queue_add_of_gpu_slots_on_a_container_with_no_gpu_count_is_refused(
        q: Queue, sandbox: sandbox_mod.SandboxInfo, isolated_env: Path) -> None:
    _no_gpu_count(sandbox, isolated_env)
    before = ok_json("queue", *T)["jobs"]
    res = run("queue", "add", *T, "--playbook", q.book("no-count"), "--gpus", "0,1")
    assert res.exit_code == errors.USAGE, res.output
    assert "GPU count is not known" in res.output and "Traceback" not in res.output
    assert ok_json("queue", *T)["jobs"] == before


def test_a_damaged_job_record_is_listed_and_left_alone_and_the_rest_is_shown(q: Queue) -> None:
    good = q.add(q.book("beside-damage"))["jobs"][0]["job_id"]
    q.wait_file_state(good, "SUCCEEDED")
    bad = f"{ROOT}/jobs/damaged-1"
    text = b'{"state": "QUEUED", "created_at": "yesterday"}'
    assert q.pct("exec", str(CT), "--", "sh", "-c", f"mkdir -p {bad} && cat > {bad}/status.json",
                 stdin=text).returncode == 0
    listed = valid("jobs", ok_json("jobs", *T))
    assert good in [r["job_id"] for r in listed["jobs"]]
    assert listed["damaged"] == [{"path": f"{bad}/status.json",
                                  "reason": "created_at 'yesterday' is not a number"}]
    shown = run("jobs", *T)
    assert shown.exit_code == 0 and f"damaged record (set aside, left as it is): {bad}" in \
        shown.output.replace("\n", "")
    assert valid("queue", ok_json("queue", *T))["damaged"] == listed["damaged"]
    assert q.pct("exec", str(CT), "--", "cat", f"{bad}/status.json").stdout == text
    q.pct("exec", str(CT), "--", "rm", "-rf", bad)


def test_after_an_ambiguous_prefix_names_the_candidates(q: Queue) -> None:
    a = q.add(q.book("twin-prefix"))["jobs"][0]["job_id"]
    b = q.add(q.book("twin-prefix"))["jobs"][0]["job_id"]
    res = run("queue", "add", *T, "--playbook", q.book("waits"), "--after", "twin-prefix")
    assert res.exit_code == 25 and "ambiguous" in res.output, res.output
    assert a in res.output and b in res.output
    unknown = run("queue", "add", *T, "--playbook", q.book("waits"), "--after", "nosuchjob")
    assert unknown.exit_code == 25 and "no such job" in unknown.output


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_to_queue_add_queues_the_whole_pipeline_or_none_of_it(
        q: Queue, signame: str) -> None:
    import os
    import signal
    import sys
    import time

    book = q.book(f"sig{signame.lower()}", gate="all")
    pipe = q.home / f"pipe-{signame.lower()}.json"
    pipe.write_text(json.dumps({"name": f"pipe{signame.lower()}", "steps": [
        {"playbook": book, "name": f"s{i}", "after": "previous" if i else None}
        for i in range(8)]}))
    outcomes = []
    for delay in (0.6, 1.2, 2.0, 3.0):  # from when opsctl's own code runs
        proc = subprocess.Popen([sys.executable, "-m", "opsctl", "queue", "add", *T,
                                 "--playbook", str(pipe), "--json"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        time.sleep(delay)  # scenario: the signal lands at this point of the command
        proc.send_signal(getattr(signal, signame))
        _out, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err
        assert proc.returncode == 0 or len(err.strip().splitlines()) <= 2, err
        outcomes.append(proc.returncode)
    listed = ok_json("jobs", *T)
    mine = [j for j in listed["jobs"] if j["name"] == f"sig{signame.lower()}"]
    assert len(mine) % 8 == 0, (outcomes, [j["job_id"] for j in mine])  # whole batches only
    ids = {j["job_id"] for j in mine}
    for j in mine:  # every queued step waits for a step of its own batch, which is there
        if j.get("after") is not None:
            assert j["after"] in ids, j


def _queue_add_processes() -> list[str]:
    """The command lines of the ``queue-add`` processes on this machine (the ssh that opsctl
    started, and the agent in the container: LXC shares this kernel's process table)."""
    import os

    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                words = f.read().decode("utf-8", "replace").replace("\0", " ")
        except OSError:
            continue
        if "queue-add" in words and "--specs-stdin" in words and "pytest" not in words:
            found.append(words)
    return found


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_while_64_steps_are_queued_names_them_and_the_command_that_takes_them_out(
        q: Queue, signame: str) -> None:
    import os
    import signal
    import sys

    name = f"wide{signame.lower()}"
    book = q.book(name, gate="all")
    pipe = q.home / f"pipe-{name}.json"
    pipe.write_text(json.dumps({"name": f"p{name}", "steps": [
        {"playbook": book, "name": f"s{i}", "after": "previous" if i else None}
        for i in range(64)]}))
    proc = subprocess.Popen([sys.executable, "-m", "opsctl", "queue", "add", *T,
                             "--playbook", str(pipe)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    wait_for(lambda: any("remote_payload.agent" in c for c in _queue_add_processes())
             or proc.poll() is not None, 120, what="the container to be queueing", interval=0.02)
    proc.send_signal(getattr(signal, signame))
    _out, err = proc.communicate(timeout=120)
    text = " ".join(err.split())  # the console wraps long lines
    assert proc.returncode == {"SIGTERM": errors.TERMINATED, "SIGHUP": errors.HANGUP}[signame], text
    assert f"queue add terminated by {signame} during queue of 64 jobs" in text, text
    assert "Traceback" not in text
    first = text.split(" of 64 jobs (", 1)[1].split(" ", 1)[0]
    command = f"opsctl stop --host sandbox --ct {CT} --job {first}"
    assert command in text and "the 63 steps that wait for it are cancelled" in text, text

    wait_for(lambda: not _queue_add_processes(), 60, what="the queue-add to end in the container")
    mine = [j for j in ok_json("jobs", *T, "--all")["jobs"] if j["name"] == name]
    assert len(mine) in (0, 64), [j["job_id"] for j in mine]  # whole or none
    if mine:  # queued: the printed command takes the whole batch out
        res = run(*command.split()[1:], "--grace", "1")
        assert res.exit_code == 0, res.output
        wait_for(lambda: all(j["state"] == "CANCELLED" for j in ok_json("jobs", *T, "--all")
                             ["jobs"] if j["name"] == name), 60, what="the batch cancelled")
