"""Files in and out of a container: push and pull (the use case: :mod:`opsctl.ops.files`)."""

from __future__ import annotations

import contextlib
import sys
import typing as t

import click

from opsctl.cli import params as clitypes
from opsctl.cli.app import json_option, target_options
from opsctl.cli.command import OpsctlCommand

_method = click.option("--method", type=click.Choice(["auto", "rsync", "tar"]), default=None,
                       help="rsync (when both ends have it) or the verified tar stream; "
                            "default auto ($OPSCTL_FILES_METHOD).")
_bwlimit = click.option("--bwlimit", "bwlimit_kib", type=clitypes.BWLIMIT, default=None,
                        help="Cap the transfer at this many KiB/s (as rsync's --bwlimit).")
_delete = click.option("--delete", is_flag=True,
                       help="Remove files at DEST that SRC does not have (never without it; "
                            "never in /, a system directory, a home or the current directory; "
                            "asks above 10 files).")
_yes = click.option("-y", "--yes", "yes", is_flag=True,
                    help="Confirm a --delete of more than 10 entries (asked on a terminal; "
                         "without one, refused unless -y).")
_dry_run = click.option("--dry-run", is_flag=True,
                        help="Print what would be sent and deleted; change nothing.")


def _approve(yes: bool) -> t.Callable[[t.Any], None]:
    """The ``--delete`` gate: say how many entries go; above ``DELETE_ASK_ABOVE`` ask on a
    terminal (``-y`` skips), and without one refuse rather than hang or guess.

    Raises:
        Declined: the answer was no (exit 130).
        ConfigError: above the threshold, no terminal and no ``-y``.
    """
    from opsctl import errors
    from opsctl.cli import render
    from opsctl.cli.app import confirm, interactive
    from opsctl.ops.filepaths import DELETE_ASK_ABOVE

    def approve(plan: t.Any) -> None:
        n = len(plan.delete)
        if n == 0:
            return
        shown = ", ".join(repr(p or ".") for p in plan.delete[:5]) + (" …" if n > 5 else "")
        render.console(stderr=True).print(render.plain(  # stderr: --json keeps stdout
            f"--delete will remove {n} entr{'y' if n == 1 else 'ies'} under {plan.dest}: "
            f"{shown}"))
        if n <= DELETE_ASK_ABOVE or yes:
            return
        if not interactive():
            raise errors.ConfigError(
                f"--delete would remove {n} entries under {plan.dest} (more than "
                f"{DELETE_ASK_ABOVE}) and there is no terminal to ask; nothing was sent",
                hint="check them with --dry-run, then pass -y to confirm")
        confirm(render.safe(f"remove these {n} entries under {plan.dest}?"), yes=False)

    return approve


@contextlib.contextmanager
def _progress(label: str, live: bool) -> t.Iterator[t.Callable[[int, int | None], None] | None]:
    """:func:`opsctl.cli.render.transfer_bar` on a terminal; nothing otherwise, and then rich
    is not even imported (a ``--json`` re-push is meant to take well under 2 s)."""
    if not live:
        yield None
        return
    from opsctl.cli import render

    with render.transfer_bar(label) as bar:
        yield bar


def _show_plan(plan: t.Any, as_json: bool) -> None:
    if as_json:
        from opsctl.cli.jsonout import print_json

        print_json(plan.to_dict())
        return
    from opsctl.cli import render

    con = render.console()
    con.print(render.plain(f"dry run: {plan.direction} {plan.src} -> {plan.dest} ({plan.target}): "
                           f"would send {len(plan.send)}, delete {len(plan.delete)}; "
                           "nothing changed"))
    for verb, names in (("send", plan.send), ("delete", plan.delete)):
        for name in names:
            con.print(render.plain(f"  {verb} {name or '.'}"))


def _show(reports: t.Sequence[t.Any], as_json: bool) -> None:
    if as_json:  # no rich on this path (startup time: a re-push is meant to take well under 2 s)
        from opsctl.cli.jsonout import print_json

        print_json(reports[0].to_dict() if len(reports) == 1 else
                   {"ok": True, "transfers": [r.to_dict() for r in reports]})
        return
    from opsctl.cli import render

    con = render.console()
    for r in reports:
        con.print(render.plain(
            f"{r.direction} {r.src} -> {r.dest} ({r.target}): {r.files} files, "
            f"{r.bytes / 1e6:.1f} MB sent of {r.total_bytes / 1e6:.1f} MB "
            f"({r.matched_bytes / 1e6:.1f} MB already there), {r.deleted} deleted, "
            f"{r.seconds:.2f} s via {r.method}"))


@click.command(cls=OpsctlCommand, examples=(
    "opsctl push . --host pve1 --ct 200 --dry-run",
    "opsctl push . /root/work --host pve1 --ct 200 --delete -y --bwlimit 20000",
))
@target_options
@click.argument("src", type=click.Path(exists=True, file_okay=True, dir_okay=True))
@click.argument("dest", required=False)
@_method
@_delete
@_dry_run
@_yes
@_bwlimit
@json_option
def push(host: str | None, ctid: int | None, accept_new_host_key: bool, src: str,
         dest: str | None, method: str | None, delete: bool, dry_run: bool, yes: bool,
         bwlimit_kib: int | None, as_json: bool) -> None:
    """Copy SRC (a file or directory here) into the container, resumable and verified
    (same-sized files are compared by content).

    DEST is the copy's path in the container: absolute, or relative to <root>/data (and
    staying inside it; default: <root>/data/<name of SRC>). Run again to resume; unchanged
    files are skipped.
    """
    from opsctl.ops import files, jobs

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        if dry_run:
            _show_plan(files.plan_push(tgt, src, dest, delete=delete), as_json)
            return
        with _progress(f"push {src}", live=not as_json and sys.stderr.isatty()) as bar:
            report = files.push(tgt, src, dest, delete=delete, method=method, on_progress=bar,
                                bwlimit_kib=bwlimit_kib, approve=_approve(yes))
    _show([report], as_json)


@click.command(cls=OpsctlCommand, examples=(
    "opsctl pull --host pve1 --ct 200 --playbook dflash-8gpu",
    "opsctl pull /root/work/out ./out --host pve1 --ct 200 --method rsync --json",
))
@target_options
@click.argument("src", required=False)
@click.argument("dest", required=False, type=click.Path())
@click.option("--playbook", "playbook_path", default=None,
              help="Without SRC: fetch this playbook's `outputs:` (default: the container's "
                   "inventory playbook).")
@click.option("--force", is_flag=True,
              help="Pull over an existing DEST that no earlier pull wrote (its files are "
                   "overwritten). Never the current directory, a home or /.")
@_method
@_delete
@_dry_run
@_yes
@_bwlimit
@json_option
def pull(host: str | None, ctid: int | None, accept_new_host_key: bool, src: str | None,
         dest: str | None, playbook_path: str | None, force: bool, method: str | None,
         delete: bool, dry_run: bool, yes: bool, bwlimit_kib: int | None, as_json: bool) -> None:
    """Copy SRC (a container path) here, resumable and verified (same-sized files are
    compared by content).

    SRC is absolute or relative to <root>/data; DEST defaults to ./<name of SRC> (never the
    current directory itself; `pull /` needs a DEST). An existing DEST that no pull wrote is
    refused without --force. Without SRC, every path in the playbook's `outputs:` is fetched
    to ./<its name> (two outputs with one name are refused, naming both).
    """
    from opsctl import errors
    from opsctl.ops import deploy as deploy_ops
    from opsctl.ops import files, jobs

    live = not as_json and sys.stderr.isatty()
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        if src is None:
            if dest is not None or delete or dry_run:
                raise errors.ConfigError("pull: DEST, --delete or --dry-run without SRC")
            book = deploy_ops.load_playbook(tgt, playbook_path)
            with _progress(f"pull {book.name} outputs", live) as bar:
                reports = files.pull_playbook_outputs(tgt, book, method=method, on_progress=bar,
                                                      force=force)
        elif dry_run:
            _show_plan(files.plan_pull(tgt, src, dest, delete=delete), as_json)
            return
        else:
            with _progress(f"pull {src}", live) as bar:
                reports = [files.pull(tgt, src, dest, delete=delete, method=method,
                                      on_progress=bar, bwlimit_kib=bwlimit_kib,
                                      approve=_approve(yes), force=force)]
    _show(reports, as_json)


#: This family's commands (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (push, pull)
