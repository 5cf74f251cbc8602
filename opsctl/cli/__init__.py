"""The command line (click only): one module per command family, rich views in :mod:`.render`.

The group is assembled here, explicitly, from each family's ``COMMANDS`` (nothing registers
itself as a side effect of an import). Adding a command: write it in its family's module and
list it in that module's ``COMMANDS``; its use case goes in ``opsctl/ops/``. A new family is
one more entry in :data:`FAMILIES`. ``tests/test_cli_commands.py`` fails for a command that is
defined but not listed.
"""

from __future__ import annotations

from opsctl.cli import complete, diag, files, hosts, interactive, jobs, sandbox, torch, view
from opsctl.cli.app import cli

FAMILIES = (sandbox, jobs, interactive, files, diag, torch, hosts, view, complete)

for family in FAMILIES:
    for command in family.COMMANDS:
        cli.add_command(command)


def main() -> None:
    cli(prog_name="opsctl")


__all__ = ["FAMILIES", "cli", "main"]
