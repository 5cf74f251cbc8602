"""Stacks of every process of a job: one file per process, labelled by rank, summarized.

Real processes with the real sitehook; the parsing rules against dumps captured from a real
two-rank gloo deadlock (tests/fixtures/stacks/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import typing as t
from pathlib import Path

import pytest

from remote_payload import wire
from remote_payload.agent import stacks
from remote_payload.probes import stackdump
from tests.paths import FIXTURES, REPO
from tests.waiting import wait_for

FIX = FIXTURES / "stacks"
HOOK = REPO / "remote_payload" / "sitehook"


def frames(name: str) -> tuple[stackdump.Frame, ...]:
    (dump,) = stackdump.parse_dump(FIX.joinpath(name).read_text())
    return dump.threads[0].frames


def test_a_rank_blocked_in_a_collective_is_named_with_the_jobs_own_call_site() -> None:
    assert stacks.blocked_in(frames("gloo-deadlock-rank0.stacks")) == ("all_reduce", "dist.py:144")
    assert stacks.blocked_in(frames("gloo-deadlock-rank1.stacks")) == ("recv", "dist.py:217")


def test_a_thread_in_its_own_code_is_not_in_a_collective() -> None:
    own = (stackdump.Frame("/work/main/remote_payload/trainer/model.py", 81, "forward"),
           *frames("gloo-deadlock-rank0.stacks"))
    assert stacks.blocked_in(own) == (None, None)


def _proc(rank: int | None, collective: str | None, caller: str | None = None,
          role: str | None = None, where: str = "x.py:1 f") -> stacks.ProcessStacks:
    return stacks.ProcessStacks(pid=100 + (rank or 0), rank=rank, role=role, gpu=None, cmd="",
                                dump="", threads=1, where=where, collective=collective,
                                caller=caller)


def test_the_summary_says_whether_every_rank_waits_in_a_collective() -> None:
    both = [_proc(0, "broadcast_object_list", "train.py:184"), _proc(1, "new_group", "dist.py:86")]
    assert stacks.summary(both) == ("all ranks in collectives: rank 1 in new_group (dist.py:86), "
                                    "rank 0 in broadcast_object_list (train.py:184)")
    one = [_proc(0, None, where="graph.py:869 _engine_run_backward"), _proc(1, "recv", "dist.py:217")]
    assert stacks.summary(one) == ("1 of 2 ranks in collectives: rank 1 in recv (dist.py:217), "
                                   "rank 0 at graph.py:869 _engine_run_backward")


def test_helper_processes_are_left_out_of_the_summary() -> None:
    procs = [_proc(0, "all_reduce", "dist.py:144"), _proc(None, None, role="helper of rank 0")]
    assert stacks.summary(procs) == "in a collective: rank 0 in all_reduce (dist.py:144)"


# --- real processes -------------------------------------------------------------------

RANK_SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, threading, time
    from remote_payload import wire
    wire.announce_process(rank=RANK, role="drafter", gpu="3")
    def feature_worker():
        time.sleep(120)
    threading.Thread(target=feature_worker, name="features", daemon=True).start()
    # a helper below the rank (like inductor's compile workers): inherits RANK from the env
    helper = subprocess.Popen([sys.executable, "-c", "import time\\ndef helper_loop():\\n"
                               "    time.sleep(120)\\nhelper_loop()"], env={**os.environ, "RANK": "RANK"})
    print(helper.pid, flush=True)
    def main_loop():
        time.sleep(120)
    main_loop()
""")


@pytest.fixture
def job(tmp_path: Path) -> t.Iterator[tuple[Path, subprocess.Popen[str], int]]:
    env = {**os.environ, "PYTHONPATH": f"{HOOK}{os.pathsep}{REPO}", wire.ENV_JOB_DIR: str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-c", RANK_SCRIPT.replace("RANK", "2")], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    assert p.stdout is not None
    helper = int(p.stdout.readline())
    wait_for(lambda: all(Path(wire.proc_stacks_path(str(tmp_path), pid)).exists()
                         for pid in (p.pid, helper)),
             20, what="the sitehook's stacks files", interval=0.05)
    yield tmp_path, p, helper
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def test_every_process_dumps_into_its_own_file_and_is_labelled_by_its_rank(job) -> None:
    job_dir, proc, helper = job
    armed, unarmed = stacks.armed_pythons(proc.pid, None)
    assert sorted(armed) == sorted([proc.pid, helper]) and unarmed == []
    got = {p.pid: p for p in stacks.capture(str(job_dir), armed, timeout=10)}
    rank, worker = got[proc.pid], got[helper]
    assert (rank.rank, rank.role, rank.gpu, rank.threads) == (2, "drafter", "3", 2)
    assert "main_loop" in rank.dump and "feature_worker" in rank.dump
    assert "helper_loop" not in rank.dump, "dumps never mix"
    assert (worker.rank, worker.role) == (None, "helper of rank 2")
    assert "helper_loop" in worker.dump and "main_loop" not in worker.dump
    assert proc.poll() is None, "a dump does not stop the process"


def test_a_second_dump_returns_only_the_new_one(job) -> None:
    job_dir, proc, _ = job
    stacks.capture(str(job_dir), [proc.pid], timeout=10)
    (second,) = stacks.capture(str(job_dir), [proc.pid], timeout=10)
    assert second.dump.count("most recent call first") == 2  # two threads, one dump


def test_a_process_that_announced_itself_records_its_place(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(wire.ENV_JOB_DIR, str(tmp_path))
    wire.announce_process(rank=5, role="target", gpu="7")
    info = json.loads(Path(wire.proc_info_path(str(tmp_path), os.getpid())).read_text())
    assert info == {"pid": os.getpid(), "rank": 5, "role": "target", "gpu": "7"}
