"""One mode of the compile-race probe, in its own process (started by ``compile_race``).

Why a separate process per mode: a hang or a crash inside torch.compile must
not take the other mode or the reporting parent with it. This process prints
human progress lines and, as its last line, one ``probe_mode_result`` event
(``remote_payload.wire``). A ``faulthandler`` watchdog writes every thread's
stack to ``--dump-file`` shortly before the parent's kill deadline, so even a
hang that holds the GIL leaves evidence behind.

Only imports torch after the watchdog is armed; ``--simulate`` replaces torch
with deterministic stand-ins (block / die by a signal / raise the FX error /
fail the import) so the reporting paths are testable in seconds on any CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import math
import os
import signal
import sys
import threading
import time
import traceback
import typing as t

from remote_payload import wire
from remote_payload.compile_guard import compiled_call, serialized_compile

MODES = ("unguarded", "guarded")  # the default pair
# Thread 0 makes warm compiled calls in a loop while the others compile under the lock:
# with the lock only (as a trainer that guards compiles but not steps), or gated by
# compile_guard.compiled_call().
WARM_MODES = ("warm-lock-only", "warm-gated")
ALL_MODES = MODES + WARM_MODES
SIMULATIONS = ("hang", "hang-hard", "crash", "error", "import-error")
FX_RACE_MESSAGE = ("Detected that you are using FX to symbolically trace a dynamo-optimized "
                   "function. This is not supported at the moment.")
EVENT_RESULT = wire.EVENT_PROBE_MODE_RESULT


@dataclasses.dataclass
class ThreadRecord:
    index: int
    ident: str | None = None
    status: str = "pending"  # pending | running | ok | error (hang is decided by main)
    elapsed_s: float | None = None
    lock_wait_s: float | None = None  # guarded: time spent waiting for the lock
    error: str | None = None
    traceback: str | None = None
    fx_flag_after: bool | None = None
    stage: str = "waiting at barrier"
    role: str = "compile"  # compile | warm (warm modes: thread 0 loops its compiled call)
    calls: int = 0


def say(mode: str, msg: str) -> None:
    sys.stdout.write(f"[{mode}] {msg}\n")  # one write: lines from threads never interleave
    sys.stdout.flush()


def read_fx_flag() -> tuple[bool | None, str | None]:
    """The FX tracing flag as seen by the calling thread, and how torch stores it.

    Up to torch 2.13 ``_is_fx_tracing_flag`` is a module-level bool shared by all
    threads (the root of the race); newer torch keeps it per thread.
    """
    if "torch" not in sys.modules:  # never import torch just to read the flag
        return None, None
    try:
        import torch.fx._symbolic_trace as st
    except Exception:
        return None, None
    obj = getattr(st, "_is_fx_tracing_flag", None)
    if isinstance(obj, bool):
        return obj, "module_global"
    if isinstance(obj, threading.local):
        for attr in ("value", "flag", "is_tracing", "_is_fx_tracing_flag"):
            if hasattr(obj, attr):
                return bool(getattr(obj, attr)), "thread_local"
        return False, "thread_local"  # never set in this thread
    if obj is not None and hasattr(obj, "get"):  # a ContextVar
        try:
            return bool(obj.get(False)), "context_var"
        except Exception:
            return None, "context_var"
    fn = getattr(st, "is_fx_tracing", None)
    if callable(fn):
        try:
            return bool(fn()), "function"
        except Exception:
            return None, "function"
    return None, None


# --- workloads ------------------------------------------------------------------


@dataclasses.dataclass
class Workload:
    env: dict[str, t.Any]
    device: str
    backward: bool
    backward_note: str | None
    make_step: t.Callable[[int], t.Callable[[], None]]
    shape: dict[str, t.Any]


def torch_workload(device_req: str, backward_req: bool, threads: int) -> Workload:
    import platform

    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    device = device_req
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
    backward, note = backward_req, None
    if backward and device == "cpu":
        # Compiled flex_attention has no CPU backward in torch 2.11+.
        backward, note = False, "skipped on CPU (compiled flex_attention has no CPU backward)"

    # Each thread passes a different `scale` so each one really compiles (dynamo
    # specializes float constants): that is what puts Tracer.trace on the race.
    limit = max(8, 2 * threads + 4)
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))

    env: dict[str, t.Any] = {
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device": device,
        "device_name": None,
        "triton": None,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        pass
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name(0)
        dtype = torch.bfloat16
        b, h, s, d = 2, 4, 1024, 64
    else:
        env["device_name"] = platform.processor() or platform.machine()
        dtype = torch.float32
        b, h, s, d = 1, 2, 128, 32

    def causal(b_: t.Any, h_: t.Any, q_idx: t.Any, kv_idx: t.Any) -> t.Any:
        return q_idx >= kv_idx

    block_mask = create_block_mask(causal, 1, 1, s, s, device=device)

    def make_step(i: int) -> t.Callable[[], None]:
        compiled = torch.compile(flex_attention)
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=backward)
                   for _ in range(3))
        scale = 0.1 * (i + 1)

        def step() -> None:
            out = compiled(q, k, v, block_mask=block_mask, scale=scale)
            if backward:
                out.float().sum().backward()  # type: ignore[no-untyped-call]
            if device == "cuda":
                torch.cuda.synchronize()

        return step

    return Workload(env, device, backward, note, make_step,
                    {"B": b, "H": h, "S": s, "D": d, "dtype": str(dtype)})


def simulated_workload(kind: str, backward_req: bool) -> Workload:
    """Deterministic stand-ins for the failure paths (tests; no torch needed)."""
    import platform

    if kind == "import-error":
        raise ModuleNotFoundError("No module named 'torch' (simulated by --simulate import-error)")

    def make_step(i: int) -> t.Callable[[], None]:
        def step() -> None:
            if kind in ("hang", "hang-hard"):
                threading.Event().wait()
            elif kind == "crash":
                time.sleep(0.2 * i)
                os.kill(os.getpid(), signal.SIGSEGV)
                time.sleep(5)
            elif kind == "error" and i % 2 == 0:  # some threads fail, as in the real race
                raise RuntimeError(FX_RACE_MESSAGE)

        return step

    env = {"torch": None, "python": platform.python_version(), "device": "simulated",
           "device_name": None, "cuda": None, "triton": None, "simulated": kind}
    return Workload(env, "simulated", backward_req, None, make_step, {})


# --- the run -------------------------------------------------------------------


def _record_error(rec: ThreadRecord, exc: BaseException) -> None:
    rec.status = "error"
    rec.error = f"{type(exc).__name__}: {exc}"
    rec.traceback = traceback.format_exc()[-4000:]


def _finish(mode: str, rec: ThreadRecord, t0: float, summary: str) -> None:
    """Close a thread's record: elapsed time, the FX flag as this thread sees it, one line."""
    rec.elapsed_s = round(time.monotonic() - t0, 3)
    rec.fx_flag_after, _ = read_fx_flag()
    rec.stage = "done"
    say(mode, f"thread {rec.index} {summary}" + (f" -- {rec.error}" if rec.error else ""))


def warm_worker(mode: str, rec: ThreadRecord, step: t.Callable[[], None], gated: bool,
                barrier: threading.Barrier, stop: threading.Event) -> None:
    """Call an already-compiled function in a loop until the compilers are done."""
    rec.ident = f"0x{threading.get_ident():016x}"
    barrier.wait()
    rec.status, rec.stage = "running", "warm calls"
    t0 = time.monotonic()
    try:
        while True:  # at least one call, even if the compilers finished first
            if gated:
                with compiled_call():
                    step()
            else:
                step()
            rec.calls += 1
            if stop.is_set():
                break
        rec.status = "ok"
    except BaseException as exc:
        _record_error(rec, exc)
    _finish(mode, rec, t0, f"(warm): {rec.status} after {rec.calls} calls")


def worker(mode: str, rec: ThreadRecord, step: t.Callable[[], None], guarded: bool,
           barrier: threading.Barrier) -> None:
    rec.ident = f"0x{threading.get_ident():016x}"
    barrier.wait()
    rec.status, rec.stage = "running", "first compiled step"
    t0 = time.monotonic()
    try:
        if guarded:
            rec.stage = "waiting for the compile lock"
            with serialized_compile():
                rec.lock_wait_s = round(time.monotonic() - t0, 3)
                rec.stage = "first compiled step (holding the lock)"
                step()
        else:
            step()
        rec.status = "ok"
    except BaseException as exc:
        _record_error(rec, exc)
    _finish(mode, rec, t0, f": {rec.status} after {time.monotonic() - t0:.1f} s")


def emit(result: dict[str, t.Any]) -> None:
    sys.stdout.write(wire.format_event(EVENT_RESULT, **result) + "\n")
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    mode = args.mode
    faulthandler.enable(file=sys.stderr, all_threads=True)  # fatal signals print stacks
    dump_f = open(args.dump_file, "w")  # noqa: SIM115 -- must outlive a hang
    faulthandler.dump_traceback_later(args.watchdog_s, repeat=False, file=dump_f, exit=False)
    if args.kill_after_s:
        # Backstop if the parent is gone (killed by a deadline above it): SIGALRM's
        # default action ends the process even while a hung thread holds the GIL.
        signal.alarm(max(1, math.ceil(args.kill_after_s)))
    result: dict[str, t.Any] = {"mode": mode, "pid": os.getpid(), "simulate": args.simulate}
    say(mode, f"pid {os.getpid()}: {args.threads} threads, backward={args.backward}, "
        f"device={args.device}, watchdog after {args.watchdog_s:.0f} s")

    try:
        t0 = time.monotonic()
        if args.simulate:
            work = simulated_workload(args.simulate, args.backward)
        else:
            work = torch_workload(args.device, args.backward, args.threads)
        result["setup_s"] = round(time.monotonic() - t0, 3)
    except BaseException as exc:
        result.update(status="crashed", stage="setup", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-4000:])
        say(mode, f"setup failed: {result['error']}")
        emit(result)
        faulthandler.cancel_dump_traceback_later()
        return 2

    result.update(env=work.env, device=work.device, backward=work.backward,
                  backward_note=work.backward_note, shape=work.shape)
    if work.backward_note:
        say(mode, f"backward {work.backward_note}")
    say(mode, f"torch {work.env.get('torch')} on {work.device} ({work.env.get('device_name')}), "
        f"setup {result['setup_s']:.1f} s")

    records = [ThreadRecord(i) for i in range(args.threads)]
    steps = [work.make_step(i) for i in range(args.threads)]
    barrier = threading.Barrier(args.threads)
    stop = threading.Event()
    warm = mode in WARM_MODES
    threads = []
    for i, (rec, step) in enumerate(zip(records, steps, strict=True)):
        if warm and i == 0:
            rec.role = "warm"
            if not args.simulate:  # compile it now, alone: the loop must start warm
                with serialized_compile():
                    step()
            threads.append(threading.Thread(
                target=warm_worker, name=f"probe-{mode}-{i}", daemon=True,
                args=(mode, rec, step, mode == "warm-gated", barrier, stop)))
        else:
            threads.append(threading.Thread(
                target=worker, name=f"probe-{mode}-{i}", daemon=True,
                args=(mode, rec, step, mode != "unguarded", barrier)))
    say(mode, f"releasing {args.threads} threads together")  # the parent keys "phase" on this
    t_release = time.monotonic()
    for th in threads:
        th.start()
    if args.simulate == "hang-hard":
        threading.Event().wait()  # as if the main thread could not run either (GIL held)

    deadline = t_start + args.watchdog_s + 1.0
    compilers = threads[1:] if warm else threads
    for th in compilers:
        th.join(max(0.0, deadline - time.monotonic()))
    stop.set()  # warm modes: the compilers are done (or hung); stop the warm loop
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    hung = [rec for rec, th in zip(records, threads, strict=True) if th.is_alive()]
    elapsed = round(time.monotonic() - t_release, 3)
    if hung:
        dump_f.flush()
        if os.path.getsize(args.dump_file) == 0:  # watchdog has not fired yet
            faulthandler.dump_traceback(file=dump_f, all_threads=True)
            dump_f.flush()
    faulthandler.cancel_dump_traceback_later()

    flag, kind = read_fx_flag()
    errors = sorted({r.error for r in records if r.error})
    if hung:
        status = "hang"
    elif errors:
        status = "error"
    else:
        status = "ok"
    result.update(
        status=status,
        elapsed_s=elapsed,
        wall_s=round(time.monotonic() - t_start, 3),
        threads=[dataclasses.asdict(r) | {"status": "hang" if r in hung else r.status}
                 for r in records],
        errors=errors,
        fx_tracing_flag=flag,
        fx_flag_kind=kind,
        thread_names={r.ident: f"worker-{r.index}" for r in records if r.ident},
    )
    say(mode, f"{status} in {elapsed:.1f} s"
        + (f"; {len(hung)} thread(s) still blocked" if hung else "")
        + (f"; FX tracing flag afterwards: {flag}" if flag is not None else ""))
    emit(result)
    if hung:
        os._exit(0)  # blocked threads would stall interpreter shutdown
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="remote_payload.probes._race_child")
    p.add_argument("--mode", choices=ALL_MODES, required=True)
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--watchdog-s", type=float, required=True)
    p.add_argument("--dump-file", required=True)
    p.add_argument("--kill-after-s", type=float, default=None,
                   help="die by SIGALRM after this long, whatever happens")
    p.add_argument("--simulate", choices=SIMULATIONS, default=None)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
