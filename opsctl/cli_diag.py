"""Diagnostic commands: ``opsctl probe compile-race`` and ``opsctl stacks``.

Registered on the main group by :mod:`opsctl.cli`. A probe that *finds* the race is
a successful diagnosis (exit 0); a probe that could not run is a failure (exit 25).
"""

from __future__ import annotations

import typing as t

import click

from opsctl import clitypes, errors
from opsctl.cli import OpsctlGroup, cli, json_option, target_options

STATUS_STYLE = {"ok": "green", "error": "bold red", "hang": "bold red", "crashed": "bold red"}


@cli.group(cls=OpsctlGroup)
def probe() -> None:
    """Probes that run in the container with its current torch build."""


@probe.command("compile-race")
@target_options
@click.option("--threads", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--timeout", "timeout_s", type=clitypes.SECONDS, default=120.0, show_default=True,
              help="Seconds per mode before it counts as a hang (stacks dumped first).")
@click.option("--backward/--no-backward", default=True, show_default=True,
              help="Also run the first backward (GPU only; CPU flex has no backward).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--modes", default="unguarded,guarded", show_default=True)
@json_option
def compile_race(host: str | None, ctid: int | None, accept_new_host_key: bool, threads: int,
                 timeout_s: float, backward: bool, device: str, modes: str, as_json: bool) -> None:
    """Do concurrent first torch.compile(flex_attention) calls from threads crash or hang?

    Runs unguarded and behind the payload's serialized_compile lock, each in its own
    process on a cold compile cache, and says which build is affected and what to do.
    """
    from opsctl import jobs, render

    n_modes = len([m for m in modes.split(",") if m.strip()])
    deadline = n_modes * (timeout_s + 15) + 60
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        tgt.agent.ensure_payload()
        err = render.console(stderr=True)
        if not as_json:
            err.print(f"probing {tgt.label}: {threads} threads, up to {timeout_s:g} s per mode "
                      f"({n_modes} modes)…")
        report = tgt.agent.call(
            "probe", "--threads", str(threads), "--timeout", f"{timeout_s:g}", "--device", device,
            "--backward" if backward else "--no-backward", "--modes", modes,
            "--deadline", f"{deadline:g}", timeout=deadline + 30)
    if as_json:
        render.print_json(report)
        click.get_current_context().meta["opsctl_json_done"] = True  # one document only
    else:
        render_probe(render.console(), tgt.label, report)
    if report.get("status") == "crashed":
        raise errors.RemoteCommandFailed(
            f"{tgt.label}: the probe did not finish: "
            f"{report.get('error') or report.get('verdict') or 'no report'}",
            log_path=report.get("raw_output"), hint="the raw output file has everything it printed")


def render_probe(con: t.Any, label: str, report: dict[str, t.Any]) -> None:
    from rich.table import Table

    from opsctl.render import plain

    env = report.get("env") or {}
    con.print(plain(f"compile-race probe on {label}: torch {env.get('torch', '?')} "
                   f"(CUDA {env.get('cuda') or '-'}, Triton {env.get('triton') or '-'}), "
                   f"device {env.get('device_name') or env.get('device') or '?'}", style="bold"))
    table = Table(box=None)
    for col in ("mode", "result", "elapsed", "FX flag after", "detail"):
        table.add_column(col)
    for name, mode in (report.get("modes") or {}).items():
        status = str(mode.get("status"))
        elapsed = mode.get("elapsed_s")
        detail = mode.get("error") or "; ".join(mode.get("errors") or [])[:160]
        if status == "hang" and mode.get("hang_stacks"):
            detail = "blocked in: " + "; ".join(
                f"{th.get('name', '?')}: {th.get('where', '?')}" for th in mode["hang_stacks"][:3])
        if status == "crashed" and mode.get("signal"):
            detail = f"died by {mode['signal']}: " + " | ".join((mode.get("stderr_tail") or [])[-2:])
        table.add_row(plain(name), plain(status, style=STATUS_STYLE.get(status, "")),
                      "-" if elapsed is None else f"{elapsed:.1f}s", plain(mode.get("fx_tracing_flag")),
                      plain(detail or ""))
    con.print(table)
    if report.get("verdict"):
        con.print(plain(report["verdict"], style="bold yellow" if report.get("affected") else "green"))
    if report.get("raw_output"):
        con.print(plain(f"raw output (in the container): {report['raw_output']}", style="dim"))


@cli.command()
@target_options
@click.option("--job", "job_id", type=clitypes.JOB_ID, default=None)
@click.option("--timeout", "timeout_s", type=clitypes.SECONDS, default=10.0, show_default=True,
              help="How long to wait for the dump to appear.")
@json_option
def stacks(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
           timeout_s: float, as_json: bool) -> None:
    """Every thread's Python stack of every process of the running job, rank by rank."""
    from opsctl import jobs, render

    args = ["--timeout", f"{timeout_s:g}"]
    if job_id:
        args += ["--job", job_id]
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        doc = tgt.agent.call("stacks", *args, timeout=timeout_s + 30)
    if as_json:
        render.print_json(doc)
        return
    render.stacks(render.console(), doc)
