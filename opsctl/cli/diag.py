"""Diagnostic commands: ``opsctl probe compile-race`` and ``opsctl stacks``.

Registered on the main group by :mod:`opsctl.cli`. A probe that *finds* the race is
a successful diagnosis (exit 0); a probe that could not run is a failure (exit 25).
"""

from __future__ import annotations

import click

from opsctl import errors
from opsctl.cli import params as clitypes
from opsctl.cli.app import OpsctlGroup, job_argument, json_option, target_options
from opsctl.cli.command import OpsctlCommand


@click.group(cls=OpsctlGroup, examples=(
    "opsctl probe compile-race --host pve1 --ct 200",
))
def probe() -> None:
    """Probes that run in the container with its current torch build."""


@probe.command("compile-race", examples=(
    "opsctl probe compile-race --host pve1 --ct 200",
    "opsctl probe compile-race --host pve1 --ct 200 --threads 8 --device cuda --json",
))
@target_options
@click.option("--threads", type=clitypes.THREADS, default=3, show_default=True,
              help="Threads that call torch.compile at once.")
@click.option("--timeout", "timeout_s", type=clitypes.SECONDS, default=120.0, show_default=True,
              help="Seconds per mode before it counts as a hang (stacks dumped first).")
@click.option("--backward/--no-backward", default=True, show_default=True,
              help="Also run the first backward (GPU only; CPU flex has no backward).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where the compiled calls run (auto: cuda when the container has a GPU).")
@click.option("--modes", default="unguarded,guarded", show_default=True,
              help="Comma-separated modes to run: unguarded (plain threads), guarded (behind "
                   "the payload's serialized_compile lock).")
@json_option
def compile_race(host: str | None, ctid: int | None, accept_new_host_key: bool, threads: int,
                 timeout_s: float, backward: bool, device: str, modes: str, as_json: bool) -> None:
    """Do concurrent first torch.compile(flex_attention) calls from threads crash or hang?

    Runs unguarded and behind the payload's serialized_compile lock, each in its own
    process on a cold compile cache, and says which build is affected and what to do.
    """
    from opsctl.cli import render
    from opsctl.ops import diag as diag_ops
    from opsctl.ops import jobs

    n_modes = len([m for m in modes.split(",") if m.strip()])
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        err = render.console(stderr=True)

        def started() -> None:
            if not as_json:
                err.print(f"probing {tgt.label}: {threads} threads, up to {timeout_s:g} s per mode "
                          f"({n_modes} modes)…")

        report = diag_ops.compile_race(tgt, threads=threads, timeout_s=timeout_s, backward=backward,
                                       device=device, modes=modes, on_start=started)
    if as_json:
        render.print_json(report)
        click.get_current_context().meta["opsctl_json_done"] = True  # one document only
    else:
        render.probe_report(render.console(), tgt.label, report)
    if report.get("status") == "crashed":
        raise errors.RemoteCommandFailed(
            f"{tgt.label}: the probe did not finish: "
            f"{report.get('error') or report.get('verdict') or 'no report'}",
            log_path=report.get("raw_output"), hint="the raw output file has everything it printed")


@click.command(cls=OpsctlCommand, examples=(
    "opsctl stacks --host pve1 --ct 200",
    "opsctl stacks a1b2c3 --host pve1 --ct 200 --timeout 30 --json",
))
@target_options
@job_argument
@click.option("--timeout", "timeout_s", type=clitypes.SECONDS, default=10.0, show_default=True,
              help="How long to wait for the dump to appear.")
@json_option
def stacks(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
           timeout_s: float, as_json: bool) -> None:
    """Every thread's Python stack of every process of the running job, rank by rank."""
    from opsctl.cli import render
    from opsctl.ops import diag as diag_ops
    from opsctl.ops import jobs

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        doc = diag_ops.stacks(tgt, job_id, timeout_s)
    if as_json:
        render.print_json(doc)
        return
    render.stacks(render.console(), doc)


@click.command(cls=OpsctlCommand, examples=(
    "opsctl doctor --host pve1 --ct 200",
    "opsctl doctor --host pve1 --ct 200 --no-torch --json",
))
@target_options
@click.option("--deadline", "deadline_s", type=clitypes.SECONDS, default=180.0, show_default=True,
              help="Seconds for every check together (a host that stops answering ends it).")
@click.option("--torch/--no-torch", "with_torch", default=True, show_default=True,
              help="Run the torch check (CUDA init and a matmul on every GPU).")
@click.option("--torch-timeout", "torch_timeout_s", type=clitypes.SECONDS, default=60.0,
              show_default=True, help="Seconds for the torch check.")
@json_option
def doctor(host: str | None, ctid: int | None, accept_new_host_key: bool, deadline_s: float,
           with_torch: bool, torch_timeout_s: float, as_json: bool) -> None:
    """The GPU chain of a container, from the host and from inside: one row per check.

    Exit 0 when no check fails, 28 when one does (each row says its evidence and fix) or
    when the deadline left no time for some checks (the ``deadline`` row names them).
    """
    from opsctl.cli import render
    from opsctl.ops import doctor as doctor_ops
    from opsctl.ops import jobs

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        report = doctor_ops.doctor(tgt, deadline_s=deadline_s, torch=with_torch,
                                   torch_timeout_s=torch_timeout_s)
    failure = None
    if report.failed:
        first = report.failed[0]
        failure = errors.DoctorFailed(f"{tgt.label}: {len(report.failed)} doctor check(s) failed, "
                                      f"first {first['name']}: {first['reason']}",
                                      hint=first["fix"] or None)
    if as_json:
        doc = report.to_dict()
        if failure is not None:
            doc["error"] = failure.to_dict()
        render.print_json(doc)
        click.get_current_context().meta["opsctl_json_done"] = True  # one document only
    else:
        render.doctor_report(render.console(), report)
    if failure is not None:
        raise failure


#: This family's commands, in ``opsctl --help`` order of appearance (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (stacks, probe, doctor)
