"""Every child opsctl or the agent starts is one process group that ends as a whole
(remote_payload/procgroup.py): at its deadline, and when this process gets Ctrl-C, SIGTERM or
SIGHUP. Real processes; each test marks its processes with a unique environment variable
(``PGTEST=<token>``, which every descendant inherits, ``setsid`` ones too) and scans /proc
for leftovers."""

from __future__ import annotations

import os
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from remote_payload import limits, procgroup
from tests import live_processes
from tests.paths import REPO
from tests.waiting import wait_for


def _with_token(token: str) -> set[int]:
    """Live processes whose environment carries ``PGTEST=<token>``."""
    return live_processes.with_env(f"PGTEST={token}")


def _tree_script() -> list[str]:
    """A child that ignores SIGTERM, with a grandchild in its group, one that ignores SIGTERM
    too and one that left for a session of its own (``setsid``)."""
    return ["sh", "-c", textwrap.dedent("""\
        trap '' TERM
        sleep 300 &
        sh -c "trap '' TERM; sleep 301" &
        setsid sleep 302 &
        echo started
        sleep 303
        """)]


@pytest.fixture
def token(monkeypatch) -> str:
    """A unique marker in this test's environment, so in every process it starts."""
    tok = uuid.uuid4().hex
    monkeypatch.setenv("PGTEST", tok)
    yield tok
    for pid in _with_token(tok):  # never leave a failed test's processes behind
        os.kill(pid, signal.SIGKILL)


def test_a_deadline_ends_the_whole_tree_setsid_and_stubborn_children_included(token):
    started = time.monotonic()
    with pytest.raises(procgroup.ChildTimeout) as caught:
        procgroup.run(_tree_script(), 1.0)
    assert caught.value.finished.out == b"started\n"  # what it printed before its end
    assert time.monotonic() - started < 1.0 + 2 * procgroup.GRACE_S + 2
    assert wait_for(lambda: not _with_token(token), 5) or not _with_token(token), \
        _with_token(token)


def test_ending_a_group_twice_is_harmless(token):
    group = procgroup.Group(_tree_script())
    wait_for(lambda: len(_with_token(token)) >= 4, 10, what="the tree")
    group.end(grace=0.2)
    assert group.end() is not None
    assert not _with_token(token)


def test_a_child_started_to_die_with_its_parent_ends_when_the_parent_is_sigkilled(token):
    """SIGKILL runs no handler: the child gets its SIGTERM from the kernel (PR_SET_PDEATHSIG)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""\
            import sys, time
            from remote_payload import procgroup
            group = procgroup.Group(["sleep", "300"], stdout=procgroup.DEVNULL,
                                    stderr=procgroup.DEVNULL, die_with_parent=True)
            print(group.pid, flush=True)
            time.sleep(300)
            """)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _with_token(token) >= {child}
        parent.kill()
        parent.wait(10)
        assert wait_for(lambda: not _with_token(token), 10, what="the child to end"), _with_token(token)
    finally:
        parent.kill()


def test_a_child_to_die_with_its_parent_is_refused_from_a_thread_which_would_end_it_early():
    import threading

    caught: list[BaseException] = []

    def start() -> None:
        try:
            procgroup.Group(["true"], die_with_parent=True)
        except ValueError as exc:
            caught.append(exc)

    worker = threading.Thread(target=start)
    worker.start()
    worker.join(10)
    assert caught and "from a thread" in str(caught[0])


def test_a_child_without_it_outlives_a_sigkilled_parent_which_is_why_it_exists(token):
    parent = subprocess.Popen(
        [sys.executable, "-c", "import time; from remote_payload import procgroup; "
         "g = procgroup.Group(['sleep', '300']); print(g.pid, flush=True); time.sleep(300)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait(10)
    time.sleep(0.5)  # scenario: the time a death signal would have taken to end it
    assert child in _with_token(token)  # the token fixture ends it


def test_a_childs_output_can_go_to_an_open_file_either_way_it_is_started(tmp_path):
    for die_with_parent in (False, True):
        log = tmp_path / f"log-{die_with_parent}"
        with log.open("wb") as f:
            group = procgroup.Group(["sh", "-c", "echo out; echo err >&2"], stdout=f.fileno(),
                                    stderr=f.fileno(), die_with_parent=die_with_parent)
            assert group.wait(10) == 0
        assert sorted(log.read_text().split()) == ["err", "out"]


def test_a_child_whose_parent_died_before_it_asked_for_the_death_signal_ends_at_once():
    """A parent SIGKILLed between the fork and the child's ``prctl`` sends no death signal
    (the child was reparented first): the child must end itself rather than run on."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # pragma: no cover - the parent that dies; it exits right after the fork
        try:
            me, setter = os.getpid(), procgroup._death_signal_setter()
            if os.fork() == 0:  # the child, between fork and exec, once its parent is gone
                try:
                    wait_for(lambda: os.getppid() != me, 10, interval=0.01)
                    assert setter is not None
                    setter()
                    os.write(w, b"ran on")
                finally:
                    os._exit(0)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    with os.fdopen(r, "rb") as f:
        assert f.read() == b""


@pytest.mark.parametrize("die_with_parent", [False, True])
def test_a_child_can_write_to_this_processs_stdout_and_stderr_as_numbers(capfd, die_with_parent):
    """fds 1 and 2 name this process's streams even though the child's own 1 and 2 are being
    replaced: stderr to this stdout while stdout is read, and the two swapped."""
    capfd.readouterr()
    done = procgroup.Group(["sh", "-c", "echo out; echo err >&2"], stdout=procgroup.PIPE,
                           stderr=1, die_with_parent=die_with_parent).result(10)
    assert (done.out, capfd.readouterr().out) == (b"out\n", "err\n")
    group = procgroup.Group(["sh", "-c", "echo out; echo err >&2"], stdout=2, stderr=1,
                            die_with_parent=die_with_parent)
    assert group.wait(10) == 0
    assert capfd.readouterr() == ("err\n", "out\n")


@pytest.mark.parametrize("die_with_parent", [False, True])
def test_a_stream_setting_that_is_neither_a_constant_nor_an_fd_is_refused(die_with_parent):
    with pytest.raises(ValueError, match="-7"):
        procgroup.Group(["true"], stdout=-7, die_with_parent=die_with_parent)


def test_output_past_the_cap_is_read_and_dropped_so_the_child_never_blocks():
    done = procgroup.run(["sh", "-c", "head -c 5000000 /dev/zero; echo end >&2"], 20, cap=1000)
    assert (done.rc, len(done.out), done.out_dropped, done.err) == (0, 1000, 4999000, b"end\n")


def test_a_program_that_is_not_there_is_an_oserror():
    with pytest.raises(OSError):
        procgroup.Group(["/no/such/program-xyz"])


_PARENT = textwrap.dedent("""\
    import sys, time
    from remote_payload import procgroup
    procgroup.install_signal_handlers()
    argv = sys.argv[2:]
    try:
        if sys.argv[1] == "late":
            print("waiting", flush=True)
            time.sleep(0.3)
        print("running", flush=True)
        procgroup.run(argv, 60)
    except procgroup.Terminated as exc:
        sys.exit(exc.code)
    except KeyboardInterrupt:
        sys.exit(130)
    """)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
@pytest.mark.parametrize("stage", ["before the child", "while it runs"])
def test_a_signal_to_the_parent_ends_every_child_tree(token, sig, stage):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT,
                               "late" if stage == "before the child" else "now",
                               *_tree_script()],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert parent.stdout is not None
    if stage == "before the child":
        assert parent.stdout.readline() == b"waiting\n"
    else:
        assert parent.stdout.readline() == b"running\n"
        wait_for(lambda: len(_with_token(token)) >= 4, 10, what="the tree")
    parent.send_signal(sig)
    _out, err = parent.communicate(timeout=30)
    if stage == "before the child" and parent.returncode == 0:  # pragma: no cover - a race
        pytest.fail("the signal came after the child ended")
    assert parent.returncode == 128 + sig, err
    assert b"Traceback" not in err
    assert wait_for(lambda: not _with_token(token), 5), _with_token(token)


# --- doctor's nvidia-smi --------------------------------------------------------------------


def _fake_smi(bin_dir: Path) -> None:
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(textwrap.dedent("""\
        #!/bin/sh
        for i in 1 2 3 4; do sleep 300 & done
        setsid sleep 301 &
        exec sleep 302
        """))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)


def test_a_hung_nvidia_smi_leaves_nothing_behind_in_doctor(token, tmp_path, monkeypatch):
    from remote_payload.agent import doctor

    _fake_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    rows, error = doctor.smi_gpus(1.0)  # doctor's own deadline bounds it
    assert rows == [] and error == "nvidia-smi did not answer within 1.0 s"
    assert wait_for(lambda: not _with_token(token), 5), _with_token(token)


def test_a_hung_nvidia_smi_leaves_nothing_behind_in_the_gpu_preflight(token, tmp_path,
                                                                      monkeypatch):
    from remote_payload.agent import gpus

    _fake_smi(tmp_path / "bin")
    monkeypatch.setattr(gpus, "SMI_TIMEOUT_S", 1.0)
    out = gpus._preflight_once(None, (), str(tmp_path / "bin" / "nvidia-smi"), True)
    assert out["error"] and "still running after 1 s" in out["error"]
    assert wait_for(lambda: not _with_token(token), 5), _with_token(token)


def test_a_hung_nvidia_smi_leaves_nothing_behind_in_the_status_query(token, tmp_path,
                                                                    monkeypatch):
    from remote_payload.agent import gpus

    _fake_smi(tmp_path / "bin")
    monkeypatch.setattr(gpus, "SMI_TIMEOUT_S", 1.0)
    assert gpus.GpuQuery(str(tmp_path / "bin" / "nvidia-smi")).result() == (
        [], "nvidia-smi timed out after 1s")
    assert wait_for(lambda: not _with_token(token), 5), _with_token(token)


# --- the console script's first moments -----------------------------------------------------


def _catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (``SigCgt`` in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask & (1 << (sig - 1)))


#: The console script (``opsctl = "opsctl.__main__:main"``): its handlers go in first.
CONSOLE_SCRIPT = "from opsctl.__main__ import main; main()"


def _start_opsctl(*words: str) -> subprocess.Popen[bytes]:
    """The console script, returned once its first line ran: from then on SIGTERM has
    opsctl's handler. Python's own start-up before it (``site``: ~0.2 s on a loaded test
    machine with editable installs) is outside opsctl; a signal there ends the interpreter as
    Python decides."""
    proc = subprocess.Popen([sys.executable, "-c", CONSOLE_SCRIPT, *words],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert wait_for(lambda: _catches(proc.pid, signal.SIGTERM) or proc.poll() is not None, 30,
                    interval=0.001)
    return proc


@pytest.mark.parametrize("delay_ms", [0, 20, 50, 100])
def test_ctrl_c_at_the_start_of_a_command_is_one_line_and_exit_130(delay_ms):
    proc = _start_opsctl("sandbox", "--help")
    time.sleep(delay_ms / 1000)  # scenario: the signal lands at this point of the start-up
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err.decode()
    if proc.returncode in (0, -signal.SIGINT):  # it finished first (or was in Python's own
        assert b"Usage:" in out  # teardown, which restores the default handlers): the help, whole
    else:  # before the command ran, or once it runs (the group's words)
        assert (proc.returncode, err) in ((130, b"opsctl: interrupted\n"), (
            130, b"interrupted (the remote job, if any, keeps running)\n")), (proc.returncode, err)


@pytest.mark.parametrize("delay_ms", [0, 50])
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_at_the_start_of_a_command_exit_with_their_codes(sig, code, delay_ms):
    proc = _start_opsctl("sandbox", "--help")
    time.sleep(delay_ms / 1000)  # scenario: the signal lands at this point of the start-up
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert b"Traceback" not in err, err.decode()
    if proc.returncode in (0, -sig):  # finished first, or in Python's own teardown
        assert b"Usage:" in out
    else:
        assert (proc.returncode, err) == (
            code, f"opsctl: terminated by {signal.Signals(sig).name}\n".encode())


#: ``opsctl hosts --json`` whose listing takes SIGTERM (sent to itself) inside a library that
#: loses the exception as {lost} says, then the console script; {lost} is one of LOSSES.
LOSSY_HOSTS = """
import os, signal, sys
from opsctl.ops import hosts
from opsctl import errors
from opsctl.__main__ import main

def lossy(**_):
    how = {lost!r}
    if how == "del":  # Python prints an exception in __del__ and goes on
        class Held:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)
        Held()
        return []
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
        return []
    except BaseException as exc:
        if how == "swallowed":  # compile() while a module without bytecode is imported
            return []
        if how == "opsctl-error":  # pydantic-core's validation error, read as a bad reply
            raise errors.ReplyShapeError(f"the reply is not a StatusDoc: {{type(exc).__name__}}") from None
        raise ValueError("Error building serializer") from exc  # pydantic-core's SchemaError

hosts.list_hosts = lossy
sys.argv[1:] = ["hosts", "--json"]
main()
"""
LOSSES = ("swallowed", "opsctl-error", "other-error", "del")


@pytest.mark.parametrize("lost", LOSSES)
def test_a_sigterm_a_library_loses_still_ends_the_command_as_sigterm(lost, tmp_path):
    """A signal's exception raised where a library swallows it or makes its own error of it
    (pydantic-core while it builds a schema or matches a string, ``compile()``, a
    ``__del__``): the run still ends in one line with the signal's code, never a traceback,
    a false "the reply is bad" or exit 0."""
    proc = subprocess.run([sys.executable, "-c", LOSSY_HOSTS.format(lost=lost)],
                          capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "OPSCTL_HOME": str(tmp_path), "OPSCTL_INVENTORY_DIRS": str(tmp_path)})
    assert (proc.returncode, proc.stderr) == (143, b"opsctl: terminated by SIGTERM\n"), \
        (proc.returncode, proc.stderr.decode(), proc.stdout.decode())


# --- evidence lines --------------------------------------------------------------------------


def test_a_100_kb_line_is_cut_and_the_cut_is_marked():
    line = "NVRM: Xid (PCI:0000:41:00): 79, " + "x" * 100_000
    shown = limits.cut_line(line)
    assert len(shown) < 400
    assert shown.startswith("NVRM: Xid (PCI:0000:41:00): 79, ")
    assert shown.endswith(f"…[cut {len(line) - limits.EVIDENCE_LINE_CHARS} bytes]")


def test_a_line_within_the_cap_is_shown_whole():
    assert limits.cut_line("x" * limits.EVIDENCE_LINE_CHARS) == "x" * limits.EVIDENCE_LINE_CHARS


def _unrelated_session_leader() -> subprocess.Popen[bytes]:
    """A process opsctl did not start: no marker, a session (so a group) of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGTEST", procgroup.MARKER)}
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)


def test_ending_a_reaped_group_never_signals_the_group_its_number_now_names(token):
    group = procgroup.Group(["true"])
    group.wait(10)
    other = _unrelated_session_leader()
    try:
        group.pid = other.pid  # the number reused: it now names a group opsctl never started
        group.end(grace=0.1)
        procgroup.end_all()
        assert other.poll() is None, "an unrelated process group was signalled"
    finally:
        other.kill()
        other.wait()


def test_a_process_without_the_marker_is_never_signalled_by_marker():
    other = _unrelated_session_leader()
    try:
        procgroup.signal_marked("no-such-token", signal.SIGKILL)
        procgroup.signal_marked("", signal.SIGKILL)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_child_whose_leader_exited_first_still_has_its_group_ended(token):
    """The child exits at once; its grandchild cleared its environment (no marker) but stayed
    in the group: the leader is kept unreaped while its group is signalled."""
    group = procgroup.Group(["sh", "-c", "env -i sh -c 'trap \"\" TERM; sleep 300' & exit 0"])
    grandchild = wait_for(lambda: procgroup._in_group(group.pid) - {group.pid}, 10,
                          what="the grandchild")
    group.end(grace=0.2)
    assert not any(procgroup._alive(p) for p in grandchild)


def test_a_marked_fork_loop_in_sessions_of_its_own_is_ended_whole(token):
    loop = ("trap '' TERM; i=0; while [ $i -lt 200 ]; do "
            "setsid sh -c \"trap '' TERM; sleep 300\" & i=$((i+1)); done; sleep 300")
    group = procgroup.Group(["sh", "-c", f"trap '' TERM; setsid sh -c {shlex.quote(loop)} & sleep 300"])
    wait_for(lambda: len(_with_token(token)) >= 20, 10, what="the loop")
    group.end(grace=0.2)
    assert wait_for(lambda: not _with_token(token), 5) or not _with_token(token), \
        len(_with_token(token))


@pytest.mark.parametrize("words", [["help", "exit-codes"], ["--help"], ["schema", "status"]])
def test_a_reader_that_closed_early_ends_opsctl_as_it_ends_cat(words, tmp_path):
    """``opsctl … | head -1``: killed by SIGPIPE, quietly (a shell shows 141); never click's
    exit 1 (a bug's code), a traceback or Python's "Exception ignored"."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before opsctl writes
    try:
        proc = subprocess.run([sys.executable, "-m", "opsctl", *words], stdout=write_end,
                              stderr=subprocess.PIPE, timeout=60, check=False,
                              env={**os.environ, "PYTHONPATH": str(REPO),
                                   "OPSCTL_HOME": str(tmp_path)})
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (-signal.SIGPIPE, b"")


def test_a_reader_that_read_everything_leaves_the_exit_code_alone(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "opsctl", "help", "exit-codes"],
                          capture_output=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OPSCTL_HOME": str(tmp_path)})
    assert proc.returncode == 0 and b"success" in proc.stdout


def test_a_rich_table_to_a_reader_that_closed_early_ends_as_cat_does():
    """What ``opsctl status | head -1`` and ``opsctl jobs | head -1`` print goes through
    rich, whose own answer to a closed reader is exit 1: opsctl's console dies of SIGPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-c", "from opsctl.cli import render\n"
                               "render.console().print('row ' * 1000)\n"
                               "raise SystemExit(7)"], stdout=write_end, stderr=subprocess.PIPE,
                              timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (-signal.SIGPIPE, b"")


def test_a_child_reads_what_it_is_given_on_stdin_and_nothing_of_this_terminal(token):
    assert procgroup.run(["cat"], 10, input=b"given\n").out == b"given\n"
    assert procgroup.run(["cat"], 10, input=b"here\n", cwd="/").out == b"here\n"  # the other path
    assert procgroup.run(["cat"], 10).out == b""  # /dev/null: it never waits on a terminal
    child = procgroup.Group(["cat"], stdin=procgroup.PIPE)
    os.write(child.inp, b"piped")
    os.close(child.inp)
    assert child.result(10).out == b"piped"
    with pytest.raises(ValueError):
        procgroup.Group(["cat"], stdin=procgroup.INHERIT)


def test_stderr_into_stdout_keeps_the_order_printed(token):
    done = procgroup.Group(["sh", "-c", "echo one; echo two >&2; echo three"],
                           stderr=procgroup.STDOUT).result(10)
    assert (done.out, done.err) == (b"one\ntwo\nthree\n", b"")
    done = procgroup.Group(["sh", "-c", "echo one; echo two >&2"], cwd="/",
                           stderr=procgroup.STDOUT).result(10)
    assert (done.out, done.err) == (b"one\ntwo\n", b"")
    with pytest.raises(ValueError):
        procgroup.Group(["true"], stdout=procgroup.STDOUT)
