"""Loaded by every python of an opsctl job (its dir leads the job's PYTHONPATH).

It arms a stack-dump signal (``remote_payload.wire.STACKS_SIGNAL``, and ``SIGUSR1`` by
convention) with faulthandler, so ``opsctl stacks`` and the agent's hang check can see where
every thread of every process is without attaching a debugger. Inside an opsctl job each
process dumps into its own file, ``<job dir>/procs/<pid>.stacks``: eight ranks dumping into
one output pipe at once interleave into something no one can read. Outside a job (no
``OPSCTL_JOB_DIR``) dumps go to stderr. Then it hands over to whatever ``sitecustomize`` would
have loaded without us (Debian ships one). Nothing here may ever break the job: every failure
is swallowed.
"""

from __future__ import annotations

_dump_file = None  # kept open for the process's lifetime: faulthandler writes to its fd


def _dump_target():  # type: ignore[no-untyped-def]
    import os
    import sys

    from remote_payload import wire

    job_dir = os.environ.get(wire.ENV_JOB_DIR)
    if not job_dir:
        return sys.stderr
    path = wire.proc_stacks_path(job_dir, os.getpid())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return open(path, "a", encoding="utf-8")


def _register_stack_dumps() -> None:
    import faulthandler
    import os
    import signal

    from remote_payload import wire

    global _dump_file
    target = _dump_target()
    if target is not _dump_file and _dump_file is not None:
        _dump_file.close()
    _dump_file = target
    # only when nobody else claimed it (a job's own handler wins); after a fork the handler
    # is ours already and is re-pointed at the child's own file
    for signum in (signal.SIGUSR1, wire.STACKS_SIGNAL):
        if signal.getsignal(signum) in (signal.SIG_DFL, None) or _registered.get(signum):
            faulthandler.register(signum, file=target, all_threads=True, chain=False)
            _registered[signum] = True
    if not _registered.get("fork_hook"):
        os.register_at_fork(after_in_child=_after_fork)
        _registered["fork_hook"] = True


_registered: dict[object, bool] = {}


def _after_fork() -> None:
    try:
        _register_stack_dumps()
    except Exception:
        pass


def _chain_next_sitecustomize() -> None:
    """Import the sitecustomize that the rest of sys.path provides, if any."""
    import importlib
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.get(__name__)
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        sys.modules.pop(__name__, None)
        try:
            importlib.import_module("sitecustomize")
        except ModuleNotFoundError as exc:
            if exc.name != "sitecustomize":
                raise
    finally:
        sys.path[:] = saved
        if me is not None:
            sys.modules[__name__] = me


try:
    _register_stack_dumps()
except Exception:
    pass

try:
    _chain_next_sitecustomize()
except Exception as _exc:  # same wording as site.py uses for a broken sitecustomize
    try:
        import sys as _sys

        _sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                          f"{type(_exc).__name__}: {_exc}\n")
    except Exception:
        pass
