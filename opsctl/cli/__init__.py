"""The command line (click only): one module per command family, rich views in :mod:`.render`.

The group is assembled here, explicitly, from each family's ``COMMANDS`` (nothing registers
itself as a side effect of an import). Adding a command: write it in its family's module and
list it in that module's ``COMMANDS``; its use case goes in ``opsctl/ops/``. A new family is
one more entry in :data:`FAMILY_MODULES`. ``tests/unit/test_cli_commands.py`` fails for a command
that is defined but not listed.

The group (``cli``) and ``FAMILIES`` are built on first use, not on import: :func:`main` first
offers the command line to :func:`opsctl.faststatus.entry.run`, which serves a plain
``status [--json] [--host H] [--ct N]`` without importing click or any family. Before even
that, :func:`main` lets the launch record start that status's ``ssh``
(:mod:`opsctl.faststatus.launchrecord`), so this module imports nothing at all (not ``typing``:
~4 ms of every start).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy reads it the same
if TYPE_CHECKING:
    import typing as t

#: The command families, in the order their commands are added.
FAMILY_MODULES = ("sandbox", "jobs", "queue", "interactive", "files", "diag", "torch", "hosts",
                  "view", "complete", "schema", "help")


def _assemble() -> tuple[t.Any, tuple[t.Any, ...]]:
    import importlib

    from opsctl.cli.app import cli

    families = tuple(importlib.import_module(f"opsctl.cli.{name}") for name in FAMILY_MODULES)
    if not cli.commands:
        for family in families:
            for command in family.COMMANDS:
                cli.add_command(command)
    return cli, families


def __getattr__(name: str) -> t.Any:
    if name in ("cli", "FAMILIES"):
        cli, families = _assemble()
        globals().update(cli=cli, FAMILIES=families)
        return cli if name == "cli" else families
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The console script; a Ctrl-C while it is still loading (before a command runs and
    reports its own interrupt) ends it with one line and the interrupted exit code, never a
    traceback of the import it cut short."""
    try:
        _main()
    except KeyboardInterrupt:
        import sys

        from opsctl.errors import INTERRUPTED

        sys.stderr.write("opsctl: interrupted while starting; nothing was done\n")
        raise SystemExit(INTERRUPTED) from None


def _main() -> None:
    import sys

    from opsctl.faststatus import trace

    trace.mark("start-up")
    from opsctl.faststatus import launchrecord

    early = launchrecord.launch(sys.argv[1:])  # first: its ssh runs while the rest loads
    if early is not None:
        trace.mark("ssh start (record)")
    from opsctl.faststatus import entry as statusonce

    if statusonce.run(sys.argv[1:], early):  # pragma: no cover - run() exits when it took it
        return
    if early is not None:
        early.discard()
    import os

    if os.environ.get("_OPSCTL_COMPLETE"):  # completion: stdout holds candidates only, and
        # nothing may land in the user's prompt (a known_hosts warning, a library's log line)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    cli, _ = _assemble()
    cli(prog_name="opsctl")


__all__ = ["FAMILIES", "FAMILY_MODULES", "cli", "main"]
