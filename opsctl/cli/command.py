"""The command class of every opsctl command: ``--help`` ends with real command lines.

A command is built with ``examples=(...)``: one to three whole command lines (``opsctl status
--host pve1 --ct 200 --json``) that ``--help`` prints last, under "Examples:", as gh and
kubectl do. ``tests/unit/test_cli_help.py`` fails on a command without examples and parses
every example, so an example with a misspelt option fails the tests. The CLI reference
(docs/cli.md) lists them from the same attribute (``docs/hooks/generated.py``).

This module imports nothing of opsctl, so :mod:`opsctl.cli.complete` (which :mod:`.app`
imports) can use it too.
"""

from __future__ import annotations

import typing as t

import click


class WithExamples(click.Command):
    """A command whose ``--help`` ends with an "Examples:" section of whole command lines."""

    def __init__(self, *args: t.Any, examples: t.Sequence[str] = (), **kwargs: t.Any) -> None:
        super().__init__(*args, **kwargs)
        self.examples: tuple[str, ...] = tuple(examples)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        if self.examples:
            with formatter.section("Examples"):
                for line in self.examples:  # written as is: a command line is never rewrapped
                    formatter.write(f"{'':>{formatter.current_indent}}{line}\n")


class OpsctlCommand(WithExamples):
    """Every opsctl command (``cls=OpsctlCommand``, or a group's ``.command``)."""
