"""Hosts, playbooks, connection multiplexers and host keys: the local side of targets."""

from __future__ import annotations

import click

from opsctl import errors
from opsctl.cli.app import OpsctlGroup, json_option
from opsctl.cli.command import OpsctlCommand


@click.command(cls=OpsctlCommand, examples=(
    "opsctl hosts",
    "opsctl hosts --check --json",
    "opsctl hosts --example",
))
@click.option("--check", is_flag=True, help="Also connect to each host and list its containers.")
@click.option("--example", is_flag=True,
              help="Print the example inventory file shipped with opsctl (never read as hosts); "
                   "copy it to ~/.opsctl/inventory/hosts.yaml and edit it.")
@json_option
def hosts(check: bool, example: bool, as_json: bool) -> None:
    """Hosts and containers in the inventory (reachability with --check).

    Hosts come from $OPSCTL_INVENTORY, ./inventory/ and ~/.opsctl/inventory/ only: a fresh
    install has none and contacts nothing."""
    from opsctl.cli import render

    if example:
        if check or as_json:
            raise errors.ConfigError("hosts --example prints a file: no --check or --json")
        from opsctl.config import paths

        click.echo(paths.EXAMPLE_INVENTORY.read_text(encoding="utf-8"), nl=False)
        return
    from opsctl.config import paths
    from opsctl.ops import hosts as hosts_ops

    rows = hosts_ops.list_hosts(check=check)
    if as_json:
        render.print_json({"hosts": [r.to_dict() for r in rows]})
        return
    if not rows:
        searched = ", ".join(str(d.path) for d in paths.inventory_search()) or "(none)"
        click.echo(f"no hosts: no inventory file defines one (searched {searched}); "
                   "`opsctl hosts --example` shows the format")
        return
    render.hosts(render.console(), rows)


@click.command(cls=OpsctlCommand, examples=(
    "opsctl playbooks",
    "opsctl playbooks --json",
))
@json_option
def playbooks(as_json: bool) -> None:
    """Playbooks by name, with where each was found (./playbooks, ~/.opsctl/playbooks, bundled).

    The first directory that has a name wins; later ones with the same name are shadowed.
    """
    from opsctl.cli import render
    from opsctl.config import paths
    from opsctl.config import playbook as playbook_mod

    found = playbook_mod.available()
    if as_json:
        render.print_json({"playbooks": [f.to_dict() for f in found],
                           "search_path": [{"origin": d.origin, "path": str(d.path)}
                                           for d in paths.playbook_dirs()]})
        return
    width = max((len(f.name) for f in found), default=4)
    for f in found:
        note = "" if f.active else "  (shadowed)"
        click.echo(f"{f.name:<{width}}  {f.origin:<7}  {f.path}{note}")


@click.group(cls=OpsctlGroup, examples=(
    "opsctl mux status",
    "opsctl mux stop",
))
def mux() -> None:
    """Connection multiplexers: one kept SSH connection per host (OPSCTL_MUX=0 disables)."""


@mux.command("status", examples=(
    "opsctl mux status --json",
))
@json_option
def mux_status(as_json: bool) -> None:
    """List the live multiplexers of this OPSCTL_HOME."""
    from opsctl.ops import hosts as hosts_ops

    rows = hosts_ops.list_muxes()
    if as_json:
        from opsctl.cli import render

        render.print_json({"muxes": rows})
        return
    if not rows:
        click.echo("no live multiplexer")
    for r in rows:
        click.echo(f"{r['host']} ({r['target']}): pid {r['pid']}, {r['calls']} calls, "
                   f"exits after {r['idle_s']:g} s idle")


@mux.command("stop", examples=(
    "opsctl mux stop",
))
def mux_stop() -> None:
    """Stop every live multiplexer (the next command connects directly)."""
    from opsctl.ops import hosts as hosts_ops

    stopped = hosts_ops.stop_muxes()
    click.echo(f"stopped {len(stopped)} multiplexer(s)")


@click.group(cls=OpsctlGroup, examples=(
    "opsctl host trust --host pve1",
))
def host() -> None:
    """Host keys and trust."""


@host.command("trust", examples=(
    "opsctl host trust --host pve1",
    "opsctl host trust --host 10.1.2.6 -y",
))
@click.option("--host", "host_name", required=True,
              help="Inventory name or address, e.g. pve1 or 10.1.2.6.")
@click.option("-y", "--yes", is_flag=True,
              help="Record the key without asking (needed without a terminal).")
def host_trust(host_name: str, yes: bool) -> None:
    """Show the host's key fingerprint and record it in known_hosts.

    Asks on a terminal; without one (a script, stdin from /dev/null) it records nothing
    and exits 2 unless -y/--yes.
    """
    from opsctl.cli.app import interactive
    from opsctl.ops import hosts as hosts_ops

    shown = hosts_ops.fetch_host_key(host_name)  # the one connection: shown == recorded
    click.echo(f"{host_name}: host key {shown.key.get_name()} {shown.fingerprint}")
    if shown.trusted:
        click.echo("already trusted")
        return
    if not yes:
        if not interactive():
            raise errors.ConfigError(f"{host_name}: key not recorded: no terminal to ask on",
                                     hint=f"check the fingerprint above, then: opsctl host trust "
                                          f"--host {host_name} --yes")
        try:
            answer = click.confirm("trust this key?", default=False, err=True)
        except click.Abort:  # Ctrl-C / Ctrl-D at the question: click would say "Aborted!"
            answer = False
        if not answer:
            raise errors.HostKeyError(f"{host_name}: key not trusted (nothing recorded)")
    hosts_ops.record(shown)
    click.echo("recorded in known_hosts")


#: This family's commands, in ``opsctl --help`` order of appearance (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (hosts, playbooks, mux, host)
