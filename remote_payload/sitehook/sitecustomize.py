"""Loaded by every python of an opsctl job (its dir leads the job's PYTHONPATH).

It makes ``SIGUSR1`` dump all threads' Python stacks to stderr (which the
wrapper records in ``output.log``), so ``opsctl stacks`` can tell a hang from
slow progress without attaching a debugger. Then it hands over to whatever
``sitecustomize`` would have loaded without us (Debian ships one). Nothing
here may ever break the job: every failure is swallowed.
"""

from __future__ import annotations

import signal as _signal

#: Keep equal to ``remote_payload.agent.verbs_jobs.STACKS_SIGNAL``.
STACKS_SIGNAL = _signal.SIGRTMIN + 7


def _register_stack_dumps() -> None:
    import faulthandler
    import signal

    # only when nobody else claimed it (a job's own handler wins). SIGUSR1 is the documented
    # convention; a private real-time signal is the one `opsctl stacks` prefers, because
    # native libraries loaded later may take SIGUSR1 over (seen on an H200 with CUDA torch:
    # SIGUSR1 stayed "caught" but no dump came) and nothing else uses this one.
    for signum in (signal.SIGUSR1, STACKS_SIGNAL):
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            faulthandler.register(signum, all_threads=True, chain=False)


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
