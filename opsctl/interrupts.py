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

The signal is remembered too (``_received``), because the exception can be lost where it
is raised: pydantic-core turns it into its own error when it lands while a schema is built or
a string is matched (a "SchemaError" traceback, or a reply "not a StatusDoc" that blames the
payload), ``compile()`` drops it while a module without bytecode is imported, a ``__del__``
or the interpreter's wait for threads at exit prints it as "Exception ignored". Wherever the
run then ends, it ends as the signal says: one line and its code (:func:`reraise_if_terminated`,
:func:`_unraisable`).
"""

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import types
    import typing as t

# Only os, signal, sys (imported by the interpreter itself) until the handlers are in place:
# the rest is imported where a handler needs it.


def install() -> None:
    """The handlers for the whole run: called first thing in ``main()``."""
    signal.signal(signal.SIGINT, _interrupted_before_commands)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminated)
    global _original_hook, _original_unraisable
    _original_hook = sys.excepthook
    sys.excepthook = _last_word
    _original_unraisable = sys.unraisablehook
    sys.unraisablehook = _unraisable


_original_hook = sys.excepthook
_original_unraisable = sys.unraisablehook
#: SIGTERM or SIGHUP, once :func:`_terminated` took it (None: neither arrived; only the console
#: script installs that handler, so a run in-process, as the tests' CLI runner, never sets it)
_received: int | None = None


def _terminated(signum: int, frame: types.FrameType | None) -> None:
    global _received
    _received = signum
    from remote_payload import procgroup

    procgroup.terminate(signum, frame)  # ends every child group, raises Terminated


def reraise_if_terminated(code: object) -> None:
    """On the way out with exit ``code`` (an error's, or 0): where SIGTERM or SIGHUP arrived and
    its :class:`~remote_payload.procgroup.Terminated` was lost or became another error on the
    way (see the module's docstring), raise it again, so the run ends as the signal says; a
    ``code`` that is already the signal's (a deploy saying what it launched) stays."""
    if _received is None:
        return
    from opsctl import errors
    from remote_payload import procgroup

    if code != errors.signal_exit_code(_received):
        raise procgroup.Terminated(_received) from None


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
    if _received is not None:  # the signal's exception became this one (pydantic-core's)
        _leave(_received, str(procgroup.Terminated(_received)))
    _original_hook(kind, value, tb)


def _unraisable(unraisable: t.Any) -> None:
    """Ctrl-C, SIGTERM or SIGHUP landing where Python can only print it and go on (a
    ``__del__``, the wait for threads at exit): the run ends there, as it would have."""
    from remote_payload import procgroup

    value = unraisable.exc_value
    if isinstance(value, KeyboardInterrupt):
        _leave(None, "interrupted")
    if isinstance(value, procgroup.Terminated):
        _leave(value.signum, str(value))
    _original_unraisable(unraisable)


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


def end_if_reader_gone(code: object) -> None:
    """On the way out with exit ``code``: where standard output's reader closed early, end as
    coreutils' ``cat`` does, killed by SIGPIPE (a shell shows 141), nothing on stderr; else
    return. Click answers a closed reader with exit 1 and a wrapped ``sys.stdout``; what is
    still buffered is flushed here, so a closed reader never surfaces at exit."""
    stdout = sys.stdout
    gone = type(stdout).__name__.lstrip("_") == "PacifyFlushWrapper" and code == 1
    if not gone:
        try:
            if stdout is not None:
                stdout.flush()
        except BrokenPipeError:
            gone = True
        except (OSError, ValueError):
            pass
    if gone:
        die_of_sigpipe()


def die_of_sigpipe() -> t.NoReturn:
    """Killed by SIGPIPE, quietly: every child group ended first, standard output pointed at
    /dev/null so no flush at exit fails on it."""
    from remote_payload import procgroup

    procgroup.end_all()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    os._exit(128 + signal.SIGPIPE)  # only where the signal could not end us
