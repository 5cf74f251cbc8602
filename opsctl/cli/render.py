"""Human rendering with rich; the only module besides cli.py that imports rich.

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
