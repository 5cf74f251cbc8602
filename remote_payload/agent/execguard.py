"""What ``opsctl exec`` runs its command under in the container: ``python3 -S -c <this file>
DEADLINE|- ARGV...`` (sent as the ``-c`` text, so it needs no payload in the container).

Why not coreutils ``timeout`` (used before): it signals one process group, so a child that
left it (``setsid sleep 100 &``) survived the deadline *and* held the output pipe open, and
the client waited for its own, later deadline (11 s for ``--timeout 2``, the
``sleep`` left running). Here the command is a *tree*, found as ``stop`` finds a job's
processes (``remote_payload/agent/jobstore.py``): this process is a child subreaper (an
orphan anywhere below it is re-parented to it, so ``/proc``'s parent links still reach it),
and every process carries ``OPSCTL_EXEC_ID`` in its environment (which ``setsid`` keeps).

- At the deadline the whole tree gets SIGTERM, then SIGKILL after :data:`KILL_AFTER_S`;
  exit 124, like ``timeout``, so the client reports its deadline (exit 25).
- When the client goes away (the reader of ``opsctl exec … | head -c 10`` closed, Ctrl-C,
  a lost connection), stdout's pipe loses its reader: the tree is ended the same way.
- When the command exits, this exits with its status (128 + n for a signal, as a shell
  says) unless processes of the tree still hold the output open: those keep the client
  waiting anyway, so they stay part of the command until they exit or the deadline fires.
  A background process that let go of the output (a daemon) is left alone.

Stdlib only (python >= 3.10), and nothing from the payload but the shared ``/proc`` reader
(:mod:`remote_payload.procfs`, with the bounded reader and the caps it imports): opsctl sends
their text along with this file's (``opsctl/remote/command.py`` ``standalone``), so it runs
where no payload is installed.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from remote_payload import procfs

KILL_AFTER_S = 2.0
TIMEOUT_RC = 124
POLL_S = 0.1
MARKER = "OPSCTL_EXEC_ID"
PR_SET_CHILD_SUBREAPER = 36


def subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    except Exception:  # no ctypes: the environment marker still finds them
        pass


def stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid``, or None."""
    st = procfs.stat(pid)
    return None if st is None else (st.state, st.ppid)


def tree(me: int, marker: bytes) -> set[int]:
    """Live pids below ``me`` (parent links) or carrying ``marker`` in their environment."""
    parent: dict[int, int] = {}
    found: set[int] = set()
    for pid in procfs.pids():
        if pid == me:
            continue
        st = stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        parent[pid] = st[1]
        if procfs.carries(pid, marker):
            found.add(pid)
    for pid in parent:
        seen, p = set(), pid
        while p in parent and p not in seen:
            seen.add(p)
            p = parent[p]
            if p == me:
                found.add(pid)
                break
    return found


def holds(pid: int, outputs: set[tuple[int, int]]) -> bool:
    """Whether ``pid`` has one of ``outputs`` ((dev, ino) pairs) open."""
    return not procfs.open_files(pid).isdisjoint(outputs)


def reap(child: int, status: int | None) -> int | None:
    """Reap every exited child (orphans come here too); the command's status once it ended."""
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == child:
            status = st


def end_tree(me: int, child: int, marker: bytes) -> None:
    """SIGTERM, then SIGKILL, to the command's group and every process of its tree."""
    for sig, wait_s in ((signal.SIGTERM, KILL_AFTER_S), (signal.SIGKILL, KILL_AFTER_S)):
        try:
            os.killpg(child, sig)
        except OSError:
            pass
        for pid in tree(me, marker):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        until = time.monotonic() + wait_s
        while time.monotonic() < until:
            reap(child, None)
            if not tree(me, marker):
                return
            time.sleep(0.05)


def start(argv: list[str], marker: bytes) -> tuple[int | None, int]:
    """Fork and exec ``argv`` in its own process group: (pid, 0), or (None, exit code)."""
    r, w = os.pipe()  # close-on-exec: EOF at a successful exec, an errno if it failed
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setpgid(0, 0)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # python ignores these; exec keeps that
                signal.signal(sig, signal.SIG_DFL)
            os.environ[MARKER] = marker.split(b"=", 1)[1].decode()
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(w, str(exc.errno or 0).encode())
        except BaseException:
            pass
        os._exit(127)
    os.close(w)
    err = os.read(r, 64)
    os.close(r)
    if not err:
        return pid, 0
    os.waitpid(pid, 0)
    errno = int(err)
    sys.stderr.write(f"opsctl exec: failed to run command {argv[0]!r}: {os.strerror(errno)}\n")
    return None, 127 if errno == 2 else 126


def exit_code(status: int | None) -> int:
    if status is None:
        return 0
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main(args: list[str]) -> int:
    if len(args) < 2:
        sys.stderr.write("usage: execguard DEADLINE|- ARGV...\n")
        return 2
    deadline = None if args[0] == "-" else time.monotonic() + float(args[0])
    me = os.getpid()
    marker = f"{MARKER}={me}-{time.time_ns()}".encode()
    subreaper()
    got: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # lxc-attach or pct ended
        signal.signal(sig, lambda s, _f: got.append(s))
    child, rc = start(args[1:], marker)
    if child is None:
        return rc
    outputs: set[tuple[int, int]] = set()
    poller = select.poll()
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            outputs.add((st.st_dev, st.st_ino))
            poller.register(fd, 0)  # POLLERR/POLLHUP: the reader went away
        except OSError:
            pass
    status: int | None = None
    done_at: float | None = None
    checked = 0.0
    while True:
        status = reap(child, status)
        now = time.monotonic()
        if got or any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0)):
            end_tree(me, child, marker)
            return 128 + (got[0] if got else signal.SIGPIPE)
        if deadline is not None and now >= deadline:
            end_tree(me, child, marker)
            return TIMEOUT_RC
        if status is not None and done_at is None:
            done_at = now
        if done_at is not None and now - checked >= 0.2:
            checked = now
            if not any(holds(p, outputs) for p in tree(me, marker)):
                return exit_code(status)
        time.sleep(POLL_S if done_at is None else 0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
