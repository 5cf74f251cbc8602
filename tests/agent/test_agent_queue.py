"""The container's job queue, run as the real agent against real tmux and processes.

Each test queues small python jobs through ``python3 -m remote_payload.agent`` under its own
``--root`` on a tmux socket private to this module, and reads the job store's files to see
the queue move on with no agent call in between (the wrappers advance it). Waits poll.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import typing as t
import uuid
from pathlib import Path

import pytest

from remote_payload import wire
from remote_payload.agent import jobstore as jobs
from tests.paths import REPO
from tests.waiting import wait_for

PY = sys.executable

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists() or not any(
    (Path(d) / "tmux").exists() for d in os.environ.get("PATH", "").split(os.pathsep)),
    reason="needs Linux /proc and tmux")


@pytest.fixture(scope="module")
def tmux_socket() -> t.Iterator[str]:
    socket = f"opsctl-test-queue-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    yield socket
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


class Agent:
    def __init__(self, root: Path, socket: str):
        self.root, self.socket = root, socket
        self.env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
        self.env["PYTHONPATH"] = str(REPO)
        self.env["OPSCTL_BOOT_HOOK"] = "off"  # never a unit or crontab line on this machine

    def reply(self, verb: str, *args: str, stdin: str | None = None) -> dict[str, t.Any]:
        proc = subprocess.run([PY, "-m", "remote_payload.agent", "--root", str(self.root),
                               "--tmux-socket", self.socket, verb, *args], input=stdin,
                              capture_output=True, text=True, env=self.env, timeout=60, check=False)
        lines = proc.stdout.splitlines()
        assert len(lines) == 1, (proc.stdout, proc.stderr[-2000:])
        return t.cast(dict[str, t.Any], json.loads(lines[0]))

    def data(self, verb: str, *args: str, stdin: str | None = None) -> t.Any:
        reply = self.reply(verb, *args, stdin=stdin)
        assert reply["ok"], reply
        return reply["data"]

    def add(self, *specs: dict[str, t.Any], slots: int = 8) -> dict[str, t.Any]:
        return t.cast(dict[str, t.Any], self.data(
            "queue-add", "--specs-stdin", "--slots", str(slots),
            stdin=json.dumps({"specs": list(specs)})))

    def state(self, job: str) -> str:
        """The job's state as its files say it (no agent call: nobody advances the queue)."""
        st = json.loads((self.root / "jobs" / job / "status.json").read_text())
        return t.cast(str, st["state"])

    def status_file(self, job: str) -> dict[str, t.Any]:
        return t.cast(dict[str, t.Any],
                      json.loads((self.root / "jobs" / job / "status.json").read_text()))

    def wait_state(self, job: str, *states: str, timeout: float = 20.0) -> None:
        wait_for(lambda: self.state(job) in states, timeout, what=f"job {job} in {states}",
                 interval=0.05)


@pytest.fixture
def agent(tmp_path: Path, tmux_socket: str) -> Agent:
    return Agent(tmp_path / "root", tmux_socket)


def spec(job_id: str, code: str = "pass", **extra: t.Any) -> dict[str, t.Any]:
    return {"job_id": job_id, "name": job_id.split("-")[0], "python": PY,
            "command": ["python3", "-c", code], **extra}


def gate(path: Path) -> str:
    """A job that waits until ``path`` exists (the test decides when it ends), then exits 0."""
    return f"import os,time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.05)"


def test_a_job_after_another_starts_when_it_succeeds_with_nobody_calling_the_agent(
        agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    out = agent.add(spec("a-1", gate(go), gpus=8), spec("b-1", "print('b ran')", after="a-1"))
    assert out["added"] == ["a-1", "b-1"] and out["started"] == ["a-1"]
    assert agent.state("b-1") == "QUEUED"
    rows = agent.data("queue", "--slots", "8")["jobs"]
    assert [(r["job_id"], r["after"]) for r in rows] == [("b-1", "a-1")]
    assert "a-1" in rows[0]["waiting_for"]
    go.touch()  # from here on no agent call: a-1's wrapper starts b-1
    agent.wait_state("b-1", "SUCCEEDED")
    assert b"b ran" in (agent.root / "jobs" / "b-1" / "output.log").read_bytes()


def test_a_failed_dependency_cancels_its_dependants_and_names_it(agent: Agent) -> None:
    agent.add(spec("a-2", "raise SystemExit(3)"), spec("b-2", after="a-2"),
              spec("c-2", after="b-2"))
    agent.wait_state("c-2", "CANCELLED")
    assert agent.state("a-2") == "FAILED"
    assert agent.status_file("b-2")["end_reason"] == "dependency a-2 FAILED"
    assert agent.status_file("c-2")["end_reason"] == "dependency b-2 CANCELLED"
    doc = agent.data("status", "--job", "b-2")
    assert doc["state"] == "CANCELLED" and doc["end_reason"] == "dependency a-2 FAILED"


def test_jobs_run_in_queue_order_and_a_removed_one_never_runs(agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    agent.add(spec("first-3", gate(go)))  # the whole container: the others wait for it
    agent.add(spec("second-3"), spec("third-3"), spec("fourth-3"))
    agent.data("queue-move", "--job", "fourth-3", "--before", "second-3")
    assert [r["job_id"] for r in agent.data("queue")["jobs"]] == ["fourth-3", "second-3", "third-3"]
    removed = agent.data("queue-rm", "--job", "third-3")
    assert removed["state"] == "CANCELLED" and removed["end_reason"] == wire.END_REASON_REMOVED
    refused = agent.reply("queue-rm", "--job", "first-3")
    assert refused["error"]["type"] == "QueueRefused" and "opsctl stop" in refused["error"]["message"]
    go.touch()
    agent.wait_state("second-3", "SUCCEEDED")
    assert agent.state("third-3") == "CANCELLED"
    assert not (agent.root / "jobs" / "third-3" / "pid").exists()
    started = {j: agent.status_file(j)["started_at"] for j in ("fourth-3", "second-3")}
    assert started["fourth-3"] < started["second-3"]


def test_two_jobs_share_the_gpus_side_by_side_on_disjoint_slots(agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    show = f"import os\nprint('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n{gate(go)}"
    out = agent.add(spec("seven-4", show, gpus=7), spec("one-4", show, gpus=1),
                    spec("more-4", gpus=2))
    assert out["started"] == ["seven-4", "one-4"]  # more-4 asks for more than is free: waits
    for job, want in (("seven-4", "0,1,2,3,4,5,6"), ("one-4", "7")):
        wait_for(lambda j=job: b"CVD=" in (agent.root / "jobs" / j / "output.log").read_bytes(),
                 10, what=f"{job}'s output")
        assert f"CVD={want}".encode() in (agent.root / "jobs" / job / "output.log").read_bytes()
    holders = {h["job_id"]: h["gpu_slots"] for h in agent.data("queue")["holders"]}
    assert holders == {"seven-4": [0, 1, 2, 3, 4, 5, 6], "one-4": [7]}
    assert agent.data("queue")["jobs"][0]["waiting_for"] == "GPUs"
    go.touch()
    agent.wait_state("more-4", "SUCCEEDED")


@pytest.mark.parametrize(("gpus", "why"), [
    (0, "at least 1"), (99999, "more GPUs than exist"), ([1, 1], "given twice"), (-1, "at least 1"),
    ([8], "does not exist"), (True, "count or a list"), ([], "at least one"),
])
def test_a_gpu_request_that_cannot_be_met_is_refused(agent: Agent, gpus: t.Any, why: str) -> None:
    reply = agent.reply("queue-add", "--specs-stdin", "--slots", "8",
                        stdin=json.dumps({"specs": [spec("x-5", gpus=gpus)]}))
    assert reply["error"]["type"] == "BadSpec" and why in reply["error"]["message"]
    assert not (agent.root / "jobs" / "x-5").exists()


@pytest.mark.parametrize(("after", "why"), [
    ("x-6", "wait for itself"), ("nosuch", "no such job"), ("bad/id", "invalid job id"),
])
def test_a_dependency_that_cannot_be_met_is_refused(agent: Agent, after: str, why: str) -> None:
    reply = agent.reply("queue-add", "--specs-stdin",
                        stdin=json.dumps({"specs": [spec("x-6", after=after)]}))
    assert not reply["ok"] and why in reply["error"]["message"], reply


def test_after_a_job_that_already_failed_is_refused(agent: Agent) -> None:
    agent.add(spec("f-7", "raise SystemExit(1)"))
    agent.wait_state("f-7", "FAILED")
    reply = agent.reply("queue-add", "--specs-stdin",
                        stdin=json.dumps({"specs": [spec("g-7", after="f-7")]}))
    assert reply["error"]["type"] == "QueueRefused" and "FAILED" in reply["error"]["message"]


def test_a_move_that_puts_a_job_before_its_dependency_is_refused(agent: Agent, tmp_path: Path) -> None:
    agent.add(spec("run-8", gate(tmp_path / "never")))
    agent.add(spec("a-8"), spec("b-8", after="a-8"))
    reply = agent.reply("queue-move", "--job", "b-8", "--before", "a-8")
    assert reply["error"]["type"] == "QueueRefused" and "dependency loop" in reply["error"]["message"]
    agent.data("stop", "--job", "run-8", "--grace", "1")
    agent.wait_state("b-8", "SUCCEEDED")


def test_two_clients_adding_at_once_both_succeed(agent: Agent, tmp_path: Path) -> None:
    agent.add(spec("hold-9", gate(tmp_path / "go")))
    procs = [subprocess.Popen(
        [PY, "-m", "remote_payload.agent", "--root", str(agent.root), "--tmux-socket",
         agent.socket, "queue-add", "--specs-stdin"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, env=agent.env, text=True) for _ in range(2)]
    outs = [p.communicate(json.dumps({"specs": [spec(f"c{i}-9")]}), timeout=60)[0]
            for i, p in enumerate(procs)]
    assert all(json.loads(o)["ok"] for o in outs), outs
    assert sorted(r["job_id"] for r in agent.data("queue")["jobs"]) == ["c0-9", "c1-9"]
    (tmp_path / "go").touch()
    agent.wait_state("c0-9", "SUCCEEDED")
    agent.wait_state("c1-9", "SUCCEEDED")


def test_after_a_restart_a_queued_job_stays_queued_and_the_next_agent_call_moves_on(
        agent: Agent, tmp_path: Path) -> None:
    agent.add(spec("run-10", gate(tmp_path / "never")), spec("dep-10", after="run-10"),
              spec("free-10"))
    assert agent.state("free-10") == "QUEUED"
    # the container restarts: the tmux server and every job in it are gone, no wrapper is left
    # to record it (SIGKILL, as a power cut)
    pid = json.loads((agent.root / "jobs" / "run-10" / "pid").read_text())
    for p in (pid["wrapper_pid"], pid["pid"]):
        os.kill(p, 9)
    wait_for(lambda: not jobs.proc_alive(pid["wrapper_pid"], None), 5, what="the wrapper's end")
    assert agent.state("free-10") == "QUEUED" and agent.state("dep-10") == "QUEUED"
    agent.data("jobs")  # the next agent call: run-10 is LOST, the queue moves on
    agent.wait_state("free-10", "SUCCEEDED")
    assert agent.state("run-10") == "LOST"
    assert agent.status_file("dep-10")["end_reason"] == "dependency run-10 LOST"


def test_a_damaged_legacy_queue_file_is_set_aside_and_the_queue_comes_from_the_job_dirs(
        agent: Agent, tmp_path: Path) -> None:
    agent.add(spec("run-11", gate(tmp_path / "go")), spec("q-11"))
    (agent.root / "jobs" / "queue.json").write_text("{not json")
    assert [r["job_id"] for r in agent.data("queue")["jobs"]] == ["q-11"]
    assert list((agent.root / "jobs").glob("queue.json.damaged-*"))
    (tmp_path / "go").touch()
    agent.wait_state("q-11", "SUCCEEDED")


def test_stop_of_a_queued_job_takes_it_out_of_the_queue(agent: Agent, tmp_path: Path) -> None:
    agent.add(spec("run-12", gate(tmp_path / "go")), spec("q-12"))
    doc = agent.data("stop", "--job", "q-12")
    assert doc["state"] == "CANCELLED"
    assert agent.status_file("q-12")["end_reason"] == wire.END_REASON_REMOVED
    agent.data("stop", "--job", "run-12", "--grace", "1")


def test_a_launch_with_gpus_runs_beside_the_jobs_whose_slots_it_does_not_share(
        agent: Agent, tmp_path: Path) -> None:
    never = gate(tmp_path / "never")
    first = agent.data("launch", "--slots", "8", "--spec-json", json.dumps(spec("l1-13", never, gpus=4)))
    second = agent.data("launch", "--slots", "8", "--spec-json",
                        json.dumps(spec("l2-13", never, gpus=4)))
    assert (first["gpu_slots"], second["gpu_slots"]) == ([0, 1, 2, 3], [4, 5, 6, 7])
    # no slot left: a third is refused naming a job in its way, as deploy always refused
    third = agent.reply("launch", "--slots", "8", "--spec-json", json.dumps(spec("l3-13", gpus=1)))
    assert third["error"]["type"] == "JobAlreadyRunning" and "opsctl queue add" in \
        third["error"]["message"]
    whole = agent.reply("launch", "--spec-json", json.dumps(spec("l4-13")))  # no gpus: all of it
    assert whole["error"]["type"] == "JobAlreadyRunning"
    # --replace stops only the jobs in its way
    agent.data("launch", "--slots", "8", "--replace", "--grace", "1", "--spec-json",
               json.dumps(spec("l5-13", never, gpus=[5])))
    assert agent.state("l2-13") == "CANCELLED" and agent.state("l1-13") in ("RUNNING", "SETTING_UP")
    agent.data("launch", "--replace", "--grace", "1", "--spec-json", json.dumps(spec("l6-13")))
    assert agent.state("l1-13") == "CANCELLED" and agent.state("l5-13") == "CANCELLED"
    agent.wait_state("l6-13", "SUCCEEDED")


def test_a_count_of_gpus_needs_the_containers_gpu_count(agent: Agent) -> None:
    reply = agent.reply("launch", "--spec-json", json.dumps(spec("c-14", gpus=2)))
    assert reply["error"]["type"] == "BadSpec" and "inventory" in reply["error"]["message"]


def test_the_restart_policy_runs_before_a_failure_counts(agent: Agent, tmp_path: Path) -> None:
    marker = tmp_path / "tried"
    flaky = (f"import os,sys\nif not os.path.exists({str(marker)!r}):\n"
             f"    open({str(marker)!r}, 'w').close(); sys.exit(1)\n")
    agent.add(spec("flaky-15", flaky, restart={"max_restarts": 1}),
              spec("next-15", "print('next ran')", after="flaky-15"))
    agent.wait_state("next-15", "SUCCEEDED")
    assert agent.status_file("flaky-15")["attempt"] == 2


def _fake_build(root: Path, build: str) -> None:
    """An installed torch build as the swap leaves it (a venv whose python is this one)."""
    from remote_payload.agent.torchenv import fingerprint, layout

    build_dir = root / "envs" / build
    (build_dir / "bin").mkdir(parents=True)
    (build_dir / "bin" / "python").symlink_to(PY)
    (build_dir / layout.MARKER).write_text("{}")
    fingerprint.store_facts(str(build_dir), {"torch": build, "cuda": None, "triton": None,
                                             "gpu": None, "python": "3.11"})


def test_a_job_on_another_torch_build_waits_until_nothing_runs_then_switches(
        agent: Agent, tmp_path: Path) -> None:
    old, new = "torch-2.13.0-cpu", "torch-2.14.0-cpu"
    _fake_build(agent.root, old)
    _fake_build(agent.root, new)
    (agent.root / "envs" / "current").symlink_to(old)
    go = tmp_path / "go"
    show = "import os; print('BUILD=' + os.environ['OPSCTL_TORCH_BUILD'])"
    out = agent.add(spec("live-7", gate(go), gpus=1),
                    spec("newer-7", show, gpus=1, torch_build=new),
                    spec("behind-7", show, gpus=1))  # FIFO: held back by newer-7
    assert out["started"] == ["live-7"]
    rows = {r["job_id"]: r["waiting_for"] for r in agent.data("queue")["jobs"]}
    assert rows["newer-7"] == f"torch build {new}: job live-7 runs on {old}"
    assert os.readlink(agent.root / "envs" / "current") == old  # never switched under a job
    go.touch()  # no agent call from here: live-7's wrapper starts newer-7, which switches
    agent.wait_state("behind-7", "SUCCEEDED")
    assert os.readlink(agent.root / "envs" / "current") == new
    for job in ("newer-7", "behind-7"):
        assert f"BUILD={new}".encode() in (agent.root / "jobs" / job / "output.log").read_bytes()


def test_a_torch_build_that_is_gone_fails_the_start_and_names_it(agent: Agent) -> None:
    agent.add(spec("gone-8", torch_build="torch-9.9.9-cpu"), spec("dep-8", after="gone-8"))
    agent.wait_state("dep-8", "CANCELLED")
    reason = agent.status_file("gone-8")["end_reason"]
    assert agent.state("gone-8") == "FAILED" and "torch-9.9.9-cpu" in reason, reason


@pytest.mark.parametrize("bad", ["../../etc", "torch-../x", "/abs", "torch-a/b", "", 7, "torch-"])
def test_a_torch_build_that_is_not_a_build_name_is_refused(agent: Agent, bad: t.Any) -> None:
    reply = agent.reply("queue-add", "--specs-stdin", stdin=json.dumps(
        {"specs": [spec("bad-9", torch_build=bad)]}))
    assert reply["error"]["type"] == "BadSpec" and reply["error"]["fields"]["field"] == "torch_build"
    assert not (agent.root / "jobs" / "bad-9").exists()


def test_a_root_no_boot_hook_can_name_is_refused_before_anything_is_queued(
        agent: Agent, tmp_path: Path) -> None:
    bad = Agent(tmp_path / "new\nline", agent.socket)
    reply = bad.reply("queue-add", "--specs-stdin", stdin=json.dumps({"specs": [spec("r-10")]}))
    assert reply["error"]["type"] == "QueueRefused" and reply["error"]["fields"]["why"] == "root"
    assert not (tmp_path / "new\nline" / "jobs" / "r-10").exists()


# --- one record of job state: the job dirs --------------------------------------------------


def _legacy_queue(agent: Agent, order: list[str]) -> None:
    """A ``jobs/queue.json`` as an older agent wrote it (it kept the order there)."""
    (agent.root / "jobs" / "queue.json").write_text(json.dumps(
        {"version": 1, "order": order, "slots": 8, "holders": {}}))


def test_a_legacy_queue_file_naming_a_finished_job_never_runs_it_again(
        agent: Agent, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    agent.add(spec("done-20", f"open({str(runs)!r}, 'a').write('ran\\n')"))
    agent.wait_state("done-20", "SUCCEEDED")
    _legacy_queue(agent, ["done-20"])
    assert agent.data("queue")["jobs"] == []
    assert agent.state("done-20") == "SUCCEEDED" and runs.read_text() == "ran\n"
    assert not (agent.root / "jobs" / "queue.json").exists()
    assert list((agent.root / "jobs").glob("queue.json.migrated-*"))  # kept for a human


def test_a_legacy_queue_file_naming_a_running_job_leaves_it_running(
        agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    agent.add(spec("live-21", gate(go)), spec("b-21"), spec("a-21"))
    agent.wait_state("live-21", "RUNNING", "SETTING_UP")
    for job in ("a-21", "b-21"):  # queued by an older agent: no rank in their status.json
        status = agent.status_file(job)
        del status["queue_rank"]
        (agent.root / "jobs" / job / "status.json").write_text(json.dumps(status))
    # the older agent's order names the running job, and puts a-21 before b-21
    _legacy_queue(agent, ["live-21", "a-21", "b-21"])
    assert [r["job_id"] for r in agent.data("queue")["jobs"]] == ["a-21", "b-21"]
    assert agent.state("live-21") in ("RUNNING", "SETTING_UP")
    pid = json.loads((agent.root / "jobs" / "live-21" / "pid").read_text())["pid"]
    assert jobs.proc_alive(pid, None)
    go.touch()
    agent.wait_state("b-21", "SUCCEEDED")
    assert agent.state("live-21") == "SUCCEEDED"
    started = {j: agent.status_file(j)["started_at"] for j in ("a-21", "b-21")}
    assert started["a-21"] < started["b-21"]


def test_a_finished_job_is_never_started_from_the_queue_again(agent: Agent) -> None:
    """The one place a queued job starts checks, under the lock, that it is QUEUED."""
    from remote_payload.agent import jobqueue, launching
    from remote_payload.agent.common import AgentFailure

    agent.add(spec("once-22"))
    agent.wait_state("once-22", "SUCCEEDED")
    with jobqueue.locked(str(agent.root)), pytest.raises(AgentFailure) as refused:
        launching.start_queued(str(agent.root), "once-22", None, agent.socket)
    assert refused.value.type == wire.ErrorType.QueueRefused
    assert "SUCCEEDED, not QUEUED" in refused.value.message
    status = agent.status_file("once-22")
    assert status["state"] == "SUCCEEDED"
    assert [t[2] for t in status["transitions"]].count("started from the queue") == 1


DAMAGE: list[tuple[str, str, bytes | None, str]] = [
    ("created-30", "status.json", b'{"state": "QUEUED", "created_at": "yesterday"}',
     "created_at 'yesterday' is not a number"),
    ("json-30", "status.json", b"{not json", "not JSON"),
    ("cut-30", "status.json", b'{"state": "SUCCEEDED", "created_at": 1', "not JSON"),
    ("state-30", "status.json", b'{"created_at": 1.0}', "state is missing"),
    ("bytes-30", "status.json", b"\xff\xfe\x00", "not UTF-8"),
    ("dir-30", "status.json", None, "a directory, not a file"),
    ("spec-30", "spec.json", b'{"gpus": "lots"}', "gpus:"),
]


def _damage(agent: Agent, job: str, name: str, data: bytes | None) -> Path:
    path = agent.root / "jobs" / job
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "status.json").exists() and name != "status.json":
        (path / "status.json").write_text(json.dumps({"state": "QUEUED", "created_at": 1.0}))
    if data is None:
        (path / name).mkdir()
    else:
        (path / name).write_bytes(data)
    return path / name


def test_damaged_records_are_set_aside_named_and_kept_and_the_other_jobs_go_on(
        agent: Agent, tmp_path: Path) -> None:
    agent.add(spec("good-30"))
    agent.wait_state("good-30", "SUCCEEDED")
    damaged = {str(_damage(agent, job, name, data)): (data, why) for job, name, data, why in DAMAGE}
    agent.add(spec("next-30"))  # the queue moves on beside them
    agent.wait_state("next-30", "SUCCEEDED")
    listed = agent.data("jobs")
    assert sorted(r["job_id"] for r in listed["jobs"]) == ["good-30", "next-30"]
    reasons = {d["path"]: d["reason"] for d in listed["damaged"]}
    assert sorted(reasons) == sorted(damaged)
    for path, (data, why) in damaged.items():
        assert why in reasons[path], (path, reasons[path])
        assert (data is None and Path(path).is_dir()) or Path(path).read_bytes() == data  # untouched
    queued = agent.data("queue")
    assert queued["jobs"] == [] and sorted(d["path"] for d in queued["damaged"]) == sorted(damaged)
    one = agent.reply("status", "--job", "created-30")
    assert one["error"]["type"] == "DamagedRecord" and "created_at" in one["error"]["message"]


def test_a_gpu_list_on_a_container_with_no_gpu_count_is_refused_and_nothing_is_queued(
        agent: Agent) -> None:
    reply = agent.reply("queue-add", "--specs-stdin",
                        stdin=json.dumps({"specs": [spec("noslots-31", gpus=[0, 1])]}))
    assert reply["error"]["type"] == "BadSpec" and "GPU count is not known" in \
        reply["error"]["message"]
    assert not (agent.root / "jobs" / "noslots-31").exists()
    assert agent.data("queue")["jobs"] == []


def test_a_queued_job_whose_gpus_no_longer_fit_fails_and_the_jobs_behind_it_move_on(
        agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    agent.add(spec("hold-32", gate(go)), spec("big-32", gpus=[3]), spec("dep-32", after="big-32"),
              spec("small-32", gpus=1), slots=4)
    assert agent.state("big-32") == "QUEUED"
    agent.data("queue", "--slots", "2")  # the inventory's count dropped
    assert agent.state("big-32") == "FAILED"
    assert "index 3 does not exist" in agent.status_file("big-32")["end_reason"]
    assert agent.status_file("dep-32")["end_reason"] == "dependency big-32 FAILED"
    go.touch()
    agent.wait_state("small-32", "SUCCEEDED")


def test_after_an_ambiguous_prefix_is_refused_listing_the_candidates(agent: Agent) -> None:
    agent.add(spec("pre-a1-33"), spec("pre-a2-33"))
    reply = agent.reply("queue-add", "--specs-stdin",
                        stdin=json.dumps({"specs": [spec("w-33", after="pre-a")]}))
    message = reply["error"]["message"]
    assert reply["error"]["type"] == "QueueRefused" and "ambiguous" in message
    assert "pre-a1-33" in message and "pre-a2-33" in message and "\n" not in message
    unknown = agent.reply("queue-add", "--specs-stdin",
                          stdin=json.dumps({"specs": [spec("w-33", after="zzz")]}))
    assert "no such job" in unknown["error"]["message"]


def test_a_job_id_named_twice_in_one_batch_is_refused_and_nothing_is_queued(agent: Agent) -> None:
    reply = agent.reply("queue-add", "--specs-stdin", stdin=json.dumps(
        {"specs": [spec("twin-34"), spec("twin-34", after="twin-34")]}))
    assert reply["error"]["type"] == "JobExists" and "twice" in reply["error"]["message"]
    assert not (agent.root / "jobs" / "twin-34").exists()


def test_ids_the_agent_draws_are_distinct_over_a_full_pipeline(agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    agent.add(spec("hold-35", gate(go)))
    steps = [{k: v for k, v in spec("x").items() if k != "job_id"} for _ in range(wire.MAX_PIPELINE_STEPS)]
    out = agent.add(*steps)
    assert len(set(out["added"])) == wire.MAX_PIPELINE_STEPS
    assert all(re.fullmatch(r"x-\d{8}-\d{6}-[0-9a-f]{8}", j) for j in out["added"]), out["added"]
    for j in out["added"]:
        agent.data("queue-rm", "--job", j)
    agent.data("stop", "--job", "hold-35", "--grace", "1")


def test_concurrent_adds_from_several_processes_lose_and_duplicate_nothing(
        agent: Agent, tmp_path: Path) -> None:
    agent.add(spec("hold-36", gate(tmp_path / "never")))
    n, per = 6, 3
    procs = [subprocess.Popen(
        [PY, "-m", "remote_payload.agent", "--root", str(agent.root), "--tmux-socket",
         agent.socket, "queue-add", "--specs-stdin", "--slots", "8"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, env=agent.env, text=True) for _ in range(n)]
    for i, p in enumerate(procs):
        assert p.stdin is not None
        p.stdin.write(json.dumps({"specs": [spec(f"c{i}-{k}-36") for k in range(per)]}))
        p.stdin.close()
    outs = []
    for p in procs:
        assert p.stdout is not None
        outs.append(json.loads(p.stdout.read()))
        assert p.wait(timeout=60) == 0
    assert all(o["ok"] for o in outs), outs
    want = sorted(f"c{i}-{k}-36" for i in range(n) for k in range(per))
    order = [r["job_id"] for r in agent.data("queue")["jobs"]]
    assert sorted(order) == want  # each once
    for i in range(n):  # each batch stays in its own order
        mine = [j for j in order if j.startswith(f"c{i}-")]
        assert mine == [f"c{i}-{k}-36" for k in range(per)]
    ranks = [agent.status_file(j)["queue_rank"] for j in order]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    agent.data("stop", "--job", "hold-36", "--grace", "1")
    for j in order:
        agent.wait_state(j, "SUCCEEDED", timeout=60)


def test_a_stray_wrapper_never_runs_a_job_that_ran_or_waits_in_the_queue(
        agent: Agent, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    agent.add(spec("ran-37", f"open({str(runs)!r}, 'a').write('ran\\n')"))
    agent.wait_state("ran-37", "SUCCEEDED")
    agent.add(spec("hold-37", gate(tmp_path / "go")), spec("waits-37"))
    for job, state in (("ran-37", "SUCCEEDED"), ("waits-37", "QUEUED")):
        path = agent.root / "jobs" / job
        before = agent.status_file(job)["transitions"]
        proc = subprocess.run([PY, "-m", "remote_payload.agent.wrapper", str(path)],
                              capture_output=True, text=True, env=agent.env, timeout=60,
                              check=False)
        assert proc.returncode == 2 and f"is {state}, not PENDING" in proc.stderr
        after = agent.status_file(job)
        assert (after["state"], after["transitions"]) == (state, before)
    assert runs.read_text() == "ran\n"
    (tmp_path / "go").touch()
    agent.wait_state("waits-37", "SUCCEEDED")


def test_a_killed_adds_staging_leftovers_are_cleared_and_a_link_there_is_never_followed(
        agent: Agent, tmp_path: Path) -> None:
    left = agent.root / "jobs" / ".staging" / "12345" / "old-38"
    left.mkdir(parents=True)
    (left / "secrets.json").write_text('{"TOKEN": "x"}')
    agent.add(spec("new-38"))
    assert not (agent.root / "jobs" / ".staging").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (agent.root / "jobs" / ".staging").symlink_to(elsewhere)
    reply = agent.reply("queue-add", "--specs-stdin", stdin=json.dumps({"specs": [spec("l-38")]}))
    assert reply["error"]["type"] == "QueueRefused" and "symbolic link" in reply["error"]["message"]
    assert list(elsewhere.iterdir()) == [] and not (agent.root / "jobs" / "l-38").exists()
