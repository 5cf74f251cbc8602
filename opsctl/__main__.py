"""The ``opsctl`` console script and ``python -m opsctl``: the signal handlers first, then the
command line.

The handlers go in before :mod:`opsctl.cli` is imported (click, rich, pydantic and every
command family: ~0.1 s), so a Ctrl-C, SIGTERM or SIGHUP at any moment of a command is one
line and a documented exit code (:mod:`opsctl.interrupts`), never a traceback.
"""

from __future__ import annotations

from opsctl import interrupts


def main() -> None:
    interrupts.install()
    from opsctl.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()
