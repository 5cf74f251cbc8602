"""Compile-race probe: does concurrent first-call ``torch.compile(flex_attention)`` hang or fail?

Why: on torch <= 2.13 the FX tracing flag is process-global, so threads making
their first compiled call at the same time can raise ``Detected that you are
using FX to symbolically trace a dynamo-optimized function`` or hang (docs/troubleshooting.md).
A warm compile cache hides it. This probe answers the question for the torch build at
hand, on a cold cache, in two modes side by side:

- ``unguarded``: N threads released by a barrier make their first compiled call
  (forward, and on GPU backward);
- ``guarded``: the same, each first step inside ``compile_guard.serialized_compile()``.

Each mode runs in its own child process (``_race_child``) with fresh
``TORCHINDUCTOR_CACHE_DIR``/``TRITON_CACHE_DIR`` and
``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``; the child is killed at ``--timeout``.
This parent imports no torch, so it always reports: the last stdout line is one
``probe_report`` event (``remote_payload.wire``), preceded by progress lines.
The full raw output goes to ``--raw-output``.

Usage::

    python -u -m remote_payload.probes.compile_race --threads 3 --timeout 120 --backward
    python -m remote_payload.probes.compile_race --device cpu --threads 2 --modes unguarded

Exit code: 0 when every mode passed, 1 when a mode hung/failed/crashed (the
report says which), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import typing as t

from remote_payload import procgroup, wire
from remote_payload.probes import race_report, stackdump
from remote_payload.probes._race_child import ALL_MODES, EVENT_RESULT, MODES, SIMULATIONS, WARM_MODES

EVENT_REPORT = wire.EVENT_PROBE_REPORT
PROBE_NAME = "compile-race"
REPORT_VERSION = 1
STDERR_TAIL_LINES = 30
RELEASE_LINE = "threads together"  # the child's progress line when the barrier opens
_PAYLOAD_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    threads: int = 3
    timeout_s: float = 120.0
    backward: bool = True
    device: str = "auto"
    modes: tuple[str, ...] = MODES
    raw_output: str | None = None
    simulate: str | None = None
    python: str = sys.executable

    @property
    def watchdog_s(self) -> float:
        """When the child dumps every stack: a little before the parent kills it."""
        margin = min(12.0, max(1.5, 0.1 * self.timeout_s))
        return max(0.5, self.timeout_s - margin)


@dataclasses.dataclass
class ChildRun:
    mode: str
    argv: list[str]
    rc: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    stdout: list[str] = dataclasses.field(default_factory=list)
    stderr: str = ""
    dump: str = ""
    result: dict[str, t.Any] | None = None
    start_error: str | None = None  # the interpreter could not even be started


def signal_name(rc: int | None) -> str | None:
    if rc is None or rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def tail(text: str, n: int = STDERR_TAIL_LINES) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()][-n:]


class RawLog:
    """The raw output file, written as things happen so a killed probe still leaves it."""

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        with self._lock:
            self._f.write(text if text.endswith("\n") else text + "\n")
            self._f.flush()

    def close(self) -> None:
        self._f.close()


def say(msg: str) -> None:
    print(f"[probe] {msg}", flush=True)


def run_child(cfg: ProbeConfig, mode: str, workdir: str, raw: RawLog) -> ChildRun:
    """Run one mode in a fresh process with a cold compile cache; never raises for child faults."""
    mdir = os.path.join(workdir, mode)
    os.makedirs(mdir, exist_ok=True)
    dump_path = os.path.join(mdir, "watchdog-stacks.txt")
    err_path = os.path.join(mdir, "stderr.txt")
    argv = [cfg.python, "-u", "-m", "remote_payload.probes._race_child", "--mode", mode,
            "--threads", str(cfg.threads), "--device", cfg.device,
            "--backward" if cfg.backward else "--no-backward",
            "--watchdog-s", f"{cfg.watchdog_s:.1f}", "--dump-file", dump_path,
            "--kill-after-s", f"{cfg.timeout_s + 10:.0f}"]
    if cfg.simulate:
        argv += ["--simulate", cfg.simulate]
    env = dict(os.environ)
    env.update(
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (_PAYLOAD_ROOT, env.get("PYTHONPATH")) if p),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(mdir, "inductor-cache"),
        TRITON_CACHE_DIR=os.path.join(mdir, "triton-cache"),
        TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
    )
    run = ChildRun(mode, argv)
    raw.write(f"\n===== mode {mode}: {' '.join(argv)}\n----- stdout")
    t0 = time.monotonic()
    with open(err_path, "wb") as err_f:
        try:  # a session of its own, so inductor's compile workers are ended with it
            child = procgroup.Group(argv, env=env, cwd=mdir, stderr=err_f.fileno())
        except OSError as exc:
            run.rc, run.start_error = 127, f"cannot start {cfg.python}: {exc}"
            raw.write(run.start_error)
            return run

        def line(text: str) -> None:
            run.stdout.append(text)
            raw.write(text)
            ev = wire.parse_event(text)
            if ev is None:
                print(f"  {text}", flush=True)
            elif ev.get("event") == EVENT_RESULT:
                run.result = ev

        # also on SIGTERM/Ctrl-C of this parent the whole tree is ended: never a hung child
        try:
            run.rc = child.stream(cfg.timeout_s, line, grace=0)
        except procgroup.ChildTimeout as exc:
            run.timed_out, run.rc = True, exc.finished.rc
            say(f"{mode}: no result after {cfg.timeout_s:.0f} s, its processes were killed")
    run.wall_s = round(time.monotonic() - t0, 3)
    run.stderr = _read(err_path)
    run.dump = _read(dump_path)
    raw.write(f"----- stderr\n{run.stderr}")
    raw.write(f"----- watchdog dump ({dump_path})\n{run.dump}")
    raw.write(f"----- exit: rc={run.rc} signal={signal_name(run.rc)} "
              f"timed_out={run.timed_out} wall_s={run.wall_s}")
    return run


def _temp_raw_path() -> str:
    fd, path = tempfile.mkstemp(prefix="compile-race-", suffix=".log")
    os.close(fd)
    return path


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def mode_report(run: ChildRun) -> dict[str, t.Any]:
    """Classify one child run as ok | error | hang | crashed, with the evidence."""
    res = dict(run.result or {})
    res.pop("event", None)
    names = res.pop("thread_names", None) or {}
    status = res.get("status")
    if status not in ("ok", "error", "hang", "crashed"):
        status = "hang" if run.timed_out else "crashed"
    rep: dict[str, t.Any] = {
        "mode": run.mode,
        "status": status,
        "elapsed_s": res.get("elapsed_s"),
        "wall_s": run.wall_s,
        "rc": run.rc,
        "signal": signal_name(run.rc),
        "killed_at_timeout": run.timed_out,
        "threads": res.get("threads", []),
        "errors": res.get("errors", []),
        "error": res.get("error"),
        "fx_tracing_flag": res.get("fx_tracing_flag"),
        "fx_flag_kind": res.get("fx_flag_kind"),
        "device": res.get("device"),
        "backward": res.get("backward"),
        "backward_note": res.get("backward_note"),
        "shape": res.get("shape"),
        "setup_s": res.get("setup_s"),
        # "compile" once the threads were released: a crash there is a finding, not a setup bug
        "phase": "compile" if any(RELEASE_LINE in ln for ln in run.stdout) else "setup",
        "stderr_tail": tail(run.stderr),
        "hang_stacks": [],
    }
    if run.result is None:
        rep["error"] = rep["error"] or run.start_error or _no_result_reason(run)
    if status == "hang":
        if rep["elapsed_s"] is None:
            rep["elapsed_s"] = run.wall_s
        dumps = stackdump.parse_dump(run.dump)
        if dumps:
            rep["hang_stacks"] = stackdump.summarize(dumps[0], names=names,
                                                     prefer=("_race_child.py",))
    return rep


def _no_result_reason(run: ChildRun) -> str:
    if run.timed_out:
        return f"no result before the {run.wall_s:.0f} s timeout; killed"
    sig = signal_name(run.rc)
    if sig:
        return f"child died by {sig} before reporting"
    return f"child exited with code {run.rc} before reporting"


def run_probe(cfg: ProbeConfig) -> dict[str, t.Any]:
    """Run every mode and build the report; child failures become report fields."""
    started = time.time()
    raw_path = cfg.raw_output or _temp_raw_path()
    raw = RawLog(raw_path)
    say(f"raw output: {raw_path}")
    raw.write(f"# opsctl {PROBE_NAME} probe, {time.strftime('%Y-%m-%d %H:%M:%S')} "
              f"on {socket.gethostname()}\n# config: {json.dumps(dataclasses.asdict(cfg))}")
    workdir = tempfile.mkdtemp(prefix="opsctl-probe-")
    modes: dict[str, dict[str, t.Any]] = {}
    env: dict[str, t.Any] = {}
    try:
        for mode in cfg.modes:
            say(f"mode {mode}: {cfg.threads} threads, timeout {cfg.timeout_s:.0f} s, "
                f"cold cache in {workdir}/{mode}")
            run = run_child(cfg, mode, workdir, raw)
            modes[mode] = mode_report(run)
            if run.result and run.result.get("env"):
                env = env or dict(run.result["env"])
            m = modes[mode]
            say(f"mode {mode}: {m['status']}"
                + (f" in {m['elapsed_s']:.1f} s" if m.get("elapsed_s") is not None else "")
                + (f" ({m['error']})" if m.get("error") and m["status"] != "ok" else ""))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    env.setdefault("python", platform.python_version())
    env.setdefault("python_executable", cfg.python)
    env["hostname"] = socket.gethostname()
    report = race_report.build(modes=modes, env=env, threads=cfg.threads,
                               backward_requested=cfg.backward)
    report.update(
        probe=PROBE_NAME,
        version=REPORT_VERSION,
        config={"threads": cfg.threads, "timeout_s": cfg.timeout_s, "backward": cfg.backward,
                "device": cfg.device, "modes": list(cfg.modes), "simulate": cfg.simulate,
                "watchdog_s": cfg.watchdog_s},
        raw_output=raw_path,
        started_at=started,
        wall_s=round(time.time() - started, 3),
    )
    raw.write(f"\n===== report\n{json.dumps(report, indent=1)}")
    raw.close()
    return report


def crashed_report(error: str, *, raw_output: str | None = None,
                   detail: str = "") -> dict[str, t.Any]:
    """The report when the probe itself failed: never print nothing."""
    return {
        "probe": PROBE_NAME, "version": REPORT_VERSION, "status": "crashed", "affected": None,
        "verdict": f"The probe did not finish, so nothing is known about the build: {error}",
        "error": error, "detail": detail[-4000:], "modes": {}, "env": {
            "python": platform.python_version(), "hostname": socket.gethostname()},
        "raw_output": raw_output,
    }


def parse_args(argv: list[str] | None) -> ProbeConfig:
    p = argparse.ArgumentParser(prog="python -m remote_payload.probes.compile_race",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=3, help="threads per mode (default 3)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds per mode before the child is killed (default 120)")
    p.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the first backward (GPU only; skipped on CPU)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--raw-output", default=None, help="file for the full raw output")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"comma-separated, from {','.join(ALL_MODES)} (default "
                        f"{','.join(MODES)}); warm-*: thread 0 loops warm compiled calls while "
                        "the others compile under the lock")
    p.add_argument("--simulate", choices=SIMULATIONS,
                   default=os.environ.get("OPSCTL_PROBE_SIMULATE") or None,
                   help="test only: make every child hang / crash / raise deterministically")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for the children (default: this one)")
    a = p.parse_args(argv)
    modes = tuple(m.strip() for m in a.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in ALL_MODES]
    if bad or not modes:
        p.error(f"--modes: unknown {bad}; choose from {','.join(ALL_MODES)}")
    if a.threads < 1 or (a.threads < 2 and any(m in WARM_MODES for m in modes)):
        p.error("--threads must be >= 1 (>= 2 for the warm-* modes)")
    if a.timeout <= 1:
        p.error("--timeout must be > 1 s")
    return ProbeConfig(threads=a.threads, timeout_s=a.timeout, backward=a.backward,
                       device=a.device, modes=modes, raw_output=a.raw_output,
                       simulate=a.simulate, python=a.python)


class Terminated(BaseException):
    """SIGTERM (e.g. a deadline above us): stop, kill the child, still print a report."""


def _on_sigterm(signum: int, frame: t.Any) -> None:
    # once: a second SIGTERM (the group's, or a deadline's repeat) would interrupt the
    # report being written; the sender's SIGKILL after its grace still ends a stuck probe
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated(f"received {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.raw_output is None:  # decided here so even a crashed report can name it
        cfg = dataclasses.replace(cfg, raw_output=_temp_raw_path())
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        report = run_probe(cfg)
    except BaseException as exc:  # includes KeyboardInterrupt: still say something
        report = crashed_report(f"{type(exc).__name__}: {exc}", raw_output=cfg.raw_output,
                                detail=traceback.format_exc())
    say(f"verdict: {report['verdict']}")
    if report.get("raw_output"):
        say(f"raw output: {report['raw_output']}")
    sys.stdout.write(wire.format_event(EVENT_REPORT, **report) + "\n")
    sys.stdout.flush()
    return 0 if report.get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
