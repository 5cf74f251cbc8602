"""opsctl command line: parse, call one operation, render, exit code. Nothing else.

Every error that is an :class:`~opsctl.errors.OpsctlError` becomes one clear line
(plus hint and log path) and its family's exit code, in :meth:`OpsctlGroup.invoke`.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import typing as t

import click

from opsctl import clitypes, errors
from opsctl.errors import OpsctlError

F = t.TypeVar("F", bound=t.Callable[..., t.Any])


class OpsctlGroup(click.Group):
    def invoke(self, ctx: click.Context) -> t.Any:
        # what the subcommand will parse (click empties these before it does)
        words = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        try:
            return super().invoke(ctx)
        except OpsctlError as exc:
            _report_error(ctx, exc)
            ctx.exit(exc.exit_code)
        except click.UsageError as exc:  # bad flag or value: still one JSON document with --json
            if _json_requested(words) and not getattr(exc, "_json_done", False):
                from opsctl.jsonout import print_json

                print_json({"ok": False, "error": {
                    "type": "UsageError", "message": exc.format_message(), "exit_code": exc.exit_code,
                    "hint": "see --help", "log_path": None}})
                exc._json_done = True  # type: ignore[attr-defined]  # nested groups print once
            raise
        except KeyboardInterrupt:
            click.echo("interrupted (the remote job, if any, keeps running)", err=True)
            ctx.exit(errors.INTERRUPTED)


def _json_requested(args: t.Sequence[str]) -> bool:
    """``--json`` among the words before ``--`` (what the command would have parsed)."""
    words = list(args)
    return "--json" in (words[:words.index("--")] if "--" in words else words)


def _report_error(ctx: click.Context, exc: OpsctlError) -> None:
    from opsctl import render

    if ctx.meta.get("opsctl_json") and not ctx.meta.get("opsctl_json_done"):
        render.print_json({"ok": False, "error": exc.to_dict()})
    render.error(render.console(stderr=True), exc)


def json_option(f: F) -> F:
    @click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON document on stdout.")
    @functools.wraps(f)
    def wrapper(*args: t.Any, as_json: bool, **kwargs: t.Any) -> t.Any:
        if as_json:
            click.get_current_context().meta["opsctl_json"] = True
        return f(*args, as_json=as_json, **kwargs)

    return t.cast(F, wrapper)


def target_options(f: F) -> F:
    f = click.option("--ct", "ctid", type=int, default=None,
                     help="Container id (default: the last deploy's).")(f)
    f = click.option("--host", "host", default=None,
                     help="Inventory name or address, e.g. pve1 or 10.1.2.6 "
                          "(default: the last deploy's).")(f)
    f = click.option("--accept-new-host-key", is_flag=True,
                     help="Like OpenSSH accept-new: record an unknown host key "
                          "(a changed key is still refused).")(f)
    return f


@click.group(cls=OpsctlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="opsctl")
def cli() -> None:
    """Run GPU training jobs in Proxmox LXC containers and keep them healthy."""


# --- sandbox ------------------------------------------------------------------------------


@cli.group(cls=OpsctlGroup)
def sandbox() -> None:
    """Make this machine an emulated Proxmox host (loopback sshd + real LXC + pct)."""


@sandbox.command("up")
@click.option("--ct", "ctids", type=int, multiple=True, default=(200,), show_default=True)
@json_option
def sandbox_up(ctids: tuple[int, ...], as_json: bool) -> None:
    """Start (or reuse) the sandbox and write its inventory entry `sandbox`."""
    from opsctl import render
    from opsctl import sandbox as sb

    con = render.console(stderr=True)
    start = time.monotonic()
    if not as_json:
        con.print("bringing the sandbox up (first time: ~1 min to build the containers)…")
    info = sb.up(containers=ctids)
    doc = {**_dc(info), "elapsed_s": round(time.monotonic() - start, 2)}
    if as_json:
        render.print_json(doc)
        return
    out = render.console()
    out.print(f"sandbox up in {doc['elapsed_s']:.1f}s: ssh {info.user}@{info.host} -p {info.port}, "
              f"containers {', '.join(map(str, info.containers))}")
    out.print(f"inventory host `sandbox` written; try: opsctl exec --host sandbox --ct "
              f"{info.containers[0]} -- uname -a")


@sandbox.command("down")
def sandbox_down() -> None:
    """Stop the sandbox containers and sshd (keeps them for a fast `up`)."""
    from opsctl import sandbox as sb

    sb.down()
    click.echo("sandbox stopped")


@sandbox.command("destroy")
def sandbox_destroy() -> None:
    """Remove the sandbox containers, keys and state."""
    from opsctl import sandbox as sb

    sb.destroy()
    click.echo("sandbox destroyed")


@sandbox.command("status")
@json_option
def sandbox_status(as_json: bool) -> None:
    """Show whether the sandbox's sshd and containers are running."""
    from opsctl import render
    from opsctl import sandbox as sb

    st = sb.status()
    doc = None if st is None else {**_dc(st.info), "sshd_running": st.sshd_running,
                                   "container_states": st.containers, "healthy": st.healthy}
    if as_json:
        render.print_json(doc)
    elif st is None:
        click.echo("sandbox is not set up (opsctl sandbox up)")
    else:
        states = ", ".join(f"{c}: {s}" for c, s in st.containers.items())
        click.echo(f"sandbox {'up' if st.healthy else 'DEGRADED'}: sshd "
                   f"{'running' if st.sshd_running else 'stopped'} on 127.0.0.1:{st.info.port}; {states}")


def _dc(obj: t.Any) -> dict[str, t.Any]:
    import dataclasses

    d = dataclasses.asdict(obj)
    return {k: (str(v) if hasattr(v, "__fspath__") else v) for k, v in d.items()}


# --- deploy / status / logs / stop ---------------------------------------------------------


@cli.command()
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
@json_option
def deploy(host: str | None, ctid: int | None, accept_new_host_key: bool, playbook_path: str | None,
           replace: bool, no_wait: bool, poll_s: float, force_payload: bool, force_gpus: bool,
           as_json: bool) -> None:
    """Push the payload, prepare torch + cache, launch the job in tmux, watch until healthy."""
    from opsctl import jobs, render
    from opsctl import playbook as playbook_mod

    if host is None:
        raise errors.ConfigError("deploy needs --host (an inventory name or an address)")
    if playbook_path is None:
        playbook_path = jobs.default_playbook(host, ctid)
    book = playbook_mod.load(playbook_path)  # validate before touching anything remote
    err = render.console(stderr=True)
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        options = dict(replace=replace, wait=not no_wait, poll_s=poll_s,
                       force_payload=force_payload, prepare=_torch_prepare_hook(book),
                       force_gpus=force_gpus)
        with _deploy_progress(err, live=not as_json and err.is_terminal, quiet=as_json) as progress:
            try:
                report = jobs.deploy(tgt, book, on_update=progress.on_update,
                                     on_step=progress.on_step, **options)
            except (errors.JobFailed, errors.JobUnhealthy) as exc:
                _show_failed_deploy(exc, as_json)
                raise
    if as_json:
        render.print_json(report.to_dict())
        return
    out = render.console()
    render.status(out, report.target, report.status)
    out.print(render.deploy_verdict(report.job_id, report.outcome, report.status, report.elapsed_s))


def _torch_prepare_hook(book: t.Any) -> t.Any:
    """torch_deploy.prepare when the playbook needs it; None keeps deploy at one round trip."""
    from opsctl import torch_deploy

    return torch_deploy.prepare if torch_deploy.prepare_needed(book) else None


class _Progress:
    """Deploy progress: a live spinner on a terminal, else one line per change on stderr."""

    def __init__(self, err: t.Any, spinner: t.Any, quiet: bool):
        self.err, self.spinner, self.quiet = err, spinner, quiet
        self._last: t.Any = object()

    def on_step(self, name: str) -> None:
        from opsctl import render

        if self.spinner is not None:
            self.spinner.update(text=render.plain(f"{name}…"))
        elif not self.quiet and not name.endswith("-done"):
            self.err.print(render.plain(f"{render.now_stamp()} {name}…"))

    def on_update(self, st: t.Any, elapsed: float, problem: str | None) -> None:
        from opsctl import render

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


def _show_failed_deploy(exc: errors.OpsctlError, as_json: bool) -> None:
    """The report of a deploy whose job failed: the JSON document, or the status on stderr."""
    from opsctl import render

    report = getattr(exc, "report", None)
    if report is None:
        return
    if as_json:
        render.print_json({**report.to_dict(), "ok": False, "error": exc.to_dict()})
        click.get_current_context().meta["opsctl_json_done"] = True  # one document only
    else:
        render.status(render.console(stderr=True), report.target, report.status)


@cli.command()
@target_options
@click.option("--job", "job_id", type=clitypes.JOB_ID, default=None,
              help="Job id (default: the current job).")
@click.option("--lines", "-n", type=clitypes.COUNT, default=20, show_default=True, help="Pane lines to show.")
@click.option("--follow", "-f", is_flag=True, help="Follow until the job reaches a terminal state.")
@click.option("--poll", "poll_s", type=clitypes.SECONDS, default=2.0, show_default=True)
@json_option
def status(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
           lines: int, follow: bool, poll_s: float, as_json: bool) -> None:
    """Job state, pane tail, metrics, GPUs and a diagnosis of known failures."""
    from opsctl import jobs, watch

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        if follow:
            from opsctl import render

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
    if as_json:  # no rich on this path: `status --json` is polled by scripts (docs/speed.md)
        from opsctl.jsonout import print_json

        print_json(st.model_dump(mode="json"))
    else:
        from opsctl import render

        render.status(render.console(), tgt.label, st, pane_lines=lines)
    if follow and st.state.value != "SUCCEEDED":
        sys.exit(errors.JOB_FAILED)


@cli.command()
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
    from opsctl import jobs

    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        jobs.follow_logs(tgt, job_id, write, follow=follow, offset=offset)


@cli.command()
@target_options
@click.option("--job", "job_id", type=clitypes.JOB_ID, default=None)
@click.option("--grace", "grace_s", type=clitypes.SECONDS_OR_ZERO, default=30.0, show_default=True,
              help="Seconds after SIGINT before SIGTERM, then SIGKILL.")
@json_option
def stop(host: str | None, ctid: int | None, accept_new_host_key: bool, job_id: str | None,
         grace_s: float, as_json: bool) -> None:
    """Stop the job: SIGINT, then SIGTERM, then SIGKILL to all its processes (its group and
    detached children); exit 25 when one survives SIGKILL (its pids are shown)."""
    from opsctl import jobs, render

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        res = jobs.stop(tgt, job_id, grace_s)
    if as_json:
        render.print_json(res.model_dump(mode="json"))
    else:
        render.console().print(render.stop_line(res.job_id, res.state, res.signals_sent,
                                                res.remaining_pids))
    if res.remaining_pids:
        sys.exit(errors.REMOTE_FAILED)


# --- exec / hosts ------------------------------------------------------------------------


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@target_options
@click.option("--timeout", "timeout_s", type=clitypes.SECONDS, default=None,
              help="Deadline; when it fires the remote process group is killed.")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True)
def exec(host: str | None, ctid: int | None, accept_new_host_key: bool, timeout_s: float | None,
         argv: tuple[str, ...]) -> None:
    """Run ARGV in the container (after `--`); output streams, exit code passes through."""
    from opsctl import jobs

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


@cli.command()
@click.option("--check", is_flag=True, help="Also connect to each host and list its containers.")
@json_option
def hosts(check: bool, as_json: bool) -> None:
    """Hosts and containers in the inventory (reachability with --check)."""
    from opsctl import hostcheck, render

    rows = hostcheck.list_hosts(check=check)
    if as_json:
        render.print_json([r.to_dict() for r in rows])
        return
    from rich.table import Table

    table = Table(box=None)
    for c in ("host", "address", "user", "containers", "reachable", "detail"):
        table.add_column(c)
    for r in rows:
        reach = "-" if r.reachable is None else ("[green]yes[/]" if r.reachable else "[red]no[/]")
        table.add_row(render.plain(r.name), render.plain(f"{r.address}:{r.port}"), render.plain(r.user),
                      ", ".join(f"{c} ({g} GPU)" for c, g in r.containers.items()), reach,
                      render.plain(r.detail or ""))
    render.console().print(table)


@cli.command()
@json_option
def playbooks(as_json: bool) -> None:
    """Playbooks by name, with where each was found (./playbooks, ~/.opsctl/playbooks, bundled).

    The first directory that has a name wins; later ones with the same name are shadowed.
    """
    from opsctl import paths, render
    from opsctl import playbook as playbook_mod

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


@cli.group(cls=OpsctlGroup)
def mux() -> None:
    """Connection multiplexers: one kept SSH connection per host (OPSCTL_MUX=0 disables)."""


@mux.command("status")
@json_option
def mux_status(as_json: bool) -> None:
    """List the live multiplexers of this OPSCTL_HOME."""
    from opsctl import mux as mux_mod

    rows = mux_mod.list_muxes()
    if as_json:
        from opsctl import render

        render.print_json(rows)
        return
    if not rows:
        click.echo("no live multiplexer")
    for r in rows:
        click.echo(f"{r['host']} ({r['target']}): pid {r['pid']}, {r['calls']} calls, "
                   f"exits after {r['idle_s']:g} s idle")


@mux.command("stop")
def mux_stop() -> None:
    """Stop every live multiplexer (the next command connects directly)."""
    from opsctl import mux as mux_mod

    stopped = mux_mod.stop_all()
    click.echo(f"stopped {len(stopped)} multiplexer(s)")


@cli.group(cls=OpsctlGroup)
def host() -> None:
    """Host keys and trust."""


@host.command("trust")
@click.option("--host", "host_name", required=True)
@click.option("--yes", is_flag=True, help="Record the key without asking.")
def host_trust(host_name: str, yes: bool) -> None:
    """Show the host's key fingerprint and record it in known_hosts."""
    from opsctl import hostcheck

    shown = hostcheck.fetch_host_key(host_name)  # the one connection: shown == recorded
    click.echo(f"{host_name}: host key {shown.key.get_name()} {shown.fingerprint}")
    if shown.trusted:
        click.echo("already trusted")
        return
    if not yes and not click.confirm("trust this key?", default=False):
        raise errors.HostKeyError(f"{host_name}: key not trusted")
    hostcheck.record(shown)
    click.echo("recorded in known_hosts")




# Commands of other modules register themselves on `cli` (kept out of this file on purpose).
from opsctl import cli_diag, cli_torch, cli_view  # noqa: E402,F401


def main() -> None:
    cli(prog_name="opsctl")
