"""The command line (click only): one module per command family, rich views in :mod:`.render`.

The group is assembled here, explicitly, from each family's ``COMMANDS`` (nothing registers
itself as a side effect of an import). Adding a command: write it in its family's module, as
an :class:`~opsctl.cli.command.OpsctlCommand` with ``examples=(...)`` and ``@target_options``
first, and list it in that module's ``COMMANDS``; its use case goes in ``opsctl/ops/``. A new family is
one more entry in :data:`FAMILIES`. ``tests/unit/test_cli_commands.py`` fails for a command
that is defined but not listed.
"""

from __future__ import annotations

import os

from opsctl.cli import (
    complete,
    diag,
    files,
    help,
    hosts,
    interactive,
    jobs,
    queue,
    sandbox,
    schema,
    torch,
    view,
)
from opsctl.cli.app import cli

#: The command families, in the order their commands are added.
FAMILIES = (sandbox, jobs, queue, interactive, files, diag, torch, hosts, view, complete, schema,
            help)

for _family in FAMILIES:
    for _command in _family.COMMANDS:
        cli.add_command(_command)


def main() -> None:
    """The command line (``opsctl.__main__.main``, the console script, installs the signal
    handlers first, before this package and its libraries are imported)."""
    if os.environ.get("_OPSCTL_COMPLETE"):  # completion: stdout holds candidates only, and
        # nothing may land in the user's prompt (a known_hosts warning, a library's log line)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    cli(prog_name="opsctl")


__all__ = ["FAMILIES", "cli", "main"]
