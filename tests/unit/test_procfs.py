"""The one ``/proc`` reader (``remote_payload/procfs.py``): a process chooses its own
``comm`` (spaces, parentheses, newlines), and the stat fields after it still come out right;
anything that does not parse is no process, never a traceback; every read is bounded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload import procfs
from tests.waiting import wait_for

#: what ``comm`` may hold: any byte but NUL, at most 16 bytes (TASK_COMM_LEN) and, to be
#: generous, longer
COMM = st.binary(max_size=64).map(lambda b: b.replace(b"\0", b"?"))
NUMBER = st.integers(min_value=0, max_value=2**63)
STATE = st.sampled_from(list("RSDZTtXIWPK"))


def stat_line(pid: int, comm: bytes, state: str, ppid: int, pgrp: int, start: int) -> bytes:
    # fields 4..52 of proc(5): ppid pgrp session tty_nr tpgid flags ... starttime (22) ...
    rest = [ppid, pgrp, 7, 0, -1, 4194560, *range(100, 112), start, *range(200, 230)]
    return (f"{pid} (".encode() + comm + f") {state} ".encode()
            + " ".join(str(n) for n in rest).encode() + b"\n")


@settings(max_examples=300, deadline=None)
@given(COMM, STATE, NUMBER, NUMBER, NUMBER)
def test_the_fields_after_any_comm_are_the_kernels(comm, state, ppid, pgrp, start):
    got = procfs.parse_stat(stat_line(4242, comm, state, ppid, pgrp, start))
    assert got == procfs.Stat(state, ppid, pgrp, start)


@pytest.mark.parametrize("comm", [b") R 1 1", b"a b c", b"((()))", b"x\n) Z 9 9 9", b")",
                                  b"", b"\xff\xfe)"])
def test_a_comm_that_imitates_the_fields_does_not_move_them(comm):
    got = procfs.parse_stat(stat_line(1, comm, "S", 77, 78, 79))
    assert (got.state, got.ppid, got.pgrp, got.start_ticks) == ("S", 77, 78, 79)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_parse_or_are_a_value_error_never_another_exception(data):
    try:
        procfs.parse_stat(data)
    except ValueError:
        pass


@pytest.mark.parametrize("data", [b"", b"1 (x)", b"1 (x) R 1 2", b"1 x) R" + b" 1" * 30,
                                  b"1 (x) RR" + b" 1" * 30, b"1 (x) R -1" + b" 1" * 30,
                                  b"1 (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 1e9"])
def test_a_line_that_is_not_a_stat_line_is_refused(data):
    with pytest.raises(ValueError):
        procfs.parse_stat(data)


def test_this_process_reads_as_itself():
    me = procfs.stat(os.getpid())
    assert me is not None and me.ppid == os.getppid() and me.pgrp == os.getpgrp()
    assert procfs.alive(os.getpid()) and procfs.alive(os.getpid(), me.start_ticks)
    assert not procfs.alive(os.getpid(), me.start_ticks + 1)  # a reused pid is not this one
    assert procfs.stat("self") is not None
    assert os.getpid() in procfs.pids()
    assert procfs.cmdline(os.getpid())
    uptime = procfs.uptime()
    assert uptime is not None and uptime > 0


def test_a_process_that_names_itself_like_stat_fields_is_read_right():
    """A real process sets its comm to ``) Z 1 1`` with a newline (prctl PR_SET_NAME): its
    state and parent still come from the kernel's fields, so it is neither a zombie nor
    re-parented to init."""
    code = ("import ctypes, sys; ctypes.CDLL(None).prctl(15, b') Z 1 1\\n(x', 0, 0, 0); "
            "print('named', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "named"
        got = wait_for(lambda: procfs.stat(child.pid), what="the child's stat")
        assert got.ppid == os.getpid() and got.state != "Z"
        assert procfs.alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not procfs.alive(child.pid)


def test_gone_and_nonsense_pids_are_none_and_empty():
    for pid in (0, -1, 2**31 + 5):
        assert not procfs.alive(pid)
    assert procfs.stat(2**31 + 5) is None
    assert procfs.cmdline(2**31 + 5) == [] and procfs.environ(2**31 + 5) == {}
    assert not procfs.carries(2**31 + 5, "A=b")


def test_the_environment_marker_is_matched_exactly():
    env = {**os.environ, "OPSCTL_JOB_ID": "job-1"}
    # the child says it runs before it is read: Popen returns once the exec has closed its
    # close-on-exec pipe, a moment before the kernel sets the new image's environment, and a
    # loaded machine can read /proc/<pid>/environ inside that moment (empty)
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); "
                              "sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        assert procfs.carries(child.pid, "OPSCTL_JOB_ID=job-1")
        assert procfs.carries(child.pid, b"OPSCTL_JOB_ID=job-1")
        assert not procfs.carries(child.pid, "OPSCTL_JOB_ID=job-")
        assert procfs.environ(child.pid)["OPSCTL_JOB_ID"] == "job-1"
    finally:
        child.kill()
        child.wait()


def test_an_environment_read_is_cut_at_its_cap(monkeypatch):
    monkeypatch.setenv("OPSCTL_PROC_FILE_BYTES", "64")
    assert sum(len(e) + 1 for e in procfs.environ_entries(os.getpid())) <= 65
