"""Name a job's failure from its output and events, with the next action.

The agent calls :func:`diagnose` in every ``status`` on the last ~200 output
lines, so it is stdlib-only and cheap (a few substring checks per line; the
regexes run only on lines that pass them). Each signature is one row of
:data:`SIGNATURES`: a cause name, a severity, a hint, and a small predicate that
returns the summary and evidence or ``None``. To add one, write a predicate and
add a row; ``tests/unit/test_diagnosis.py`` feeds each row a real captured log.

Finding shape (docs/contracts.md, status document ``diagnosis``)::

    {"cause": str, "severity": "error" | "warning" | "info", "summary": str,
     "evidence": [str], "hint": str}
"""

from __future__ import annotations

import re
import signal as _signal
import typing as t

from remote_payload import wire

# Seconds without output or events before an alive job counts as hung, unless the job
# announced a longer budget for its current phase (``budget_s`` on its events) or the
# playbook says otherwise (``hang_after_s``, ``phase_budgets_s``): see :func:`hang_threshold`.
DEFAULT_HANG_AFTER_S = 90.0
# A job that says it compiles but announced no budget (not our trainer): a cold
# torch.compile of a big model takes minutes.
UNANNOUNCED_COMPILE_HANG_S = 1800.0
GPU_IDLE_PCT = 5.0
THROUGHPUT_WARN_RATIO = 0.5  # warn below half the playbook's expect_tok_s
MAX_EVIDENCE = 4
MAX_EVIDENCE_CHARS = 300
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

FX_RACE_FIXES = (
    "Fixes, best first: (1) run one process per GPU instead of threads; (2) use torch >= 2.14 "
    "(the FX tracing flag is thread-local there); (3) if threads must stay, serialize every "
    "compile (first call, each new shape, first backward) behind one lock "
    "(remote_payload.compile_guard.serialized_compile) and bound the shapes. Do not use "
    "torch._dynamo.config.force_compile_during_fx_trace: it ran at 4.6 Ktok/s instead of ~20. "
    "A warm compile cache only hides the race; `opsctl probe compile-race` checks a build cold.")


# NamedTuples, not dataclasses: `dataclasses` imports `inspect`, ~10 ms of every `status`
# (the agent's start is on the path of every poll; docs/benchmarks.md). For the same reason the
# patterns below are strings, compiled on first use by `re`'s own cache: output that passes
# none of the substring checks compiles none of them (~1.5 ms of each poll).


class Finding(t.NamedTuple):
    cause: str
    severity: str
    summary: str
    evidence: list[str]
    hint: str

    def to_dict(self) -> dict[str, t.Any]:
        return {**self._asdict(), "evidence": list(self.evidence)}


class Match(t.NamedTuple):
    """What a predicate found; ``severity``/``hint`` override the table row when set."""

    summary: str
    evidence: list[str]
    severity: str | None = None
    hint: str | None = None


class Context(t.NamedTuple):
    lines: list[str]  # output tail plus error-event messages, oldest first
    events: list[dict[str, t.Any]]
    status: dict[str, t.Any]
    now: float

    def grep(self, *needles: str) -> list[str]:
        """Lines containing any needle (plain substring: fast)."""
        return [ln for ln in self.lines if any(n in ln for n in needles)]


class Signature(t.NamedTuple):
    cause: str
    severity: str
    hint: str
    match: t.Callable[[Context], Match | None]


def _ev(lines: t.Iterable[str]) -> list[str]:
    """Evidence: the last few distinct lines, trimmed."""
    out: list[str] = []
    for ln in lines:
        s = ln.strip()
        if len(s) > MAX_EVIDENCE_CHARS:
            s = s[:MAX_EVIDENCE_CHARS - 3] + "..."
        if s and s not in out:
            out.append(s)
    return out[-MAX_EVIDENCE:]


def _num(x: t.Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


# --- predicates -----------------------------------------------------------------

_FX_NEEDLES = ("Detected that you are using FX to symbolically trace a dynamo-optimized function",
               "is_fx_symbolic_tracing")


def _fx_race(ctx: Context) -> Match | None:
    """The incident's error: threads compiled concurrently and one saw another's FX tracing
    (``Detected that you are using FX to symbolically trace a dynamo-optimized function``)."""
    hits = ctx.grep(*_FX_NEEDLES)
    if not hits:
        return None
    n = sum(1 for ln in hits if _FX_NEEDLES[0] in ln and "Error" in ln)
    return Match(
        "Concurrent torch.compile in threads: the FX tracing race (torch <= 2.13 keeps the FX "
        "tracing flag process-global, so one thread's compile breaks another's compiled call)"
        + (f"; raised {n} time(s) in this output" if n else ""),
        _ev(hits))


_STEP_EVENT = r'"event"\s*:\s*"step"'
#: In both dump-header patterns of probes/stackdump.py (tests/sandbox/test_status_fast.py checks it).
_DUMP_HEADER = "(most recent call first):"


def _compile_hang_stacks(ctx: Context) -> Match | None:
    """Stack dumps show threads blocked inside torch.compile (``compile_fx``, ``Tracer.trace``):
    the concurrent-compile hang of the incident."""
    # every dump header has this text: the parser (and its regexes) load only for a dump
    if not any(_DUMP_HEADER in ln for ln in ctx.lines):
        return None
    from remote_payload.probes import stackdump

    if not stackdump.looks_like_dump(ctx.lines):
        return None
    last_header = max(i for i, ln in enumerate(ctx.lines) if stackdump.looks_like_dump([ln]))
    if any(re.search(_STEP_EVENT, ln) for ln in ctx.lines[last_header:]):
        return None  # training stepped on after the dump: it was not stuck
    dumps = stackdump.parse_dump(ctx.lines)
    if not dumps:
        return None
    dump = dumps[-1]
    compiling = [th for th in dump.threads if th.in_compile and th.landmarks()
                 and not set(th.landmarks()) <= {"compile worker pool"}]
    if not compiling:
        return None
    tracing = [th for th in compiling if "fx Tracer.trace" in th.landmarks()]
    ev = [f"thread {th.ident}: {' < '.join(th.landmarks()[:3])} at {th.where()}"
          for th in compiling]
    several = len(compiling) > 1
    summary = (f"Stack dump: {len(compiling)} thread(s) inside torch.compile"
               + (" at once, one of them in FX Tracer.trace: the concurrent-compile hang"
                  if several and tracing else "")
               + (" (a dump taken after a timeout)" if dump.timeout_after else ""))
    return Match(summary, _ev(ev), severity="error" if several and tracing else "warning",
                 hint=FX_RACE_FIXES if several else
                 "One thread is compiling; take `opsctl stacks` again in a minute: if the "
                 "stack has not moved, the compile is stuck.")


def _activity_times(ctx: Context) -> list[float]:
    st = ctx.status
    times = [_num(st.get("last_output_at"))]
    last_step = st.get("last_step") or {}
    times.append(_num(last_step.get("_at")))
    for ev in ctx.events:
        for key in ("_at", "ts", "time"):
            if _num(ev.get(key)) is not None:
                times.append(_num(ev.get(key)))
                break
    return [x for x in times if x is not None]


def hang_threshold(status: t.Mapping[str, t.Any]) -> tuple[float, str]:
    """Seconds of silence after which the job is hung, and why that many.

    One rule for the wrapper's watch (which takes the stacks) and ``status``'s diagnosis.
    Order: the playbook's budget for the current phase; else the budget the job announced for
    it, when longer than the playbook's ``hang_after_s`` (default 90 s); else that.
    """
    phase = str(status.get("phase") or "")
    per_phase = status.get("phase_budgets_s") or {}
    if isinstance(per_phase, dict) and _num(per_phase.get(phase)):
        return float(per_phase[phase]), f"playbook phase_budgets_s.{phase}"
    floor = _num(status.get("hang_after_s"))
    why = "playbook hang_after_s" if floor else "default"
    floor = floor or DEFAULT_HANG_AFTER_S
    budget = _num(status.get("budget_s"))
    if budget is not None:
        if budget > floor:
            return budget, f"announced by the job for phase {phase or '?'}"
        return floor, why
    compiling = status.get("state") == "COMPILING" or phase in ("compiling", "warmup")
    if compiling and floor < UNANNOUNCED_COMPILE_HANG_S:
        return UNANNOUNCED_COMPILE_HANG_S, "compiling, no budget announced"
    return floor, why


def _hang(ctx: Context) -> Match | None:
    """The job is alive but printed nothing and sent no step event for longer than its current
    budget (``hang_after_s``, the phase's announced ``budget_s``)."""
    st = ctx.status
    state = str(st.get("state") or "")
    if not st.get("alive") or state in ("SUCCEEDED", "FAILED", "CANCELLED", "LOST", "PENDING"):
        return None
    compiling = state == "COMPILING" or str(st.get("phase") or "") in ("compiling", "warmup")
    thr, thr_why = hang_threshold(st)
    times = _activity_times(ctx)
    started = _num(st.get("started_at")) or _num(st.get("created_at"))
    if times:
        last, what = max(times), "no new output or step events"
    elif started is not None:
        last, what = started, "no output at all since the start"
    else:
        return None
    idle = ctx.now - last
    if idle < thr:
        return None
    utils = [_num(g.get("util_pct")) for g in st.get("gpus") or []]
    known = [u for u in utils if u is not None]
    ev = [f"{what} for {idle:.0f} s (threshold {thr:.0f} s: {thr_why}; state {state or '?'}, "
          f"phase {st.get('phase') or '?'})"]
    step = st.get("last_step")
    if step:
        ev.append(f"last step event: step {step.get('step')}, tok_s {step.get('tok_s')}")
    if known:
        ev.append("GPU util: " + ", ".join(f"{u:.0f}%" for u in known))
    stacks = _hang_stacks(st, last)
    if stacks:
        ev.append(f"stacks taken at the hang: {stacks.get('saved_to')}")
    where = f"; {stacks['summary']}" if stacks and stacks.get("summary") else ""
    in_collective = stacks is not None and any(p.get("collective") for p in stacks.get("processes") or [])
    if known and max(known) >= GPU_IDLE_PCT and not in_collective:
        return Match(f"Quiet for {idle:.0f} s but the GPUs are busy (max {max(known):.0f}%): "
                     "probably a long step or compile that prints nothing" + where,
                     ev, severity="warning",
                     hint="`opsctl stacks` shows what every process is doing; print progress "
                          "more often (or raise the playbook's hang_after_s) if this is expected")
    gpu_word = ("GPUs busy only waiting (NCCL kernels spin in a stuck collective)"
                if known and max(known) >= GPU_IDLE_PCT else "GPUs idle" if known else "GPU load unknown")
    return Match(f"Looks hung: alive, {what} for {idle:.0f} s, {gpu_word}"
                 + (" (stuck compiling?)" if compiling and not where else "") + where, ev,
                 severity="error" if known or in_collective else "warning")


def _hang_stacks(st: t.Mapping[str, t.Any], quiet_since: float) -> dict[str, t.Any] | None:
    """The stacks the wrapper took in this quiet spell (not in an earlier one)."""
    hang = st.get("hang")
    if not isinstance(hang, dict):
        return None
    since = _num(hang.get("quiet_since"))
    if since is None or since + 1.0 < quiet_since:
        return None
    return hang


_OOM_NEW = (
    r"Tried to allocate (?P<req>[\d.]+ [KMGT]?i?B)\. GPU (?P<gpu>\d+) has a total capac?i?ty of "
    r"(?P<total>[\d.]+ [KMGT]?i?B) of which (?P<free>[\d.]+ (?:[KMGT]?i?B|bytes)) is free\."
    r"(?: Including non-PyTorch memory, this process has (?P<proc>[\d.]+ [KMGT]?i?B) memory in use\.)?"
    r"(?: Of the allocated memory (?P<alloc>[\d.]+ [KMGT]?i?B) is allocated by PyTorch, and "
    r"(?P<reserved>[\d.]+ [KMGT]?i?B) is reserved by PyTorch but unallocated\.)?")
_OOM_OLD = (
    r"Tried to allocate (?P<req>[\d.]+ [KMGT]?i?B) \(GPU (?P<gpu>\d+); (?P<total>[\d.]+ [KMGT]?i?B) "
    r"total capacity; (?P<alloc>[\d.]+ [KMGT]?i?B) already allocated; (?P<free>[\d.]+ [KMGT]?i?B) "
    r"free; (?P<reserved>[\d.]+ [KMGT]?i?B) reserved in total by PyTorch\)")
_UNITS = {"B": 1 / 2**30, "bytes": 1 / 2**30, "KiB": 1 / 2**20, "MiB": 1 / 2**10, "GiB": 1.0,
          "TiB": 2**10}


def gib(size: str | None) -> float | None:
    """'1.20 GiB' -> 1.2; '512.00 MiB' -> 0.5."""
    if not size:
        return None
    num, _, unit = size.partition(" ")
    try:
        return float(num) * _UNITS.get(unit, 1.0)
    except ValueError:
        return None


def _cuda_oom(ctx: Context) -> Match | None:
    """``torch.OutOfMemoryError``: the GPU ran out of memory; the numbers (asked, free,
    reserved, held by others) come from the message."""
    hits = ctx.grep("CUDA out of memory", "OutOfMemoryError")
    if not hits:
        return None
    for ln in reversed(hits):
        m = re.search(_OOM_NEW, ln) or re.search(_OOM_OLD, ln)
        if m:
            g = m.groupdict()
            summary = (f"CUDA out of memory on GPU {g['gpu']}: tried to allocate {g['req']} "
                       f"with {g['free']} free of {g['total']}")
            extra = []
            if g.get("proc"):
                extra.append(f"this process holds {g['proc']}")
            if g.get("alloc"):
                extra.append(f"PyTorch allocated {g['alloc']}")
            if g.get("reserved"):
                extra.append(f"{g['reserved']} reserved but unallocated")
            if extra:
                summary += " (" + ", ".join(extra) + ")"
            hint = ("Lower token_budget / max_batch_size (or the sequence length), or shard "
                    "the model differently.")
            reserved, total = gib(g.get("reserved")), gib(g.get("total"))
            if reserved is not None and total and reserved > 0.05 * total:
                hint += (" Much memory is reserved but unallocated (fragmentation): set "
                         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
            proc = gib(g.get("proc"))
            if proc is not None and total and proc < 0.5 * total:
                hint += (" This process holds less than half the GPU: another process uses it "
                         "(check nvidia-smi).")
            return Match(summary, _ev([ln]), hint=hint)
    return Match("CUDA out of memory", _ev(hits))


_NCCL_TIMEOUT = (
    r"Watchdog caught collective operation timeout: WorkNCCL\((?P<work>.*?)\) ran for "
    r"(?P<ms>\d+) milliseconds before timing out")


def _nccl_timeout(ctx: Context) -> Match | None:
    """A collective did not finish within the process group's timeout: NCCL's watchdog tore the
    rank down."""
    hits = ctx.grep("Watchdog caught collective operation timeout", "timed out in blocking wait")
    if not hits:
        return None
    m = next((m for ln in reversed(hits) if (m := re.search(_NCCL_TIMEOUT, ln))), None)
    if m is None:
        return Match("NCCL collective timed out", _ev(hits))
    work = dict(kv.split("=", 1) for kv in m.group("work").split(", ") if "=" in kv)
    ranks = sorted({int(r) for r in re.findall(r"\[Rank (\d+)\] Watchdog caught", "\n".join(hits))})
    return Match(
        f"NCCL {work.get('OpType', 'collective')} (SeqNum {work.get('SeqNum', '?')}) timed out "
        f"after {int(m.group('ms')) / 1000:.0f} s" + (f" on rank(s) {ranks}" if ranks else ""),
        _ev(hits))


_NCCL_ERROR = r"NCCL error in: (?P<where>\S+?),? (?P<what>[^,(]+)"
_NCCL_CODES = ("ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
               "ncclInvalidUsage", "ncclRemoteError", "ncclInvalidArgument")


def _nccl_error(ctx: Context) -> Match | None:
    """NCCL reported an error of its own (``ncclInternalError``, ``ncclSystemError``, an
    unhandled CUDA error inside NCCL, ...)."""
    hits = [ln for ln in ctx.grep("NCCL error", *_NCCL_CODES, "NCCL communicator was aborted")
            if "Watchdog caught collective operation timeout" not in ln]
    if not hits:
        return None
    code = next((c for ln in hits for c in _NCCL_CODES if c in ln), None)
    m = next((m for ln in reversed(hits) if (m := re.search(_NCCL_ERROR, ln))), None)
    what = m.group("what").strip() if m else "error"
    return Match(f"NCCL {what}" + (f" ({code})" if code else ""), _ev(hits))


def _flex_uncompiled(ctx: Context) -> Match | None:
    """``flex_attention`` ran without torch.compile (its dense fallback): correct but many times
    slower, the user's 4.6 Ktok/s."""
    hits = ctx.grep("flex_attention called without torch.compile()")
    if not hits:
        return None
    return Match("flex_attention runs uncompiled: the unfused path materializes the full score "
                 "matrix (the incident's 4.6 Ktok/s instead of ~20 Ktok/s)", _ev(hits))


_RECOMPILE = (r"torch\._?dynamo hit (?:config\.)?(?P<kind>recompile_limit|cache_size_limit|"
              r"accumulated_recompile_limit|accumulated_cache_size_limit)"
              r"|hit recompilation cache limit")
_RECOMPILE_FN = r"function: '(?P<fn>[^']+)' \((?P<where>[^)]*)\)"


def _recompile_limit(ctx: Context) -> Match | None:
    """Dynamo hit its recompile limit and fell back to eager for a function: slow steps, often
    from unbounded shapes."""
    hits = ctx.grep("hit config.", "recompile_limit", "cache_size_limit", "recompilation cache limit")
    hits = [ln for ln in hits if re.search(_RECOMPILE, ln) or "function: '" in ln
            or "last reason:" in ln or "recompile_limit reached" in ln]
    if not any(re.search(_RECOMPILE, ln) or "recompile_limit reached" in ln for ln in hits):
        return None
    more = [ln for ln in ctx.lines if "function: '" in ln or "last reason:" in ln]
    fns = sorted({m.group("fn") for ln in more if (m := re.search(_RECOMPILE_FN, ln))})
    return Match("torch._dynamo hit its recompile limit"
                 + (f" for {', '.join(repr(f) for f in fns)}" if fns else "")
                 + ": that code now runs uncompiled (slow path)", _ev(hits + more))


_DRIVER_NEEDLES = ("The NVIDIA driver on your system is too old",
                   "CUDA driver version is insufficient for CUDA runtime version",
                   "no kernel image is available for execution on the device",
                   "Found no NVIDIA driver on your system",
                   "is not compatible with the current PyTorch installation")


def _cuda_mismatch(ctx: Context) -> Match | None:
    """The torch build does not fit the host driver or the GPU (``CUDA driver version is
    insufficient``, ``no kernel image is available``, NVML version mismatch)."""
    hits = ctx.grep(*_DRIVER_NEEDLES)
    if not hits:
        return None
    found = re.search(r"found version (\d+)", "\n".join(hits))
    kind = next(n for n in _DRIVER_NEEDLES if any(n in ln for ln in hits))
    summary = {
        _DRIVER_NEEDLES[0]: "The torch build needs a newer NVIDIA driver than the host has",
        _DRIVER_NEEDLES[1]: "The torch build's CUDA runtime is newer than the host driver supports",
        _DRIVER_NEEDLES[2]: "The torch build has no kernels for this GPU architecture",
        _DRIVER_NEEDLES[3]: "No NVIDIA driver visible in the container",
        _DRIVER_NEEDLES[4]: "The torch build does not support this GPU",
    }[kind]
    if found:
        v = int(found.group(1))
        summary += f" (driver supports CUDA {v // 1000}.{(v % 1000) // 10})"
    return Match(summary, _ev(hits))


_NO_MODULE = r"ModuleNotFoundError: No module named '(?P<mod>[^']+)'"
_NO_NAME = r"ImportError: cannot import name '(?P<name>[^']+)' from '(?P<mod>[^']+)'"


def _missing_module(ctx: Context) -> Match | None:
    """An import failed (``ModuleNotFoundError``/``ImportError``): a package missing from the
    job's env, or the payload off ``PYTHONPATH``."""
    hits = ctx.grep("ModuleNotFoundError", "ImportError: cannot import name")
    if not hits:
        return None
    mods = [m.group("mod") for ln in hits if (m := re.search(_NO_MODULE, ln))]
    names = [f"{m.group('name')} from {m.group('mod')}" for ln in hits
             if (m := re.search(_NO_NAME, ln))]
    if not mods and not names:
        return None
    hint = ("Install it into the job's env (envs/current, see `opsctl envs`) or fix PYTHONPATH / "
            "the job's workdir.")
    if any(m.split(".")[0] == "torch" for m in mods):
        hint = "torch is not installed in the python the job ran: check the job's env / `opsctl envs`."
    elif any(m.split(".")[0] == "remote_payload" for m in mods):
        hint = "The payload is not on PYTHONPATH or not deployed: run `opsctl deploy`."
    if names and not mods:
        hint = ("A package is there but in another version than the code expects: pin matching "
                "versions in the env.")
    what = ", ".join(dict.fromkeys([f"no module {m!r}" for m in mods]
                                   + [f"cannot import {n}" for n in names]))
    return Match(f"Import failed: {what}", _ev(hits), hint=hint)


_SIGNAL_MEANING = {
    "SIGKILL": ("Killed by SIGKILL: most likely the kernel OOM killer (host RAM, not GPU memory)",
                "On the Proxmox host: `dmesg -T | grep -iE 'killed process|out of memory'` (or "
                "`journalctl -k`); check the container's memory limit (`pct config <ct>`); reduce "
                "dataloader workers / pinned buffers. Ignore if you killed it yourself."),
    "SIGSEGV": ("Crashed with a segmentation fault (native code: torch/driver/extension bug or a "
                "build mismatch)", "Read the faulthandler stack above the crash in `opsctl logs`; "
                "try another torch build (`opsctl envs`)."),
    "SIGABRT": ("Aborted (SIGABRT): a C++ exception, failed assert, or the NCCL watchdog tearing "
                "the process down", "Read the lines just above the abort in `opsctl logs`."),
    "SIGBUS": ("Bus error (SIGBUS): often /dev/shm too small for dataloader workers",
               "Enlarge /dev/shm in the container or use fewer dataloader workers."),
    "SIGTERM": ("Terminated by SIGTERM: something stopped it (opsctl stop, a scheduler, shutdown)",
                "Check who sent it; `opsctl status` evidence shows opsctl's own stops."),
}


_KILLED_LINE = r"^(?:.*: line \d+: +\d+ )?Killed\b"  # bash's report of a SIGKILL


def _killed_by_signal(ctx: Context) -> Match | None:
    """The job's process was killed by a signal (SIGKILL: most likely the kernel OOM killer;
    SIGSEGV, SIGBUS, SIGABRT, SIGTERM)."""
    st = ctx.status
    if st.get("state") == "CANCELLED":
        return None
    sig = st.get("signal")
    code = st.get("exit_code")
    if not sig and isinstance(code, int) and (code < 0 or 128 < code < 160):
        num = -code if code < 0 else code - 128
        try:
            sig = _signal.Signals(num).name
        except ValueError:
            sig = f"signal {num}"
    killed_lines = [ln for ln in ctx.lines[-20:] if re.match(_KILLED_LINE, ln.strip())]
    if not sig and killed_lines and not st.get("alive"):
        sig = "SIGKILL"
    if not sig:
        return None
    summary, hint = _SIGNAL_MEANING.get(str(sig), (f"Killed by {sig}", "See `opsctl logs`."))
    ev = [f"exit_code={code} signal={st.get('signal')}", *killed_lines]
    return Match(summary, _ev(ev), hint=hint)


def _throughput(ctx: Context) -> Match | None:
    """Steady-state tokens/s below half of the playbook's ``expect_tok_s``."""
    st = ctx.status
    if str(st.get("state") or "") not in ("RUNNING", ""):
        return None
    expect = _num(st.get("expect_tok_s")) or _num((st.get("spec") or {}).get("expect_tok_s"))
    step = st.get("last_step") or {}
    tok_s = _num(step.get("tok_s"))
    if not expect or tok_s is None or (_num(step.get("step")) or 0) < 2:
        return None
    ratio = tok_s / expect
    if ratio >= THROUGHPUT_WARN_RATIO:
        return None
    recent = [_num(e.get("tok_s")) for e in ctx.events if e.get("event") == wire.EVENT_STEP]
    ev = [f"last step {step.get('step')}: {tok_s:,.0f} tok/s; playbook expects {expect:,.0f}"]
    if len([r for r in recent if r is not None]) > 1:
        ev.append("recent tok/s: " + ", ".join(f"{r:,.0f}" for r in recent[-5:] if r is not None))
    return Match(f"Throughput {tok_s / 1000:.1f} Ktok/s is {ratio:.0%} of the expected "
                 f"{expect / 1000:.1f} Ktok/s", ev)


# A rank failing because another one died first says nothing about the cause.
_CONSEQUENCE = ("Connection closed by peer", "remote worker crashing", "Connection reset by peer",
                "NCCL communicator was aborted", "Broken pipe", "ProcessGroupNCCL is aborted",
                "has been aborted", "Socket Timeout")


def _rank_failed(ctx: Context) -> Match | None:
    """In a distributed run, the first rank whose failure took the others down (named by its own
    error event)."""
    errs = [e for e in ctx.status.get("errors") or []
            if isinstance(e, dict) and isinstance(e.get("rank"), int)]
    ranks = sorted({int(e["rank"]) for e in errs})
    if not any(r != 0 for r in ranks):  # one process (or only rank 0 spoke): python_exception
        return None

    def is_consequence(e: dict[str, t.Any]) -> bool:
        return any(c in str(e.get("message") or "") for c in _CONSEQUENCE)

    first = min(errs, key=lambda e: (is_consequence(e), _num(e.get("_at")) or 0.0))
    gpu = f" (GPU {first['gpu']})" if first.get("gpu") not in (None, "") else ""
    msg = str(first.get("message") or "").strip()
    others = [r for r in ranks if r != first["rank"]]
    summary = (f"Rank {first['rank']}{gpu} failed: {first.get('type') or 'Error'}"
               + (f": {msg}" if msg else ""))
    if others:
        summary += f"; rank(s) {', '.join(map(str, others))} failed after it"
    ev = [f"rank {e['rank']}: {e.get('type')}: {e.get('message')}" for e in errs]
    return Match(summary, _ev(ev))


FEATURE_WAIT_WARN_PCT = 50.0


def _drafters_waiting(ctx: Context) -> Match | None:
    """Split layout: the drafter ranks spend much of each step waiting for features from the
    target ranks (the target side is the bottleneck)."""
    step = ctx.status.get("last_step") or {}
    pct = _num(step.get("feature_wait_pct"))
    if pct is None or pct <= FEATURE_WAIT_WARN_PCT or ctx.status.get("state") != "RUNNING":
        return None
    return Match(f"Drafter ranks spend {pct:.0f}% of their time waiting for the target ranks' "
                 "features: the targets are the bottleneck of this split layout",
                 [f"step {step.get('step')}: feature_wait_pct {pct}, tok_s {step.get('tok_s')}"])


def _gpus_busy_at_launch(ctx: Context) -> Match | None:
    """A forced launch (``deploy --force``) found GPUs the job needs held by processes outside
    the job."""
    pre = ctx.status.get("preflight")
    busy = pre.get("busy") if isinstance(pre, dict) else None
    if not busy:
        return None
    ev = [f"GPU {b.get('index')}: {b.get('why')}" for b in busy if isinstance(b, dict)]
    forced = isinstance(pre, dict) and pre.get("forced")
    return Match(f"{len(ev)} GPU(s) this job needs were in use by something else at launch"
                 + (" (launched with --force)" if forced else ""), _ev(ev))


_EXC_LINE = r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?:: (?P<msg>.*))?$"


def _python_exception(ctx: Context) -> Match | None:
    """The job ended with a Python traceback that no more specific signature explains; its last
    line is the summary."""
    st = ctx.status
    if st.get("state") != "FAILED":
        return None
    for ln in reversed(ctx.lines):
        m = re.match(_EXC_LINE, ln.strip())
        if m:
            msg = (m.group("msg") or "").strip()
            return Match(f"The job failed with {m.group('type')}" + (f": {msg}" if msg else ""),
                         _ev([ln]))
    return None


# --- the table ------------------------------------------------------------------

SIGNATURES: tuple[Signature, ...] = (
    Signature("fx_tracing_race", "error", FX_RACE_FIXES, _fx_race),
    Signature("compile_hang_stacks", "warning", FX_RACE_FIXES, _compile_hang_stacks),
    Signature("hang", "error",
              "The stacks above were taken when the job went quiet (`opsctl stacks` takes them "
              "again): a rank that is not in a collective is the one the others wait for; stuck "
              "in torch.compile, data loading or a dead peer? Then `opsctl stop` it.", _hang),
    Signature("cuda_oom", "error", "Lower token_budget / max_batch_size.", _cuda_oom),
    Signature("nccl_timeout", "error",
              "One rank stopped reaching the collective (crashed, hung, or far slower, e.g. still "
              "compiling): read every rank's output, `opsctl stacks` while it is stuck, "
              "NCCL_DEBUG=INFO for transport problems; raise the process-group timeout only if "
              "one step is legitimately that slow.", _nccl_timeout),
    Signature("nccl_error", "error",
              "Run with NCCL_DEBUG=INFO (NCCL_DEBUG=WARN first) to see the cause; check that the "
              "NCCL and CUDA versions match the driver and that all GPUs are visible "
              "(CUDA_VISIBLE_DEVICES). Keep NVLink multicast off (NCCL_NVLS_ENABLE=0).",
              _nccl_error),
    Signature("flex_attention_uncompiled", "warning",
              "Call torch.compile(flex_attention), not the plain function; if threads compile "
              "concurrently fix that first (fx_tracing_race), and do not use "
              "force_compile_during_fx_trace.", _flex_uncompiled),
    Signature("recompile_limit", "warning",
              "Bound the shapes (pad to a few buckets, or torch._dynamo.mark_dynamic) or raise "
              "torch._dynamo.config.recompile_limit; TORCH_LOGS=recompiles shows each reason.",
              _recompile_limit),
    Signature("cuda_driver_mismatch", "error",
              "Use a torch build that matches the host driver (CUDA 12.8 builds need driver "
              ">= 570, CUDA 13.0 builds >= 580; `nvidia-smi` shows the driver) and the GPU "
              "arch: `opsctl envs` / swap to a matching build.", _cuda_mismatch),
    Signature("missing_module", "error", "Install the missing package into the job's env.",
              _missing_module),
    Signature("rank_failed", "error",
              "The first rank to fail is the cause; the job brings the other ranks down with it "
              "(no orphan holds a GPU). `opsctl logs` has its traceback; an NCCL watchdog "
              "timeout also left flight-recorder dumps in the job's flight-recorder/ folder "
              "(`python -m torch.distributed.flight_recorder.fr_trace <folder> -p rank_`).",
              _rank_failed),
    Signature("killed_by_signal", "error", "See `opsctl logs`.", _killed_by_signal),
    Signature("throughput_regression", "warning",
              "Common causes: uncompiled flex_attention or recompile-limit fallbacks (see other "
              "findings), force_compile_during_fx_trace, another process on the GPUs "
              "(nvidia-smi), data loading stalls.", _throughput),
    Signature("drafters_waiting_for_features", "info",
              "Give the targets more ranks (e.g. 6 + 2 instead of 5 + 3) or run --topology "
              "colocated (every rank runs its own target): compare tok/s in a short run.",
              _drafters_waiting),
    Signature("gpus_busy_at_launch", "warning",
              "A leftover process (the incident had one) or another container holds these GPUs: "
              "expect OOM or slow steps. `opsctl exec -- nvidia-smi` names what runs; stop it.",
              _gpus_busy_at_launch),
    Signature("python_exception", "error", "`opsctl logs` shows the full traceback.",
              _python_exception),
)

_SLOW_PATH_CAUSES = ("flex_attention_uncompiled", "recompile_limit", "fx_tracing_race")


def diagnose(*, output_tail: list[str], events: list[dict[str, t.Any]], status: dict[str, t.Any],
             now: float) -> list[dict[str, t.Any]]:
    """Every signature that matches, errors first; ``[]`` for a healthy job."""
    lines = [ln.rstrip("\r\n") for ln in output_tail]
    for ev in events:
        if ev.get("event") == wire.EVENT_ERROR:  # the trainer's own error events read like log lines
            lines.append(f"{ev.get('type') or 'Error'}: {ev.get('message') or ''}")
    ctx = Context(lines, list(events), dict(status), now)
    found: list[Finding] = []
    for sig in SIGNATURES:
        m = sig.match(ctx)
        if m is not None:
            found.append(Finding(sig.cause, m.severity or sig.severity, m.summary, m.evidence,
                                 m.hint or sig.hint))
    causes = {f.cause for f in found}
    if "python_exception" in causes and any(
            f.severity == "error" and f.cause != "python_exception" for f in found):
        found = [f for f in found if f.cause != "python_exception"]  # a named cause says more
    slow = [c for c in _SLOW_PATH_CAUSES if c in causes]
    if slow:
        found = [f._replace(summary=f"{f.summary}; likely cause: {', '.join(slow)}")
                 if f.cause == "throughput_regression" else f for f in found]
    found.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    return [f.to_dict() for f in found]
