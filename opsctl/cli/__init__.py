"""The command line (click only): one module per command family, rich views in :mod:`.render`.

This is the one place that lists every command. Adding one: write the click command in the
family's module here (or a new one), the use case in ``opsctl/ops/``, and add it below.
"""

from __future__ import annotations

from opsctl.cli import diag, hosts, jobs, sandbox, torch
from opsctl.cli.app import cli

COMMANDS = (
    sandbox.sandbox,
    jobs.deploy, jobs.status, jobs.logs, jobs.stop, jobs.exec,
    diag.stacks, diag.probe,
    torch.swap_torch, torch.envs, torch.cache,
    hosts.hosts, hosts.playbooks, hosts.mux, hosts.host,
)
for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    cli(prog_name="opsctl")


__all__ = ["cli", "main"]
