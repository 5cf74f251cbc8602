"""Torch build and compile-cache commands: ``swap-torch``, ``envs``, ``cache info|clear|seed``."""

from __future__ import annotations

import time
import typing as t

import click

from opsctl.cli import params as clitypes
from opsctl.cli.app import OpsctlGroup, json_option, target_options
from opsctl.cli.command import OpsctlCommand


def _progress(as_json: bool) -> t.Callable[[str], None]:
    from opsctl.cli import render

    err = render.console(stderr=True)

    def say(msg: str) -> None:
        if not as_json:
            err.print(render.plain(f"{render.now_stamp()} {msg}"))

    return say


@click.command("swap-torch", cls=OpsctlCommand, examples=(
    "opsctl swap-torch cu128 --host pve1 --ct 200 --dry-run",
    "opsctl swap-torch cu128 --host pve1 --ct 200 --version 2.11.0 --json",
))
@click.argument("variant")
@target_options
@click.option("--version", "version", default=None, help="torch release, e.g. 2.11.0 (default: builds table)")
@click.option("--index-url", default=None, help="Override the build's index (mirror).")
@click.option("--wheelhouse/--no-wheelhouse", "wheelhouse", default=None,
              help="Download wheels here and stream them in (air-gapped hosts).")
@click.option("--requirement", "requirements", multiple=True, help="Extra package for the new env.")
@click.option("--reinstall", is_flag=True, help="Rebuild the env even if it exists.")
@click.option("--dry-run", is_flag=True, help="Say what would happen; change nothing.")
@json_option
def swap_torch(variant: str, host: str | None, ctid: int | None, accept_new_host_key: bool,
               version: str | None, index_url: str | None, wheelhouse: bool | None,
               requirements: tuple[str, ...], reinstall: bool, dry_run: bool, as_json: bool) -> None:
    """Switch the container's torch build (e.g. cu130); the old build stays until the new one verifies."""
    from opsctl.cli import render
    from opsctl.ops import jobs
    from opsctl.ops import torch as torch_ops

    torch_ops.check_index_url(index_url)  # refused before connecting
    start = time.monotonic()
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        rep = torch_ops.swap(tgt, variant, version=version, index_url=index_url,
                                wheelhouse=wheelhouse, requirements=requirements, dry_run=dry_run,
                                reinstall=reinstall, progress=_progress(as_json))
    rep["elapsed_s"] = round(time.monotonic() - start, 2)
    if as_json:
        render.print_json(rep)
        return
    con = render.console()
    con.print(render.swap_headline(rep))
    for fact in rep.get("checked") or []:
        con.print(render.plain(f"  checked: {fact}"))
    verification = rep.get("verification")
    checks = verification["checks"] if verification else []
    for c in checks:
        mark = "skipped" if c.get("skipped") else ("ok" if c.get("ok") else "FAILED")
        con.print(render.plain(f"  verify {c.get('name')}: {mark} {c.get('detail') or ''}"))
    if rep.get("log_path"):
        con.print(render.plain(f"  log (on the target): {rep['log_path']}", style="dim"))


@click.command(cls=OpsctlCommand, examples=(
    "opsctl envs --host pve1 --ct 200",
    "opsctl envs --host pve1 --ct 200 --history 5 --json",
))
@target_options
@click.option("--history", type=clitypes.COUNT, default=20, show_default=True,
              help="Entries of the swap history to show, newest first.")
@json_option
def envs(host: str | None, ctid: int | None, accept_new_host_key: bool, history: int,
         as_json: bool) -> None:
    """Torch builds in the container: sizes, which is current, swap history."""
    from opsctl.cli import render
    from opsctl.ops import jobs
    from opsctl.ops import torch as torch_ops

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        label, doc = tgt.label, torch_ops.envs(tgt, history)
    if as_json:
        render.print_json(doc)
        return
    render.torch_envs(render.console(), label, doc, history)


@click.group(cls=OpsctlGroup, examples=(
    "opsctl cache info --host pve1 --ct 200",
    "opsctl cache clear --host pve1 --ct 200",
))
def cache() -> None:
    """Compile caches, one per torch build fingerprint."""


@cache.command("info", examples=(
    "opsctl cache info --host pve1 --ct 200 --json",
))
@target_options
@json_option
def cache_info(host: str | None, ctid: int | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Per fingerprint: size, files, created, last used, current or stale; outside caches warned."""
    from opsctl.cli import render
    from opsctl.ops import jobs
    from opsctl.ops import torch as torch_ops

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        label, doc = tgt.label, torch_ops.cache_info(tgt)
    if as_json:
        render.print_json(doc)
        return
    render.compile_caches(render.console(), label, doc)


@cache.command("clear", examples=(
    "opsctl cache clear --host pve1 --ct 200",
    "opsctl cache clear --host pve1 --ct 200 --all --json",
))
@target_options
@click.option("--all", "clear_all", is_flag=True, help="Every build's cache, not just the current one.")
@json_option
def cache_clear(host: str | None, ctid: int | None, accept_new_host_key: bool, clear_all: bool,
                as_json: bool) -> None:
    """Delete the current build's compile cache (or every cache with --all)."""
    from opsctl.cli import render
    from opsctl.ops import jobs
    from opsctl.ops import torch as torch_ops

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        doc = torch_ops.cache_clear(tgt, clear_all=clear_all)
    if as_json:
        render.print_json(doc)
        return
    removed = doc.get("removed", [])
    click.echo(f"removed {len(removed)} cache(s), freed {(doc.get('freed_bytes') or 0) / 1e6:.1f} MB")


@cache.command("seed", examples=(
    "opsctl cache seed --host pve1 --ct 200 --playbook dflash-8gpu",
    "opsctl cache seed --host pve1 --ct 200 --playbook dflash-8gpu --timeout 3600 --json",
))
@target_options
@click.option("--playbook", "playbook_path", required=True,
              help="Path or name of the playbook whose shapes are compiled.")
@click.option("--timeout", "timeout_s", type=clitypes.SECONDS, default=1800.0, show_default=True,
              help="Seconds each of the two runs (cold, then seeded) may take.")
@json_option
def cache_seed(host: str | None, ctid: int | None, accept_new_host_key: bool, playbook_path: str,
               timeout_s: float, as_json: bool) -> None:
    """Warm the current build's cache with the playbook's exact shapes; prove reuse by hit counters."""
    from opsctl.cli import render
    from opsctl.config import playbook as playbook_mod
    from opsctl.ops import jobs
    from opsctl.ops import torch as torch_ops

    book = playbook_mod.load(playbook_path)
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        doc = torch_ops.seed_cache(tgt, book, timeout_s, _progress(as_json))
    if as_json:
        render.print_json(doc)
        return
    cold, seeded = doc.get("cold") or {}, doc.get("seeded") or {}
    click.echo(f"seeded {doc.get('fingerprint')}: compile {cold.get('compile_seconds')} s cold -> "
               f"{seeded.get('compile_seconds')} s seeded (x{doc.get('speedup')}); "
               f"hits {seeded.get('hits')}; reuse proven: {doc.get('reuse_proven')}")


#: This family's commands, in ``opsctl --help`` order of appearance (added by ``opsctl.cli``).
COMMANDS: tuple[click.Command, ...] = (swap_torch, envs, cache)
