"""Turn per-mode outcomes of the compile-race probe into an overall status and a verdict.

Kept apart from the process handling so the wording can be tested on plain
dicts. Stdlib only.
"""

from __future__ import annotations

import re
import typing as t

FIXES = ("one process per GPU; torch >= 2.14 (thread-local FX tracing flag); or serialize "
         "every compile (first call, each new shape, first backward) behind "
         "remote_payload.compile_guard.serialized_compile() and bound the shapes")
FX_MARKER = "Detected that you are using FX to symbolically trace"


def torch_at_least(version: str | None, major: int, minor: int) -> bool | None:
    if not version:
        return None
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2))) >= (major, minor)


def _where_blocked(mode: dict[str, t.Any], limit: int = 3) -> str:
    """'worker-0: fx Tracer.trace > autograd backward; worker-1: ...' from the hang stacks."""
    parts = []
    for th in mode.get("hang_stacks") or []:
        if not th.get("name", "") or not str(th.get("name")).startswith("worker-"):
            continue
        stages = th.get("landmarks") or []
        parts.append(f"{th['name']}: {' < '.join(stages[:3]) if stages else th.get('where')}")
    if not parts:  # unnamed (parent-killed before the child reported): compile threads
        parts = [th.get("where", "?") for th in mode.get("hang_stacks") or []
                 if th.get("in_compile")]
    return "; ".join(parts[:limit])


def _describe(name: str, mode: dict[str, t.Any], threads: int, what: str) -> str:
    if name.startswith("warm-"):
        return _describe_warm(name, mode, threads)
    st = mode.get("status")
    el = mode.get("elapsed_s")
    secs = f"{el:.0f} s" if isinstance(el, (int, float)) else "?"
    if st == "ok":
        return f"{name}, {threads} threads {what} passed in {secs}"
    if st == "hang":
        where = _where_blocked(mode)
        return (f"{name}, {threads} threads {what} hung (no finish after {secs}"
                + (f"; blocked in {where}" if where else "") + ")")
    if st == "error":
        errs = mode.get("errors") or []
        n_bad = sum(1 for th in mode.get("threads") or [] if th.get("status") == "error")
        fx = any(FX_MARKER in e for e in errs)
        first = "the FX tracing race error (" + FX_MARKER + " ...)" if fx else (
            errs[0] if errs else "an error")
        return f"{name}, {n_bad} of {threads} threads {what} raised {first}"
    sig = mode.get("signal")
    cause = mode.get("error") or (f"died by {sig}" if sig else f"exit code {mode.get('rc')}")
    if mode.get("phase") == "compile":
        return f"{name}, {threads} threads {what} crashed the process ({cause})"
    return f"{name} could not start ({cause})"


def _describe_warm(name: str, mode: dict[str, t.Any], threads: int) -> str:
    how = "gated by compiled_call()" if name == "warm-gated" else "with only the compile lock"
    setup = (f"{name}, 1 thread making warm compiled calls ({how}) while {threads - 1} "
             "compile under the lock")
    st = mode.get("status")
    ths = mode.get("threads") or []
    warm: dict[str, t.Any] = next((th for th in ths if th.get("role") == "warm"), {})
    el = mode.get("elapsed_s")
    secs = f"{el:.0f} s" if isinstance(el, (int, float)) else "?"
    if st == "ok":
        return f"{setup}: passed in {secs} ({warm.get('calls', '?')} warm calls)"
    if st == "error":
        who = [("the warm thread" if th.get("role") == "warm" else f"compiler {th.get('index')}")
               for th in ths if th.get("status") == "error"]
        errs = mode.get("errors") or ["an error"]
        fx = any(FX_MARKER in e for e in errs)
        return (f"{setup}: {', '.join(who) or 'a thread'} raised "
                + ("the FX tracing race error" if fx else errs[0]))
    if st == "hang":
        return f"{setup}: hung (no finish after {secs})"
    return f"{setup}: crashed ({mode.get('error') or mode.get('signal')})"


def build(*, modes: dict[str, dict[str, t.Any]], env: dict[str, t.Any], threads: int,
          backward_requested: bool) -> dict[str, t.Any]:
    """Overall ``status`` (ok | affected | crashed), ``affected`` and a one-paragraph verdict."""
    statuses = {name: m.get("status") for name, m in modes.items()}
    # A crash while unguarded threads compile is evidence too (e.g. a segfault in the race).
    race_crash = (statuses.get("unguarded") == "crashed"
                  and modes["unguarded"].get("phase") == "compile"
                  and statuses.get("guarded") in ("ok", None))
    any_bad = race_crash or any(s in ("error", "hang") for s in statuses.values())
    any_crash = any(s == "crashed" for s in statuses.values())
    reported = [m.get("backward") for m in modes.values() if m.get("backward") is not None]
    backward = any(reported) if reported else backward_requested
    what = ("making their first compiled flex_attention forward+backward at once" if backward
            else "making their first compiled flex_attention forward at once")
    torch_v = env.get("torch")
    build_s = f"torch {torch_v}" if torch_v else "this build"
    if env.get("device_name"):
        build_s += f" on {env['device_name']}"
    parts = [_describe(n, m, threads, what) for n, m in modes.items()]
    notes = []
    if backward_requested and not backward and env.get("device") == "cpu":
        notes.append("CPU run, forward only (compiled flex_attention has no CPU backward; the "
                     "H200 hang was seen with backward)")
    thread_local = any(m.get("fx_flag_kind") == "thread_local" for m in modes.values())

    if any_bad:
        status, affected = "affected", True
        g = modes.get("guarded", {})
        head = f"This build is affected ({build_s}): " + "; ".join(parts) + "."
        if g.get("status") == "ok":
            tail = (" The serialized_compile lock avoided it. Fixes, best first: " + FIXES + ".")
        elif g.get("status") in ("error", "hang"):
            tail = (" Even the lock did not help here: use one process per GPU (or torch "
                    ">= 2.14).")
        else:
            tail = " Fixes, best first: " + FIXES + "."
        lock_only = modes.get("warm-lock-only", {}).get("status")
        if lock_only in ("error", "hang") and modes.get("warm-gated", {}).get("status") == "ok":
            tail += (" The lock alone did not protect a thread making warm compiled calls "
                     "meanwhile; compile_guard.compiled_call() (or guard_first_calls) did.")
        stuck = [m for m in modes.values() if m.get("fx_tracing_flag") is True]
        if stuck:
            tail += (" The FX tracing flag was still True afterwards, so every later compiled "
                     "call in that process would fail too.")
        verdict = head + tail
    elif any_crash:
        status, affected = "crashed", None
        verdict = (f"The probe could not finish ({build_s}): " + "; ".join(parts)
                   + ". See the raw output for the full stderr.")
    else:
        status, affected = "ok", False
        verdict = f"Not reproduced ({build_s}): " + "; ".join(parts) + "."
        if thread_local or torch_at_least(torch_v, 2, 14):
            verdict += (" This torch keeps the FX tracing flag per thread, so the race "
                        "cannot fire.")
        else:
            verdict += (" The race is timing dependent and this torch keeps the FX tracing "
                        "flag process-global: a pass does not prove the build safe; keep "
                        "compiles serialized or use one process per GPU.")
    if notes:
        verdict += " Note: " + "; ".join(notes) + "."
    return {"status": status, "affected": affected, "verdict": verdict, "modes": modes,
            "env": env}
