"""Signals from the first line of the console script: Ctrl-C, SIGTERM and SIGHUP each end
every child opsctl started (:mod:`remote_payload.procgroup`) and leave one line and a
documented exit code, never a traceback.

Why a handler of its own before the commands run: a Ctrl-C in the first ~0.1 s of a command
(imports, click's parsing) raised ``KeyboardInterrupt`` where nothing caught it, and printed
a traceback. Until a command runs (:func:`commands_running`, called by the group's
``invoke``), Ctrl-C ends the process at once: nothing was done yet. From then on it is
Python's ``KeyboardInterrupt`` again, so each command says what it had already done
(``opsctl.cli.app.report_interrupt``). SIGTERM and SIGHUP raise
:class:`~remote_payload.procgroup.Terminated` at any time, after every child group was ended
(``forward``'s tunnel, a probe's ``ssh``); ``finally`` blocks run on the way out.
"""

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import types

# Only os, signal, sys (imported by the interpreter itself) until the handlers are in place:
# the rest is imported where a handler needs it.


def install() -> None:
    """The handlers for the whole run: called first thing in ``main()``."""
    signal.signal(signal.SIGINT, _interrupted_before_commands)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminated)
    global _original_hook
    _original_hook = sys.excepthook
    sys.excepthook = _last_word


_original_hook = sys.excepthook


def _terminated(signum: int, frame: types.FrameType | None) -> None:
    from remote_payload import procgroup

    procgroup.terminate(signum, frame)  # ends every child group, raises Terminated


def commands_running() -> None:
    """From here Ctrl-C raises ``KeyboardInterrupt`` (each command says what it did)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_before_commands:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted_before_commands(_signum: int, _frame: types.FrameType | None) -> None:
    _leave(None, "interrupted")


def _last_word(kind: type[BaseException], value: BaseException,
               tb: types.TracebackType | None) -> None:
    """Uncaught Ctrl-C or SIGTERM/SIGHUP: one line and the exit code; anything else is a bug
    and keeps its traceback."""
    from remote_payload import procgroup

    if isinstance(value, KeyboardInterrupt):
        _leave(None, "interrupted")
    if isinstance(value, procgroup.Terminated):
        _leave(value.signum, str(value))
    _original_hook(kind, value, tb)


def _leave(signum: int | None, words: str) -> None:
    """End every child group, say ``words``, exit with the code of ``signum`` (None: Ctrl-C)."""
    try:
        from opsctl import errors
        from remote_payload import procgroup

        procgroup.end_all()
        codes: dict[int | None, int] = {None: errors.INTERRUPTED, signal.SIGTERM: errors.TERMINATED,
                                        signal.SIGHUP: errors.HANGUP}
        code = codes.get(signum, 128 + (signum or signal.SIGINT))
    except BaseException:  # a second signal during these imports: still the same exit
        code = 128 + (signum or signal.SIGINT)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    try:
        sys.stderr.write(f"opsctl: {words}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)
