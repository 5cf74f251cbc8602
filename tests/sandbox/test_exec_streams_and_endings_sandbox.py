"""`opsctl exec`'s output and endings, through the real sandbox, direct and through
the connection multiplexer, as a user's shell runs it (a child process):

- 200 MB of output passes through in constant client memory;
- ``--timeout`` ends the whole remote tree (a ``setsid`` child too), on time;
- a reader that closes early ends opsctl quietly, as it ends ``cat``, and the remote command.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from opsctl import errors
from tests.waiting import wait_for

pytestmark = pytest.mark.sandbox

MB = 1_000_000
#: The client's peak RSS for any amount of output (it was 2x the output before: 1 GB for 500 MB).
MAX_RSS_MB = 150


def opsctl_exec(*argv: str, timeout: float | None = None) -> list[str]:
    return [sys.executable, "-m", "opsctl", "exec", "--host", "sandbox", "--ct", "200",
            *(["--timeout", f"{timeout:g}"] if timeout is not None else []), "--", *argv]


def container_ps() -> str:
    res = subprocess.run(opsctl_exec("ps", "-eo", "args"), capture_output=True, timeout=60)
    return res.stdout.decode()


def marker() -> str:
    return str(400000 + time.time_ns() % 100000)


# Linux carries a process's peak RSS across fork and exec (exec_mmap keeps the old mm's high
# water mark), so a child of this test process starts at the xdist worker's own peak (torch
# loaded by an earlier module: ~525 MB). A small launcher in between starts at its own size,
# and reports its child's peak from wait4.
_PEAK_OF = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_pid, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_exec_streams_in_constant_memory(via, tmp_path):
    size = 200 * MB
    peak_file = tmp_path / "peak-kib"
    proc = subprocess.Popen([sys.executable, "-c", _PEAK_OF, str(peak_file),
                             *opsctl_exec("head", "-c", str(size), "/dev/zero")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    got = 0
    while chunk := proc.stdout.read(1 << 20):
        assert not chunk.strip(b"\0"), "byte-exact: zeros only"
        got += len(chunk)
    stderr = proc.stderr.read()
    assert (proc.wait(), stderr) == (0, b"")
    assert got == size
    peak_mb = int(peak_file.read_text()) / 1024
    assert peak_mb < MAX_RSS_MB, f"peak RSS {peak_mb:.0f} MB"


def test_exec_timeout_ends_the_whole_remote_tree(via):
    start = time.monotonic()
    subprocess.run(opsctl_exec("true"), check=True, timeout=60)
    baseline = time.monotonic() - start  # this machine's cost of one exec, whatever its load
    m = marker()
    start = time.monotonic()
    res = subprocess.run(opsctl_exec("sh", "-c", f"setsid sleep {m} & sleep {m}", timeout=2),
                         capture_output=True, timeout=60)
    took = time.monotonic() - start
    assert res.returncode == errors.REMOTE_FAILED, res.stderr
    said = res.stderr.decode()
    for words in ("sandbox ct 200", f"sleep {m}", "2 s deadline"):
        assert words in said, said
    assert took < baseline + 2 + 3, f"{took:.1f} s for a 2 s deadline (one exec: {baseline:.1f} s)"
    assert f"sleep {m}" not in container_ps()


def test_exec_into_a_closed_pipe_is_quiet(via):
    m = marker()
    proc = subprocess.Popen(opsctl_exec("sh", "-c", f"setsid sleep {m} & while :; do echo {m}; done"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10)
    proc.stdout.close()  # the reader's choice, like `| head -c 10`
    assert proc.wait(timeout=30) == -signal.SIGPIPE  # as cat: a shell shows 141
    assert proc.stderr.read() == b""  # quietly: no traceback, no message
    wait_for(lambda: m not in container_ps(), 10)
    assert m not in container_ps(), "the remote command and its setsid child were ended"


def test_exec_interrupted_by_ctrl_c_ends_the_remote_tree_too(via):
    m = marker()
    proc = subprocess.Popen(opsctl_exec("sh", "-c", f"setsid sleep {m} & echo started; sleep {m}"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == errors.INTERRUPTED
    wait_for(lambda: m not in container_ps(), 10)
    assert m not in container_ps(), "the client went away: the guard ended the tree"
