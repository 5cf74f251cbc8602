"""Human rendering with rich: every table, panel, line and live view the commands print.

This is the only module that imports rich (``tests/unit/test_architecture.py``); the
``--json`` paths print through :mod:`.jsonout`, which does not.

Colours live in a table here, not in the state enum.

Remote text (job output, pane tails, evidence, diagnosis, agent error messages,
step names) is shown only through :func:`safe`: a job that prints an OSC title,
a clear-scrollback, an OSC 52 clipboard write or any other control sequence gets
it displayed as inert ``\\x1b…`` text, never executed by the user's terminal.
Rich markup in remote text is never interpreted either (it always
travels inside :class:`~rich.text.Text`). ``opsctl logs`` is the exception on
purpose: it is the job's raw output, byte-exact, which the user asked for (pipe
it through ``cat -v`` to inspect it on a terminal).
"""

from __future__ import annotations

import contextlib
import re
import time
import typing as t

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from opsctl.cli.jsonout import print_json as print_json  # re-exported: callers use render.print_json
from opsctl.errors import OpsctlError
from remote_payload.wire import EVENT_ACCEPTANCE, JobState, parse_event

if t.TYPE_CHECKING:
    from remote_payload.wire_shapes import (
        DamagedRecordDoc,
        DiagnosisDoc,
        GpuRowDoc,
        JobListDoc,
        JobRowDoc,
        QueueDoc,
        QueueHolderDoc,
        StatusDoc,
    )

STATE_COLOR: dict[JobState, str] = {
    JobState.QUEUED: "blue",
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

# C0 controls but tab (ESC starts every CSI/OSC/DCS sequence; CR and BS overwrite what is
# shown), DEL, C1 controls (U+009B is an 8-bit CSI to some terminals) and the bidi
# overrides that make text display in another order than it reads.
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_NL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e"
                             r"\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(text: object, *, newlines: bool = False) -> str:
    """Remote text made inert for a terminal: each control character shown as ``\\xNN``.

    The one place terminal control sequences are neutralised; every renderer of
    remote text goes through it. ``newlines`` keeps line breaks (multi-line panels).
    """
    return (_UNSAFE_KEEP_NL if newlines else _UNSAFE).sub(_escape, str(text))


def plain(text: object, style: str = "") -> Text:
    """Remote text as a rich ``Text``: control sequences neutralised, markup not interpreted."""
    return Text(safe(text), style=style)


class _Console(Console):
    """A reader that closed early (``opsctl jobs | head -1``) ends the command as it ends
    ``cat``: killed by SIGPIPE, quietly (rich's own answer is exit 1, a bug's code)."""

    def on_broken_pipe(self) -> None:
        from opsctl import interrupts

        interrupts.die_of_sigpipe()


def console(stderr: bool = False) -> Console:
    # soft_wrap: an error stays one line (grep-able, copy-able), whatever the terminal width
    return _Console(stderr=stderr, highlight=False, soft_wrap=stderr)


def error(con: Console, exc: OpsctlError) -> None:
    con.print(plain(f"error: {exc.message}", style="bold red"))
    if exc.hint:
        con.print(plain(f"  hint: {exc.hint}", style="yellow"))
    if exc.log_path:
        con.print(plain(f"  full output: {exc.log_path}", style="dim"))


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


def state_text(state: JobState | str) -> Text:
    known = JobState(state)
    return Text(known.value, style=STATE_COLOR[known])


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def gpu_table(gpus: list[GpuRowDoc], holders: t.Sequence[QueueHolderDoc] = ()) -> Table:
    """The GPU table; with ``holders`` (the queue's record) a column says which job holds each."""
    table = Table(title="GPUs", title_justify="left", box=None, pad_edge=False)
    cols = ["#", "name", "util %", "mem used/total MiB", "temp °C", "power W"]
    for col in [*cols, *(["job"] if holders else [])]:
        table.add_column(col, justify="left" if col in ("name", "job") else "right")
    for g in gpus:
        row: list[str | Text] = [str(g["index"]), plain(g["name"]), _num(g["util_pct"]),
               f"{_num(g['mem_used_mib'])}/{_num(g['mem_total_mib'])}", _num(g["temp_c"]),
               _num(g["power_w"], "{:.1f}")]
        if holders:
            row.append(plain(holder_of(g["index"], holders) or "-"))
        table.add_row(*row)
    return table


def holder_of(index: int, holders: t.Sequence[QueueHolderDoc]) -> str | None:
    """The job holding GPU ``index`` (a job without slots holds the whole container)."""
    return next((h["job_id"] for h in holders
                 if h["gpu_slots"] is None or index in h["gpu_slots"]), None)


def slots_text(slots: list[int] | None) -> str:
    return "all" if slots is None else ",".join(str(g) for g in slots)


_QUEUE_COLUMNS = ("#", "JOB", "PLAYBOOK", "AFTER", "GPUS", "WAITING FOR")


def queue_table(con: Console, label: str, q: QueueDoc) -> None:
    """``opsctl queue``: the queued jobs in order, then who holds which GPU slots."""
    slots = "unknown (set gpus: for the target in the inventory)" if q["slots"] is None \
        else str(q["slots"])
    con.print(Text.assemble(("queue on ", "dim"), (safe(label), "bold"),
                            (f"  ({len(q['jobs'])} queued; GPU slots {slots})", "dim")))
    if q["jobs"] and not con.is_terminal:  # a pipe or a file: one line a job, never wrapped
        con.print(plain("  ".join(_QUEUE_COLUMNS)), soft_wrap=True)
        for r in q["jobs"]:
            con.print(plain("  ".join([str(r["position"]), r["job_id"], r["name"] or "-",
                                        r["after"] or "-", _queue_gpus(r["gpus"]),
                                        r["waiting_for"]])), soft_wrap=True)
    elif q["jobs"]:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for col in _QUEUE_COLUMNS:
            table.add_column(col, no_wrap=col != "WAITING FOR", overflow="fold")
        for r in q["jobs"]:
            table.add_row(str(r["position"]), plain(r["job_id"]), plain(r["name"] or "-"),
                          plain(r["after"] or "-"), _queue_gpus(r["gpus"]), plain(r["waiting_for"]))
        con.print(table)
    for h in q["holders"]:
        con.print(plain(f"running: {h['job_id']} ({h['state'] or '?'}) holds GPU slots "
                        f"{slots_text(h['gpu_slots'])}", style="dim"), soft_wrap=True)
    damaged_records(con, q.get("damaged", []))


def _queue_gpus(gpus: int | list[int] | None) -> str:
    return "all" if gpus is None else (str(gpus) if isinstance(gpus, int)
                                       else "slots " + slots_text(gpus))


def damaged_records(con: Console, damaged: t.Sequence[DamagedRecordDoc]) -> None:
    """One line per job record the agent could not parse (left on disk untouched)."""
    for d in damaged:
        con.print(plain(f"damaged record (set aside, left as it is): {d['path']}: {d['reason']}",
                        style="yellow"), soft_wrap=True)


def queue_added(con: Console, report: t.Any) -> None:
    """``opsctl queue add`` / ``deploy`` of a pipeline: each job id, and what started at once."""
    for j in report.jobs:
        what = f"after {j['after']}" if j.get("after") else "no dependency"
        state = "started" if j["job_id"] in report.started else (
            "cancelled" if j["job_id"] in report.cancelled else "queued")
        step = f" [{j['step']}]" if j.get("step") else ""
        con.print(plain(f"{j['job_id']}{step}: {state} ({what})"))
    for note in report.notes:
        con.print(plain(f"note: {note}", style="yellow"))
    con.print(plain("the container runs the queue by itself: `opsctl queue` shows it", style="dim"))


def diagnosis(items: list[DiagnosisDoc]) -> Panel | None:
    if not items:
        return None
    parts: list[Text] = []
    for d in items:
        parts.append(plain(f"[{d['severity']}] {d['cause']}: {d['summary']}",
                           style=SEVERITY_COLOR[d["severity"]]))
        parts.extend(plain(f"    evidence: {e}", style="dim") for e in d["evidence"][:4])
        if d["hint"]:
            parts.append(plain(f"    next: {d['hint']}", style="bold"))
    worst = "red" if any(d["severity"] == "error" for d in items) else "yellow"
    return Panel(Group(*parts), title="diagnosis", border_style=worst, title_align="left")


class Bits:
    """``head`` then ``bits`` joined by ``sep``, wrapped between bits only, never mid-value."""

    def __init__(self, head: str, bits: list[str], *, sep: str = " · ", style: str = ""):
        self.head, self.bits, self.sep, self.style = head, bits, sep, style

    @property
    def plain(self) -> str:
        return self.head + self.sep.join(self.bits)

    def lines(self, width: int) -> list[str]:
        out: list[str] = []
        line = self.head
        for i, bit in enumerate(self.bits):
            piece = (self.sep if i else "") + bit
            if i and len(line) + len(piece) > width:
                out.append(line.rstrip())
                line = " " * min(len(self.head), 4) + bit
            else:
                line += piece
        out.append(line)
        return out

    def __rich_console__(self, con: Console, options: t.Any) -> t.Iterator[Text]:
        for line in self.lines(options.max_width):
            yield Text(line, style=self.style)


def metrics_line(step: dict[str, t.Any] | None) -> Bits:
    if not step:
        return Bits("metrics: no step events yet", [], style="dim")
    bits = [f"step {safe(step.get('step'))}"]
    for key, label, fmt in (("loss", "loss {:.4f}", None), ("acc", "acc {:.3f}", None),
                            ("tok_s", "{:.2f} Ktok/s", 1000.0), ("eta_s", "ETA {}", None),
                            ("lr", "lr {:.2e}", None)):
        v = step.get(key)
        if v is None:
            continue
        try:
            if key == "eta_s":
                bits.append(label.format(duration(float(v))))
            else:
                bits.append(label.format(float(v) / (fmt or 1.0)))
        except (TypeError, ValueError):  # a job's event is data, not trusted to be numeric
            bits.append(f"{key} {safe(v)}")
    mfu = mfu_text(step)
    if mfu:
        bits.append(mfu)
    return Bits("metrics: ", bits, style="bold")


def mfu_text(step: dict[str, t.Any]) -> str | None:
    """"MFU 41.2% of 989 datasheet (51.6% of 790 measured matmul)": the first figure
    divides by the GPU's datasheet dense bf16 peak, the second by the measured matmul rate."""
    try:
        mfu, peak = float(step["mfu"]), float(step.get("peak_tflops", 989.0))
    except (KeyError, TypeError, ValueError):
        return None
    text = f"MFU {100 * mfu:.1f}% of {peak:g} datasheet"
    try:
        text += (f" ({100 * float(step['mfu_matmul']):.1f}% of "
                 f"{float(step.get('matmul_tflops', 790.0)):g} measured matmul)")
    except (KeyError, TypeError, ValueError):
        pass
    return text


def acceptance_line(events: list[dict[str, t.Any]]) -> Text | None:
    """"τ 3.20 (untrained 1.00)" from the newest ``acceptance`` event (``trainer eval``)."""
    ev = next((e for e in reversed(events) if e.get("event") == EVENT_ACCEPTANCE), None)
    if ev is None:
        return None
    try:
        line = f"τ {float(ev['tau']):.2f}"
        if ev.get("tau_untrained") is not None:
            line += f" (untrained {float(ev['tau_untrained']):.2f})"
    except (KeyError, TypeError, ValueError):
        return plain(f"acceptance: {ev}", style="yellow")
    return Text(line, style="bold")


def status(con: Console, target: str, st: StatusDoc, *, pane_lines: int = 20) -> None:
    head = Text.assemble(("job ", "dim"), (safe(st["job_id"]), "bold"), ("  on ", "dim"),
                         (safe(target), "bold"), ("  state ", "dim"), state_text(st["state"]))
    if st["phase"]:
        head.append(f"  phase {safe(st['phase'])}", style="dim")
    con.print(head)
    ended = ""
    if st["exit_code"] is not None:
        ended = f"  exit code {st['exit_code']}"
    if st["signal"]:
        ended = f"  killed by {safe(st['signal'])}"
    con.print(Text(f"elapsed {duration(st['elapsed_s'])}  pid {st['pid'] or '-'}{ended}", style="dim"))
    for line in restart_lines(st):
        con.print(line)
    brief = goodput_line(st.get("goodput"))
    if brief is not None:
        con.print(brief)
    con.print(metrics_line(st["last_step"]))
    tau = acceptance_line(st["events_tail"])
    if tau is not None:
        con.print(tau)
    sparklines(con, st)
    for e in st["evidence"]:
        con.print(plain(f"evidence: {e}", style="yellow"))
    panel = diagnosis(st["diagnosis"])
    if panel is not None:
        con.print(panel)
    # events are for machines (status parses them); the human panel shows the human lines
    tail = [x for x in (st["pane_tail"] or st["output_tail"]) if parse_event(x) is None]
    if tail:
        src = "pane" if st["pane_tail"] else "output.log"
        shown = tail[-pane_lines:]
        con.print(Panel(Text("\n".join(safe(x) for x in shown)), title=f"{src} (last {len(shown)} lines)",
                        title_align="left", border_style="dim"))
    slots = st.get("gpu_slots")
    if slots is not None:
        con.print(plain(f"GPU slots {slots_text(slots)} (CUDA_VISIBLE_DEVICES)", style="dim"))
    if st.get("after"):
        con.print(plain(f"after job {st.get('after')} (starts when it succeeds)", style="dim"))
    if st["gpus"]:
        con.print(gpu_table(st["gpus"], st.get("gpu_holders", [])))
    elif st["gpu_error"]:
        con.print(plain(f"GPUs: {st['gpu_error']}", style="yellow"))
    else:
        con.print(Text("GPUs: none on this target", style="dim"))
    if st["output_log"]:
        con.print(plain(f"full output: {st['output_log']} (on the target; `opsctl logs`)",
                        style="dim"))


def attempt_text(r: StatusDoc | JobRowDoc) -> str:
    """``2/4``: attempt 2 of at most 4 (1 + max_restarts); ``-`` without a restart policy."""
    attempt, most = r.get("attempt"), r.get("max_restarts")
    if attempt is None:
        return "-"
    return f"{attempt}/{1 + most}" if most is not None else str(attempt)


def restart_lines(r: StatusDoc | JobRowDoc) -> list[Text]:
    """The restart policy's record: the attempt, each decision, why the job ended."""
    out: list[Text] = []
    attempt, restarts = r.get("attempt"), r.get("restarts") or []
    if attempt is not None and (r.get("max_restarts") or restarts or attempt > 1):
        out.append(Text(f"attempt {attempt_text(r)}", style="bold"))
    for rec in restarts:
        when = rec.get("at")
        at = time.strftime("%m-%d %H:%M:%S", time.localtime(when)) if when else "-"
        n = rec.get("attempt")
        out.append(plain(f"  attempt {n if n is not None else '?'} ended {at}: "
                         f"{rec.get('reason') or '?'} → {rec.get('decision') or '?'}", style="dim"))
    if r.get("end_reason"):
        out.append(plain(f"ended: {r.get('end_reason')}", style="dim"))
    return out


def _clock(ts: float | None, now: float) -> str:
    """A time as a table shows it: ``14:03:12`` today, ``11-28 14:03`` otherwise."""
    if not ts:
        return "-"
    lt, today = time.localtime(ts), time.localtime(now)
    if lt[:3] == today[:3]:
        return time.strftime("%H:%M:%S", lt)
    return time.strftime("%m-%d %H:%M", lt)


def jobs_table(con: Console, label: str, jl: JobListDoc) -> None:
    """``opsctl jobs``: one row per job, newest first, sacct-like."""
    now = time.time()
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, justify in (("", "left"), ("JOB", "left"), ("PLAYBOOK", "left"), ("STATE", "left"),
                         ("START", "left"), ("END", "left"), ("TIME", "right"), ("EXIT", "right"),
                         ("STEP", "right"), ("KTOK/S", "right"), ("TRY", "right"),
                         ("GOODPUT", "right"), ("DIAGNOSIS", "left")):
        table.add_column(col, justify=justify,  # type: ignore[arg-type]
                         no_wrap=col != "DIAGNOSIS", overflow="fold")
    for r in jl["jobs"]:
        step = r.get("last_step") or {}
        tok = step.get("tok_s")
        sig, code, state = r.get("signal"), r.get("exit_code"), r.get("state")
        exit_text = safe(sig) if sig else ("-" if code is None else str(code))
        head = r.get("headline")
        diag = plain(r.get("error") or "", style="red") if state is None else (
            plain(head["summary"][:120], style=SEVERITY_COLOR.get(head["severity"], ""))
            if head else Text(""))
        table.add_row(
            "*" if r.get("current") else "", plain(r["job_id"]), plain(r.get("name") or "-"),
            state_text(state) if state else Text("?", style="red"),
            _clock(r.get("started_at") or r.get("created_at"), now), _clock(r.get("ended_at"), now),
            duration(r.get("elapsed_s")), exit_text, safe(step.get("step", "-")),
            f"{tok / 1000:.2f}" if isinstance(tok, int | float) else "-", attempt_text(r),
            _pct(r.get("goodput"), 1.0), diag)
    shown, total = len(jl["jobs"]), jl["total"]
    con.print(Text.assemble(("jobs on ", "dim"), (safe(label), "bold"),
                            (f"  ({shown} of {total}"
                             f"{'' if not jl['limit'] or shown >= total else '; --all for every job'}"
                             "; * = current)", "dim")))
    if jl["jobs"]:
        if not con.is_terminal:  # piped (grep, awk): one line per job, never folded at 80
            con = _Console(file=con.file, width=400, highlight=False, color_system=None)
        con.print(table)
    damaged_records(con, jl.get("damaged", []))


def sparklines(con: Console, st: StatusDoc, width: int = 48) -> None:
    """Loss, tok/s and GPU utilisation over the job's history, marks underneath; each line
    ends at the value the metrics line and the GPU table show."""
    from opsctl.cli import plots

    history = st.get("history")
    rows = plots.sparkline_rows(history, width, latest=plots.status_latest(st))
    if not rows or history is None:
        return
    lw = max(len(r.label) for r in rows)
    for r in rows:
        line = Text(f"  {r.label:<{lw}} ", style="dim")
        line.append(r.spark, style="cyan")
        line.append(f" {r.last}  ({r.low}…{r.high})", style="dim")
        con.print(line)
    marks = plots.mark_line(history, max(len(r.spark) for r in rows))
    if marks.strip():
        con.print(Text(f"  {'':<{lw}} {marks}", style="magenta"))
        for entry in plots.legend(history):
            con.print(plain(f"  {'':<{lw}} {entry}", style="dim"))


def progress_line(st: StatusDoc | None, elapsed: float, problem: str | None) -> Text:
    if problem:
        return plain(f"{duration(elapsed)}  {problem}", style="yellow")
    if st is None:
        return Text(f"{duration(elapsed)}  waiting for the first status…")
    line = Text(f"{duration(elapsed)}  ")
    line.append_text(state_text(st["state"]))
    if st["phase"]:
        line.append(f" ({safe(st['phase'])})", style="dim")
    step = st["last_step"]
    if step and isinstance(step.get("tok_s"), int | float):
        line.append(f"  step {safe(step.get('step'))} {step['tok_s'] / 1000:.2f} Ktok/s")
    human = [x for x in st["output_tail"] if parse_event(x) is None]
    if human:
        line.append(f"  │ {safe(human[-1][:80])}", style="dim")
    return line


def now_stamp() -> str:
    return time.strftime("%H:%M:%S")


def deploy_verdict(job_id: str, outcome: str, st: StatusDoc, elapsed_s: float) -> Text:
    """The last line of a deploy: what the job is doing *now*, never a stale "healthy"."""
    after = f" after {duration(elapsed_s)}"
    state = JobState(st["state"])
    if state.is_terminal():  # finished before (or while) it was watched: say how
        how = f"exit code {st['exit_code']}" if st["exit_code"] is not None else (
            f"killed by {safe(st['signal'])}" if st["signal"] else "no exit code")
        return Text(f"{safe(job_id)}: finished {state.value} ({how}){after}",
                    style=STATE_COLOR[state])
    if outcome == "healthy":
        return Text(f"{safe(job_id)}: healthy: {state.value}, training is running{after}",
                    style="bold green")
    if outcome == "launched":
        return Text(f"{safe(job_id)}: launched (not watched){after}", style="bold green")
    return Text(f"{safe(job_id)}: {safe(outcome)} ({state.value}){after}", style="yellow")


def stop_line(job_id: str, state: JobState | str, signals: list[str], remaining: list[int]) -> Text:
    line = Text(f"{safe(job_id)}: ")
    line.append_text(state_text(state))
    line.append(f" (signals: {safe(', '.join(signals)) or 'none'})")
    if remaining:
        line.append(f"; still alive after SIGKILL: pids {', '.join(map(str, remaining))}",
                    style="bold red")
    return line


def swap_headline(rep: t.Mapping[str, t.Any]) -> Text:
    """``swap-torch``'s first line; a dry run says what *would* happen (nothing changed)."""
    action = str(rep.get("action"))
    if rep.get("dry_run"):
        verb = {"noop": "already current:", "switch": "would switch to",
                "install": "would install and switch to"}.get(action, f"would {action}")
        style = "bold yellow"
    else:
        verb = {"noop": "already current:", "switch": "switched to",
                "install": "installed and switched to"}.get(action, action)
        style = "bold green"
    line = Text(safe(f"{verb} {rep.get('build')}"), style=style)
    line.append(safe(f" (previous: {rep.get('previous') or 'none'}) in "
                     f"{duration(rep.get('elapsed_s'))}"))
    if rep.get("dry_run"):
        line.append(" [dry run: nothing was changed]", style="bold yellow")
    return line


def stacks(con: Console, doc: t.Mapping[str, t.Any]) -> None:
    """``opsctl stacks``: a summary line, then each process's dump under its rank/pid/GPU."""
    procs = doc.get("processes") or []
    con.print(safe(f"{doc.get('job_id')}: {doc.get('threads')} threads in {len(procs)} process(es); "
                   f"{doc.get('summary') or ''}"), style="bold", markup=False, highlight=False)
    for p in procs:
        who = " ".join(x for x in (
            f"rank {p['rank']}" if p.get("rank") is not None else "",
            p.get("role") or "", f"GPU {p['gpu']}" if p.get("gpu") is not None else "",
            f"pid {p['pid']}" if p.get("pid") is not None else "") if x)
        con.print("\n" + safe(f"── {who}: {p.get('label')} ({p.get('threads')} threads) · "
                              f"{p.get('cmd')}"), style="bold cyan", markup=False, highlight=False)
        con.print(safe(p.get("dump", ""), newlines=True), markup=False, highlight=False)
    if doc.get("saved_to"):
        con.print(safe(f"saved on the target: {doc['saved_to']}"), style="dim", markup=False)


# --- tables of the torch, probe and hosts commands -------------------------------------------


def torch_envs(con: Console, label: str, doc: t.Mapping[str, t.Any], history: int) -> None:
    """``opsctl envs``: the builds in the container and the swap history."""
    table = Table(title=f"torch builds on {label}", title_justify="left", box=None)
    for col in ("", "build", "pin", "size", "installed", "source"):
        table.add_column(col)
    for b in doc.get("builds", []):
        table.add_row("*" if b.get("current") else "", plain(b["name"]), plain(b.get("pin", "")),
                      f"{(b.get('size_bytes') or 0) / 1e9:.2f} GB",
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(b.get("installed_at") or 0)),
                      plain("wheelhouse" if b.get("wheelhouse") else (b.get("index_url") or "")))
    con.print(table)
    if not doc.get("builds"):
        con.print("no torch build installed yet (opsctl swap-torch <variant>)")
    for h in doc.get("history", [])[-history:]:
        con.print(plain(
            f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(h.get('time', 0)))} "
            f"{h.get('from') or '-'} -> {h.get('to')}: {h.get('action')} {h.get('result')}"
            + (f" ({h.get('step')}: {h.get('reason')})" if h.get("result") != "ok" else "")))


def compile_caches(con: Console, label: str, doc: t.Mapping[str, t.Any]) -> None:
    """``opsctl cache info``: one row per compile cache."""
    table = Table(title=f"compile caches on {label}", title_justify="left", box=None)
    for col in ("status", "fingerprint", "size", "files", "last used", "mega-cache"):
        table.add_column(col)
    for c in doc.get("caches", []):
        table.add_row(plain(c.get("status", "")), plain(c["fingerprint"]),
                      f"{(c.get('size_bytes') or 0) / 1e6:.1f} MB",
                      str(c.get("files", "")),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(c.get("last_used_at") or 0)),
                      "yes" if c.get("mega_cache") else "")
    con.print(table)
    for w in doc.get("warnings", []):
        con.print(plain(f"warning: {w}", style="yellow"))


PROBE_STATUS_STYLE = {"ok": "green", "error": "bold red", "hang": "bold red", "crashed": "bold red"}


def probe_report(con: Console, label: str, report: t.Mapping[str, t.Any]) -> None:
    env = report.get("env") or {}
    con.print(plain(f"compile-race probe on {label}: torch {env.get('torch', '?')} "
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
        table.add_row(plain(name), plain(status, style=PROBE_STATUS_STYLE.get(status, "")),
                      "-" if elapsed is None else f"{elapsed:.1f}s", plain(mode.get("fx_tracing_flag")),
                      plain(detail or ""))
    con.print(table)
    if report.get("verdict"):
        con.print(plain(report["verdict"], style="bold yellow" if report.get("affected") else "green"))
    if report.get("raw_output"):
        con.print(plain(f"raw output (on the target): {report['raw_output']}", style="dim"))


def target_column(ctid: int | None) -> str:
    """A target in a table's ``ct`` column: its container id, ``host`` for a direct host's
    one target (the host itself), ``-`` for none."""
    from opsctl.config.inventory import DIRECT_CTID

    return "-" if ctid is None else ("host" if ctid == DIRECT_CTID else str(ctid))


def hosts(con: Console, rows: t.Sequence[t.Any]) -> None:
    """``opsctl hosts``: one row per inventory host (reachability after ``--check``)."""
    table = Table(box=None)
    for c in ("host", "address", "user", "containers", "reachable", "detail"):
        table.add_column(c)
    for r in rows:
        reach = "-" if r.reachable is None else ("[green]yes[/]" if r.reachable else "[red]no[/]")
        table.add_row(plain(r.name), plain(f"{r.address}:{r.port}"), plain(r.user),
                      ", ".join(f"{target_column(c)} ({g} GPU)" for c, g in r.containers.items()), reach,
                      plain(r.detail or ""))
    con.print(table)


def fleet(con: Console, report: t.Any) -> None:
    """``opsctl status --all``: one row per container; errors say their exit code."""
    table = Table(box=None)
    for c in ("host", "ct", "reach", "job", "state", "step", "tok/s", "GPU util", "diagnosis / note"):
        table.add_column(c, justify="right" if c in ("ct", "step", "tok/s", "GPU util") else "left")
    for r in report.rows:
        reach = ("-" if r.reachable is None else "[green]yes[/]" if r.reachable
                 else "[red]no[/]")
        state = Text("-") if r.state is None else (
            state_text(JobState(r.state)) if r.state in JobState.__members__ else plain(r.state))
        if r.error is not None:
            last = plain(f"error {r.error['exit_code']}: {r.error['message']}", style="red")
        else:
            last = plain(r.diagnosis or r.note or "", style="yellow" if r.diagnosis else "dim")
        util = "-" if r.gpu_util_pct is None else f"{r.gpu_util_pct:.0f}% ×{r.gpus}"
        table.add_row(plain(r.host), target_column(r.ctid), reach,
                      plain(r.job_id or "-"), state, _num(r.step), _num(r.tok_s), util, last)
    con.print(table)
    errs = f", [red]{report.errors} errors[/]" if report.errors else ""
    con.print(f"{len(report.rows)} containers on {len(report.hosts)} hosts in "
              f"{report.took_s:.2f} s{errs}")
def run_table(con: Console, report: t.Any) -> None:
    """A multi-node run (``opsctl.ops.multinode.RunReport``): one row per node, the verdict.

    ``status`` of a run shows each node's state, phase, last step and its diagnosis headline;
    a node that could not be asked shows its error in place of a state.
    """
    head = Text.assemble(("run ", "dim"), (safe(report.job_id), "bold"),
                         (f"  on {len(report.nodes)} nodes  state ", "dim"))
    try:
        head.append_text(state_text(JobState(report.state)))
    except ValueError:  # UNKNOWN: a node could not be asked
        head.append(safe(report.state), style="yellow")
    if report.rendezvous:
        head.append(f"  rendezvous {safe(report.rendezvous)}", style="dim")
    con.print(head)
    table = Table(box=None, pad_edge=False)
    for col in ("node", "container", "state", "phase", "step", "loss", "tok/s", "diagnosis"):
        table.add_column(col)
    for row in report.nodes:
        st = row.status
        if st is None:
            table.add_row(str(row.index), plain(row.label), Text("-", style="dim"), "", "", "", "",
                          plain(row.error or "", style="yellow"))
            continue
        step = st["last_step"] or {}
        first = st["diagnosis"][0]["summary"] if st["diagnosis"] else ""
        table.add_row(str(row.index), plain(row.label), state_text(st["state"]), plain(st["phase"] or ""),
                      safe(step.get("step", "")), safe(step.get("loss", "")),
                      safe(step.get("tok_s", "")), plain(first[:100]))
    con.print(table)
    if report.summary:
        con.print(plain(report.summary, style="bold red" if report.state == "FAILED" else "yellow"))


def run_stop_lines(con: Console, report: t.Any) -> None:
    """``stop`` of a multi-node run: one line per node."""
    for row in report.nodes:
        prefix = f"node {row.index} ({row.label}): "
        if row.stop is None:
            con.print(plain(prefix + (row.error or "no answer"), style="yellow"))
            continue
        line = plain(prefix)
        line.append_text(stop_line(row.stop["job_id"], row.stop["state"], row.stop["signals_sent"],
                                   row.stop["remaining_pids"]))
        con.print(line)


_DOCTOR_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def doctor_report(con: Console, report: t.Any) -> None:
    """``opsctl doctor``: one row per check (status, check, reason; evidence and fix below)."""
    table = Table(title=f"doctor {safe(report.target)}", show_lines=False, expand=False)
    table.add_column("status")
    table.add_column("check")
    table.add_column("reason / evidence / fix", overflow="fold")
    for row in report.rows:
        detail = Text(row["reason"])
        if row.get("evidence"):
            detail.append(f"\n{row['evidence']}", style="dim")
        if row.get("fix") and row["status"] != "ok":
            detail.append(f"\nfix: {row['fix']}", style="cyan")
        table.add_row(Text(row["status"], style=_DOCTOR_STYLE.get(row["status"], "")),
                      Text(row["name"]), detail)
    con.print(table)
    failed = [r["name"] for r in report.rows if r["status"] == "fail"]
    con.print(plain(f"{len(failed)} failing check(s): {', '.join(failed)}" if failed
                    else f"no failing check ({report.elapsed_s:.1f} s)",
                    "bold red" if failed else "green"))


# --- live views (a terminal only) --------------------------------------------------------


@contextlib.contextmanager
def transfer_bar(label: str) -> t.Iterator[t.Callable[[int, int | None], None]]:
    """``push``/``pull`` on a terminal: a rich bar with bytes/s on stderr (the caller decides
    whether there is a terminal; never with --json).

    The bar starts with the first bytes, so that a ``--delete`` question asked before the
    transfer is not drawn over.
    """
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TimeRemainingColumn(),
                   console=console(stderr=True), transient=True)
    task = bar.add_task(safe(label), total=None)
    started = [False]

    def update(done: int, total: int | None) -> None:
        if not started[0]:
            bar.start()
            started[0] = True
        bar.update(task, completed=done, total=total)

    try:
        yield update
    finally:
        if started[0]:
            bar.stop()


@contextlib.contextmanager
def live_spinner(err: Console, text: str) -> t.Iterator[t.Any]:
    """``deploy`` on a terminal: a spinner on stderr whose text the caller updates, gone when
    the block ends."""
    from rich.live import Live
    from rich.spinner import Spinner

    spinner = Spinner("dots", text=text)
    with Live(spinner, console=err, refresh_per_second=8, transient=True):
        yield spinner


# --- goodput -------------------------------------------------------------------------------

#: each cause of a run's ledger: its name in tables, its cell in the timeline, its colour
GOODPUT_CAUSES: dict[str, tuple[str, str, str]] = {
    "productive": ("productive", "█", "green"),
    "startup": ("start-up", "s", "cyan"),
    "compile": ("recompiles", "c", "magenta"),
    "checkpoint": ("checkpoints", "k", "blue"),
    "stall": ("stalls", "!", "bold red"),
    "lost": ("lost progress", "x", "red"),
    "shutdown": ("wind-down", "w", "grey50"),
    "restart_gap": ("restart gaps", "_", "yellow"),
    "queue_wait": ("queue waits", "q", "yellow"),
    "unknown": ("unknown", "?", "grey50"),
}


def _pct(part: float | None, whole: float | None) -> str:
    if part is None or not whole:
        return "-"
    return f"{100.0 * part / whole:.1f} %"


def goodput_line(brief: t.Mapping[str, t.Any] | None) -> Text | None:
    """``goodput 93.1 % of 41h12m · lost 2.1 % (2 crashes) · checkpoints 0.4 % · start-up
    1.0 %``: a status's one line on its run's ledger (lost: lost progress and stalls)."""
    if not brief or not brief.get("wall_s") or brief.get("goodput") is None:
        return None
    wall, causes = brief["wall_s"], brief.get("causes") or {}
    crashes, hangs = brief.get("crashes") or 0, brief.get("hangs") or 0
    lost = (causes.get("lost") or 0.0) + (causes.get("stall") or 0.0)
    why = [f"{crashes} crash{'es' if crashes != 1 else ''}"] if crashes else []
    why += [f"{hangs} hang{'s' if hangs != 1 else ''}"] if hangs else []
    parts = [f"goodput {100.0 * brief['goodput']:.1f} % of {duration(wall)}",
             f"lost {_pct(lost, wall)}" + (f" ({', '.join(why)})" if why else ""),
             f"checkpoints {_pct(causes.get('checkpoint'), wall)}",
             f"start-up {_pct(causes.get('startup'), wall)}"]
    if causes.get("unknown"):
        parts.append(f"unknown {_pct(causes.get('unknown'), wall)}")
    if brief.get("eta_s"):  # the steps left at the run's effective rate, not the last step's
        parts.append(f"ETA {duration(brief['eta_s'])} at the effective rate")
    style = "green" if brief["goodput"] >= 0.9 else "yellow" if brief["goodput"] >= 0.8 else "red"
    return Text(" · ".join(parts), style=style)


def goodput_cells(timeline: t.Sequence[t.Sequence[t.Any]], start: float, end: float,
                  n: int) -> list[str]:
    """``n`` columns of the run's time, each the cause with the most time in it."""
    if n <= 0 or not end > start:
        return []
    width = (end - start) / n
    cols: list[dict[str, float]] = [{} for _ in range(n)]
    for seg in timeline:
        try:
            cause, lo, hi = str(seg[0]), float(seg[1]), float(seg[2])
        except (IndexError, TypeError, ValueError):
            continue
        if not (hi > lo and hi > start and lo < end):
            continue
        lo, hi = max(lo, start), min(hi, end)  # an infinite end is the window's edge
        a = max(0, min(n - 1, int((lo - start) / width)))
        b = max(0, min(n - 1, int((hi - start) / width)))
        for k in range(a, b + 1):
            part = min(hi, start + (k + 1) * width) - max(lo, start + k * width)
            if part > 0:
                cols[k][cause] = cols[k].get(cause, 0.0) + part
    return [max(c.items(), key=lambda kv: kv[1])[0] if c else "unknown" for c in cols]


def goodput_timeline(doc: t.Mapping[str, t.Any], width: int) -> Text:
    """The run's time as one row of cells, a cause each (:data:`GOODPUT_CAUSES`)."""
    start = float(doc["started_at"])
    end = start + float(doc["wall_s"])
    line = Text()
    for cause in goodput_cells(doc.get("timeline") or [], start, end, width):
        _name, cell, style = GOODPUT_CAUSES.get(cause, GOODPUT_CAUSES["unknown"])
        line.append(cell, style=style)
    return line


def goodput_report(con: Console, label: str, doc: t.Mapping[str, t.Any], width: int = 100) -> None:
    """``opsctl goodput``: the run's wall time per cause and per attempt, and its timeline."""
    wall = doc["wall_s"]
    jobs = doc.get("jobs") or []
    con.print(Text.assemble(("run ", "dim"), (safe(doc["run_id"]), "bold"), ("  on ", "dim"),
                            (safe(label), "bold"),
                            (f"  {len(jobs)} job(s), {len(doc.get('attempts') or [])} attempt(s)"
                             f"  {'live' if doc.get('ended_at') is None else 'ended'}", "dim")))
    if doc.get("out_dir"):
        con.print(plain(f"out-dir {doc['out_dir']}", style="dim"))
    headline = goodput_line(doc)
    if headline is not None:
        con.print(headline)
    rate = doc.get("effective_tok_s")
    eff = [f"effective {rate / 1000:.2f} Ktok/s" if rate is not None else "effective -",
           f"surviving steps {doc['surviving_steps']}"
           + (f" of {doc['target_steps']}" if doc.get("target_steps") else ""),
           f"ETA {duration(doc.get('eta_s'))}" if doc.get("eta_s") is not None else "ETA -"]
    if doc.get("expect_tok_s"):
        eff.append(f"slow {duration(doc['slow_s'])} below {doc['expect_tok_s'] / 1000:.2f} Ktok/s"
                   f" (costing {duration(doc['slow_shortfall_s'])})")
    con.print(Text("  ".join(eff), style="dim"))
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, justify in (("CAUSE", "left"), ("TIME", "right"), ("SHARE", "right"), ("", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    causes = doc.get("causes") or {}
    for cause, (name, cell, style) in GOODPUT_CAUSES.items():
        secs = causes.get(cause) or 0.0
        if secs or cause == "productive":
            table.add_row(Text(name, style=style), duration(secs), _pct(secs, wall),
                          Text(cell, style=style))
    con.print(table)
    atts = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("JOB", "TRY", "ENDED", "STEPS", "LOST", "START-UP", "PRODUCTIVE", "OTHER"):
        atts.add_column(col, justify="left" if col in ("JOB", "ENDED") else "right",
                        no_wrap=True)
    for a in doc.get("attempts") or []:
        c = a.get("causes") or {}
        other = sum(v for k, v in c.items() if k not in ("startup", "productive"))
        atts.add_row(plain(a["job_id"]), str(a["attempt"]), plain(a["ended"][:40]),
                     f"{a['start_step']}→{a['last_step']}", str(a["lost_steps"]),
                     duration(c.get("startup")), duration(c.get("productive")), duration(other))
    con.print(atts)
    for a in doc.get("attempts") or []:
        phases = a.get("startup") or []
        if phases:
            con.print(plain(f"start-up of {a['job_id']} attempt {a['attempt']}: " + " · ".join(
                f"{p['phase']} {duration(p['seconds'])}" for p in phases), style="dim"))
    con.print(goodput_timeline(doc, min(width, con.width)))
    con.print(Text("  ".join(f"{cell} {name}" for name, cell, _ in GOODPUT_CAUSES.values()),
                   style="dim"))
    for note in doc.get("unknown") or []:
        con.print(plain(f"note: {note}", style="yellow"))
