"""The host's kernel log is filtered and capped on the host (remote_payload/gpufacts/kernlog.py
``CAP_SCRIPT``, caps in remote_payload/limits.py): a log of hundreds of MB of Xid lines costs
the client the cap, one 100 KB line is cut with the cut marked, and the log command's own
exit status still comes back. The script runs here under ``sh``, as on a Proxmox host."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload import limits
from remote_payload.gpufacts import kernlog

XID = ("2026-12-01T16:11:09.262206+00:00 host kernel: NVRM: Xid (PCI:0000:41:00): 79, pid=1234, "
       "name=python3, GPU has fallen off the bus.\n")


@pytest.fixture(scope="module")
def big_log(tmp_path_factory) -> Path:
    """~20 MB: noise, 150,000 Xid lines, one Xid line of 100 KB, noise."""
    path = tmp_path_factory.mktemp("klog") / "kern.log"
    with path.open("w") as f:
        f.write("systemd[1]: noise\n" * 1000)
        f.write(XID * 150_000)
        f.write("2026-12-01T16:11:10.000000+00:00 host kernel: NVRM: Xid (PCI:0000:41:00): 79, "
                + "x" * 100_000 + "\n")
        f.write("systemd[1]: more noise\n")
    return path


def _run(argv: list[str], **caps: int) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(kernlog.capped_argv(argv, **caps), capture_output=True, timeout=60,
                          check=False)


def test_a_20_mb_log_comes_back_as_its_newest_lines_within_the_byte_cap(big_log):
    started = time.monotonic()
    res = _run(["cat", str(big_log)], lines=1000, size=100_000, width=300)
    assert time.monotonic() - started < 20
    assert res.returncode == 0 and len(res.stdout) <= 100_000
    # the pipeline's own peak, measured in a fresh process (this one's RUSAGE_CHILDREN holds
    # every child an earlier test started): no stage held the log (~20 MB) many times
    probe = ("import resource, subprocess, sys\n"
             "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=False)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    rss_kib = int(subprocess.run(
        [sys.executable, "-c", probe, *kernlog.capped_argv(["cat", str(big_log)], lines=1000,
                                                            size=100_000, width=300)],
        capture_output=True, text=True, timeout=60, check=True).stdout)
    assert rss_kib < 200_000
    lines = res.stdout.decode().splitlines()
    assert len(lines) <= 1000
    head = "2026-12-01T16:11:10.000000+00:00 host kernel: NVRM: Xid (PCI:0000:41:00): 79, "
    assert lines[-1] == (head + "x" * 100_000)[:300] + limits.cut_marker(len(head) + 100_000 - 300)
    assert len(lines[-1].encode()) < 400
    events = kernlog.parse(res.stdout.decode())
    assert events and events[-1].xid == 79


def test_the_line_cap_keeps_the_newest_lines():
    res = _run(["printf", "NVRM: Xid a\\nNVRM: Xid b\\nNVRM: Xid c\\n"], lines=2, size=1000, width=300)
    assert res.stdout == b"NVRM: Xid b\nNVRM: Xid c\n"


def test_only_the_lines_the_parser_can_use_leave_the_host():
    res = _run(["printf", "noise\\nOut of memory: Killed process 42 (python3)\\nmore\\n"],
               lines=10, size=1000, width=300)
    assert res.stdout == b"Out of memory: Killed process 42 (python3)\n"


@pytest.mark.parametrize("rc", [0, 1, 3])
def test_the_log_commands_own_exit_status_comes_back(rc):
    res = _run(["sh", "-c", f"echo 'NVRM: Xid x'; echo oops >&2; exit {rc}"], lines=10, size=100,
               width=300)
    assert (res.returncode, res.stdout, res.stderr) == (rc, b"NVRM: Xid x\n", b"oops\n")


def test_a_missing_log_command_is_a_failure_not_an_empty_log():
    res = _run(["no-such-journalctl-xyz"], lines=10, size=100, width=300)
    assert res.returncode == 127 and res.stdout == b""


@settings(max_examples=40, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                    max_size=400))
def test_whatever_the_log_holds_the_cap_holds_and_the_parser_answers(text):
    data = ("NVRM: Xid " + text).encode("utf-8")
    res = subprocess.run(kernlog.capped_argv(["cat"], lines=5, size=200, width=50), input=data,
                         capture_output=True, timeout=30, check=False)
    assert len(res.stdout) <= 200
    kernlog.parse(res.stdout.decode("utf-8", "replace"))


def test_the_caps_can_be_lowered_through_the_environment(monkeypatch):
    monkeypatch.setenv("OPSCTL_KERNLOG_BYTES", "1234")
    assert limits.cap("KERNLOG_BYTES") == 1234
    monkeypatch.setenv("OPSCTL_KERNLOG_BYTES", "-5")
    assert limits.cap("KERNLOG_BYTES") == limits.KERNLOG_BYTES


def test_a_host_command_prints_at_most_the_cap_and_keeps_its_exit_status():
    res = subprocess.run(limits.head_argv(["sh", "-c", "echo hi; echo err >&2; exit 4"], 100),
                         capture_output=True, timeout=30, check=False)
    assert (res.returncode, res.stdout, res.stderr) == (4, b"hi\n", b"err\n")
    endless = subprocess.run(limits.head_argv(["cat", "/dev/zero"], 10), capture_output=True,
                             timeout=30, check=False)
    assert len(endless.stdout) == 10 and endless.returncode == 141  # cut off: SIGPIPE


@pytest.mark.parametrize("raw", ["0", "-1", "", "garbage", "1e9", "²", "١٢", "0x10", "12.5",
                                 "9" * 400])
def test_an_override_that_is_no_plain_number_or_is_absurd_never_removes_a_cap(monkeypatch, raw):
    monkeypatch.setenv("OPSCTL_CHILD_OUTPUT_BYTES", raw)
    got = limits.cap("CHILD_OUTPUT_BYTES")
    assert 1 <= got <= limits.CHILD_OUTPUT_BYTES * limits.CEILING_FACTOR


def test_a_huge_override_is_clamped_to_the_ceiling(monkeypatch):
    monkeypatch.setenv("OPSCTL_KERNLOG_BYTES", "99999999999999999999999")
    assert limits.cap("KERNLOG_BYTES") == limits.KERNLOG_BYTES * limits.CEILING_FACTOR
    monkeypatch.setenv("OPSCTL_KERNLOG_BYTES", "0")
    assert limits.cap("KERNLOG_BYTES") == 1


@given(st.text(max_size=40))
def test_any_override_text_gives_a_cap_within_its_bounds(raw):
    with pytest.MonkeyPatch.context() as mp:
        if "\0" in raw:
            mp.delenv("OPSCTL_KERNLOG_LINES", raising=False)
        else:
            mp.setenv("OPSCTL_KERNLOG_LINES", raw)
        assert 1 <= limits.cap("KERNLOG_LINES") <= limits.KERNLOG_LINES * limits.CEILING_FACTOR


@pytest.mark.parametrize("ending", [b"\n", b""])
def test_one_50_mb_line_is_cut_in_linear_time_with_its_exact_count(ending):
    """Debian's awk takes minutes over one 50 MB line; the host's cut never hands it one."""
    line = b"NVRM: Xid (PCI:0000:41:00): 79, " + b"A" * 50_000_000
    started = time.monotonic()
    res = subprocess.run(kernlog.capped_argv(["cat"], lines=5, size=4096, width=300),
                         input=line + ending, capture_output=True, timeout=60, check=False)
    assert time.monotonic() - started < 15
    assert res.stdout == line[:300] + f"…[cut {len(line) - 300} bytes]\n".encode()


@pytest.mark.parametrize("size", [4094, 4095, 4096, 4097, 8192, 8193])
def test_a_line_at_the_host_cuts_piece_edges_is_counted_exactly(size):
    line = (b"NVRM: Xid (PCI:0000:41:00): 79, " + b"B" * 9000)[:size]
    res = subprocess.run(kernlog.capped_argv(["cat"], lines=5, size=1 << 20, width=5000),
                         input=line + b"\n" + line[:40] + b"\n", capture_output=True, timeout=30,
                         check=False)
    first = line if size <= 5000 else line[:5000] + f"…[cut {size - 5000} bytes]".encode()
    assert res.stdout == first + b"\n" + line[:40] + b"\n"
