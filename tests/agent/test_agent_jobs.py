"""The container agent's job verbs, run as the real CLI against real tmux and real processes.

Every test launches small python3/sh jobs through ``python3 -m remote_payload.agent``
(a subprocess, exactly as ``pct exec`` runs it) under its own ``--root`` and on a
tmux socket private to this module. Waits poll; nothing sleeps a fixed time.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import typing as t
import uuid
from pathlib import Path

import pytest

from remote_payload.agent import jobstore as jobs
from tests.agent_helper import run_agent
from tests.paths import REPO
from tests.waiting import wait_for, wait_for_value

PY = sys.executable
# the container runs the agent on Debian's python3 (3.11); point this at one to check it here
AGENT_PY = os.environ.get("OPSCTL_TEST_AGENT_PYTHON") or sys.executable

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists() or not any(
    (Path(d) / "tmux").exists() for d in os.environ.get("PATH", "").split(os.pathsep)),
    reason="needs Linux /proc and tmux")


def _kill_tmux_server(socket: str) -> None:
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def _remove_tmux_socket(socket: str) -> None:
    tmpdir = os.environ.get("TMUX_TMPDIR") or "/tmp"
    Path(tmpdir, f"tmux-{os.getuid()}", socket).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def tmux_socket() -> t.Iterator[str]:
    socket = f"opsctl-test-agent-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    yield socket
    _kill_tmux_server(socket)
    _remove_tmux_socket(socket)


class Agent:
    """Runs agent verbs as a subprocess and returns the parsed reply."""

    def __init__(self, root: Path, socket: str):
        self.root = root
        self.socket = socket
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.env.pop("TMUX", None)

    def reply(self, verb: str, *args: str) -> dict[str, t.Any]:
        return run_agent(self.root, verb, *args, python=AGENT_PY, tmux_socket=self.socket,
                         env=self.env).reply

    def data(self, verb: str, *args: str) -> t.Any:
        reply = self.reply(verb, *args)
        assert reply["ok"], reply
        return reply["data"]

    def launch(self, code: str, *extra_argv: str, replace: bool = False,
               **spec: t.Any) -> dict[str, t.Any]:
        """Launch ``python3 -c code`` (python substituted by the spec's ``python``)."""
        spec = {"name": "t", "command": ["python3", "-c", code, *extra_argv], "python": PY, **spec}
        return self.data("launch", "--spec-json", json.dumps(spec), *(["--replace"] * replace))

    def status(self, job: str | None = None) -> dict[str, t.Any]:
        return self.data("status", *(["--job", job] if job else []))

    def wait_state(self, job: str, *states: str, timeout: float = 20.0) -> dict[str, t.Any]:
        doc = wait_for_value(lambda: self.status(job), lambda d: d["state"] in states, timeout,
                             interval=0.05)
        if doc["state"] not in states:
            raise AssertionError(f"job {job} stayed {doc['state']}, wanted {states}: {doc}")
        return doc


@pytest.fixture
def agent(tmp_path: Path, tmux_socket: str) -> Agent:
    return Agent(tmp_path / "root", tmux_socket)


def _wait(pred: t.Callable[[], bool], timeout: float = 10.0) -> None:
    wait_for(pred, timeout, what="the condition", interval=0.02)


def _gone(pid: int) -> bool:
    return not jobs.proc_alive(pid, None)


SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(120)"


def test_a_job_that_exits_0_ends_SUCCEEDED_with_its_output(agent: Agent) -> None:
    doc = agent.launch("print('hello from the job')")
    assert doc["state"] in ("SETTING_UP", "RUNNING", "SUCCEEDED"), doc
    end = agent.wait_state(doc["job_id"], "SUCCEEDED")
    assert end["exit_code"] == 0
    assert end["signal"] is None
    assert end["healthy"] is True
    assert end["output_tail"] == ["hello from the job"]
    assert end["alive"] is False
    exit_rec = json.loads(Path(end["output_log"]).with_name("exit_code").read_text())
    assert exit_rec["exit_code"] == 0
    assert exit_rec["signal"] is None


def test_a_python_traceback_is_FAILED_in_the_first_status_after_the_crash(agent: Agent) -> None:
    code = "import time\nprint('ready', flush=True)\ntime.sleep(0.3)\n1/0"
    doc = agent.launch(code)
    _wait(lambda: _gone(doc["pid"]))  # the crash has happened (zombie or reaped)
    first = agent.status(doc["job_id"])
    assert first["state"] == "FAILED", first
    assert first["exit_code"] == 1
    assert first["signal"] is None
    assert "Traceback (most recent call last):" in first["output_tail"]
    assert first["output_tail"][-1] == "ZeroDivisionError: division by zero"


def test_the_plain_status_line_gets_the_reply_the_argparse_path_gives(agent: Agent) -> None:
    """opsctl's own status line skips argparse (agent/__main__.py, plain_status); an ``=``
    form of the same options goes through argparse: one reply, both ways."""
    doc = agent.launch("print('ready', flush=True)\n1/0")
    agent.wait_state(doc["job_id"], "FAILED")

    def ask(*argv: str) -> dict[str, t.Any]:
        reply = agent.data("status", *argv)
        for field in ("now", "gpus_at"):  # the moment of asking
            reply.pop(field)
        return reply

    # FAILED is said as soon as status.json is final; the wrapper then still flushes the
    # history and releases the GPU slots: compare once it has exited. (tmux notes the pane's
    # death when it reaps the wrapper, which under load came 16 s late: the pane is compared
    # apart, on the job's last line.)
    pid = json.loads((Path(jobs.job_dir(agent.root, doc["job_id"])) / jobs.PID).read_text())
    wait_for(lambda: not jobs.proc_alive(pid["wrapper_pid"], pid.get("wrapper_start_ticks")),
             timeout=30, what="the wrapper to exit")
    plain = ask("--job", doc["job_id"], "--lines", "5")
    parsed = ask(f"--job={doc['job_id']}", "--lines=5")
    panes = plain.pop("pane_tail"), parsed.pop("pane_tail")
    assert plain == parsed
    assert all(any("FAILED: exited with code 1" in ln for ln in pane) for pane in panes), panes
    assert plain["diagnosis"] and plain["output_tail"][-1] == "ZeroDivisionError: division by zero"


def test_a_job_killed_by_SIGKILL_is_FAILED_with_the_signal(agent: Agent) -> None:
    doc = agent.launch("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    end = agent.wait_state(doc["job_id"], "FAILED")
    assert end["signal"] == "SIGKILL"
    assert end["exit_code"] is None


def test_killing_the_tmux_server_makes_the_job_LOST_and_leaves_no_orphan(tmp_path: Path) -> None:
    socket = f"opsctl-test-agent-lost-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    agent = Agent(tmp_path / "root", socket)
    try:
        doc = agent.launch(SLEEPER, healthy_when={"regex": "ready"})
        agent.wait_state(doc["job_id"], "RUNNING")
        wrapper_pid = json.loads(Path(doc["output_log"]).with_name("pid").read_text())["wrapper_pid"]
        _kill_tmux_server(socket)
        _wait(lambda: _gone(doc["pid"]) and _gone(wrapper_pid))
        assert jobs.group_members(doc["pgid"]) == []
        lost = agent.status(doc["job_id"])
    finally:
        _kill_tmux_server(socket)
        _remove_tmux_socket(socket)
    assert lost["state"] == "LOST", lost
    assert lost["alive"] is False
    assert lost["exit_code"] is None
    assert any("SIGHUP" in e for e in lost["evidence"]), lost["evidence"]


def test_a_killed_wrapper_takes_the_job_down_and_the_job_is_LOST(agent: Agent) -> None:
    doc = agent.launch(SLEEPER, healthy_when={"regex": "ready"})
    agent.wait_state(doc["job_id"], "RUNNING")
    wrapper_pid = json.loads(Path(doc["output_log"]).with_name("pid").read_text())["wrapper_pid"]
    os.kill(wrapper_pid, signal.SIGKILL)
    _wait(lambda: _gone(doc["pid"]))
    lost = agent.status(doc["job_id"])
    assert lost["state"] == "LOST", lost
    assert any(f"wrapper pid {wrapper_pid} is gone" in e for e in lost["evidence"]), lost
    assert any("no exit_code" in e for e in lost["evidence"]), lost


def test_stop_cancels_with_SIGINT_and_leaves_no_process(agent: Agent) -> None:
    doc = agent.launch(SLEEPER, healthy_when={"regex": "ready"})
    agent.wait_state(doc["job_id"], "RUNNING")
    stopped = agent.data("stop", "--grace", "10")
    assert stopped["signals_sent"] == ["SIGINT"]
    assert stopped["remaining_pids"] == []
    assert stopped["state"] == "CANCELLED"
    assert jobs.group_members(doc["pgid"]) == []
    end = agent.status(doc["job_id"])
    assert end["state"] == "CANCELLED"
    assert any("KeyboardInterrupt" in ln for ln in end["output_tail"]), end["output_tail"]


def test_stop_escalates_to_SIGTERM_then_SIGKILL_for_a_job_that_ignores_them(agent: Agent) -> None:
    code = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "time.sleep(120)")
    doc = agent.launch(code, healthy_when={"regex": "ready"})
    agent.wait_state(doc["job_id"], "RUNNING")
    stopped = agent.data("stop", "--grace", "0.3", "--kill-after", "0.3")
    assert stopped["signals_sent"] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert stopped["remaining_pids"] == []
    assert stopped["state"] == "CANCELLED"
    assert jobs.group_members(doc["pgid"]) == []


def test_stop_of_a_finished_job_sends_nothing(agent: Agent) -> None:
    doc = agent.launch("pass")
    agent.wait_state(doc["job_id"], "SUCCEEDED")
    stopped = agent.data("stop")
    assert stopped["signals_sent"] == []
    assert stopped["state"] == "SUCCEEDED"


def test_healthy_when_event_goes_through_COMPILING_to_RUNNING(agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = ("import json, os, sys, time\ngo = sys.argv[1]\n"
            "def wait(p):\n    while not os.path.exists(p): time.sleep(0.01)\n"
            "print(json.dumps({'event': 'phase', 'phase': 'compiling'}), flush=True)\n"
            "wait(go)\nprint(json.dumps({'event': 'step', 'step': 1, 'loss': 2.5}), flush=True)\n"
            "wait(go + '.2')\n")
    doc = agent.launch(code, str(go), healthy_when={"event": "step"})
    compiling = agent.wait_state(doc["job_id"], "COMPILING")
    assert compiling["healthy"] is False
    assert compiling["phase"] == "compiling"
    go.touch()
    running = agent.wait_state(doc["job_id"], "RUNNING")
    assert running["healthy"] is True
    assert running["last_step"]["step"] == 1
    assert running["last_step"]["loss"] == 2.5
    assert [e["event"] for e in running["events_tail"]] == ["phase", "step"]
    Path(f"{go}.2").touch()
    end = agent.wait_state(doc["job_id"], "SUCCEEDED")
    states = [tr[0] for tr in end["transitions"]]
    assert states == ["PENDING", "SETTING_UP", "COMPILING", "RUNNING", "SUCCEEDED"]


def test_healthy_when_regex_marks_RUNNING_on_a_matching_line(agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    code = ("import os, sys, time\nprint('loading model', flush=True)\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
            "print('model loaded in 3.2s', flush=True)\ntime.sleep(120)")
    doc = agent.launch(code, str(go), healthy_when={"regex": r"model loaded in \d"})
    agent.wait_state(doc["job_id"], "SETTING_UP")
    _wait(lambda: "loading model" in Path(doc["output_log"]).read_text())
    assert agent.status(doc["job_id"])["state"] == "SETTING_UP"
    go.touch()
    running = agent.wait_state(doc["job_id"], "RUNNING")
    assert running["healthy"] is True
    agent.data("stop", "--grace", "5")


def test_healthy_when_started_is_RUNNING_as_soon_as_launch_returns(agent: Agent) -> None:
    doc = agent.launch(SLEEPER, healthy_when={"started": True})
    assert doc["state"] == "RUNNING"
    assert doc["alive"] is True
    assert doc["pid"] == doc["pgid"]
    sample = Path(doc["output_log"]).with_name("gpus.json")
    _wait(sample.exists)  # the wrapper samples GPUs so status need not query them
    assert json.loads(sample.read_text())["gpus"] == agent.status(doc["job_id"])["gpus"]
    agent.data("stop", "--grace", "5")


def test_a_second_launch_is_refused_unless_replace(agent: Agent) -> None:
    first = agent.launch(SLEEPER, healthy_when={"started": True})
    refused = agent.reply("launch", "--spec-json",
                          json.dumps({"command": [PY, "-c", "pass"], "name": "second"}))
    assert refused["ok"] is False
    assert refused["error"]["type"] == "JobAlreadyRunning"
    assert refused["error"]["fields"] == {"job_id": first["job_id"], "state": "RUNNING"}
    second = agent.launch(SLEEPER, replace=True, healthy_when={"started": True})
    assert second["job_id"] != first["job_id"]
    assert second["state"] == "RUNNING"
    assert agent.status(first["job_id"])["state"] == "CANCELLED"
    assert jobs.group_members(first["pgid"]) == []
    listed = agent.data("jobs")
    assert [j["job_id"] for j in listed["jobs"]] == [second["job_id"], first["job_id"]]
    assert listed["current"] == second["job_id"]
    agent.data("stop", "--grace", "5")


def test_logs_offsets_reassemble_the_exact_output_bytes(agent: Agent) -> None:
    code = ("import sys\nsys.stdout.buffer.write(bytes(range(256)) * 40)\n"
            "sys.stdout.buffer.write('\\nμ tail without newline'.encode())")
    doc = agent.launch(code)
    agent.wait_state(doc["job_id"], "SUCCEEDED")
    expected = bytes(range(256)) * 40 + "\nμ tail without newline".encode()
    got, offset = b"", 0
    while True:
        part = agent.data("logs", "--offset", str(offset), "--max-bytes", "3000")
        assert part["offset"] == offset
        got += base64.b64decode(part["data_b64"])
        offset = part["next_offset"]
        if part["eof"]:
            break
    assert part["terminal"] is True
    assert part["state"] == "SUCCEEDED"
    assert got == expected
    assert Path(doc["output_log"]).read_bytes() == expected


def test_logs_rejects_an_offset_past_the_end(agent: Agent) -> None:
    doc = agent.launch("print('x')")
    agent.wait_state(doc["job_id"], "SUCCEEDED")
    bad = agent.reply("logs", "--offset", "999")
    assert bad["error"]["type"] == "BadOffset"


def test_stacks_returns_a_dump_of_every_thread_of_a_sleeping_python_job(agent: Agent) -> None:
    code = ("import threading, time\ndef background_worker():\n    time.sleep(120)\n"
            "threading.Thread(target=background_worker, daemon=True).start()\n"
            "print('ready', flush=True)\ntime.sleep(120)")
    doc = agent.launch(code, healthy_when={"regex": "ready"})
    agent.wait_state(doc["job_id"], "RUNNING")
    dump = agent.data("stacks", "--timeout", "10")
    assert dump["pids"] == [doc["pid"]]
    (proc,) = dump["processes"]
    assert proc["pid"] == doc["pid"] and proc["threads"] == 2 == dump["threads"]
    assert "Current thread 0x" in proc["dump"] or proc["dump"].count("Thread 0x") == 2
    assert "background_worker" in proc["dump"]
    assert proc["dump"] in Path(dump["saved_to"]).read_text()
    # the dump went to the process's own file, not into the job's output
    output = Path(agent.status(doc["job_id"])["output_log"]).read_text()
    assert "background_worker" not in output
    assert agent.status(doc["job_id"])["state"] == "RUNNING"  # the dump did not kill it
    agent.data("stop", "--grace", "5")


def test_stacks_refuses_a_job_without_python_and_leaves_it_running(agent: Agent) -> None:
    spec = {"name": "sh", "command": ["sh", "-c", "echo ready; exec sleep 120"],
            "healthy_when": {"regex": "ready"}}
    doc = agent.data("launch", "--spec-json", json.dumps(spec))
    agent.wait_state(doc["job_id"], "RUNNING")
    refused = agent.reply("stacks", "--timeout", "1")
    assert refused["error"]["type"] == "NoStacks"
    assert "no python process" in refused["error"]["message"]
    assert agent.status(doc["job_id"])["alive"] is True
    agent.data("stop", "--grace", "5")


def test_a_command_that_does_not_exist_is_FAILED_with_127(agent: Agent) -> None:
    spec = {"name": "missing", "command": ["/nonexistent/trainer", "--x"]}
    doc = agent.data("launch", "--spec-json", json.dumps(spec))
    end = agent.wait_state(doc["job_id"], "FAILED")
    assert end["exit_code"] == 127
    assert "cannot start '/nonexistent/trainer'" in end["output_tail"][-1]


def test_the_job_gets_its_env_the_opsctl_vars_and_the_sitehook(agent: Agent) -> None:
    code = ("import os, sys, sitecustomize\n"
            "print(os.environ['OPSCTL_JOB_ID'], os.environ['OPSCTL_JOB_DIR'])\n"
            "print(os.environ['MY_VAR'], os.environ['PYTHONUNBUFFERED'], sys.executable)\n"
            "print(os.environ['PYTHONPATH'])\nprint(sitecustomize.__file__)\n"
            "print(os.environ['OPSCTL_GOODPUT_FILE'], os.environ['OPSCTL_ATTEMPT'])")
    doc = agent.launch(code, env={"MY_VAR": "v 1", "PYTHONPATH": "/extra"})
    end = agent.wait_state(doc["job_id"], "SUCCEEDED")
    job_dir = str(Path(doc["output_log"]).parent)
    assert end["output_tail"][0] == f"{doc['job_id']} {job_dir}"
    assert end["output_tail"][1] == f"v 1 1 {PY}"
    assert end["output_tail"][2] == os.pathsep.join(
        [str(REPO / "remote_payload" / "sitehook"), str(REPO), "/extra"])
    assert end["output_tail"][3] == str(REPO / "remote_payload" / "sitehook" / "sitecustomize.py")
    # the run's goodput summary the wrapper keeps, for the trainer's --report-to scalars
    # and which attempt of the job this process is
    assert end["output_tail"][4] == os.path.join(job_dir, "goodput-summary.json") + " 1"


@pytest.mark.parametrize(("spec", "field"), [
    ({"command": []}, "command"),
    ({"command": ["x"], "env": {"A": 1}}, "env"),
    ({"command": ["x"], "healthy_when": {"regex": "("}}, "healthy_when.regex"),
    ({"command": ["x"], "healthy_when": {"event": "step", "regex": "x"}}, "healthy_when"),
    ({"command": ["x"], "workdir": "/nonexistent-dir"}, "workdir"),
    ({"command": ["x"], "job_id": "../escape"}, "job_id"),
])
def test_a_bad_spec_is_refused_naming_the_field(agent: Agent, spec: dict[str, t.Any],
                                                field: str) -> None:
    bad = agent.reply("launch", "--spec-json", json.dumps(spec))
    assert bad["error"]["type"] == "BadSpec"
    assert bad["error"]["fields"]["field"] == field
    assert not (agent.root / "jobs").exists() or not jobs.list_job_ids(str(agent.root))


def test_status_without_any_job_is_a_typed_error(agent: Agent) -> None:
    reply = agent.reply("status")
    assert reply["error"]["type"] == "NoSuchJob"


def test_launch_runs_python_jobs_on_the_current_torch_build_with_its_cache(agent: Agent) -> None:
    from remote_payload.agent.torchenv import fingerprint, layout

    build = "torch-2.13.0-cpu"
    build_dir = agent.root / "envs" / build
    (build_dir / "bin").mkdir(parents=True)
    (build_dir / "bin" / "python").symlink_to(PY)
    (build_dir / layout.MARKER).write_text("{}")
    fingerprint.store_facts(str(build_dir), {"torch": "2.13.0+cpu", "cuda": None, "triton": None,
                                             "gpu": None, "python": "3.11"})
    (agent.root / "envs" / "current").symlink_to(build)
    spec = {"name": "on-build", "command": ["python3", "-c",
            "import os; print(os.environ['TORCHINDUCTOR_CACHE_DIR']); print(os.environ['MINE'])"],
            "env": {"MINE": "kept"}}
    doc = agent.data("launch", "--spec-json", json.dumps(spec))
    end = agent.wait_state(doc["job_id"], "SUCCEEDED")
    launched = json.loads(Path(doc["output_log"]).with_name("launch.json").read_text())
    assert launched["argv"][0] == str(build_dir / "bin" / "python")
    cache_dir, mine = end["output_tail"]
    assert cache_dir.startswith(str(agent.root / "cache") + os.sep)
    assert cache_dir.endswith(os.sep + "inductor")
    assert mine == "kept"


def test_a_crashing_wrapper_leaves_its_traceback_as_LOST_evidence(agent: Agent,
                                                                  tmp_path: Path) -> None:
    job_dir = agent.root / "jobs" / "broken-1"
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(json.dumps({"command": ["true"]}))  # no job_id: a bug
    (job_dir / "launch.json").write_text(json.dumps({"created_at": time.time()}))
    (job_dir / "status.json").write_text(json.dumps({"state": "PENDING"}))
    wrapper = subprocess.run([PY, "-m", "remote_payload.agent.wrapper", str(job_dir)],
                             capture_output=True, text=True, env=agent.env, timeout=60, check=False)
    assert wrapper.returncode == 70
    assert "KeyError: 'job_id'" in wrapper.stderr
    lost = agent.status("broken-1")
    assert lost["state"] == "LOST"
    assert any("the wrapper crashed: KeyError: 'job_id'" in e for e in lost["evidence"]), lost


def test_launch_refuses_gpus_held_by_another_process_unless_forced(agent: Agent,
                                                                    tmp_path: Path) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"  # answers as on an H200 with a leftover process
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\ncase \"$1\" in\n"
                   "  --query-gpu=index,uuid,memory.used) echo '0, GPU-a, 60761';;\n"
                   "  --query-compute-apps=*) echo 'GPU-a, 2444, 60752, /usr/bin/python3';;\n"
                   "  *) exit 9;;\nesac\n")
    smi.chmod(0o755)
    agent.env = {**agent.env, "PATH": f"{smi.parent}{os.pathsep}{agent.env['PATH']}"}
    spec = json.dumps({"name": "gpu", "command": ["sleep", "60"]})
    refused = agent.reply("launch", "--spec-json", spec)
    assert refused["error"]["type"] == "GpusBusy"
    assert "GPU 0: 1 process(es) from outside this job: pid 2444" in refused["error"]["message"]
    assert not (agent.root / "jobs").exists() or not jobs.list_job_ids(str(agent.root))
    doc = agent.data("launch", "--spec-json", spec, "--force-gpus")
    assert doc["preflight"]["forced"] is True
    found = {d["cause"]: d for d in doc["diagnosis"]}
    assert "launched with --force" in found["gpus_busy_at_launch"]["summary"]
    agent.data("stop", "--grace", "1")


def test_launch_refuses_on_a_failing_doctor_check_unless_forced(tmp_path: Path, tmux_socket: str) -> None:
    """A nearly full disk under the root (a real 64 MiB tmpfs): the launch answers doctor's
    own ``disk-free`` row as its error and creates nothing; --force-gpus (deploy --force)
    launches anyway and the status says it was forced."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        agent = Agent(small / "root", tmux_socket)
        spec = json.dumps({"name": "disk", "command": ["sleep", "60"]})
        refused = agent.reply("launch", "--spec-json", spec)
        assert refused["error"]["type"] == "PreflightFailed", refused
        row = refused["error"]["fields"]["row"]
        assert (row["name"], row["status"]) == ("disk-free", "fail")
        assert refused["error"]["message"].startswith("doctor check disk-free failed: less than 2.0 GiB free")
        assert "opsctl cache prune" in row["fix"] and row["fix"] in refused["error"]["message"]
        assert not (agent.root / "jobs").exists() or not jobs.list_job_ids(str(agent.root))
        doc = agent.data("launch", "--spec-json", spec, "--force-gpus")
        assert doc["preflight"]["forced"] is True
        assert [r["status"] for r in doc["preflight"]["rows"] if r["name"] == "disk-free"] == ["fail"]
        agent.data("stop", "--grace", "1")
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_status_read_between_the_exit_record_and_the_final_status_carries_the_ends_evidence(
        tmp_path: Path) -> None:
    """The wrapper writes the exit record, then status.json with the end's evidence (the
    leftovers it reaped, why it ended). A status read in between must not report the end from
    the exit record with stale evidence: it waits for the final status.json while the wrapper
    lives."""
    root, job_id = str(tmp_path), "j-race"
    path = Path(jobs.job_dir(root, job_id))
    path.mkdir(parents=True)
    # a live "wrapper": its pid, start time and a command line naming the job dir
    wrapper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", str(path)])
    try:
        ticks = jobs.start_ticks(wrapper.pid)
        (path / jobs.PID).write_text(json.dumps({
            "pid": 2**22 + 7, "pgid": 2**22 + 7, "start_ticks": 1,
            "wrapper_pid": wrapper.pid, "wrapper_start_ticks": ticks}))
        (path / jobs.STATUS).write_text(json.dumps({"state": "RUNNING", "evidence": []}))
        (path / jobs.EXIT_CODE).write_text(json.dumps({"exit_code": 0, "signal": None}))
        final = {"state": "SUCCEEDED", "exit_code": 0,
                 "evidence": ["killed 3 leftover process(es) of the job's group: [1, 2, 3]",
                              "exited with code 0"]}

        def write_final() -> None:
            time.sleep(0.3)  # scenario: the wrapper is still writing its final status
            tmp = path / (jobs.STATUS + ".tmp")
            tmp.write_text(json.dumps(final))
            os.replace(tmp, path / jobs.STATUS)

        writer = threading.Thread(target=write_final)
        writer.start()
        rec = jobs.load(root, job_id)
        writer.join()
        assert (rec.state.value, rec.evidence) == ("SUCCEEDED", final["evidence"])
    finally:
        wrapper.kill()
        wrapper.wait()


def test_status_after_the_exit_record_of_a_dead_wrapper_is_the_records(tmp_path: Path) -> None:
    root, job_id = str(tmp_path), "j-dead"
    path = Path(jobs.job_dir(root, job_id))
    path.mkdir(parents=True)
    (path / jobs.PID).write_text(json.dumps({"pid": 2**22 + 7, "start_ticks": 1,
                                             "wrapper_pid": 2**22 + 9, "wrapper_start_ticks": 1}))
    (path / jobs.STATUS).write_text(json.dumps({"state": "RUNNING", "evidence": ["before"]}))
    (path / jobs.EXIT_CODE).write_text(json.dumps({"exit_code": 3, "signal": None}))
    t0 = time.monotonic()
    rec = jobs.load(root, job_id)
    assert (rec.state.value, rec.evidence[:1]) == ("FAILED", ["before"])
    assert time.monotonic() - t0 < 0.5  # no wait: nobody will write the final status


@pytest.mark.slow
def test_the_wrapper_writes_its_runs_goodput_summary_where_the_job_is_told(agent: Agent) -> None:
    """No status is asked after the launch (a status writes the same file): a summary the job
    finds at OPSCTL_GOODPUT_FILE computed over 10 s after its start is the wrapper's own
    refresh, which comes 15 s after the start."""
    code = ("import json, os, time\n"
            "path, began = os.environ['OPSCTL_GOODPUT_FILE'], time.time()\n"
            "while time.time() < began + 40:\n"
            "    try:\n"
            "        doc = json.load(open(path))\n"
            "    except (OSError, ValueError):\n"
            "        doc = {'at': 0}\n"
            "    if doc['at'] > began + 10:\n"
            "        print('summary', doc['run_id'], doc['moment'], sorted(doc['summary']))\n"
            "        break\n"
            "    time.sleep(0.2)\n")
    began = time.time()
    doc = agent.launch(code)
    job_dir = Path(doc["output_log"]).parent
    _wait(lambda: (job_dir / jobs.EXIT_CODE).exists(), timeout=60)
    took = time.time() - began
    line = next(x for x in (job_dir / "output.log").read_text().splitlines()
                if x.startswith("summary "))
    assert line.startswith(f"summary {doc['job_id']} ['RUNNING', 1] ['causes', "), line
    assert took >= 15.0, took  # the first refresh waits for the first steps


def test_a_directory_opsctl_never_made_under_jobs_is_no_job_and_never_written_into(
        agent: Agent) -> None:
    """A user's own directory under ``jobs/`` (none of a job's records, older than a launch
    takes to write them): ``jobs`` lists it as damaged, not PENDING; ``stop`` of it is a
    one-line DamagedRecord and writes nothing into it."""
    first = agent.launch("print('one')")
    agent.wait_state(first["job_id"], "SUCCEEDED")
    mine = agent.root / "jobs" / "stuff"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    old = time.time() - jobs.PENDING_GRACE_S - 5
    os.utime(mine, (old, old))
    listing = agent.data("jobs")
    assert "stuff" not in [j["job_id"] for j in listing["jobs"]], listing
    assert any(d["path"].endswith("/stuff") and d["reason"] == jobs.NOT_A_JOB_DIR
               for d in listing["damaged"]), listing
    reply = agent.reply("stop", "--job", "stuff")
    assert not reply["ok"] and reply["error"]["type"] == "DamagedRecord", reply
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"], "nothing written into it"
