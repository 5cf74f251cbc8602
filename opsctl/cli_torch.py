"""Torch build and compile-cache commands: ``swap-torch``, ``envs``, ``cache info|clear|seed``."""

from __future__ import annotations

import time
import typing as t

import click

from opsctl import clitypes
from opsctl.cli import OpsctlGroup, cli, json_option, target_options


def _progress(as_json: bool) -> t.Callable[[str], None]:
    from opsctl import render

    err = render.console(stderr=True)

    def say(msg: str) -> None:
        if not as_json:
            err.print(render.plain(f"{render.now_stamp()} {msg}"))

    return say


def _payload_and_call(host: str | None, ctid: int | None, accept_new_host_key: bool, verb: str,
                      *args: str, timeout: float) -> tuple[str, t.Any]:
    """One agent verb with the current payload in place; returns (target label, data)."""
    from opsctl import jobs

    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        tgt.agent.ensure_payload()
        return tgt.label, tgt.agent.call(verb, *args, timeout=timeout)


@cli.command("swap-torch")
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
    from opsctl import jobs, render, torch_deploy

    start = time.monotonic()
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        rep = torch_deploy.swap(tgt, variant, version=version, index_url=index_url,
                                wheelhouse=wheelhouse, requirements=requirements, dry_run=dry_run,
                                reinstall=reinstall, progress=_progress(as_json))
    rep["elapsed_s"] = round(time.monotonic() - start, 2)
    if as_json:
        render.print_json(rep)
        return
    con = render.console()
    con.print(render.swap_headline(rep))
    checks = ((rep.get("verification") or {}).get("checks")) or []
    for c in checks:
        mark = "skipped" if c.get("skipped") else ("ok" if c.get("ok") else "FAILED")
        con.print(render.plain(f"  verify {c.get('name')}: {mark} {c.get('detail') or ''}"))
    if rep.get("log_path"):
        con.print(render.plain(f"  log (in the container): {rep['log_path']}", style="dim"))


@cli.command()
@target_options
@click.option("--history", type=clitypes.COUNT, default=20, show_default=True)
@json_option
def envs(host: str | None, ctid: int | None, accept_new_host_key: bool, history: int,
         as_json: bool) -> None:
    """Torch builds in the container: sizes, which is current, swap history."""
    from rich.table import Table

    from opsctl import render

    label, doc = _payload_and_call(host, ctid, accept_new_host_key, "envs", "--history",
                                   str(history), timeout=60)
    if as_json:
        render.print_json(doc)
        return
    con = render.console()
    table = Table(title=f"torch builds on {label}", title_justify="left", box=None)
    for col in ("", "build", "pin", "size", "installed", "source"):
        table.add_column(col)
    for b in doc.get("builds", []):
        table.add_row("*" if b.get("current") else "", render.plain(b["name"]),
                      render.plain(b.get("pin", "")), f"{(b.get('size_bytes') or 0) / 1e9:.2f} GB",
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(b.get("installed_at") or 0)),
                      render.plain("wheelhouse" if b.get("wheelhouse") else (b.get("index_url") or "")))
    con.print(table)
    if not doc.get("builds"):
        con.print("no torch build installed yet (opsctl swap-torch <variant>)")
    for h in doc.get("history", [])[-history:]:
        con.print(render.plain(
            f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(h.get('time', 0)))} "
            f"{h.get('from') or '-'} -> {h.get('to')}: {h.get('action')} {h.get('result')}"
            + (f" ({h.get('step')}: {h.get('reason')})" if h.get("result") != "ok" else "")))


@cli.group(cls=OpsctlGroup)
def cache() -> None:
    """Compile caches, one per torch build fingerprint."""


@cache.command("info")
@target_options
@json_option
def cache_info(host: str | None, ctid: int | None, accept_new_host_key: bool, as_json: bool) -> None:
    """Per fingerprint: size, files, created, last used, current or stale; outside caches warned."""
    from rich.table import Table

    from opsctl import render

    label, doc = _payload_and_call(host, ctid, accept_new_host_key, "cache-info", timeout=120)
    if as_json:
        render.print_json(doc)
        return
    con = render.console()
    table = Table(title=f"compile caches on {label}", title_justify="left", box=None)
    for col in ("status", "fingerprint", "size", "files", "last used", "mega-cache"):
        table.add_column(col)
    for c in doc.get("caches", []):
        table.add_row(render.plain(c.get("status", "")), render.plain(c["fingerprint"]),
                      f"{(c.get('size_bytes') or 0) / 1e6:.1f} MB",
                      str(c.get("files", "")),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(c.get("last_used_at") or 0)),
                      "yes" if c.get("mega_cache") else "")
    con.print(table)
    for w in doc.get("warnings", []):
        con.print(render.plain(f"warning: {w}", style="yellow"))


@cache.command("clear")
@target_options
@click.option("--all", "clear_all", is_flag=True, help="Every build's cache, not just the current one.")
@json_option
def cache_clear(host: str | None, ctid: int | None, accept_new_host_key: bool, clear_all: bool,
                as_json: bool) -> None:
    """Delete the current build's compile cache (or every cache with --all)."""
    from opsctl import render

    _, doc = _payload_and_call(host, ctid, accept_new_host_key, "cache-clear",
                               *(["--all"] if clear_all else []), timeout=300)
    if as_json:
        render.print_json(doc)
        return
    removed = doc.get("removed", [])
    click.echo(f"removed {len(removed)} cache(s), freed {(doc.get('freed_bytes') or 0) / 1e6:.1f} MB")


@cache.command("seed")
@target_options
@click.option("--playbook", "playbook_path", required=True)
@click.option("--timeout", "timeout_s", type=clitypes.SECONDS, default=1800.0, show_default=True)
@json_option
def cache_seed(host: str | None, ctid: int | None, accept_new_host_key: bool, playbook_path: str,
               timeout_s: float, as_json: bool) -> None:
    """Warm the current build's cache with the playbook's exact shapes; prove reuse by hit counters."""
    from opsctl import jobs, render, torch_deploy
    from opsctl import playbook as playbook_mod

    book = playbook_mod.load(playbook_path)
    with jobs.open_target(host, ctid, accept_new_host_key=accept_new_host_key) as tgt:
        tgt.agent.ensure_payload()
        _progress(as_json)("compiling every shape bucket cold, then again from the seeded cache…")
        doc = torch_deploy.cache_seed(tgt, book, timeout_s)
    if as_json:
        render.print_json(doc)
        return
    cold, seeded = doc.get("cold") or {}, doc.get("seeded") or {}
    click.echo(f"seeded {doc.get('fingerprint')}: compile {cold.get('compile_seconds')} s cold -> "
               f"{seeded.get('compile_seconds')} s seeded (x{doc.get('speedup')}); "
               f"hits {seeded.get('hits')}; reuse proven: {doc.get('reuse_proven')}")
