"""Interactive commands: ``opsctl attach``, ``opsctl shell``, ``opsctl forward``, ``opsctl tensorboard``.

They hand the terminal (or a local port) to the OpenSSH client (``opsctl.ops.interactive``
says why), so they have no ``--json``: there is no report, only the session.
"""

from __future__ import annotations

import sys

import click

from opsctl.cli import params as clitypes
from opsctl.cli.app import job_argument, target_options
from opsctl.cli.command import OpsctlCommand


@click.command(cls=OpsctlCommand, examples=(
    "opsctl attach --host pve1 --ct 200",
    "opsctl attach a1b2c3 --host pve1 --ct 200",
))
@target_options
@job_argument
def attach(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None) -> None:
    """Open the job's tmux pane on this terminal; detach with Ctrl-b d (the job keeps running).

    Like `tmux attach`: what you type goes to the job (Ctrl-C too). Exits with tmux's code.
    """
    from opsctl.cli import render
    from opsctl.errors import ConfigError
    from opsctl.ops import interactive, jobs

    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # refused here: nothing is sent
        raise ConfigError("attach needs a terminal (stdin and stdout are not both one)",
                          hint="for the job's output without a terminal: opsctl logs --follow")
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        plan = interactive.attach_plan(tgt, job_id)
        render.console(stderr=True).print(render.plain(
            f"attaching to job {plan.job_id} ({plan.state}) on {tgt.label}; detach: Ctrl-b d",
            style="dim"))
        rc = interactive.run_tty(tgt, plan.argv)
    sys.exit(rc)


@click.command(cls=OpsctlCommand, examples=(
    "opsctl shell --host pve1 --ct 200",
))
@target_options
def shell(host: str | None, ctid: int | None, accept_new_host_key: bool) -> None:
    """A login shell (root) in the container; exits with the shell's exit code."""
    from opsctl.ops import interactive, jobs

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        rc = interactive.run_tty(tgt, interactive.shell_argv(tgt.host.direct))
    sys.exit(rc)


@click.command(cls=OpsctlCommand, examples=(
    "opsctl forward 8888 --host pve1 --ct 200",
    "opsctl forward 16006:6006 --host pve1 --ct 200",
))
@click.argument("ports", metavar="PORT[:REMOTE]")
@target_options
def forward(ports: str, host: str | None, ctid: int | None, accept_new_host_key: bool) -> None:
    """Forward 127.0.0.1:PORT here to REMOTE (default: PORT) in the container, until Ctrl-C.

    e.g. `opsctl forward 6006` for TensorBoard, then open http://127.0.0.1:6006/.
    """
    from opsctl.cli import render
    from opsctl.ops import interactive, jobs

    local, remote_port = interactive.parse_ports(ports)  # bad input fails before connecting
    err = render.console(stderr=True)

    def ready(address: str, why: str) -> None:
        err.print(render.plain(f"forwarding 127.0.0.1:{local} -> {tgt.label} {address}:{remote_port} "
                               f"({why}); Ctrl-C stops"))

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        try:
            rc = interactive.forward(tgt, local, remote_port, ready)
        except KeyboardInterrupt:
            err.print(render.plain("forward stopped"))
            return
    if rc != 0:
        from opsctl import errors

        raise errors.TransportError(f"{tgt.label}: the forward ended: ssh exit {rc}")


@click.command(cls=OpsctlCommand, examples=(
    "opsctl tensorboard --host pve1 --ct 200",
    "opsctl tensorboard a1b2c3 --host pve1 --ct 200 --port 16006 --refresh 60",
))
@target_options
@job_argument
@click.option("--port", type=clitypes.PORT, default=6006, show_default=True,
              help="Port on 127.0.0.1 (0: any free one).")
@click.option("--refresh", "refresh_s", type=clitypes.PULL_EVERY, default=30.0, show_default=True,
              help="Pull new event files this often while the job runs (s; 0: once).")
def tensorboard(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
                port: int, refresh_s: float) -> None:
    """Show the job's TensorBoard curves on 127.0.0.1 here, until Ctrl-C.

    The job's event files (written by the trainer's `--report-to tensorboard`) are pulled
    to this machine and served by a local TensorBoard; nothing runs in the container, and
    Ctrl-C (or SIGTERM/SIGHUP) leaves nothing running here. Needs tensorboard installed
    here (pip install 'opsctl[trackers]').
    """
    from opsctl.cli import render
    from opsctl.ops import jobs
    from opsctl.ops import tensorboard as tb

    tb.check_installed()  # before connecting
    tb.check_port(port)
    err = render.console(stderr=True)
    # SIGTERM/SIGHUP during the connection or the first pull end it as Ctrl-C does (the
    # pull's ssh/rsync are stopped, exit code "interrupted"), never by the default action
    with tb.stop_on_signals(), \
            jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        src = tb.locate(tgt, job_id)

        def ready(url: str) -> None:
            err.print(render.plain(f"TensorBoard of job {src.job_id} ({src.state}) on {url} "
                                   f"(event files from {tgt.label}:{src.remote_dir}); Ctrl-C stops"))

        tb.serve(tgt, src, port, refresh_s, ready,
                 lambda text: err.print(render.plain(text, style="dim")))
    err.print(render.plain("tensorboard stopped"))


#: This family's commands (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (attach, shell, forward, tensorboard)
