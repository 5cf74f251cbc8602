"""The ``opsctl`` group: error handling, shared options. The commands are listed in ``opsctl.cli``.

Every error that is an :class:`~opsctl.errors.OpsctlError` becomes one clear line
(plus hint and log path) and its family's exit code, in :meth:`OpsctlGroup.invoke`.
Anything else is a bug and keeps its traceback.

Every command is an :class:`~opsctl.cli.command.OpsctlCommand` and every group an
:class:`OpsctlGroup`, both with ``examples=(...)`` (see :mod:`opsctl.cli.command`).
"""

from __future__ import annotations

import functools
import typing as t

import click

from opsctl import errors, interrupts
from opsctl.cli import complete
from opsctl.cli import params as clitypes
from opsctl.cli.command import OpsctlCommand, WithExamples
from opsctl.errors import OpsctlError
from remote_payload import safe_write

F = t.TypeVar("F", bound=t.Callable[..., t.Any])


class JsonOnlyCommand(OpsctlCommand):
    """A command whose output is always one JSON document and has no ``--json`` option of its
    own (``opsctl schema``): ``opsctl --json`` takes it, and its errors are documents then."""


class OpsctlGroup(WithExamples, click.Group):
    """Every opsctl group: errors become one line and an exit code; ``.command`` and ``.group``
    make opsctl commands and groups."""

    command_class = OpsctlCommand
    group_class = type  # a subgroup is of this group's class

    def invoke(self, ctx: click.Context) -> t.Any:
        # what the subcommand will parse (click empties these before it does)
        words = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        interrupts.commands_running()
        try:
            return super().invoke(ctx)
        except OpsctlError as exc:
            interrupts.reraise_if_terminated(exc.exit_code)  # never the signal's error as a reply's
            _report_error(ctx, exc)
            ctx.exit(exc.exit_code)
        except safe_write.DestinationError as exc:  # a local write refused or failed
            err = errors.LocalWriteError.of(exc)
            interrupts.reraise_if_terminated(err.exit_code)
            _report_error(ctx, err)
            ctx.exit(err.exit_code)
        except click.UsageError as exc:  # bad flag or value: still one JSON document with --json
            if _json_requested(words) or _global_json(ctx):
                _usage_document(exc)
            raise
        except KeyboardInterrupt:
            ctx.exit(_report_interrupt(ctx))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        words = list(args)  # (click's parser consumes the list)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:  # `opsctl --json=1 …`: still one JSON document
            if ctx.parent is None and _json_requested(words):
                _usage_document(exc)
            raise

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        if (_global_json(ctx) and cmd is not None and not isinstance(cmd, click.Group)
                and not isinstance(cmd, JsonOnlyCommand)
                and not any(p.name == "as_json" for p in cmd.params)):
            raise click.UsageError(f"`{ctx.command_path} {name}` has no JSON output; "
                                   "leave out --json", ctx)
        return name, cmd, rest


def _usage_document(exc: click.UsageError) -> None:
    """A usage error's ``{"ok": false, ...}`` document (once: nested groups see it again)."""
    if getattr(exc, "_json_done", False):
        return
    from opsctl.cli.jsonout import print_json

    print_json({"ok": False, "error": {
        "type": "UsageError", "message": exc.format_message(), "exit_code": exc.exit_code,
        "hint": "see --help", "log_path": None}})
    exc._json_done = True  # type: ignore[attr-defined]


def _global_json(ctx: click.Context) -> bool:
    """``opsctl --json …`` (the root group's own option, parsed before any subcommand)."""
    return bool(ctx.find_root().params.get("as_json"))


def _json_requested(args: t.Sequence[str]) -> bool:
    """``--json`` (or ``--json=…``, which click refuses) among the words before ``--`` (what
    the command would have parsed)."""
    words = list(args)
    before = words[:words.index("--")] if "--" in words else words
    return any(w == "--json" or w.startswith("--json=") for w in before)


def _report_error(ctx: click.Context, exc: OpsctlError) -> None:
    """An error's end: its document on stdout (with --json, unless the command printed its
    own) and its one line on stderr."""
    from opsctl.cli import render

    if ctx.meta.get("opsctl_json") and not ctx.meta.get("opsctl_json_done"):
        render.print_json({"ok": False, "error": exc.to_dict()})
    render.error(render.console(stderr=True), exc)


def _report_interrupt(ctx: click.Context) -> int:
    """Ctrl-C: say what keeps running (with --json also as the one error document, so a
    script reading stdout never gets nothing); returns the exit code."""
    message = "interrupted (the remote job, if any, keeps running)"
    if ctx.meta.get("opsctl_json") and not ctx.meta.get("opsctl_json_done"):
        from opsctl.cli import render

        render.print_json({"ok": False, "error": errors.Interrupted(message).to_dict()})
    click.echo(message, err=True)
    return errors.INTERRUPTED


def json_option(f: F) -> F:
    @click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON document on stdout.")
    @functools.wraps(f)
    def wrapper(*args: t.Any, as_json: bool, **kwargs: t.Any) -> t.Any:
        ctx = click.get_current_context()
        as_json = as_json or _global_json(ctx)
        if as_json:
            ctx.meta["opsctl_json"] = True
        return f(*args, as_json=as_json, **kwargs)

    return t.cast(F, wrapper)


def target_options(f: F) -> F:
    """``--host``, ``--ct`` and ``--accept-new-host-key``, in that order (put it above the
    command's other options and arguments so that ``--help`` lists the target first)."""
    f = click.option("--accept-new-host-key", is_flag=True,
                     help="Like OpenSSH accept-new: record an unknown host key "
                          "(a changed key is still refused).")(f)
    f = click.option("--ct", "ctid", type=clitypes.CTID, default=None,
                     help="Container id (default: the last deploy's; a direct host takes "
                          "none).")(f)
    f = click.option("--host", "host", default=None, shell_complete=complete.hosts,
                     help="Inventory name or address, e.g. pve1 or 10.1.2.6 "
                          "(default: the last deploy's).")(f)
    return f


def job_argument(f: F) -> F:
    """An optional positional ``JOB`` (id or unique prefix; default: the container's current,
    i.e. last launched, job) and the same as an option, ``--job``; the command gets ``job_id``."""

    @click.argument("job", type=clitypes.JOB_ID, required=False, shell_complete=complete.jobs)
    @click.option("--job", "job_opt", type=clitypes.JOB_ID, default=None,
                  help="Job id or unique prefix; the same as the JOB argument.")
    @functools.wraps(f)
    def wrapper(*args: t.Any, job: str | None, job_opt: str | None, **kwargs: t.Any) -> t.Any:
        if job and job_opt and job != job_opt:
            raise click.UsageError(f"two job ids: {job} and --job {job_opt}")
        return f(*args, job_id=job or job_opt, **kwargs)

    return t.cast(F, wrapper)


def yes_option(f: F) -> F:
    return click.option("-y", "--yes", "yes", is_flag=True,
                        help="Do not ask for confirmation (it is only asked on a terminal).")(f)


def interactive() -> bool:
    """A person can answer: stdin and stderr (where the question goes) are terminals."""
    import sys

    return bool(sys.stdin and sys.stdin.isatty() and sys.stderr.isatty())


def confirm(question: str, *, yes: bool) -> None:
    """Ask ``question`` on a terminal unless ``yes``; never asks without one.

    Raises:
        Declined: the answer was no (nothing was done).
    """
    if yes or not interactive():
        return
    if not click.confirm(question, default=False, err=True):
        raise errors.Declined("not confirmed: nothing was done")


def version_text() -> str:
    """``opsctl, version X``: the installed distribution's version, or, run from a checkout
    that was never installed (``python3 -m opsctl`` in the tree), the checkout's
    ``pyproject.toml`` version, said as such. click's ``version_option(package_name=)``
    raises ``RuntimeError`` there, a traceback for a question that has an answer."""
    import importlib.metadata
    from pathlib import Path

    try:
        return f"opsctl, version {importlib.metadata.version('opsctl')}"
    except importlib.metadata.PackageNotFoundError:
        pass
    import tomllib

    tree = Path(__file__).resolve().parents[2]
    try:
        with (tree / "pyproject.toml").open("rb") as f:
            version = str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        version = "unknown"
    return f"opsctl, version {version} (not installed: the checkout at {tree})"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_text())
        ctx.exit(0)


@click.group(cls=OpsctlGroup, context_settings={"help_option_names": ["-h", "--help"]}, examples=(
    "opsctl status --host pve1 --ct 200",
    "opsctl --json jobs --host pve1 --ct 200",
    "opsctl help exit-codes",
))
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show opsctl's version (installed, or the checkout's) and exit.")
@click.option("--json", "as_json", is_flag=True,
              help="Every command's --json: exactly one JSON document on stdout.")
def cli(as_json: bool) -> None:
    """Run GPU training jobs in Proxmox LXC containers and keep them healthy."""


def as_dict(obj: t.Any) -> dict[str, t.Any]:
    """A dataclass as a JSON-ready dict (paths as strings)."""
    import dataclasses

    d = dataclasses.asdict(obj)
    return {k: (str(v) if hasattr(v, "__fspath__") else v) for k, v in d.items()}
