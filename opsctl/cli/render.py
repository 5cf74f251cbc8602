"""Human rendering with rich: every table, panel and line the commands print.

Only ``opsctl/cli/`` imports rich (``tests/test_architecture.py``); the ``--json`` paths
print through :mod:`.jsonout`, which does not.

Colours live in a table here, not in the state enum.
"""

from __future__ import annotations

import time
import typing as t

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from opsctl.cli.jsonout import print_json as print_json  # re-exported: callers use render.print_json
from opsctl.errors import OpsctlError
from opsctl.remote.models import DiagnosisItem, GpuRow, JobStatus
from remote_payload.wire import JobState, parse_event

STATE_COLOR: dict[JobState, str] = {
    JobState.PENDING: "grey50",
    JobState.SETTING_UP: "cyan",
    JobState.COMPILING: "magenta",
    JobState.RUNNING: "green",
    JobState.SUCCEEDED: "bold green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "yellow",
    JobState.LOST: "bold red",
}
SEVERITY_COLOR = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def console(stderr: bool = False) -> Console:
    # soft_wrap: an error stays one line (grep-able, copy-able), whatever the terminal width
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr)


def error(con: Console, exc: OpsctlError) -> None:
    con.print(Text(f"error: {exc.message}", style="bold red"))
    if exc.hint:
        con.print(Text(f"  hint: {exc.hint}", style="yellow"))
    if exc.log_path:
        con.print(Text(f"  full output: {exc.log_path}", style="dim"))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s"
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    if d:
        return f"{d}d{h:02d}h{m:02d}m"
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def state_text(state: JobState) -> Text:
    return Text(state.value, style=STATE_COLOR[state])


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def gpu_table(gpus: list[GpuRow]) -> Table:
    table = Table(title="GPUs", title_justify="left", box=None, pad_edge=False)
    for col in ("#", "name", "util %", "mem used/total MiB", "temp °C", "power W"):
        table.add_column(col, justify="left" if col == "name" else "right")
    for g in gpus:
        table.add_row(str(g.index), g.name, _num(g.util_pct),
                      f"{_num(g.mem_used_mib)}/{_num(g.mem_total_mib)}", _num(g.temp_c),
                      _num(g.power_w, "{:.1f}"))
    return table


def diagnosis(items: list[DiagnosisItem]) -> Panel | None:
    if not items:
        return None
    parts: list[Text] = []
    for d in items:
        parts.append(Text(f"[{d.severity}] {d.cause}: {d.summary}", style=SEVERITY_COLOR[d.severity]))
        parts.extend(Text(f"    evidence: {e}", style="dim") for e in d.evidence[:4])
        if d.hint:
            parts.append(Text(f"    next: {d.hint}", style="bold"))
    worst = "red" if any(d.severity == "error" for d in items) else "yellow"
    return Panel(Group(*parts), title="diagnosis", border_style=worst, title_align="left")


def metrics_line(step: dict[str, t.Any] | None) -> Text:
    if not step:
        return Text("metrics: no step events yet", style="dim")
    bits = [f"step {step.get('step')}"]
    if step.get("loss") is not None:
        bits.append(f"loss {step['loss']:.4f}")
    if step.get("acc") is not None:
        bits.append(f"acc {step['acc']:.3f}")
    if step.get("tok_s") is not None:
        bits.append(f"{step['tok_s'] / 1000:.2f} Ktok/s")
    if step.get("eta_s") is not None:
        bits.append(f"ETA {duration(step['eta_s'])}")
    if step.get("lr") is not None:
        bits.append(f"lr {step['lr']:.2e}")
    return Text("metrics: " + " · ".join(bits), style="bold")


def status(con: Console, target: str, st: JobStatus, *, pane_lines: int = 20) -> None:
    head = Text.assemble(("job ", "dim"), (st.job_id, "bold"), ("  on ", "dim"), (target, "bold"),
                         ("  state ", "dim"), state_text(st.state))
    if st.phase:
        head.append(f"  phase {st.phase}", style="dim")
    con.print(head)
    ended = ""
    if st.exit_code is not None:
        ended = f"  exit code {st.exit_code}"
    if st.signal:
        ended = f"  killed by {st.signal}"
    con.print(Text(f"elapsed {duration(st.elapsed_s)}  pid {st.pid or '-'}{ended}", style="dim"))
    con.print(metrics_line(st.last_step))
    for e in st.evidence:
        con.print(Text(f"evidence: {e}", style="yellow"))
    panel = diagnosis(st.diagnosis)
    if panel is not None:
        con.print(panel)
    # events are for machines (status parses them); the human panel shows the human lines
    tail = [x for x in (st.pane_tail or st.output_tail) if parse_event(x) is None]
    if tail:
        src = "pane" if st.pane_tail else "output.log"
        shown = tail[-pane_lines:]
        con.print(Panel("\n".join(shown), title=f"{src} (last {len(shown)} lines)",
                        title_align="left", border_style="dim"))
    if st.gpus:
        con.print(gpu_table(st.gpus))
    elif st.gpu_error:
        con.print(Text(f"GPUs: {st.gpu_error}", style="yellow"))
    else:
        con.print(Text("GPUs: none in this container", style="dim"))
    if st.output_log:
        con.print(Text(f"full output: {st.output_log} (in the container; `opsctl logs`)", style="dim"))


def progress_line(st: JobStatus | None, elapsed: float, problem: str | None) -> Text:
    if problem:
        return Text(f"{duration(elapsed)}  {problem}", style="yellow")
    if st is None:
        return Text(f"{duration(elapsed)}  waiting for the first status…")
    line = Text(f"{duration(elapsed)}  ")
    line.append_text(state_text(st.state))
    if st.phase:
        line.append(f" ({st.phase})", style="dim")
    if st.last_step and st.last_step.get("tok_s") is not None:
        line.append(f"  step {st.last_step.get('step')} {st.last_step['tok_s'] / 1000:.2f} Ktok/s")
    human = [x for x in st.output_tail if parse_event(x) is None]
    if human:
        line.append(f"  │ {human[-1][:80]}", style="dim")
    return line


def now_stamp() -> str:
    return time.strftime("%H:%M:%S")


def stacks(con: Console, doc: dict[str, t.Any]) -> None:
    """``opsctl stacks``: a summary line, then each process's dump under its rank/pid/GPU."""
    procs = doc.get("processes") or []
    con.print(f"{doc.get('job_id')}: {doc.get('threads')} threads in {len(procs)} process(es); "
              f"{doc.get('summary') or ''}", style="bold", markup=False, highlight=False)
    for p in procs:
        who = " ".join(x for x in (
            f"rank {p['rank']}" if p.get("rank") is not None else "",
            p.get("role") or "", f"GPU {p['gpu']}" if p.get("gpu") is not None else "",
            f"pid {p['pid']}" if p.get("pid") is not None else "") if x)
        con.print(f"\n── {who}: {p.get('label')} ({p.get('threads')} threads) · {p.get('cmd')}",
                  style="bold cyan", markup=False, highlight=False)
        con.print(p.get("dump", ""), markup=False, highlight=False)
    if doc.get("saved_to"):
        con.print(f"saved in the container: {doc['saved_to']}", style="dim", markup=False)


# --- tables of the torch, probe and hosts commands -------------------------------------------


def torch_envs(con: Console, label: str, doc: dict[str, t.Any], history: int) -> None:
    """``opsctl envs``: the builds in the container and the swap history."""
    table = Table(title=f"torch builds on {label}", title_justify="left", box=None)
    for col in ("", "build", "pin", "size", "installed", "source"):
        table.add_column(col)
    for b in doc.get("builds", []):
        table.add_row("*" if b.get("current") else "", b["name"], b.get("pin", ""),
                      f"{(b.get('size_bytes') or 0) / 1e9:.2f} GB",
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(b.get("installed_at") or 0)),
                      "wheelhouse" if b.get("wheelhouse") else (b.get("index_url") or ""))
    con.print(table)
    if not doc.get("builds"):
        con.print("no torch build installed yet (opsctl swap-torch <variant>)")
    for h in doc.get("history", [])[-history:]:
        con.print(f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(h.get('time', 0)))} "
                  f"{h.get('from') or '-'} -> {h.get('to')}: {h.get('action')} {h.get('result')}"
                  + (f" ({h.get('step')}: {h.get('reason')})" if h.get("result") != "ok" else ""),
                  markup=False)


def compile_caches(con: Console, label: str, doc: dict[str, t.Any]) -> None:
    """``opsctl cache info``: one row per compile cache."""
    table = Table(title=f"compile caches on {label}", title_justify="left", box=None)
    for col in ("status", "fingerprint", "size", "files", "last used", "mega-cache"):
        table.add_column(col)
    for c in doc.get("caches", []):
        table.add_row(c.get("status", ""), c["fingerprint"], f"{(c.get('size_bytes') or 0) / 1e6:.1f} MB",
                      str(c.get("files", "")),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(c.get("last_used_at") or 0)),
                      "yes" if c.get("mega_cache") else "")
    con.print(table)
    for w in doc.get("warnings", []):
        con.print(f"[yellow]warning:[/] {w}")


PROBE_STATUS_STYLE = {"ok": "green", "error": "bold red", "hang": "bold red", "crashed": "bold red"}


def probe_report(con: Console, label: str, report: dict[str, t.Any]) -> None:
    env = report.get("env") or {}
    con.print(Text(f"compile-race probe on {label}: torch {env.get('torch', '?')} "
                   f"(CUDA {env.get('cuda') or '-'}, Triton {env.get('triton') or '-'}), "
                   f"device {env.get('device_name') or env.get('device') or '?'}", style="bold"))
    table = Table(box=None)
    for col in ("mode", "result", "elapsed", "FX flag after", "detail"):
        table.add_column(col)
    for name, mode in (report.get("modes") or {}).items():
        status = str(mode.get("status"))
        elapsed = mode.get("elapsed_s")
        detail = mode.get("error") or "; ".join(mode.get("errors") or [])[:160]
        if status == "hang" and mode.get("hang_stacks"):
            detail = "blocked in: " + "; ".join(
                f"{th.get('name', '?')}: {th.get('where', '?')}" for th in mode["hang_stacks"][:3])
        if status == "crashed" and mode.get("signal"):
            detail = f"died by {mode['signal']}: " + " | ".join((mode.get("stderr_tail") or [])[-2:])
        table.add_row(name, Text(status, style=PROBE_STATUS_STYLE.get(status, "")),
                      "-" if elapsed is None else f"{elapsed:.1f}s", str(mode.get("fx_tracing_flag")),
                      detail or "")
    con.print(table)
    if report.get("verdict"):
        con.print(Text(str(report["verdict"]), style="bold yellow" if report.get("affected") else "green"))
    if report.get("raw_output"):
        con.print(Text(f"raw output (in the container): {report['raw_output']}", style="dim"))


def hosts(con: Console, rows: t.Sequence[t.Any]) -> None:
    """``opsctl hosts``: one row per inventory host (reachability after ``--check``)."""
    table = Table(box=None)
    for c in ("host", "address", "user", "containers", "reachable", "detail"):
        table.add_column(c)
    for r in rows:
        reach = "-" if r.reachable is None else ("[green]yes[/]" if r.reachable else "[red]no[/]")
        table.add_row(r.name, f"{r.address}:{r.port}", r.user,
                      ", ".join(f"{c} ({g} GPU)" for c, g in r.containers.items()), reach, r.detail or "")
    con.print(table)
