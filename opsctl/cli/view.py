"""Commands that show a job as a picture: ``opsctl plot``, ``opsctl goodput`` and
``opsctl dashboard``.

Listed in :data:`COMMANDS` (assembled by :mod:`opsctl.cli`). Drawing lives in :mod:`opsctl.cli.plots`,
the web page in :mod:`opsctl.cli.dashboard`; both use the same operations as ``status``.
"""

from __future__ import annotations

import sys

import click

from opsctl.cli import params as clitypes
from opsctl.cli.app import job_argument, json_option, target_options
from opsctl.cli.command import OpsctlCommand


@click.command(cls=OpsctlCommand, examples=(
    "opsctl plot --host pve1 --ct 200",
    "opsctl plot a1b2c3 --host pve1 --ct 200 --metric loss,tok_s --since 6h --by step",
    "opsctl plot --host pve1 --ct 200 --png loss.png --json",
))
@target_options
@job_argument
@click.option("--metric", "metrics", default="loss,tok_s,gpu_util,mem", show_default=True,
              help="Comma-separated: loss, tok_s, gpu_util, mem, mfu, feature_wait_pct.")
@click.option("--since", default=None, help="Only the last part of the run, e.g. 30m, 6h, 2d.")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), default=None,
              help="Write the charts to this PNG file (matplotlib) instead of the terminal.")
@click.option("--width", type=clitypes.WIDTH, default=None,
              help="Chart width in characters (default: the terminal's).")
@click.option("--by", "by", type=click.Choice(["time", "step"]), default="time", show_default=True,
              help="The x axis: time since the start, or the trainer's step (the step events' "
                   "metrics only: the GPU samples have no step).")
@json_option
def plot(host: str | None, ctid: int | None, accept_new_host_key: bool,
         job_id: str | None, metrics: str, since: str | None, png_path: str | None,
         width: int | None, by: str, as_json: bool) -> None:
    """Charts of loss, tok/s, GPU utilisation and memory over the job's history.

    The curves end at the job's newest sample. A short job is drawn from its step events
    themselves; `--by step` draws the step events against their step. Vertical lines mark
    where the job recompiled (C), restarted from a checkpoint (R), logged an error (E),
    hung (H), was diagnosed (D) or ended (X). `--json` prints the history whole (both its
    time buckets and its step table) whatever `--by` says.
    """
    import shutil

    from opsctl.cli import plots, render
    from opsctl.ops import history, jobs

    names = plots.parse_metrics(metrics)  # bad input fails before any connection
    plots.check_axis(by, names)
    since_s = plots.parse_since(since)
    if png_path is not None and not as_json:
        plots.check_output_path(png_path)  # before anything is fetched
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        rep = history.fetch(tgt.agent, job_id, since_s)
    if as_json:
        render.print_json(rep)
        return
    con = render.console()
    title = f"job {rep['job_id']} on {tgt.label}: {rep['state']}"
    if png_path is not None:
        plots.write_png(rep["history"], names, png_path, title=render.safe(title), by=by)
        con.print(render.plain(f"{title}: charts written to {png_path}"))
        return
    con.print(render.plain(title, style="bold"))
    cols = width or max(40, min(shutil.get_terminal_size((100, 24)).columns, 160))
    sys.stdout.write(plots.terminal_charts(rep["history"], names, width=cols,
                                           color=sys.stdout.isatty(), by=by) + "\n")
    sys.stdout.flush()
    for entry in plots.legend(rep["history"]):
        con.print(render.plain(entry, style="dim"))


@click.command(cls=OpsctlCommand, examples=(
    "opsctl goodput --host pve1 --ct 200",
    "opsctl goodput dflash-20261203-101500-a1b2 --host pve1 --ct 200 --json",
    "opsctl goodput /opt/opsctl/runs/dflash-8gpu --host pve1 --ct 200 --png goodput.png",
))
@target_options
@click.argument("run", type=clitypes.RUN, required=False)
@click.option("--width", type=clitypes.WIDTH, default=None,
              help="Timeline width in characters (default: the terminal's).")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the timeline and the time per cause to this PNG file (matplotlib).")
@json_option
def goodput(host: str | None, ctid: int | None, accept_new_host_key: bool, run: str | None,
            width: int | None, png_path: str | None, as_json: bool) -> None:
    """Where a run's wall-clock time went: goodput, and the time lost by cause.

    RUN is a job of the run (id or unique prefix), its --run-id, or its out-dir; by default
    the current job's run. A run is every attempt and re-deploy that resumes one training
    (one out-dir, --resume), across job ids. Prints the time per cause, per attempt, and a
    timeline (docs/guide/goodput.md says how each cause is measured).
    """
    import shutil

    from opsctl.cli import plots, render
    from opsctl.ops import goodput as goodput_ops
    from opsctl.ops import jobs

    if png_path is not None:
        plots.check_output_path(png_path)  # before anything is fetched
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        rep = goodput_ops.fetch(tgt.agent, run)
    if png_path is not None:
        plots.write_goodput_png(rep, png_path,
                                title=render.safe(f"run {rep['run_id']} on {tgt.label}"))
    if as_json:
        render.print_json(rep)
        return
    cols = width or max(40, min(shutil.get_terminal_size((100, 24)).columns, 160))
    con = render.console()
    render.goodput_report(con, tgt.label, rep, width=cols)
    if png_path is not None:
        con.print(render.plain(f"timeline written to {png_path}", style="dim"))


@click.command(cls=OpsctlCommand, examples=(
    "opsctl dashboard",
    "opsctl dashboard --port 8765 --refresh 3",
))
@click.option("--port", type=clitypes.PORT, default=8765, show_default=True,
              help="Port on 127.0.0.1 (0: any free one).")
@click.option("--refresh", "refresh_s", type=clitypes.REFRESH, default=3.0, show_default=True,
              help="How often the page refreshes itself (s).")
@click.option("--lines", type=clitypes.COUNT, default=15, show_default=True,
              help="Pane lines shown per job.")
@click.option("--doctor-every", "doctor_every_s", type=clitypes.DOCTOR_EVERY, default=0.0,
              show_default=True,
              help="Run `opsctl doctor` (no torch matmul) on each container every this many "
                   "seconds and show its failing checks, also on /metrics (0: never; otherwise at "
                   "least 60).")
def dashboard(port: int, refresh_s: float, lines: int, doctor_every_s: float) -> None:
    """A read-only web page of every inventory host's containers and jobs, on 127.0.0.1.

    It binds to loopback only and so needs no login: only users of this machine can open
    it (reach it from elsewhere with `ssh -L 8765:127.0.0.1:8765`). `/metrics` serves the
    same snapshot in Prometheus' text format (docs/guide/prometheus.md: the series and
    example alerting rules).
    """
    from opsctl.cli import dashboard as dash

    try:
        server = dash.serve(port=port, refresh_s=refresh_s, lines=lines,
                            doctor_every_s=doctor_every_s)
    except OSError as exc:  # the port is taken (a dashboard already runs there) or refused
        from opsctl.errors import ConfigError

        raise ConfigError(f"dashboard: cannot listen on 127.0.0.1:{port}: "
                          f"{exc.strerror or exc}",
                          hint="a dashboard may run there already (open it), or pick another "
                               "--port (0: any free one)") from None
    click.echo(f"dashboard on {dash.url(server)} (read-only, loopback only; Ctrl-C stops)", err=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        server.app.close()


COMMANDS: tuple[click.Command, ...] = (plot, goodput, dashboard)
