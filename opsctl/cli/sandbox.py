"""``opsctl sandbox``: this machine as an emulated Proxmox host."""

from __future__ import annotations

import time

import click

from opsctl.cli import params as clitypes
from opsctl.cli.app import OpsctlGroup, as_dict, json_option


@click.group(cls=OpsctlGroup, examples=(
    "opsctl sandbox up",
    "opsctl sandbox status --json",
    "opsctl sandbox down",
))
def sandbox() -> None:
    """Make this machine an emulated Proxmox host (loopback sshd + real LXC + pct)."""


@sandbox.command("up", examples=(
    "opsctl sandbox up",
    "opsctl sandbox up --ct 200 --ct 201 --json",
))
@click.option("--ct", "ctids", type=clitypes.CTID, multiple=True, default=(200,), show_default=True,
              help="A container of the sandbox; repeat it for more than one.")
@json_option
def sandbox_up(ctids: tuple[int, ...], as_json: bool) -> None:
    """Start (or reuse) the sandbox and write its inventory entry `sandbox`."""
    from opsctl.cli import render
    from opsctl.sandbox import host as sb

    con = render.console(stderr=True)
    start = time.monotonic()
    if not as_json:
        con.print("bringing the sandbox up (first time: ~1 min to build the containers)…")
    info = sb.up(containers=ctids)
    doc = {**as_dict(info), "elapsed_s": round(time.monotonic() - start, 2)}
    if as_json:
        render.print_json(doc)
        return
    out = render.console()
    out.print(f"sandbox up in {doc['elapsed_s']:.1f}s: ssh {info.user}@{info.host} -p {info.port}, "
              f"containers {', '.join(map(str, info.containers))}")
    out.print(f"inventory host `sandbox` written; try: opsctl exec --host sandbox --ct "
              f"{info.containers[0]} -- uname -a")


@sandbox.command("down", examples=(
    "opsctl sandbox down",
))
def sandbox_down() -> None:
    """Stop the sandbox containers and sshd (keeps them for a fast `up`)."""
    from opsctl.sandbox import host as sb

    sb.down()
    click.echo("sandbox stopped")


@sandbox.command("destroy", examples=(
    "opsctl sandbox destroy",
))
def sandbox_destroy() -> None:
    """Remove the sandbox containers, keys and state."""
    from opsctl.sandbox import host as sb

    sb.destroy()
    click.echo("sandbox destroyed")


@sandbox.command("status", examples=(
    "opsctl sandbox status",
    "opsctl sandbox status --json",
))
@json_option
def sandbox_status(as_json: bool) -> None:
    """Show whether the sandbox's sshd and containers are running."""
    from opsctl.cli import render
    from opsctl.sandbox import host as sb

    st = sb.status()
    doc = {"set_up": False} if st is None else {
        "set_up": True, **as_dict(st.info), "sshd_running": st.sshd_running,
        "container_states": st.containers,
        "wanted_running": list(st.wanted_running), "healthy": st.healthy}
    if as_json:
        render.print_json(doc)
    elif st is None:
        click.echo("sandbox is not set up (opsctl sandbox up)")
    else:
        states = ", ".join(f"{c}: {s}" + ("" if c in st.wanted_running else " (not up's)")
                           for c, s in st.containers.items())
        click.echo(f"sandbox {'up' if st.healthy else 'DEGRADED'}: sshd "
                   f"{'running' if st.sshd_running else 'stopped'} on 127.0.0.1:{st.info.port}; {states}")


#: This family's commands, in ``opsctl --help`` order of appearance (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (sandbox,)
