"""Start a job attempt's process: own process group, die with the wrapper, join the job's cgroup.

``python3 -S -m remote_payload.agent.spawn CGROUP|- ARGV...`` sets the process up, then
``execvp``s ARGV (same pid). The wrapper starts a job's first attempt with these steps in
``Popen(preexec_fn=...)``; a restart happens while the wrapper runs threads (GPU sampler,
hang watch, notifier), where ``preexec_fn`` is unsafe (a lock another thread held at the
fork, e.g. the import lock, stays held in the child forever), so restarts go through this
small exec helper instead. ``-S``: no ``site``/sitecustomize before the exec.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CANNOT_START_RC = 127


def die_with_parent() -> None:
    """Own process group (``process_group=0`` needs 3.11; containers may have 3.10), and
    SIGKILL if the wrapper dies (best effort, Linux only)."""
    os.setpgid(0, 0)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def child_setup(cgroup: str | None) -> None:
    """:func:`die_with_parent`, a child subreaper (kept across the exec: an orphan anywhere
    below the job's first process is re-parented to it, so ``stop`` finds it by the tree,
    :func:`remote_payload.agent.jobstore.tree_members`, whatever session, cgroup or
    environment it moved to), then join the job's cgroup (before exec, so every process the
    job ever starts is in it; best effort)."""
    die_with_parent()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    except Exception:
        pass
    if cgroup is not None:
        try:
            fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError:
            pass


def cannot_start(program: str, exc: OSError) -> str:
    """The line the job's output gets when its program cannot be started."""
    return f"[opsctl] cannot start {program!r}: {exc}\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        sys.stderr.write("usage: python3 -S -m remote_payload.agent.spawn CGROUP|- ARGV...\n")
        return 2
    child_setup(None if args[0] == "-" else args[0])
    try:
        os.execvp(args[1], args[1:])
    except OSError as exc:
        sys.stdout.write(cannot_start(args[1], exc))
        sys.stdout.flush()
    return CANNOT_START_RC


if __name__ == "__main__":
    sys.exit(main())
