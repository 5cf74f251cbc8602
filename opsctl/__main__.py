"""The ``opsctl`` console script and ``python -m opsctl``: the signal handlers first, then the
command line.

The handlers go in before :mod:`opsctl.cli` is imported (click, rich, pydantic and every
command family: ~0.1 s), so a Ctrl-C, SIGTERM or SIGHUP at any moment of a command is one
line and a documented exit code (:mod:`opsctl.interrupts`), never a traceback. A reader
that closed early (``opsctl … | head -1``) ends it as it ends ``cat``: killed by SIGPIPE,
quietly (:func:`opsctl.interrupts.end_if_reader_gone`), not click's exit 1 (a bug's code) or
Python's "Exception ignored" at exit.
"""

from __future__ import annotations

from opsctl import interrupts


def main() -> None:
    interrupts.install()
    from opsctl.cli import main as command_line

    try:
        command_line()
    except SystemExit as exc:
        interrupts.reraise_if_terminated(exc.code)
        interrupts.end_if_reader_gone(exc.code)
        raise
    interrupts.reraise_if_terminated(0)
    interrupts.end_if_reader_gone(0)


if __name__ == "__main__":
    main()
