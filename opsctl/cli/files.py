"""Files in and out of a container: push and pull (the use case: :mod:`opsctl.ops.files`)."""

from __future__ import annotations

import contextlib
import sys
import typing as t

import click

from opsctl.cli import params as clitypes
from opsctl.cli.app import json_option, target_options

_method = click.option("--method", type=click.Choice(["auto", "rsync", "tar"]), default=None,
                       help="rsync (when both ends have it) or the verified tar stream; "
                            "default auto ($OPSCTL_FILES_METHOD).")
_bwlimit = click.option("--bwlimit", "bwlimit_kib", type=clitypes.BWLIMIT, default=None,
                        help="Cap the transfer at this many KiB/s (as rsync's --bwlimit).")
_delete = click.option("--delete", is_flag=True,
                       help="Remove files at DEST that SRC does not have (never without it).")


@contextlib.contextmanager
def _progress(label: str, live: bool) -> t.Iterator[t.Callable[[int, int | None], None] | None]:
    """A rich bar with bytes/s on a terminal; nothing otherwise (and never with --json)."""
    if not live:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from opsctl.cli import render

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(),
                  console=render.console(stderr=True), transient=True) as bar:
        task = bar.add_task(render.safe(label), total=None)

        def update(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        yield update


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


@click.command()
@target_options
@click.argument("src", type=click.Path(exists=True, file_okay=True, dir_okay=True))
@click.argument("dest", required=False)
@_method
@_delete
@_bwlimit
@json_option
def push(host: str | None, ctid: int | None, accept_new_host_key: bool, src: str,
         dest: str | None, method: str | None, delete: bool, bwlimit_kib: int | None,
         as_json: bool) -> None:
    """Copy SRC (a file or directory here) into the container, resumable and verified.

    DEST is the copy's path in the container: absolute, or relative to <root>/data
    (default: <root>/data/<name of SRC>). Run again to resume; unchanged files are skipped.
    """
    from opsctl.ops import files, jobs

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt, \
            _progress(f"push {src}", live=not as_json and sys.stderr.isatty()) as bar:
        report = files.push(tgt, src, dest, delete=delete, method=method, on_progress=bar,
                            bwlimit_kib=bwlimit_kib)
    _show([report], as_json)


@click.command()
@target_options
@click.argument("src", required=False)
@click.argument("dest", required=False, type=click.Path())
@click.option("--playbook", "playbook_path", default=None,
              help="Without SRC: fetch this playbook's `outputs:` (default: the container's "
                   "inventory playbook).")
@_method
@_delete
@_bwlimit
@json_option
def pull(host: str | None, ctid: int | None, accept_new_host_key: bool, src: str | None,
         dest: str | None, playbook_path: str | None, method: str | None, delete: bool,
         bwlimit_kib: int | None, as_json: bool) -> None:
    """Copy SRC (a container path) here, resumable and verified.

    SRC is absolute or relative to <root>/data; DEST defaults to ./<name of SRC>. Without
    SRC, every path in the playbook's `outputs:` is fetched to ./<its name>.
    """
    from opsctl import errors
    from opsctl.ops import deploy as deploy_ops
    from opsctl.ops import files, jobs

    live = not as_json and sys.stderr.isatty()
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        if src is None:
            if dest is not None:
                raise errors.ConfigError("pull: DEST without SRC")
            book = deploy_ops.load_playbook(tgt, playbook_path)
            with _progress(f"pull {book.name} outputs", live) as bar:
                reports = files.pull_playbook_outputs(tgt, book, method=method, on_progress=bar)
        else:
            with _progress(f"pull {src}", live) as bar:
                reports = [files.pull(tgt, src, dest, delete=delete, method=method,
                                      on_progress=bar, bwlimit_kib=bwlimit_kib)]
    _show(reports, as_json)


#: This family's commands (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (push, pull)
