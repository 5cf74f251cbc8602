"""``cache seed``: warm the current build's cache for a job and prove the artifact is reused.

Runs the job's warm-up entry point twice in single processes, each with an EMPTY
inductor/triton cache: cold (saving mega-cache artifacts), then seeded (loading them).
Only hit counters reported by the seeded run prove reuse; a load that succeeds but is
never hit proves nothing, so then the artifact is not installed.
"""

from __future__ import annotations

import os
import shutil
import time
import typing as t

from remote_payload import wire
from remote_payload.agent.common import AgentFailure, read_json, write_json_atomic
from remote_payload.agent.torchenv.caches import (
    ENV_BUILD,
    ENV_CACHE_DIR,
    ENV_FINGERPRINT,
    ENV_INDUCTOR,
    ENV_TRITON,
    MEGA_CACHE,
    PROVENANCE,
    current_fingerprint,
    ensure_cache_dir,
)
from remote_payload.agent.torchenv.jobguard import refuse_if_job_running
from remote_payload.agent.torchenv.layout import Layout, current_python, locked
from remote_payload.agent.torchenv.procs import clean_env, run_logged
from remote_payload.wire import ErrorType

WARMUP_FLAGS = ("--warmup-only",)
SAVE_FLAG = "--save-cache-artifacts"
LOAD_FLAG = "--load-cache-artifacts"
_COUNTER_EVENTS = frozenset({"compile", "cache", "cache_stats", "compile_stats", "warmup"})


def with_python(command: t.Sequence[str], python: str) -> list[str]:
    """Substitute the build's python for a leading ``python``/``python3`` (launch does the same)."""
    argv = list(command)
    if argv and os.path.basename(argv[0]).startswith("python"):
        argv[0] = python
    return argv


def summarize_events(events: t.Sequence[t.Mapping[str, t.Any]]) -> dict[str, t.Any]:
    """Compile seconds and cache hit/miss counters from a run's events.

    Counters are numeric fields whose name contains ``hit`` or ``miss``, top level or in a
    ``counters``/``cache`` dict, of ``compile``/``cache``/``cache_stats``/``compile_stats``/``warmup``
    events; the last value per name wins (counters are cumulative in a process).
    """
    counters: dict[str, float] = {}
    compile_s = 0.0
    compile_total: float | None = None
    for ev in events:
        if ev.get("event") not in _COUNTER_EVENTS:
            continue
        fields = dict(ev)
        for nested in ("counters", "cache"):  # the trainer nests them under "cache"
            if isinstance(ev.get(nested), dict):
                fields.update(ev[nested])
        for k, v in fields.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and ("hit" in k or "miss" in k):
                counters[k] = v
        if ev.get("event") == wire.EVENT_COMPILE and isinstance(ev.get("seconds"), int | float):
            compile_s += float(ev["seconds"])
        for key in ("compile_s", "compile_seconds"):
            if isinstance(ev.get(key), int | float):
                compile_total = float(ev[key])
    hits = sum(v for k, v in counters.items() if "hit" in k)
    return {"compile_seconds": compile_total if compile_total is not None else
            (round(compile_s, 3) if compile_s else None),
            "counters": counters, "hits": hits}


def _run(layout: Layout, name: str, argv: list[str], scratch: str, env_extra: dict[str, str],
         build: str, fp: str, workdir: str, log_path: str, timeout_s: float, cache_dir: str
         ) -> dict[str, t.Any]:
    """One warm-up run on empty compile caches of its own (under ``scratch``).

    ``OPSCTL_CACHE_DIR`` is the build's cache folder, as in a job: the trainer keeps the
    Python bytecode of a torch env that cannot keep its own there (``pycache/``), so the
    first job after a seed does not compile torch's modules from source again (7 s of a
    seeded start on an H200, 2026-12-02). Bytecode is not compiled code of the job's graphs,
    so the runs stay cold where it matters."""
    caches = os.path.join(scratch, name)
    env = clean_env(**env_extra)
    env.update({ENV_INDUCTOR: os.path.join(caches, "inductor"),
                ENV_TRITON: os.path.join(caches, "triton"), ENV_BUILD: build,
                ENV_FINGERPRINT: fp, ENV_CACHE_DIR: cache_dir, "PYTHONUNBUFFERED": "1",
                "TMPDIR": scratch})
    env.setdefault("PYTHONPATH", layout.payload)
    os.makedirs(env[ENV_INDUCTOR])
    os.makedirs(env[ENV_TRITON])
    t0 = time.monotonic()
    rc, out = run_logged(argv, log_path=log_path, env=env, label=f"seed-{name}", cwd=workdir,
                         timeout_s=timeout_s)
    wall = time.monotonic() - t0
    events = [ev for ev in map(wire.parse_event, out.splitlines()) if ev is not None]
    summary = summarize_events(events)
    if rc != 0:
        raise AgentFailure(ErrorType.CacheSeedFailed, f"{name} warm-up run exited {rc}; see {log_path}",
                           step=f"{name}-run", rc=rc, log_path=log_path, output_tail=out[-2000:])
    return {"wall_seconds": round(wall, 2), **summary,
            "compile_seconds_source": "events" if summary["compile_seconds"] is not None else
            "wall", "events": len(events)}


def seed(layout: Layout, command: t.Sequence[str], *, workdir: str | None = None,
         env_extra: t.Mapping[str, str] | None = None, timeout_s: float = 1800.0
         ) -> dict[str, t.Any]:
    """Seed ``cache/<fp>/mega-cache.bin`` for the current build from the job's warm-up.

    Raises
    ------
    AgentFailure
        ``JobRunning``, ``NoCurrentBuild``, ``CacheSeedFailed`` (step ``cold-run``,
        ``seeded-run``, ``save`` or ``prove-reuse``; the installed artifact is untouched).
    """
    if not command:
        raise AgentFailure(ErrorType.CacheSeedFailed, "no warm-up command given", step="args")
    refuse_if_job_running(layout, "seed the compile cache")
    cur = current_fingerprint(layout)
    python = current_python(layout.root)
    if cur is None or python is None:
        raise AgentFailure(ErrorType.NoCurrentBuild, "no current torch build to seed a cache for",
                           hint="opsctl swap-torch <variant>")
    build, fp, facts = cur
    with locked(layout):
        paths = ensure_cache_dir(layout, fp, facts, build, made_by="cache-seed")
        scratch = os.path.join(layout.cache, f".seed-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
        log_path = layout.new_log("seed", build)
        wd = workdir or (layout.payload if os.path.isdir(layout.payload) else layout.root)
        extra = dict(env_extra or {})
        base = with_python(command, python)
        artifact = os.path.join(scratch, MEGA_CACHE)
        try:
            cold = _run(layout, "cold", [*base, *WARMUP_FLAGS, SAVE_FLAG, artifact], scratch,
                        extra, build, fp, wd, log_path, timeout_s, paths["dir"])
            if not os.path.isfile(artifact) or os.path.getsize(artifact) == 0:
                raise AgentFailure(ErrorType.CacheSeedFailed, f"the cold run saved no artifact at "
                                   f"{artifact}; see {log_path}", step="save", log_path=log_path)
            seeded = _run(layout, "seeded", [*base, *WARMUP_FLAGS, LOAD_FLAG, artifact], scratch,
                          extra, build, fp, wd, log_path, timeout_s, paths["dir"])
            if seeded["hits"] <= 0:
                raise AgentFailure(
                    ErrorType.CacheSeedFailed, "the seeded run reported no cache hits, so the artifact "
                    f"was not reused (counters: {seeded['counters'] or 'none reported'}); "
                    f"artifact not installed; see {log_path}", step="prove-reuse",
                    log_path=log_path, cold=cold, seeded=seeded)
            size = os.path.getsize(artifact)
            os.replace(artifact, paths["mega_cache"])
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        record = {"seeded_at": time.time(), "command": base, "artifact_bytes": size,
                  "cold": cold, "seeded": seeded, "log_path": log_path}
        prov = read_json(paths["provenance"], default={}) or {}
        prov["seed"] = record
        write_json_atomic(os.path.join(paths["dir"], PROVENANCE), prov)
    speedup = None
    if cold["compile_seconds"] and seeded["compile_seconds"]:
        speedup = round(cold["compile_seconds"] / max(seeded["compile_seconds"], 1e-6), 2)
    return {"build": build, "fingerprint": fp, "artifact": paths["mega_cache"],
            "artifact_bytes": size, "cold": cold, "seeded": seeded, "speedup": speedup,
            "reuse_proven": True, "log_path": log_path}
