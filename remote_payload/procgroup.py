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

Output is read by :meth:`Group.result` (whole, capped) or :meth:`Group.stream` (line by line,
for pip's progress); both keep the deadline with ``poll``, so a silent child or a grandchild
holding the pipe is ended on time. A process found by number (a job's, by
:mod:`remote_payload.agent.jobstore`) is signalled through :func:`signal_if`, held by a pidfd.
Nothing else starts or signals a process: ``tests/unit/test_only_procgroup.py`` fails on a
spawn or a signal outside this module, except at the places it lists with their reasons.

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

from remote_payload import limits, procfs

MARKER = "OPSCTL_PROCGROUP"
GRACE_S = 2.0
_READ_SIZE = 65536
# ``stdout``/``stderr``: one of these, or an open file descriptor >= 0 (the stream goes there)
PIPE = -1  #: read it (:meth:`Group.result`); for ``stdin``: write it (:attr:`Group.inp`)
INHERIT = -2  #: this process's own
DEVNULL = -3
STDOUT = -4  #: ``stderr`` only: where ``stdout`` goes (one stream, in the order printed)
_LINE_CAP = 65536  #: :meth:`Group.stream`: a longer line is handed over in pieces this long

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
    """``argv`` started now in a session of its own (found on PATH). ``stdin``: /dev/null
    (DEVNULL), a pipe this process writes (PIPE: :attr:`inp`, closed by the caller) or an
    open file descriptor. ``hand_over`` ({child fd: this process's fd}) gives the child one of this process's
    open files (a lock) under a fixed number. ``die_with_parent``: the child gets SIGTERM
    when the thread that started it ends, however it ends (Linux; start it from the main
    thread).

    Raises:
        OSError: it could not be started (as ``subprocess.Popen``).
    """

    def __init__(self, argv: t.Sequence[str], *, env: t.Mapping[str, str] | None = None,
                 cwd: str | None = None, stdout: int = PIPE, stderr: int = PIPE,
                 stdin: int = DEVNULL, hand_over: t.Mapping[int, int] | None = None,
                 die_with_parent: bool = False):
        self.argv = list(argv)
        self.token = f"{os.getpid()}-{time.monotonic_ns()}-{id(self)}"
        full = dict(os.environ if env is None else env)
        full[MARKER] = self.token
        self.returncode: int | None = None
        self.out: int | None = None
        self.err: int | None = None
        self.inp: int | None = None  #: the write end of the child's stdin (``stdin=PIPE``)
        for how in (stdout, stderr if stderr != STDOUT else PIPE, stdin):
            if how < DEVNULL:  # the spawn path would read it as INHERIT, the other refuse it
                raise ValueError(f"stdin/stdout/stderr {how}: not PIPE, INHERIT, DEVNULL or an "
                                 "fd >= 0 (STDOUT: stderr only)")
        if stdin == INHERIT:
            raise ValueError("stdin INHERIT: a child never reads this process's terminal")
        if die_with_parent:
            import threading

            if threading.current_thread() is not threading.main_thread():
                raise ValueError("die_with_parent from a thread: its child would end with the thread")
        if cwd is None and not die_with_parent:
            self.pid = self._spawn(full, stdin, stdout, stderr, hand_over or {})
        elif hand_over:
            raise ValueError("hand_over needs cwd None and no die_with_parent")
        else:
            self.pid = self._popen(full, cwd, stdin, stdout, stderr, die_with_parent)
        _LIVE[self.pid] = self

    def _spawn(self, env: dict[str, str], stdin: int, stdout: int, stderr: int,
               hand_over: t.Mapping[int, int]) -> int:
        opened: list[int] = []
        actions: list[tuple[int, int, int]] = []
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        opened.append(null)
        ends: dict[int, int] = {}
        if stdin == PIPE:
            r, w = os.pipe()
            ends[0] = w
            opened.append(r)
            actions.append((os.POSIX_SPAWN_DUP2, r, 0))
        elif stdin >= 0:
            import fcntl

            copy = fcntl.fcntl(stdin, fcntl.F_DUPFD_CLOEXEC, 3)  # never one of 0, 1, 2
            opened.append(copy)
            actions.append((os.POSIX_SPAWN_DUP2, copy, 0))
        else:
            actions.append((os.POSIX_SPAWN_DUP2, null, 0))
        for target, how in ((1, stdout), (2, stderr)):
            if how == STDOUT:  # the actions run in order: 1 is already the child's stdout
                actions.append((os.POSIX_SPAWN_DUP2, 1, 2))
            elif how == PIPE:
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
        self.inp, self.out, self.err = ends.get(0), ends.get(1), ends.get(2)
        return pid

    def _popen(self, env: dict[str, str], cwd: str | None, stdin: int, stdout: int,
               stderr: int, die_with_parent: bool) -> int:
        import subprocess

        def how(value: int) -> int | None:
            if value >= 0:
                return value
            return {PIPE: subprocess.PIPE, DEVNULL: subprocess.DEVNULL, INHERIT: None,
                    STDOUT: subprocess.STDOUT}[value]

        preexec = _death_signal_setter() if die_with_parent else None
        proc = subprocess.Popen(self.argv, env=env, cwd=cwd, stdin=how(stdin),
                                stdout=how(stdout), stderr=how(stderr), start_new_session=True,
                                preexec_fn=preexec)
        self._proc = proc  # keeps the pipe objects (their fds are read below) alive
        self.inp = os.dup(proc.stdin.fileno()) if proc.stdin else None
        self.out = os.dup(proc.stdout.fileno()) if proc.stdout else None
        self.err = os.dup(proc.stderr.fileno()) if proc.stderr else None
        for f in (proc.stdin, proc.stdout, proc.stderr):
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

    def stream(self, timeout: float | None, on_line: t.Callable[[str], None], *,
               on_tick: t.Callable[[], None] | None = None, tick_s: float = 15.0,
               linger: float = GRACE_S, grace: float = GRACE_S) -> int:
        """Hand each line the child prints (stdout, then stderr if piped too; without its
        newline, decoded as UTF-8 with replacement; a line over 64 KiB in pieces) to
        ``on_line`` as it arrives, and ``on_tick`` every ``tick_s`` seconds (a heartbeat),
        until the child exited and closed its pipes. Returns its exit code; the whole tree
        is ended before this returns, so nothing it started runs on.

        The deadline holds whatever the child does: it is kept by ``poll`` with a timeout,
        never by a read that waits for the next line, so a silent child is ended on time.
        A grandchild that keeps a pipe open after the child exited gets ``linger`` seconds
        to finish printing, then the tree is ended (the child's exit code stands).

        Raises:
            ChildTimeout: not finished within ``timeout`` seconds (None: no deadline); its
                tree got SIGTERM, ``grace`` seconds, then SIGKILL (``grace`` 0: SIGKILL).
        """
        fds = [fd for fd in (self.out, self.err) if fd is not None]
        partial = {fd: bytearray() for fd in fds}
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        reading = set(fds)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        next_tick = start + tick_s if on_tick is not None else None
        exited_at: float | None = None
        timed_out = False

        def take(fd: int, data: bytes) -> None:
            buf = partial[fd]
            buf += data
            while True:
                cut = buf.find(b"\n")
                if cut < 0 and len(buf) < _LINE_CAP:
                    break
                end = cut if 0 <= cut < _LINE_CAP else _LINE_CAP
                piece = bytes(buf[:end])
                del buf[:end + 1 if end == cut else end]
                on_line(piece.decode("utf-8", "replace"))

        try:
            while True:
                now = time.monotonic()
                if next_tick is not None and on_tick is not None and now >= next_tick:
                    on_tick()
                    next_tick = now + tick_s
                if exited_at is None and self._exited():
                    exited_at = now
                if exited_at is not None and (not reading or now >= exited_at + linger):
                    break  # done; or what is left of its tree holds a pipe: ended below
                if deadline is not None and now >= deadline:
                    timed_out = True
                    break
                wake = [now + 0.1]  # the child's exit is seen within this
                if deadline is not None:
                    wake.append(deadline)
                if next_tick is not None:
                    wake.append(next_tick)
                if exited_at is not None:
                    wake.append(exited_at + linger)
                wait_ms = max(1, int((min(wake) - now) * 1000))
                if not reading:
                    time.sleep(wait_ms / 1000)
                    continue
                for fd, _ in poller.poll(wait_ms):
                    data = os.read(fd, _READ_SIZE)
                    if data:
                        take(fd, data)
                    else:  # EOF: every holder of the pipe closed it
                        poller.unregister(fd)
                        reading.discard(fd)
            self.end(grace=grace if timed_out else 0.2)
            for fd in reading:  # what the ended tree printed before it went (bounded: a
                for _ in range(16):  # process that left session and marker may hold it)
                    if not select.select([fd], [], [], 0)[0] or not (data := os.read(fd, _READ_SIZE)):
                        break
                    take(fd, data)
            for fd in fds:
                if partial[fd]:
                    on_line(bytes(partial[fd]).decode("utf-8", "replace"))
        except BaseException:
            self.end()
            raise
        finally:
            self._close_pipes()
        _LIVE.pop(self.pid, None)
        rc = self.returncode if self.returncode is not None else -signal.SIGKILL
        if timed_out:
            raise ChildTimeout(f"still running after {timeout:g} s", Finished(rc, b"", b"", 0, 0))
        return rc

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
        number names. Once reaped, only marked processes are signalled. ``grace`` 0: SIGKILL
        at once (a tree that had its chance, or one whose exit signal is evidence)."""
        if grace > 0:
            self._signal_tree(signal.SIGTERM)
        if grace <= 0 or not self._gone_within(grace):
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

    def exited(self) -> bool:
        """Whether the child exited; it stays unreaped where the platform allows, so its
        group can still be ended by number (:meth:`end`): wait on this, then end."""
        return self._exited()

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
        cwd: str | None = None, cap: int | None = None, input: bytes | None = None) -> Finished:
    """``argv`` to its end, its output capped (:meth:`Group.result`). ``input``: what it
    reads on stdin, from an unlinked temporary file (a pipe written while its output is read
    could fill both ways).

    Raises:
        OSError: it could not be started.
        TimeoutError: not done within ``timeout`` seconds (its whole tree was ended).
    """
    if input is None:
        return Group(argv, env=env, cwd=cwd).result(timeout, cap)
    import tempfile

    with tempfile.TemporaryFile() as feed:
        feed.write(input)
        feed.flush()
        feed.seek(0)
        return Group(argv, env=env, cwd=cwd, stdin=feed.fileno()).result(timeout, cap)


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
    """(state, ppid, pgrp) of ``pid``, or None (:func:`remote_payload.procfs.stat`)."""
    st = procfs.stat(pid)
    return None if st is None else (st.state, st.ppid, st.pgrp)


def _pids() -> list[int]:
    return procfs.pids()


def _in_group(pgid: int) -> set[int]:
    return {p for p in _pids() if (st := _stat(p)) is not None and st[2] == pgid
            and st[0] not in ("Z", "X")}


def marked(token: str) -> set[int]:
    """Live processes whose environment carries ``MARKER=token`` (readable ones: this user's)."""
    return {pid for pid in _pids() if pid != os.getpid() and _carries(pid, token) and _alive(pid)}


def _carries(pid: int, token: str) -> bool:
    return procfs.carries(pid, f"{MARKER}={token}")


def signal_marked(token: str, sig: int) -> None:
    """``sig`` to every process carrying ``MARKER=token``, and to no other
    (:func:`signal_if`)."""
    me = os.getpid()
    for pid in _pids():
        if pid != me and _carries(pid, token):
            signal_if(pid, sig, lambda p: _carries(p, token))


def signal_if(pid: int, sig: int, still: t.Callable[[int], bool]) -> bool:
    """``sig`` to ``pid`` if ``still(pid)`` holds while the process is held: it is held by a
    pidfd before ``still`` is asked again, and signalled through that pidfd only if it was
    alive after the check, so a number reused since the caller's scan names another process,
    which the pidfd never reaches. Without pidfds (Linux < 5.3), by number after the check.
    Returns whether the signal was sent.

    The one place a process is signalled by number: jobs (:mod:`remote_payload.agent.jobstore`)
    and child groups both end through it."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfds here
        if not still(pid):
            return False
        try:
            os.kill(pid, sig)
        except OSError:
            return False
        return True
    try:
        if not still(pid):  # the number may have been reused before the open
            return False
        if select.select([fd], [], [], 0)[0]:  # it exited: what was read may be another's
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
