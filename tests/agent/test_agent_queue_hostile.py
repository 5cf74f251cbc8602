"""The queue and the job store against records opsctl did not write, and a killed add, run
as the real agent (real tmux, real processes) under each test's own ``--root``.

Every reply must still be one JSON document of its wire shape; a record that is not opsctl's
is listed under ``damaged`` and left on disk exactly as it was, never read through a link,
never started, never removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import typing as t
import uuid
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from opsctl.remote.shapes import pydantic_view
from remote_payload import wire_shapes
from tests.agent.test_agent_queue import PY, Agent, gate, pytestmark, spec
from tests.waiting import wait_for

__all__ = ["pytestmark"]  # the same needs: Linux /proc and tmux
SHAPES = {"queue": wire_shapes.QueueDoc, "jobs": wire_shapes.JobListDoc}


@pytest.fixture(scope="module")
def socket() -> t.Iterator[str]:
    name = f"opsctl-test-hostile-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    yield name
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True, check=False)


@pytest.fixture
def agent(tmp_path: Path, socket: str) -> Agent:
    return Agent(tmp_path / "root", socket)


def _valid(verb: str, data: t.Any) -> t.Any:
    return TypeAdapter(pydantic_view(SHAPES[verb])).validate_python(data)


def _files(top: Path) -> dict[str, bytes | str]:
    """Every entry under ``top``: a file's bytes, a link's target, a FIFO's kind."""
    out: dict[str, bytes | str] = {}
    for p in sorted(top.rglob("*")):
        key = str(p.relative_to(top))
        if p.is_symlink():
            out[key] = f"link -> {os.readlink(p)}"
        elif p.is_fifo():
            out[key] = "fifo"
        elif p.is_file():
            out[key] = p.read_bytes()
    return out


def test_records_that_are_not_opsctls_are_listed_damaged_left_as_they_are_and_never_started(
        agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    agent.add(spec("real-40", gate(go)), spec("next-40", "print('next ran')"))
    jobs = agent.root / "jobs"
    secret = tmp_path / "shadow"
    secret.write_text('{"state": "QUEUED", "created_at": 1.0, "queue_rank": 0.5}')
    twin = jobs / "twin-40"  # its status is another job's, through a link
    twin.mkdir()
    (twin / "status.json").symlink_to("../next-40/status.json")
    (twin / "spec.json").write_bytes((jobs / "next-40" / "spec.json").read_bytes())
    shadow = jobs / "shadow-40"
    shadow.mkdir()
    (shadow / "status.json").symlink_to(secret)
    elsewhere = tmp_path / "elsewhere" / "away-40"  # a job dir that is a link
    elsewhere.mkdir(parents=True)
    (elsewhere / "status.json").write_text('{"state": "QUEUED", "created_at": 1.0}')
    (jobs / "away-40").symlink_to(elsewhere)
    bare = jobs / "bare-40"  # queued by hand, with no spec
    bare.mkdir()
    (bare / "status.json").write_text('{"state": "QUEUED", "created_at": 1.0, "queue_rank": 0.1}')
    fifo = jobs / "fifo-40"
    fifo.mkdir()
    os.mkfifo(fifo / "status.json")
    huge = jobs / "huge-40"
    huge.mkdir()
    (huge / "status.json").write_text('{"state": "QUEUED", "created_at": 1' + "0" * 400 + "}")
    (jobs / "gpu-slots.json").unlink()
    (jobs / "gpu-slots.json").symlink_to("/dev/zero")
    (jobs / ".queued").unlink()
    (jobs / ".queued").mkdir()  # the hint, as a directory
    before_jobs, before_elsewhere = _files(jobs), _files(tmp_path / "elsewhere")
    before_secret = secret.read_bytes()

    queue = _valid("queue", agent.data("queue"))
    listed = _valid("jobs", agent.data("jobs"))
    assert [r["job_id"] for r in queue["jobs"]] == ["next-40"]
    damaged = {Path(d["path"]).relative_to(jobs).parts[0] for d in queue["damaged"]}
    assert damaged == {"twin-40", "shadow-40", "away-40", "bare-40", "fifo-40", "huge-40"}
    assert {r["job_id"] for r in listed["jobs"]} == {"real-40", "next-40"}
    assert {Path(d["path"]).relative_to(jobs).parts[0] for d in listed["damaged"]} == damaged
    for job in ("shadow-40", "away-40", "huge-40"):
        reply = agent.reply("status", "--job", job)
        assert reply["error"]["type"] == "DamagedRecord", reply
    go.touch()
    agent.wait_state("next-40", "SUCCEEDED")
    assert "next ran" in (jobs / "next-40" / "output.log").read_text()
    agent.data("queue")
    after = _files(jobs)
    for name, content in before_jobs.items():  # every record opsctl did not write is kept
        if name.split("/")[0] not in ("real-40", "next-40", "current", ".queue.lock"):
            assert after.get(name) == content, name
    assert _files(tmp_path / "elsewhere") == before_elsewhere
    assert secret.read_bytes() == before_secret
    assert not (twin / "output.log").exists() and not (elsewhere / "launch.json").exists()


def test_an_add_killed_between_moving_its_jobs_in_queues_the_whole_pipeline(
        agent: Agent, tmp_path: Path) -> None:
    go = tmp_path / "go"
    agent.add(spec("block-41", gate(go)))
    steps = [spec(f"s{i}-41", "print('ran')", after=f"s{i - 1}-41" if i else None)
             for i in range(4)]
    # the real agent, SIGKILLed right after the first of its job dirs is moved into place
    kill_after_first_move = (
        "import os, signal, sys\n"
        "real = os.rename\n"
        "def rename(src, dst, **kw):\n"
        "    real(src, dst, **kw)\n"
        "    if '/.staging/' in str(src):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "os.rename = rename\n"
        "from remote_payload.agent.__main__ import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run(
        [PY, "-c", kill_after_first_move, "--root", str(agent.root), "--tmux-socket",
         agent.socket, "queue-add", "--specs-stdin", "--slots", "8"],
        input=json.dumps({"specs": steps}), capture_output=True, text=True, env=agent.env,
        timeout=60, check=False)
    assert proc.returncode == -9 and proc.stdout == ""
    jobs = agent.root / "jobs"
    assert (jobs / "s0-41").is_dir() and not (jobs / "s1-41").exists()  # killed half way
    queue = _valid("queue", agent.data("queue"))  # the next lock holder moves the rest in
    assert [r["job_id"] for r in queue["jobs"]] == [f"s{i}-41" for i in range(4)]
    assert not (jobs / ".staging").exists()
    go.touch()
    agent.wait_state("s3-41", "SUCCEEDED", timeout=60)
    assert all(agent.state(f"s{i}-41") == "SUCCEEDED" for i in range(4))


def test_an_empty_job_id_never_means_the_current_job(agent: Agent) -> None:
    agent.add(spec("cur-42"))
    agent.wait_state("cur-42", "SUCCEEDED")
    reply = agent.reply("queue-add", "--specs-stdin", "--slots", "8",
                        stdin=json.dumps({"specs": [spec("dep-42", after="")]}))
    assert reply["error"]["type"] == "QueueRefused" and "empty" in reply["error"]["message"]
    assert not (agent.root / "jobs" / "dep-42").exists()
    for args in (["queue-rm", "--job", ""], ["queue-move", "--job", "", "--after", "cur-42"],
                 ["queue-move", "--job", "cur-42", "--before", ""]):
        reply = agent.reply(*args)
        assert reply["error"]["type"] == "UsageError" and "empty" in reply["error"]["message"]
    assert agent.state("cur-42") == "SUCCEEDED"


def test_a_running_job_whose_status_is_cut_short_keeps_its_gpu_until_stop_ends_its_processes(
        agent: Agent, tmp_path: Path) -> None:
    """The attack: a RUNNING job's status.json is truncated. Its GPU slot must not go to the
    next queued job while its processes live, and ``stop`` must still end them."""
    go = tmp_path / "never"  # the gate never opens: only stop ends the first job
    pidfile = tmp_path / "first.pid"
    code = f"import os\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n{gate(go)}"
    out = agent.add(spec("held-50", code, gpus=[0]))
    assert out["started"] == ["held-50"]
    agent.wait_state("held-50", "RUNNING")
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 10, what="the job's pid"))
    status = agent.root / "jobs" / "held-50" / "status.json"
    status.write_bytes(status.read_bytes()[:17])  # cut short mid-document
    added = agent.add(spec("next-50", "print('ran beside it')", gpus=[0]))
    assert added["started"] == []  # GPU 0 is still used by held-50's process
    listed = agent.data("queue", "--slots", "8")
    assert {h["job_id"]: h["gpu_slots"] for h in listed["holders"]} == {"held-50": [0]}
    assert [d["path"] for d in listed["damaged"]] == [str(status)]
    assert [r["job_id"] for r in listed["jobs"]] == ["next-50"]
    assert os.path.exists(f"/proc/{pid}")

    stopped = agent.reply("stop", "--job", "held-50", "--grace", "2", "--kill-after", "2")
    wait_for(lambda: not _alive(pid), 10, what="held-50's process to end")
    if stopped["ok"]:  # the live wrapper wrote its record again: the end is backed by it
        assert stopped["data"]["state"] == "CANCELLED" and stopped["data"]["remaining_pids"] == []
    else:  # never a state the record cannot back: the error says what was ended
        err = stopped["error"]
        assert err["type"] == "DamagedRecord" and "none is left" in err["message"], err
    agent.wait_state("next-50", "SUCCEEDED")  # the slot is free once the process is gone


def test_stop_of_a_job_whose_records_are_all_damaged_still_ends_its_marked_processes(
        agent: Agent, tmp_path: Path) -> None:
    """No record parses (status and pid cut short, no wrapper): the job's processes are found
    by their ``OPSCTL_JOB_ID`` marker, ended, and the reply says so, never CANCELLED."""
    job = agent.root / "jobs" / "wreck-51"
    job.mkdir(parents=True)
    (job / "spec.json").write_text(json.dumps({"job_id": "wreck-51", "command": ["x"],
                                               "gpus": [1], "gpu_slots": [1]}))
    (job / "status.json").write_bytes(b'{"state": "RUNN')
    (job / "pid").write_bytes(b'{"pid": ')
    env = {**os.environ, "OPSCTL_JOB_ID": "wreck-51"}
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(300)"], env=env,
                            start_new_session=True)
    try:
        held = agent.data("queue", "--slots", "8")["holders"]
        assert {h["job_id"]: h["gpu_slots"] for h in held} == {"wreck-51": [1]}
        reply = agent.reply("stop", "--job", "wreck-51", "--grace", "1", "--kill-after", "1")
        assert not reply["ok"] and reply["error"]["type"] == "DamagedRecord", reply
        assert f"[{proc.pid}]" in reply["error"]["message"]
        assert "none is left" in reply["error"]["message"]
        assert proc.wait(timeout=10) != 0
        assert (job / "status.json").read_bytes() == b'{"state": "RUNN'  # left as it is
        assert agent.data("queue", "--slots", "8")["holders"] == []  # nothing holds GPU 1 now
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False
