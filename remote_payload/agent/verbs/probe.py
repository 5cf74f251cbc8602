"""``probe``: run the compile-race probe with the container's torch build and return its report.

The probe runs as its own process (never imported here: the agent does not
import torch) under a total deadline. Whatever happens, the verb answers a
report dict: the probe's own ``probe_report`` event, or, when the probe died or
printed none, a ``status: "crashed"`` report with its exit code or signal and
the tail of its output. Raw output lands in ``<root>/probes/<timestamp>/raw.log``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import typing as t

from remote_payload import procgroup, wire
from remote_payload.probes.compile_race import signal_name, tail  # stdlib-only module

PROBE_MODULE = "remote_payload.probes.compile_race"
MODES = ("unguarded", "guarded")
TAIL_LINES = 30
TERM_GRACE_S = 10.0
#: the probe prints its report last, after every mode's log: keep all of a probe's output
PROBE_OUTPUT_BYTES = 64 << 20
_PAYLOAD_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def add_arguments(verb: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--python", default=None,
                   help="interpreter with torch (default <root>/envs/current/bin/python, "
                        "else python3)")
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per mode")
    p.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--deadline", type=float, default=None,
                   help="total seconds for the probe process (default: per-mode timeouts + 60)")
    p.add_argument("--simulate", default=None, help=argparse.SUPPRESS)  # tests only


def default_python(root: str) -> str:
    env_python = os.path.join(root, "envs", "current", "bin", "python")
    if os.path.exists(env_python):
        return env_python
    return shutil.which("python3") or "python3"


def run(verb: str, args: argparse.Namespace) -> dict[str, t.Any]:
    python = args.python or default_python(args.root)
    modes = [m for m in args.modes.split(",") if m.strip()]
    deadline = args.deadline or len(modes) * (args.timeout + 15.0) + 60.0
    outdir = os.path.join(args.root, "probes",
                          time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    os.makedirs(outdir, exist_ok=True)
    raw = os.path.join(outdir, "raw.log")
    argv = [python, "-u", "-m", PROBE_MODULE, "--threads", str(args.threads),
            "--timeout", f"{args.timeout:g}", "--device", args.device,
            "--backward" if args.backward else "--no-backward",
            "--modes", ",".join(modes), "--raw-output", raw, "--python", python]
    if args.simulate:
        argv += ["--simulate", args.simulate]
    return run_probe_process(argv, deadline=deadline, outdir=outdir, raw=raw)


def run_probe_process(argv: list[str], *, deadline: float, outdir: str,
                      raw: str) -> dict[str, t.Any]:
    """Run the probe under ``deadline`` seconds; always return a report dict."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PAYLOAD_ROOT, env.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    timed_out = False
    try:
        child = procgroup.Group(argv, env=env, cwd=outdir)
    except OSError as exc:
        return {**crashed(f"cannot start the probe with {argv[0]}: {exc}", argv=argv, rc=None,
                          raw=raw, wall_s=0.0), "deadline_hit": False}
    # At the deadline SIGTERM first: the probe then kills its mode child and still prints
    # a report; what the probe left behind is ended with it (procgroup).
    try:
        done = child.result(deadline, PROBE_OUTPUT_BYTES, grace=TERM_GRACE_S)
    except procgroup.ChildTimeout as exc:
        timed_out, done = True, exc.finished
    out_b, err_b, returncode = done.out, done.err, done.rc
    wall = round(time.monotonic() - t0, 3)
    out = out_b.decode("utf-8", "replace")
    err = err_b.decode("utf-8", "replace")
    with open(os.path.join(outdir, "probe-output.log"), "w", encoding="utf-8") as f:
        f.write(f"$ {' '.join(argv)}\n----- stdout\n{out}\n----- stderr\n{err}\n"
                f"----- rc={returncode} timed_out={timed_out} wall_s={wall}\n")

    report = None
    for line in out.splitlines():
        ev = wire.parse_event(line)
        if ev is not None and ev.get("event") == wire.EVENT_PROBE_REPORT:
            report = ev
    if report is None:
        why = (f"the probe printed no report before the {deadline:g} s deadline (killed)"
               if timed_out else "the probe exited without printing a report")
        return {**crashed(why, argv=argv, rc=returncode, raw=raw, wall_s=wall,
                          stdout=out, stderr=err), "deadline_hit": timed_out}
    report.pop("event", None)
    report["deadline_hit"] = timed_out  # then it is the probe's crashed report after SIGTERM
    report.setdefault("raw_output", raw)
    report["probe_rc"] = returncode
    report["probe_output"] = os.path.join(outdir, "probe-output.log")
    return report


def crashed(why: str, *, argv: list[str], rc: int | None, raw: str, wall_s: float,
            stdout: str = "", stderr: str = "") -> dict[str, t.Any]:
    sig = signal_name(rc)
    how = f"killed by {sig}" if sig else (f"exit code {rc}" if rc is not None else "not started")
    return {
        "probe": "compile-race",
        "status": "crashed",
        "affected": None,
        "verdict": f"The probe process failed: {why} ({how}). Nothing was learned about the "
                   "build; see stderr_tail and the raw output.",
        "error": why,
        "rc": rc,
        "signal": sig,
        "stderr_tail": _tail(stderr),
        "stdout_tail": _tail(stdout),
        "argv": argv,
        "modes": {},
        "env": {},
        "raw_output": raw if os.path.exists(raw) else None,
        "wall_s": wall_s,
    }


def _tail(text: str) -> list[str]:
    return tail(text, TAIL_LINES)
