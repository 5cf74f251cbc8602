"""Commands on a container's job: deploy, jobs, status, logs, stop, and exec.

``status``, ``logs`` and ``stop`` (and ``stacks``, ``plot``, ``attach``) take an optional
positional JOB, an id or a unique prefix of one; without it they act on the container's
current job (the last one launched). An unknown job exits 26 (``errors.UNKNOWN_JOB``).
"""

from __future__ import annotations

import contextlib
import sys
import typing as t

import click

from opsctl import errors
from opsctl.cli import complete
from opsctl.cli import params as clitypes
from opsctl.cli.app import confirm, interactive, job_argument, json_option, target_options, yes_option
from opsctl.cli.command import OpsctlCommand
from opsctl.cli.jsonout import print_failure

# --- deploy / status / logs / stop ---------------------------------------------------------


@click.command(cls=OpsctlCommand, examples=(
    "opsctl deploy --host pve1 --ct 200 --playbook dflash-8gpu",
    "opsctl deploy --host pve1 --ct 200 --replace -y --detach --json",
    "opsctl deploy --nodes pve1:200,pve2:200 --playbook dflash-8gpu",
))
@target_options
@click.option("--playbook", "playbook_path", default=None, shell_complete=complete.playbooks,
              help="Path or name of a playbook (playbooks/<name>.yaml); default: the container's "
                   "`playbook:` in the inventory.")
@click.option("--replace", is_flag=True,
              help="Stop a running job first instead of refusing (asks first on a terminal).")
@yes_option
@click.option("--no-wait", "-d", "--detach", "no_wait", is_flag=True,
              help="Launch and return without watching.")
@click.option("--poll", "poll_s", type=clitypes.POLL, default=2.0, show_default=True,
              help="Poll interval (s).")
@click.option("--force-payload", is_flag=True, help="Send the payload even if unchanged.")
@click.option("--force", "force_gpus", is_flag=True,
              help="Launch although GPUs the job needs are in use by something else (named).")
@click.option("--env-file", "env_file", default=None, metavar="FILE",
              help="NAME=value lines with the playbook's secrets (else the environment).")
@click.option("--nodes", "nodes_text", default=None, metavar="HOST:CT,...",
              help="One run across these containers (node 0 first) through torchrun; "
                   "instead of --host/--ct.")
@json_option
def deploy(host: str | None, ctid: int | None, accept_new_host_key: bool, playbook_path: str | None,
           replace: bool, yes: bool, no_wait: bool, poll_s: float, force_payload: bool,
           force_gpus: bool, env_file: str | None, nodes_text: str | None, as_json: bool) -> None:
    """Push the payload, prepare torch + cache, launch the job in tmux, watch until healthy."""
    from opsctl.cli import render
    from opsctl.ops import deploy as deploy_ops
    from opsctl.ops import jobs

    if nodes_text is not None:
        _deploy_nodes(nodes_text, host, ctid, accept_new_host_key, playbook_path, replace, no_wait,
                      poll_s, force_payload, force_gpus, as_json)
        return
    if host is None:
        raise errors.ConfigError("deploy needs --host (an inventory name or an address)")
    if playbook_path is None and ctid is None:
        from opsctl.config import inventory

        if not inventory.load().resolve(host).direct:  # a direct host is its own one target
            raise errors.ConfigError("deploy needs --ct (the container id)")
    err = render.console(stderr=True)
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        from opsctl.config.pipeline import Pipeline, load_any

        loaded = load_any(playbook_path or deploy_ops.default_playbook(tgt.host, tgt.ctid))
        if isinstance(loaded, Pipeline):  # every step queued at once (opsctl queue)
            _deploy_pipeline(tgt, loaded, replace=replace, env_file=env_file, as_json=as_json)
            return
        book = deploy_ops.load_playbook(tgt, playbook_path)  # validated before anything remote
        secrets = deploy_ops.collect_secrets(book, env_file)  # so are the secrets
        if replace and not yes and interactive():
            _confirm_replacing(tgt)
        with _deploy_progress(err, live=not as_json and err.is_terminal, quiet=as_json) as progress:
            try:
                report = deploy_ops.deploy(tgt, book, replace=replace, wait=not no_wait, poll_s=poll_s,
                                           force_payload=force_payload, force_gpus=force_gpus,
                                           on_update=progress.on_update, on_step=progress.on_step,
                                           secrets=secrets)
            except errors.DeployOutcomeError as exc:
                _show_failed_deploy(exc, as_json)
                raise
    if as_json:
        render.print_json(report.to_dict())
        return
    out = render.console()
    render.status(out, report.target, report.status)
    out.print(render.deploy_verdict(report.job_id, report.outcome, report.status, report.elapsed_s))


def _deploy_pipeline(tgt: t.Any, pipe: t.Any, *, replace: bool, env_file: str | None,
                     as_json: bool) -> None:
    """``deploy`` of a pipeline playbook: its steps go into the container's queue at once, each
    after the step it names; the container runs them (``opsctl queue`` shows them)."""
    from opsctl.cli import render
    from opsctl.config.pipeline import resolve
    from opsctl.ops import deploy as deploy_ops
    from opsctl.ops import queue as queue_ops

    if replace:
        raise errors.ConfigError(f"{pipe.name} is a pipeline: its steps are queued; --replace "
                                 "does not apply (`opsctl stop` a running job first)")
    secrets: dict[str, str] = {}
    for step in resolve(pipe):
        secrets.update(deploy_ops.collect_secrets(step.book, env_file))
    report = queue_ops.add_pipeline(tgt, pipe, secrets=secrets)
    if as_json:
        render.print_json(report.to_dict())
        return
    render.queue_added(render.console(), report)


def _confirm_replacing(tgt: t.Any) -> None:
    """``deploy --replace`` on a terminal: say which live job it will stop, and ask."""
    from opsctl.ops import watch
    from opsctl.remote.agent_client import NoPayload

    try:
        st = watch.fetch_status(tgt.agent, None, lines=0)
    except (errors.UnknownJob, NoPayload):  # nothing launched (or shipped) yet
        return
    if not watch.is_terminal(st):
        confirm(f"{tgt.label}: replace job {st['job_id']} ({st['state']}, "
                f"{_step_text(st['last_step'])})?", yes=False)


def _step_text(step: dict[str, t.Any] | None) -> str:
    return f"step {step.get('step')}" if step and step.get("step") is not None else "no step yet"
def _deploy_nodes(nodes_text: str, host: str | None, ctid: int | None, accept_new_host_key: bool,
                  playbook_path: str | None, replace: bool, no_wait: bool, poll_s: float,
                  force_payload: bool, force_gpus: bool, as_json: bool) -> None:
    """``deploy --nodes``: one run across containers (opsctl.ops.multinode)."""
    from opsctl.cli import render
    from opsctl.config.nodes import parse_nodes
    from opsctl.ops import multinode

    if host is not None or ctid is not None:
        raise errors.ConfigError("deploy: give either --nodes or --host/--ct, not both")
    refs = parse_nodes(nodes_text)
    err = render.console(stderr=True)
    seen: dict[str, t.Any] = {"key": None}

    def on_step(name: str) -> None:
        if not as_json and not name.endswith("-done"):
            err.print(render.plain(f"{render.now_stamp()} {name}…"))

    def on_poll(rows: list[t.Any], elapsed: float) -> None:
        key = [(r.status["state"], r.status["phase"]) if r.status else r.error for r in rows]
        if not as_json and key != seen["key"]:
            seen["key"] = key
            err.print(render.plain(f"{render.now_stamp()} " + "  ".join(
                f"node {r.index}: {r.status['state'] if r.status else 'no answer'}"
                f"{' ' + r.status['phase'] if r.status and r.status['phase'] else ''}" for r in rows)))

    try:
        report = multinode.deploy(refs, playbook_path, replace=replace, wait=not no_wait,
                                  poll_s=poll_s, on_step=on_step, on_poll=on_poll,
                                  force_payload=force_payload, force_gpus=force_gpus,
                                  accept_new_host_key=accept_new_host_key)
    except errors.DeployOutcomeError as exc:
        if exc.report is not None and as_json:
            print_failure(exc.report.to_dict(), exc.to_dict())
        elif exc.report is not None:
            render.run_table(err, exc.report)
        raise
    if as_json:
        render.print_json({"ok": True, **report.to_dict()})
        return
    out = render.console()
    render.run_table(out, report)
    out.print(render.plain(f"{report.job_id}: {report.outcome} on {len(report.nodes)} nodes after "
                           f"{render.duration(report.elapsed_s)}", style="bold green"))


class _Progress:
    """Deploy progress: a live spinner on a terminal, else one line per change on stderr."""

    def __init__(self, err: t.Any, spinner: t.Any, quiet: bool):
        self.err, self.spinner, self.quiet = err, spinner, quiet
        self._last: t.Any = object()

    def on_step(self, name: str) -> None:
        from opsctl.cli import render

        if self.spinner is not None:
            self.spinner.update(text=render.plain(f"{name}…"))
        elif not self.quiet and not name.endswith("-done"):
            self.err.print(render.plain(f"{render.now_stamp()} {name}…"))

    def on_update(self, st: t.Any, elapsed: float, problem: str | None) -> None:
        from opsctl.cli import render

        line = render.progress_line(st, elapsed, problem)
        if self.spinner is not None:
            self.spinner.update(text=line)
            return
        key = (st["state"], st["phase"]) if st is not None else None
        if not self.quiet and (problem or key != self._last):
            self._last = key
            self.err.print(line)


@contextlib.contextmanager
def _deploy_progress(err: t.Any, *, live: bool, quiet: bool) -> t.Iterator[_Progress]:
    if not live:
        yield _Progress(err, None, quiet)
        return
    from opsctl.cli import render

    with render.live_spinner(err, "connecting…") as spinner:
        yield _Progress(err, spinner, quiet)


def _show_failed_deploy(exc: errors.DeployOutcomeError, as_json: bool) -> None:
    """The report of a deploy whose job failed: the JSON document, or the status on stderr."""
    from opsctl.cli import render

    report = exc.report
    if report is None:
        return
    if as_json:
        print_failure(report.to_dict(), exc.to_dict())
    else:
        render.status(render.console(stderr=True), report.target, report.status)


@click.command(cls=OpsctlCommand, examples=(
    "opsctl status --host pve1 --ct 200 --json",
    "opsctl status --host pve1 --ct 200 --follow --lines 50",
    "opsctl status --all --host 'pve*' --deadline 20",
))
@target_options
@job_argument
@click.option("--lines", "-n", type=clitypes.COUNT, default=20, show_default=True,
              help="Pane lines to show.")
@click.option("--follow", "-f", is_flag=True, help="Follow until the job reaches a terminal state.")
@click.option("--poll", "poll_s", type=clitypes.POLL, default=2.0, show_default=True,
              help="With --follow: seconds between two looks at the job.")
@click.option("--all", "all_hosts", is_flag=True,
              help="Every container of every inventory host, in parallel, one row each; --host "
                   "then selects hosts by glob pattern or inventory group, --ct filters.")
@click.option("--deadline", "deadline_s", type=clitypes.DEADLINE, default=20.0, show_default=True,
              help="With --all: seconds each host has to answer before its rows are errors.")
@click.option("--parallel", "max_parallel", type=clitypes.PARALLEL, default=16, show_default=True,
              help="With --all: hosts (and containers of one host) queried at once.")
@click.option("--nodes", "nodes_text", default=None, metavar="HOST:CT,...",
              help="Every node of a multi-node run (default, without --host/--ct: the last "
                   "`deploy --nodes`).")
@click.option("--host-log", is_flag=True,
              help="Also read the host's kernel log for the job's time window (Xid, OOM "
                   "killer): one more round trip, so plain `status` does not.")
@json_option
def status(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
           lines: int, follow: bool, poll_s: float, all_hosts: bool, deadline_s: float,
           max_parallel: int, nodes_text: str | None, host_log: bool, as_json: bool) -> None:
    """Job state, pane tail, metrics, GPUs and a diagnosis of known failures.

    With --all: one row per container of the fleet; exit 27 when some rows are errors.
    With --nodes (or after `deploy --nodes`): one row per node of the run.
    """
    # one function per mode; this only picks the mode
    if all_hosts:
        if follow or job_id is not None or nodes_text is not None:
            raise errors.ConfigError("status --all shows each container's current job: "
                                     "--follow, --job and --nodes need a single target")
        _status_all(host, ctid, deadline_s, max_parallel, as_json)
    elif (run := _run_nodes(host, ctid, nodes_text, job_id)) is not None:
        if follow:
            raise errors.ConfigError("status --follow follows one container: pass --host and --ct "
                                     "(one node of the run)")
        _status_run(run, lines, accept_new_host_key, as_json)
    elif follow:
        _status_follow(host, ctid, accept_new_host_key, job_id, lines, poll_s, as_json)
    else:
        _status_once(host, ctid, accept_new_host_key, job_id, lines, as_json, host_log=host_log)


def _status_once(host: str | None, ctid: int | None, accept_new_host_key: bool,
                 job_id: str | None, lines: int, as_json: bool, *, host_log: bool) -> None:
    """Plain ``status``: one ``status`` call to the agent, through the transport; with
    ``host_log``, plus the host kernel's Xid/OOM entries of the job's window (warnings while
    it runs, errors once it failed)."""
    from opsctl.ops import jobs, watch

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        st = watch.fetch_status(tgt.agent, job_id, lines)
        if host_log:
            from opsctl.ops import deploy as deploy_ops

            st = deploy_ops.with_host_events(tgt, st)
    if as_json:  # jsonout, not render: scripts poll this, and it needs no rich
        from opsctl.cli.jsonout import print_json

        print_json(st)
    else:
        from opsctl.cli import render

        render.status(render.console(), tgt.label, st, pane_lines=lines)


def _status_run(run: t.Any, lines: int, accept_new_host_key: bool, as_json: bool) -> None:
    """``status --nodes``: one row per node of a multi-node run."""
    from opsctl.cli import render
    from opsctl.ops import multinode

    try:
        report = multinode.status(run[0], run[1], lines=lines, accept_new_host_key=accept_new_host_key)
    except errors.FleetIncomplete as exc:  # a node not asked: every row shown, never "ok"
        _show_run(exc.report, as_json, render.run_table, exc)
        raise
    _show_run(report, as_json, render.run_table)


def _status_follow(host: str | None, ctid: int | None, accept_new_host_key: bool,
                   job_id: str | None, lines: int, poll_s: float, as_json: bool) -> None:
    """``status --follow``: until the job ends; exit 0 only when it SUCCEEDED."""
    from opsctl.cli import render
    from opsctl.ops import jobs, watch

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        err = render.console(stderr=True)
        seen: dict[str, t.Any] = {"key": None}

        def on_update(st: t.Any, elapsed: float, problem: str | None) -> None:
            key = (st["state"], st["phase"], (st["last_step"] or {}).get("step")) if st else None
            if not as_json and (problem or key != seen["key"]):
                seen["key"] = key
                err.print(render.progress_line(st, elapsed, problem))

        st = watch.wait(tgt.agent, job_id, until="terminal", timeout_s=None, poll_s=poll_s,
                        on_update=on_update, lines=lines).status
        if st["state"] in ("FAILED", "LOST"):  # the host's Xid/OOM lines of the job's window
            from opsctl.ops import deploy as deploy_ops

            st = deploy_ops.with_host_events(tgt, st)
        if not as_json:  # the job followed is the one it started with, whatever came after
            err.print(render.plain(f"followed job {st['job_id']} to its end: {st['state']}"))
    if as_json:
        render.print_json(st)
    else:
        render.status(render.console(), tgt.label, st, pane_lines=lines)
    if st["state"] != "SUCCEEDED":
        sys.exit(errors.JOB_FAILED)


def _status_all(pattern: str | None, ctid: int | None, deadline_s: float, max_parallel: int,
                as_json: bool) -> None:
    from opsctl.ops import fleet

    try:
        report = fleet.fleet_status(pattern, ctids=None if ctid is None else {ctid},
                                    deadline_s=deadline_s, max_parallel=max_parallel)
    except errors.FleetIncomplete as exc:
        if as_json:
            print_failure(exc.report.to_dict(), exc.to_dict())
        else:
            from opsctl.cli import render

            render.fleet(render.console(), exc.report)
        raise
    if as_json:
        from opsctl.cli.jsonout import print_json

        print_json(report.to_dict())
    else:
        from opsctl.cli import render

        render.fleet(render.console(), report)


@click.command(cls=OpsctlCommand, examples=(
    "opsctl logs --host pve1 --ct 200 --tail 100",
    "opsctl logs --host pve1 --ct 200 --since 10m --follow",
    "opsctl logs a1b2c3 --host pve1 --ct 200 > output.log",
))
@target_options
@job_argument
@click.option("--follow", "-f", is_flag=True,
              help="Keep following until the job ends (reconnects after a dropped connection).")
@click.option("--tail", "tail", type=clitypes.COUNT, default=None,
              help="Start at the last N lines.")
@click.option("--since", default=None,
              help="Start at the output written in the last 10m, 2h, 90s... (1 s resolution).")
@click.option("--offset", type=clitypes.OFFSET, default=0, help="Start at this byte of output.log.")
def logs(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
         follow: bool, tail: int | None, since: str | None, offset: int) -> None:
    """The job's full output (output.log), byte-exact; -f follows until the job ends.

    Raw on purpose: control sequences the job printed pass through (status and deploy
    show them inert). -f stays on the job it started with, even if another replaces it;
    a dropped connection is retried (0.5 s doubling to 10 s, notices on stderr) from the
    byte it had reached. When the followed job ends its state and exit code go to stderr
    and the exit code is 0 for SUCCEEDED, 40 otherwise.
    """
    from opsctl.cli import plots, render
    from opsctl.ops import jobs
    from remote_payload.wire import JobState

    since_s = plots.parse_since(since)
    out = sys.stdout.buffer
    err = render.console(stderr=True)

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    def notice(text: str) -> None:
        err.print(render.plain(f"{render.now_stamp()} opsctl logs: {text}", style="yellow"))

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        last = jobs.follow_logs(tgt, job_id, write, follow=follow, offset=offset, tail=tail,
                                since_s=since_s, on_notice=notice)
    if follow:
        how = (f"killed by {last['signal']}" if last["signal"] else
               f"exit code {last['exit_code']}" if last["exit_code"] is not None else "no exit code")
        err.print(render.plain(f"job {last['job_id']} ended: {last['state']} ({how})",
                               style=render.STATE_COLOR[JobState(last["state"])]))
        if last["state"] != "SUCCEEDED":
            sys.exit(errors.JOB_FAILED)


@click.command(cls=OpsctlCommand, examples=(
    "opsctl stop --host pve1 --ct 200",
    "opsctl stop a1b2c3 --host pve1 --ct 200 --grace 60 -y --json",
    "opsctl stop --nodes pve1:200,pve2:200",
))
@target_options
@job_argument
@yes_option
@click.option("--grace", "grace_s", type=clitypes.SECONDS_OR_ZERO, default=30.0, show_default=True,
              help="Seconds after SIGINT before SIGTERM, then SIGKILL.")
@click.option("--nodes", "nodes_text", default=None, metavar="HOST:CT,...",
              help="Every node of a multi-node run (default, without --host/--ct: the last "
                   "`deploy --nodes`).")
@json_option
def stop(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
         yes: bool, grace_s: float, nodes_text: str | None, as_json: bool) -> None:
    """Stop the job: SIGINT, then SIGTERM, then SIGKILL to all its processes (its group and
    detached children); exit 25 when one survives SIGKILL (its pids are shown). A multi-node
    run is stopped on every node at once.

    On a terminal it first says which job and asks (-y skips); never asks otherwise."""
    from opsctl.cli import render
    from opsctl.ops import jobs, watch
    from remote_payload.wire import ErrorType

    run = _run_nodes(host, ctid, nodes_text, job_id)
    if run is not None:
        from opsctl.ops import multinode

        try:
            report = multinode.stop(run[0], run[1], grace_s, accept_new_host_key=accept_new_host_key)
        except errors.FleetIncomplete as exc:  # the nodes reached were stopped; not "ok"
            _show_run(exc.report, as_json, render.run_stop_lines, exc)
            raise
        survivors = any(r.stop and r.stop["remaining_pids"] for r in report.nodes)
        if as_json:
            render.print_json({"ok": not survivors, **report.to_dict()})
        else:
            render.run_stop_lines(render.console(), report)
        if survivors:
            sys.exit(errors.REMOTE_FAILED)
        return
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        if not yes and interactive():
            try:
                st = watch.fetch_status(tgt.agent, job_id, lines=0)
            except errors.AgentError as exc:
                if exc.remote_type != ErrorType.DamagedRecord or not job_id:
                    raise
                # its record does not parse, but its processes may run: stop still ends them
                confirm(f"{tgt.label}: stop job {job_id} (its record is damaged: "
                        f"{exc.fields.get('reason')})?", yes=False)
            else:
                job_id = st["job_id"]  # stop exactly the job the question named
                if not watch.is_terminal(st):
                    confirm(f"{tgt.label}: stop job {st['job_id']} ({st['state']}, "
                            f"{_step_text(st['last_step'])})?", yes=False)
        res = jobs.stop(tgt, job_id, grace_s)
    if as_json:
        render.print_json(res)
    else:
        render.console().print(render.stop_line(res["job_id"], res["state"], res["signals_sent"],
                                                res["remaining_pids"]))
    if res["remaining_pids"]:
        sys.exit(errors.REMOTE_FAILED)


@click.command("jobs", cls=OpsctlCommand, examples=(
    "opsctl jobs --host pve1 --ct 200",
    "opsctl jobs --host pve1 --ct 200 --all --json",
))
@target_options
@click.option("--all", "all_jobs", is_flag=True,
              help="Every job the container has, the newest 1,000 at most (default: the newest "
                   "20 plus any still live).")
@json_option
def jobs_cmd(host: str | None, ctid: int | None, accept_new_host_key: bool, all_jobs: bool,
             as_json: bool) -> None:
    """The container's jobs, newest first: state, times, exit, last step, diagnosis."""
    from opsctl.ops import jobs

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        listed = jobs.list_jobs(tgt, all_jobs=all_jobs)
    if as_json:
        from opsctl.cli.jsonout import print_json

        print_json({"target": tgt.label, **listed})
        return
    from opsctl.cli import render

    render.jobs_table(render.console(), tgt.label, listed)
def _show_run(report: t.Any, as_json: bool, show: t.Callable[[t.Any, t.Any], None],
              exc: errors.OpsctlError | None = None) -> None:
    """A multi-node run's report: one document with ``ok`` (false with the error when a
    node could not be asked), or the per-node lines (the error follows on stderr)."""
    from opsctl.cli import render

    if not as_json:
        show(render.console(), report)
    elif exc is not None:
        print_failure(report.to_dict(), exc.to_dict())
    else:
        render.print_json({"ok": True, **report.to_dict()})


def _run_nodes(host: str | None, ctid: int | None, nodes_text: str | None,
               job_id: str | None) -> t.Any:
    """(nodes, job id) when the command addresses a multi-node run, else None.

    A single container's status never imports the multi-node code (``status --json`` speed)."""
    if nodes_text is not None and (host is not None or ctid is not None):
        raise errors.ConfigError("give either --nodes or --host/--ct, not both")
    if host is not None or ctid is not None:
        return None
    if nodes_text is None:
        from opsctl.state import last_target

        if not last_target.remembers_run():
            return None
    from opsctl.ops import multinode

    return multinode.remembered_run(nodes_text, job_id)


# --- exec / hosts ------------------------------------------------------------------------


@click.command(cls=OpsctlCommand,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
               examples=(
    "opsctl exec --host pve1 --ct 200 -- nvidia-smi",
    "opsctl exec --host pve1 --ct 200 --timeout 30 -- df -h /root",
))
@target_options
@click.option("--timeout", "timeout_s", type=clitypes.SECONDS, default=None,
              help="Deadline; when it fires the command and every process it started are ended.")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True)
def exec(host: str | None, ctid: int | None, accept_new_host_key: bool, timeout_s: float | None,
         argv: tuple[str, ...]) -> None:
    """Run ARGV in the container (after `--`); output streams, exit code passes through."""
    from opsctl.ops import execute, jobs
    from opsctl.remote.command import OutputClosed

    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    out, err = sys.stdout.buffer, sys.stderr.buffer

    def to_stdout(data: bytes) -> None:
        try:
            out.write(data)
            out.flush()
        except BrokenPipeError:  # the reader closed early (`| head -c 10`): its choice
            raise OutputClosed from None

    def to_stderr(data: bytes) -> None:
        try:
            err.write(data)
            err.flush()
        except BrokenPipeError:  # nobody reads our stderr: nothing to tell it
            pass

    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer
    try:
        with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
            execute.check(tgt, args)
            rc = execute.run(tgt, args, timeout=timeout_s, stdin=stdin, on_stdout=to_stdout,
                             on_stderr=to_stderr)
    except OutputClosed:
        _die_of_sigpipe()
    sys.exit(rc)


def _die_of_sigpipe() -> t.NoReturn:
    """End as coreutils' ``cat`` does when its reader is gone (the remote command was already
    ended: channel closed)."""
    from opsctl import interrupts

    interrupts.die_of_sigpipe()


#: This family's commands, in ``opsctl --help`` order of appearance (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (deploy, jobs_cmd, status, logs, stop, exec)
