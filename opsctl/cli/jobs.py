"""Commands on a container's job: deploy, status, logs, stop, and exec."""

from __future__ import annotations

import contextlib
import sys
import typing as t

import click

from opsctl import errors
from opsctl.cli import params as clitypes
from opsctl.cli.app import json_option, target_options

# --- deploy / status / logs / stop ---------------------------------------------------------


@click.command()
@target_options
@click.option("--playbook", "playbook_path", default=None,
              help="Path or name of a playbook (playbooks/<name>.yaml); default: the container's "
                   "`playbook:` in the inventory.")
@click.option("--replace", is_flag=True, help="Stop a running job first instead of refusing.")
@click.option("--no-wait", is_flag=True, help="Launch and return without watching.")
@click.option("--poll", "poll_s", type=clitypes.SECONDS, default=2.0, show_default=True,
              help="Poll interval (s).")
@click.option("--force-payload", is_flag=True, help="Send the payload even if unchanged.")
@click.option("--force", "force_gpus", is_flag=True,
              help="Launch although GPUs the job needs are in use by something else (named).")
@click.option("--nodes", "nodes_text", default=None, metavar="HOST:CT,...",
              help="One run across these containers (node 0 first) through torchrun; "
                   "instead of --host/--ct.")
@json_option
def deploy(host: str | None, ctid: int | None, accept_new_host_key: bool, playbook_path: str | None,
           replace: bool, no_wait: bool, poll_s: float, force_payload: bool, force_gpus: bool,
           nodes_text: str | None, as_json: bool) -> None:
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
        raise errors.ConfigError("deploy needs --ct (the container id)")
    err = render.console(stderr=True)
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        book = deploy_ops.load_playbook(tgt, playbook_path)  # validated before anything remote
        with _deploy_progress(err, live=not as_json and err.is_terminal, quiet=as_json) as progress:
            try:
                report = deploy_ops.deploy(tgt, book, replace=replace, wait=not no_wait, poll_s=poll_s,
                                           force_payload=force_payload, force_gpus=force_gpus,
                                           on_update=progress.on_update, on_step=progress.on_step)
            except errors.DeployOutcomeError as exc:
                _show_failed_deploy(exc, as_json)
                raise
    if as_json:
        render.print_json(report.to_dict())
        return
    out = render.console()
    render.status(out, report.target, report.status)
    out.print(render.deploy_verdict(report.job_id, report.outcome, report.status, report.elapsed_s))


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
        key = [(r.status.state, r.status.phase) if r.status else r.error for r in rows]
        if not as_json and key != seen["key"]:
            seen["key"] = key
            err.print(render.plain(f"{render.now_stamp()} " + "  ".join(
                f"node {r.index}: {r.status.state.value if r.status else 'no answer'}"
                f"{' ' + r.status.phase if r.status and r.status.phase else ''}" for r in rows)))

    try:
        report = multinode.deploy(refs, playbook_path, replace=replace, wait=not no_wait,
                                  poll_s=poll_s, on_step=on_step, on_poll=on_poll,
                                  force_payload=force_payload, force_gpus=force_gpus,
                                  accept_new_host_key=accept_new_host_key)
    except errors.DeployOutcomeError as exc:
        if exc.report is not None and as_json:
            render.print_json({**exc.report.to_dict(), "ok": False, "error": exc.to_dict()})
            click.get_current_context().meta["opsctl_json_done"] = True
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
        key = (st.state, st.phase) if st is not None else None
        if not self.quiet and (problem or key != self._last):
            self._last = key
            self.err.print(line)


@contextlib.contextmanager
def _deploy_progress(err: t.Any, *, live: bool, quiet: bool) -> t.Iterator[_Progress]:
    if not live:
        yield _Progress(err, None, quiet)
        return
    from rich.live import Live
    from rich.spinner import Spinner

    spinner = Spinner("dots", text="connecting…")
    with Live(spinner, console=err, refresh_per_second=8, transient=True):
        yield _Progress(err, spinner, quiet)


def _show_failed_deploy(exc: errors.DeployOutcomeError, as_json: bool) -> None:
    """The report of a deploy whose job failed: the JSON document, or the status on stderr."""
    from opsctl.cli import render

    report = exc.report
    if report is None:
        return
    if as_json:
        render.print_json({**report.to_dict(), "ok": False, "error": exc.to_dict()})
        click.get_current_context().meta["opsctl_json_done"] = True  # one document only
    else:
        render.status(render.console(stderr=True), report.target, report.status)


@click.command()
@target_options
@click.option("--job", "job_id", type=clitypes.JOB_ID, default=None,
              help="Job id (default: the current job).")
@click.option("--lines", "-n", type=clitypes.COUNT, default=20, show_default=True, help="Pane lines to show.")
@click.option("--follow", "-f", is_flag=True, help="Follow until the job reaches a terminal state.")
@click.option("--poll", "poll_s", type=clitypes.SECONDS, default=2.0, show_default=True)
@click.option("--nodes", "nodes_text", default=None, metavar="HOST:CT,...",
              help="Every node of a multi-node run (default, without --host/--ct: the last "
                   "`deploy --nodes`).")
@json_option
def status(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
           lines: int, follow: bool, poll_s: float, nodes_text: str | None, as_json: bool) -> None:
    """Job state, pane tail, metrics, GPUs and a diagnosis of known failures."""
    from opsctl.ops import jobs, watch

    run = _run_nodes(host, ctid, nodes_text, job_id)
    if run is not None:
        if follow:
            raise errors.ConfigError("status --follow follows one container: pass --host and --ct "
                                     "(one node of the run)")
        from opsctl.ops import multinode

        report = multinode.status(run[0], run[1], lines=lines, accept_new_host_key=accept_new_host_key)
        if as_json:
            from opsctl.cli.jsonout import print_json

            print_json({"ok": True, **report.to_dict()})
        else:
            from opsctl.cli import render

            render.run_table(render.console(), report)
        return
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        if follow:
            from opsctl.cli import render

            err = render.console(stderr=True)
            seen: dict[str, t.Any] = {"key": None}

            def on_update(st: t.Any, elapsed: float, problem: str | None) -> None:
                key = (st.state, st.phase, (st.last_step or {}).get("step")) if st else None
                if not as_json and (problem or key != seen["key"]):
                    seen["key"] = key
                    err.print(render.progress_line(st, elapsed, problem))

            st = watch.wait(tgt.agent, job_id, until="terminal", timeout_s=None, poll_s=poll_s,
                            on_update=on_update, lines=lines).status
            if not as_json:  # the job followed is the one it started with, whatever came after
                err.print(render.plain(f"followed job {st.job_id} to its end: {st.state.value}"))
        else:
            st = watch.fetch_status(tgt.agent, job_id, lines)
    if as_json:  # no rich on this path: `status --json` is polled by scripts (README, Speed)
        from opsctl.cli.jsonout import print_json

        print_json(st.model_dump(mode="json"))
    else:
        from opsctl.cli import render

        render.status(render.console(), tgt.label, st, pane_lines=lines)
    if follow and st.state.value != "SUCCEEDED":
        sys.exit(errors.JOB_FAILED)


@click.command()
@target_options
@click.option("--job", "job_id", type=clitypes.JOB_ID, default=None)
@click.option("--follow", "-f", is_flag=True, help="Keep following until the job ends.")
@click.option("--offset", type=clitypes.COUNT, default=0, help="Start at this byte of output.log.")
def logs(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
         follow: bool, offset: int) -> None:
    """The job's full output (output.log), byte-exact; -f follows until the job ends.

    Raw on purpose: control sequences the job printed pass through (status and deploy
    show them inert). -f stays on the job it started with, even if another replaces it.
    """
    from opsctl.ops import jobs

    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        jobs.follow_logs(tgt, job_id, write, follow=follow, offset=offset)


@click.command()
@target_options
@click.option("--job", "job_id", type=clitypes.JOB_ID, default=None)
@click.option("--grace", "grace_s", type=clitypes.SECONDS_OR_ZERO, default=30.0, show_default=True,
              help="Seconds after SIGINT before SIGTERM, then SIGKILL.")
@click.option("--nodes", "nodes_text", default=None, metavar="HOST:CT,...",
              help="Every node of a multi-node run (default, without --host/--ct: the last "
                   "`deploy --nodes`).")
@json_option
def stop(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
         grace_s: float, nodes_text: str | None, as_json: bool) -> None:
    """Stop the job: SIGINT, then SIGTERM, then SIGKILL to all its processes (its group and
    detached children); exit 25 when one survives SIGKILL (its pids are shown). A multi-node
    run is stopped on every node at once."""
    from opsctl.cli import render
    from opsctl.ops import jobs

    run = _run_nodes(host, ctid, nodes_text, job_id)
    if run is not None:
        from opsctl.ops import multinode

        report = multinode.stop(run[0], run[1], grace_s, accept_new_host_key=accept_new_host_key)
        failed = any(r.error or (r.stop and r.stop.remaining_pids) for r in report.nodes)
        if as_json:
            render.print_json({"ok": not failed, **report.to_dict()})
        else:
            render.run_stop_lines(render.console(), report)
        if failed:
            sys.exit(errors.REMOTE_FAILED)
        return
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        res = jobs.stop(tgt, job_id, grace_s)
    if as_json:
        render.print_json(res.model_dump(mode="json"))
    else:
        render.console().print(render.stop_line(res.job_id, res.state, res.signals_sent,
                                                res.remaining_pids))
    if res.remaining_pids:
        sys.exit(errors.REMOTE_FAILED)


def _run_nodes(host: str | None, ctid: int | None, nodes_text: str | None,
               job_id: str | None) -> t.Any:
    """(nodes, job id) when the command addresses a multi-node run, else None.

    A single container's status never imports the multi-node code (``status --json`` speed)."""
    if nodes_text is not None and (host is not None or ctid is not None):
        raise errors.ConfigError("give either --nodes or --host/--ct, not both")
    if host is not None or ctid is not None:
        return None
    if nodes_text is None:
        from opsctl.config import last_target

        last = last_target.load()
        if last is None or not last.nodes:
            return None
    from opsctl.ops import multinode

    return multinode.remembered_run(nodes_text, job_id)


# --- exec / hosts ------------------------------------------------------------------------


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@target_options
@click.option("--timeout", "timeout_s", type=clitypes.SECONDS, default=None,
              help="Deadline; when it fires the remote process group is killed.")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True)
def exec(host: str | None, ctid: int | None, accept_new_host_key: bool, timeout_s: float | None,
         argv: tuple[str, ...]) -> None:
    """Run ARGV in the container (after `--`); output streams, exit code passes through."""
    from opsctl.ops import jobs

    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise errors.ConfigError("nothing to run: give the command after --")
    out, err = sys.stdout.buffer, sys.stderr.buffer

    def w(stream: t.BinaryIO) -> t.Callable[[bytes], None]:
        def write(data: bytes) -> None:
            stream.write(data)
            stream.flush()
        return write

    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        res = tgt.remote.pct_exec(tgt.ctid, args, timeout=timeout_s, stdin=stdin, on_stdout=w(out),
                                  on_stderr=w(err), step="exec")
    sys.exit(res.rc)


#: This family's commands, in ``opsctl --help`` order of appearance (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (deploy, status, logs, stop, exec)
