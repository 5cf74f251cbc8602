"""The one way opsctl and the agent start a child and end it: the child in a session (and so a
process group) of its own, marked, read through pipes with a byte cap, and ended as a whole.

Why: a child killed alone leaves its own children behind. A hung ``nvidia-smi`` killed at its
deadline left the ``sleep`` processes it had started; a killed ``compileall`` primer left its
workers, which held the primer's lock so no later start primed that cache again; ``opsctl
forward`` ended by SIGTERM left its ``ssh -L`` listening. Here every child:

- starts in a new session (``setsid``), so its process group is exactly its tree, and a
  terminal's Ctrl-C reaches this process alone, which then ends the child's tree itself;
- carries :data:`MARKER` in its environment (kept across ``setsid`` and ``exec``), so a
  grandchild that moved to a session of its own is still found (a ``/proc`` scan) and ended;
- is ended by :meth:`Group.end`: SIGTERM to the group and every marked process, a grace of
  :data:`GRACE_S`, then SIGKILL (repeated while a marked fork loop still starts others),
  and reaped last: until then the child's number stays its group's, so the group signal
  never reaches a group a reused number names. A marked process is held by a pidfd while
  its marker is checked, so a number reused between the scan and the signal is never hit:
  nothing without the marker is signalled except the child's own unreaped group. A deadline,
  Ctrl-C, SIGTERM and SIGHUP all end it this way: :func:`end_all` ends every group still running, and
  :func:`install_signal_handlers` turns SIGTERM and SIGHUP into :class:`Terminated` after
  doing so.

``os.posix_spawnp`` and a ``poll`` loop, not ``subprocess``: the agent's ``status`` starts
``tmux capture-pane`` and ``nvidia-smi`` on every poll, and importing ``subprocess``
(selectors, locale, threading) was ~3 ms of the agent's ~20 ms start in the container
(docs/benchmarks.md). A child that needs a working directory is started by ``subprocess``
(``posix_spawn`` has no ``chdir`` before Python 3.13), with the same session and marker.

A child that must not outlive this process even when it is SIGKILLed (which runs no handler:
a local server, a port forward) is started with ``die_with_parent``: Linux's
``PR_SET_PDEATHSIG`` sends it SIGTERM when the thread that started it ends.

What this cannot reach: a process that left both the session and the environment marker
(``env -i setsid …``); the job wrapper's cgroup covers that for jobs
(``remote_payload/agent/jobstore.py``). ``opsctl exec``'s guard (``agent/execguard.py``) runs
the same rule in the container from its own text, since it runs before any payload exists.

Stdlib only, Python >= 3.10: the agent, the trainer and the CLI import it.
"""

from __future__ import annotations

import os
import select
import signal
import time
import typing as t

from remote_payload import limits

MARKER = "OPSCTL_PROCGROUP"
GRACE_S = 2.0
_READ_SIZE = 65536
# ``stdout``/``stderr``: one of these, or an open file descriptor >= 0 (the stream goes there)
PIPE = -1  #: read it (:meth:`Group.result`)
INHERIT = -2  #: this process's own
DEVNULL = -3

PR_SET_PDEATHSIG = 1  #: prctl(2)

_LIVE: dict[int, Group] = {}


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived; every child group was ended first. ``code`` is the exit
    status a shell gives for that signal (128 + n)."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum
        self.code = 128 + signum


class ChildTimeout(TimeoutError):
    """A child ran past its deadline; its tree was ended. ``finished``: what it printed."""

    def __init__(self, message: str, finished: Finished):
        super().__init__(message)
        self.finished = finished


class Finished(t.NamedTuple):
    rc: int  #: ``-N`` after signal N, as ``subprocess`` reports it
    out: bytes
    err: bytes
    out_dropped: int  #: bytes past the cap, read and dropped
    err_dropped: int


class Group:
    """``argv`` started now in a session of its own (found on PATH; stdin /dev/null).
    ``hand_over`` ({child fd: this process's fd}) gives the child one of this process's
    open files (a lock) under a fixed number. ``die_with_parent``: the child gets SIGTERM
    when the thread that started it ends, however it ends (Linux; start it from the main
    thread).

    Raises:
        OSError: it could not be started (as ``subprocess.Popen``).
    """

    def __init__(self, argv: t.Sequence[str], *, env: t.Mapping[str, str] | None = None,
                 cwd: str | None = None, stdout: int = PIPE, stderr: int = PIPE,
                 hand_over: t.Mapping[int, int] | None = None, die_with_parent: bool = False):
        self.argv = list(argv)
        self.token = f"{os.getpid()}-{time.monotonic_ns()}-{id(self)}"
        full = dict(os.environ if env is None else env)
        full[MARKER] = self.token
        self.returncode: int | None = None
        self.out: int | None = None
        self.err: int | None = None
        for how in (stdout, stderr):
            if how < DEVNULL:  # the spawn path would read it as INHERIT, the other refuse it
                raise ValueError(f"stdout/stderr {how}: not PIPE, INHERIT, DEVNULL or an fd >= 0")
        if die_with_parent:
            import threading

            if threading.current_thread() is not threading.main_thread():
                raise ValueError("die_with_parent from a thread: its child would end with the thread")
        if cwd is None and not die_with_parent:
            self.pid = self._spawn(full, stdout, stderr, hand_over or {})
        elif hand_over:
            raise ValueError("hand_over needs cwd None and no die_with_parent")
        else:
            self.pid = self._popen(full, cwd, stdout, stderr, die_with_parent)
        _LIVE[self.pid] = self

    def _spawn(self, env: dict[str, str], stdout: int, stderr: int,
               hand_over: t.Mapping[int, int]) -> int:
        opened: list[int] = []
        actions: list[tuple[int, int, int]] = []
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        opened.append(null)
        actions.append((os.POSIX_SPAWN_DUP2, null, 0))
        ends: dict[int, int] = {}
        for target, how in ((1, stdout), (2, stderr)):
            if how == PIPE:
                r, w = os.pipe()  # close-on-exec; dup2 onto 1 or 2 clears it in the child
                ends[target] = r
                opened.append(w)
                actions.append((os.POSIX_SPAWN_DUP2, w, target))
            elif how == DEVNULL:
                actions.append((os.POSIX_SPAWN_DUP2, null, target))
            elif how >= 0:
                if how <= 2:  # the child's 0, 1 and 2 are replaced in order: dup a copy above them
                    import fcntl

                    how = fcntl.fcntl(how, fcntl.F_DUPFD_CLOEXEC, 3)
                    opened.append(how)
                actions.append((os.POSIX_SPAWN_DUP2, how, target))
        for target, source in hand_over.items():  # dup2 clears close-on-exec on the copy
            actions.append((os.POSIX_SPAWN_DUP2, source, target))
        try:
            pid = os.posix_spawnp(self.argv[0], self.argv, env, file_actions=actions,
                                  setsid=True)
        except OSError:
            for fd in ends.values():
                os.close(fd)
            raise
        finally:
            for fd in opened:
                os.close(fd)
        self.out, self.err = ends.get(1), ends.get(2)
        return pid

    def _popen(self, env: dict[str, str], cwd: str | None, stdout: int, stderr: int,
               die_with_parent: bool) -> int:
        import subprocess

        def how(value: int) -> int | None:
            if value >= 0:
                return value
            return {PIPE: subprocess.PIPE, DEVNULL: subprocess.DEVNULL, INHERIT: None}[value]

        preexec = _death_signal_setter() if die_with_parent else None
        proc = subprocess.Popen(self.argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=how(stdout), stderr=how(stderr), start_new_session=True,
                                preexec_fn=preexec)
        self._proc = proc  # keeps the pipe objects (their fds are read below) alive
        self.out = os.dup(proc.stdout.fileno()) if proc.stdout else None
        self.err = os.dup(proc.stderr.fileno()) if proc.stderr else None
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        proc.returncode = 0  # reaped here, not by subprocess (its __del__ stays quiet)
        return proc.pid

    # --- state ---------------------------------------------------------------------------

    def poll(self) -> int | None:
        """The exit code once it ended (reaped), else None."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid == self.pid:
                self._reaped(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; waits at most ``timeout`` seconds (None: without end).

        Raises:
            TimeoutError: still running then (it keeps running).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"still running after {timeout:g} s")
            time.sleep(0.02)
        return t.cast(int, self.returncode)

    def send_signal(self, sig: int) -> None:
        """``sig`` to the child alone (not its group), while it is not yet reaped."""
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def _reaped(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)

    # --- reading ---------------------------------------------------------------------------

    def result(self, timeout: float, cap: int | None = None, grace: float = GRACE_S) -> Finished:
        """Its output (the first ``cap`` bytes of each stream; None: the child-output cap)
        and exit code, once it exited and closed both pipes. At ``timeout`` seconds from now
        its tree gets SIGTERM and ``grace`` seconds to finish what it prints (a report),
        then :meth:`end`. Anything that interrupts the wait (Ctrl-C, :class:`Terminated`)
        ends the group first.

        Raises:
            ChildTimeout: not finished in time (its tree was ended; ``.finished`` holds what
                it printed).
        """
        limit = limits.cap("CHILD_OUTPUT_BYTES") if cap is None else cap
        fds = [fd for fd in (self.out, self.err) if fd is not None]
        got = {fd: bytearray() for fd in fds}
        dropped = {fd: 0 for fd in fds}
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        reading = set(fds)
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not reading:
                    if not reading and self.poll() is not None:
                        break
                    if left > 0:  # pipes closed, the child not yet reaped
                        time.sleep(min(left, 0.01))
                        continue
                    if timed_out:
                        break
                    timed_out = True
                    self._signal_tree(signal.SIGTERM)
                    deadline = time.monotonic() + grace
                    continue
                for fd, _ in poller.poll(max(1, int(left * 1000))):
                    data = os.read(fd, _READ_SIZE)
                    if not data:  # EOF: every holder of the pipe closed it
                        poller.unregister(fd)
                        reading.discard(fd)
                        continue
                    room = max(0, limit - len(got[fd]))
                    got[fd] += data[:room]
                    dropped[fd] += len(data) - min(room, len(data))
            if timed_out:
                self.end(grace=0)
        except BaseException:
            self.end()
            raise
        finally:
            self._close_pipes()
        _LIVE.pop(self.pid, None)
        out_fd, err_fd = self.out, self.err
        done = Finished(self.returncode if self.returncode is not None else -signal.SIGKILL,
                        bytes(got[out_fd]) if out_fd is not None else b"",
                        bytes(got[err_fd]) if err_fd is not None else b"",
                        dropped[out_fd] if out_fd is not None else 0,
                        dropped[err_fd] if err_fd is not None else 0)
        if timed_out:
            raise ChildTimeout(f"still running after {timeout:g} s", done)
        return done

    def _close_pipes(self) -> None:
        for fd in (self.out, self.err):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    # --- ending ----------------------------------------------------------------------------

    def end(self, grace: float = GRACE_S) -> int | None:
        """End the whole tree: SIGTERM to its group and every marked process, ``grace``
        seconds for them to go, then SIGKILL (again, while a marked process is still
        starting others); the child is reaped last. Returns its exit code (None if it could
        not be reaped). Safe to call again.

        The child stays unreaped (a zombie) until its tree is gone: its number then stays
        its group's, so the group signal reaches its own group and never one a reused
        number names. Once reaped, only marked processes are signalled."""
        self._signal_tree(signal.SIGTERM)
        if not self._gone_within(grace):
            until = time.monotonic() + GRACE_S
            while True:
                self._signal_tree(signal.SIGKILL)
                if self._gone_within(0.2) or time.monotonic() >= until:
                    break
        if self.returncode is None:
            try:
                self._reaped(os.waitpid(self.pid, 0)[1])
            except ChildProcessError:
                pass
        _LIVE.pop(self.pid, None)
        return self.returncode

    def _exited(self) -> bool:
        """Whether the child exited, leaving it unreaped where the platform allows."""
        if self.returncode is not None:
            return True
        if not hasattr(os, "waitid"):
            return self.poll() is not None
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.poll() is not None
        return info is not None

    def _others(self) -> list[int]:
        """Live processes of the group or carrying the marker, this child excluded."""
        group = _in_group(self.pid) if self.returncode is None else set()
        return [p for p in marked(self.token) | group if p != self.pid]

    def _gone_within(self, seconds: float) -> bool:
        """Whether the child exited and nothing of its tree is left within ``seconds``."""
        until = time.monotonic() + seconds
        while True:
            if self._exited() and not self._others():
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(0.05)

    def _signal_tree(self, sig: int) -> None:
        """Send ``sig`` to the group (only while the child is unreaped: its number is then
        still its own) and to every process carrying this group's marker."""
        if self.returncode is None:
            try:
                os.killpg(self.pid, sig)
            except OSError:
                pass
        signal_marked(self.token, sig)


def _death_signal_setter() -> t.Callable[[], None] | None:
    """What the child runs between fork and exec so that it gets SIGTERM when its parent
    thread ends (None where there is no ``prctl``). Resolved here, in the parent: the child
    of a threaded process may only call what is already loaded.

    A parent that dies between the fork and the ``prctl`` sends no signal (the child was
    already reparented): the child then sees another parent and ends itself, as the signal
    would have ended it, rather than run on with no one to end it."""
    if os.uname().sysname != "Linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def set_death_signal() -> None:  # pragma: no cover - runs in the child
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(128 + signal.SIGTERM)

    return set_death_signal


def run(argv: t.Sequence[str], timeout: float, *, env: t.Mapping[str, str] | None = None,
        cwd: str | None = None, cap: int | None = None) -> Finished:
    """``argv`` to its end, its output capped (:meth:`Group.result`).

    Raises:
        OSError: it could not be started.
        TimeoutError: not done within ``timeout`` seconds (its whole tree was ended).
    """
    return Group(argv, env=env, cwd=cwd).result(timeout, cap)


def end_all() -> None:
    """End every group this process started that still runs (see :meth:`Group.end`)."""
    for group in list(_LIVE.values()):
        group.end()


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP end every child group, then raise :class:`Terminated` in the main
    thread (``finally`` blocks run; the caller exits with ``exc.code``). SIGINT stays
    Python's ``KeyboardInterrupt``; :meth:`Group.result` ends its group on it."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, terminate)


def terminate(signum: int, _frame: object) -> None:
    """The SIGTERM/SIGHUP handler: end every child group, then raise :class:`Terminated`."""
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut the clean-up
        signal.signal(sig, signal.SIG_IGN)
    end_all()
    raise Terminated(signum)


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def _in_group(pgid: int) -> set[int]:
    return {p for p in _pids() if (st := _stat(p)) is not None and st[2] == pgid
            and st[0] not in ("Z", "X")}


def marked(token: str) -> set[int]:
    """Live processes whose environment carries ``MARKER=token`` (readable ones: this user's)."""
    return {pid for pid in _pids() if pid != os.getpid() and _carries(pid, token) and _alive(pid)}


def _carries(pid: int, token: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARKER}={token}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def signal_marked(token: str, sig: int) -> None:
    """``sig`` to every process carrying ``MARKER=token``, and to no other: each is held by
    a pidfd before its environment is read, and signalled through that pidfd only if it was
    still alive after the read (a number reused between the scan and the signal names
    another process, which the pidfd never reaches). Without pidfds (Linux < 5.3), by
    number."""
    me = os.getpid()
    for pid in _pids():
        if pid == me or not _carries(pid, token):
            continue
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        except (AttributeError, OSError):  # no pidfds here
            try:
                os.kill(pid, sig)
            except OSError:
                pass
            continue
        try:
            if not _carries(pid, token):  # the number may have been reused before the open
                continue
            if select.select([fd], [], [], 0)[0]:  # it exited: the read may be another's
                continue
            signal.pidfd_send_signal(fd, sig)
        except OSError:
            pass
        finally:
            os.close(fd)
