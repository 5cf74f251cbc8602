"""``opsctl queue``: the container's job queue.

``opsctl queue`` lists it; ``queue add`` puts a playbook's job into it (``--after JOB`` waits
for that job's success, ``--gpus N|LIST`` reserves GPU slots); ``queue rm`` takes a queued
job out (it never runs); ``queue move`` reorders. The container runs the queue with no client
connected (docs/guide/queue.md).
"""

from __future__ import annotations

import typing as t

import click

from opsctl import errors
from opsctl.cli import complete
from opsctl.cli import params as clitypes
from opsctl.cli.app import OpsctlGroup, json_option, target_options
from remote_payload import wire

if t.TYPE_CHECKING:
    from remote_payload.wire_shapes import QueueDoc


class GpuSpec(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """``--gpus 4`` (a count) or ``--gpus 0,1,3`` (slot indices); refused at parse time."""

    name = "N|LIST"

    def convert(self, value: t.Any, param: click.Parameter | None,
                ctx: click.Context | None) -> wire.GpuRequest:
        if not isinstance(value, str):
            return t.cast(wire.GpuRequest, value)
        try:
            return wire.parse_gpu_request(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


GPU_SPEC = GpuSpec()


def _open(host: str | None, ctid: int | None, accept_new_host_key: bool) -> t.Any:
    from opsctl.ops import jobs

    return jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key)


def _show_queue(label: str, listed: QueueDoc, as_json: bool) -> None:
    from opsctl.cli import render

    if as_json:
        render.print_json({"target": label, **listed})
    else:
        render.queue_table(render.console(), label, listed)


@click.group("queue", invoke_without_command=True, cls=OpsctlGroup, examples=(
    "opsctl queue --host pve1 --ct 200",
    "opsctl queue --host pve1 --ct 200 --json",
))
@target_options
@json_option
@click.pass_context
def queue(ctx: click.Context, host: str | None, ctid: int | None, accept_new_host_key: bool,
          as_json: bool) -> None:
    """The container's job queue, first to start first, and who holds which GPU."""
    if ctx.invoked_subcommand is not None:
        return
    from opsctl.ops import queue as queue_ops

    with _open(host, ctid, accept_new_host_key) as tgt:
        listed = queue_ops.listing(tgt)
    _show_queue(tgt.label, listed, as_json)


@queue.command("add", examples=(
    "opsctl queue add --host pve1 --ct 200 --playbook dflash-8gpu",
    "opsctl queue add --host pve1 --ct 200 --playbook dflash-8gpu --after a1b2c3 --gpus 4",
    "opsctl queue add --host pve1 --ct 200 --playbook dflash-8gpu --gpus 0,1 -- --lr 3e-4",
))
@target_options
@click.option("--playbook", "playbook_path", required=True, shell_complete=complete.playbooks,
              help="Path or name of a playbook, or of a pipeline (every step is queued).")
@click.option("--after", "after", type=clitypes.JOB_ID, default=None,
              help="Start only after this job succeeded (like Slurm's afterok).")
@click.option("--gpus", "gpus", type=GPU_SPEC, default=None,
              help="GPUs to reserve: a count (4) or slot indices (0,1,3); default: the "
                   "playbook's gpus:, else the whole container.")
@click.option("--env-file", "env_file", default=None, metavar="FILE",
              help="NAME=value lines with the playbook's secrets (else the environment).")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@json_option
def add(host: str | None, ctid: int | None, accept_new_host_key: bool, playbook_path: str,
        after: str | None, gpus: wire.GpuRequest, env_file: str | None, extra: tuple[str, ...],
        as_json: bool) -> None:
    """Queue a playbook's job (after `--`: arguments added to its command); prints its id."""
    from opsctl.cli import render
    from opsctl.config.pipeline import Pipeline, load_any
    from opsctl.config.playbook import Playbook
    from opsctl.ops import deploy as deploy_ops
    from opsctl.ops import queue as queue_ops

    args = list(extra)  # what follows `--` (click takes the `--` itself)
    loaded = load_any(playbook_path)  # validated before anything remote
    with _open(host, ctid, accept_new_host_key) as tgt:
        if isinstance(loaded, Pipeline):
            if after is not None or gpus is not None or args:
                raise errors.ConfigError(f"{playbook_path} is a pipeline: --after, --gpus and "
                                         "job arguments belong in its steps")
            report = queue_ops.add_pipeline(tgt, loaded)
        else:
            update: dict[str, t.Any] = {"command": [*loaded.command, *args]}
            if gpus is not None:
                update["gpus"] = gpus
            book = Playbook.model_validate({**loaded.model_dump(), **update})
            secrets = deploy_ops.collect_secrets(book, env_file)
            report = queue_ops.add(tgt, [queue_ops.QueuedStep(book, after)], secrets=secrets)
    if as_json:
        render.print_json(report.to_dict())
        return
    render.queue_added(render.console(), report)


@queue.command("rm", examples=(
    "opsctl queue rm a1b2c3 --host pve1 --ct 200",
))
@target_options
@click.argument("job", type=clitypes.JOB_ID, shell_complete=complete.jobs)
@json_option
def rm(host: str | None, ctid: int | None, accept_new_host_key: bool, job: str,
       as_json: bool) -> None:
    """Take a queued job out of the queue: it never runs (CANCELLED, end_reason removed)."""
    from opsctl.cli import render
    from opsctl.ops import queue as queue_ops

    with _open(host, ctid, accept_new_host_key) as tgt:
        doc = queue_ops.remove(tgt, job)
    if as_json:
        render.print_json({"target": tgt.label, **doc})
        return
    con = render.console()
    con.print(render.plain(f"job {doc['job_id']} removed from the queue (CANCELLED)"))
    for dep in doc.get("cancelled") or []:
        con.print(render.plain(f"job {dep} cancelled: it waited for {doc['job_id']}",
                               style="yellow"))


@queue.command("move", examples=(
    "opsctl queue move a1b2c3 --host pve1 --ct 200 --before d4e5f6",
    "opsctl queue move a1b2c3 --host pve1 --ct 200 --after d4e5f6 --json",
))
@target_options
@click.argument("job", type=clitypes.JOB_ID, shell_complete=complete.jobs)
@click.option("--before", "before", type=clitypes.JOB_ID, default=None,
              help="Put JOB just before this queued job.")
@click.option("--after", "after", type=clitypes.JOB_ID, default=None,
              help="Put JOB just after this queued job.")
@json_option
def move(host: str | None, ctid: int | None, accept_new_host_key: bool, job: str,
         before: str | None, after: str | None, as_json: bool) -> None:
    """Reorder the queue (a job never moves ahead of a job it waits for)."""
    from opsctl.ops import queue as queue_ops

    if (before is None) == (after is None):
        raise click.UsageError("give exactly one of --before JOB2 and --after JOB2")
    with _open(host, ctid, accept_new_host_key) as tgt:
        listed = queue_ops.move(tgt, job, before=before, after=after)
    _show_queue(tgt.label, listed, as_json)


#: This family's commands (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (queue,)
