"""Per-build compile caches: ``cache/<fingerprint>/{inductor,triton}``, provenance, info, clear.

A cache written by one torch build silently hid a race under another (docs/troubleshooting.md, "Never
silent: probe, stacks, diagnosis"), so each fingerprint gets its own directory, jobs are
pointed at it explicitly, and caches outside opsctl (torch's defaults) are reported as a risk.
"""

from __future__ import annotations

import contextlib
import getpass
import glob
import os
import shutil
import socket
import tempfile
import time
import typing as t

from remote_payload import wire
from remote_payload.agent.common import AgentFailure, read_json, write_json_atomic
from remote_payload.agent.torchenv.fingerprint import build_facts, fingerprint_of
from remote_payload.agent.torchenv.jobguard import refuse_if_job_running
from remote_payload.agent.torchenv.layout import Layout, current_build, dir_usage, locked
from remote_payload.wire import ErrorType

if t.TYPE_CHECKING:  # the reply shapes: checked by mypy, never imported at run time
    from remote_payload.wire_shapes import (
        CacheClearDoc,
        CacheInfoDoc,
        CacheRowDoc,
        OutsideCacheDoc,
        RemovedCacheDoc,
    )

PROVENANCE = "provenance.json"
LAST_USED = ".last_used"
MEGA_CACHE = "mega-cache.bin"

# Env var names a job gets (docs/contracts.md, "Torch builds and caches").
ENV_INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"
ENV_TRITON = "TRITON_CACHE_DIR"
ENV_BUILD = "OPSCTL_TORCH_BUILD"
ENV_FINGERPRINT = "OPSCTL_CACHE_FINGERPRINT"
ENV_CACHE_DIR = wire.ENV_CACHE_DIR
ENV_ARTIFACTS = wire.ENV_ARTIFACTS


def cache_paths(layout: Layout, fingerprint: str) -> dict[str, str]:
    base = os.path.join(layout.cache, fingerprint)
    return {"dir": base, "inductor": os.path.join(base, "inductor"),
            "triton": os.path.join(base, "triton"), "mega_cache": os.path.join(base, MEGA_CACHE),
            "provenance": os.path.join(base, PROVENANCE)}


def ensure_cache_dir(layout: Layout, fingerprint: str, facts: t.Mapping[str, t.Any], build: str,
                     made_by: str) -> dict[str, str]:
    """Create the fingerprint's directories; write ``provenance.json`` on first use only."""
    paths = cache_paths(layout, fingerprint)
    os.makedirs(paths["inductor"], exist_ok=True)
    os.makedirs(paths["triton"], exist_ok=True)
    if not os.path.exists(paths["provenance"]):
        write_json_atomic(paths["provenance"], {
            "fingerprint": fingerprint, "facts": dict(facts), "build": build,
            "created_at": time.time(), "created_by": made_by, "host": socket.gethostname(),
        })
    return paths


def current_fingerprint(layout: Layout) -> tuple[str, str, dict[str, t.Any]] | None:
    """(build, fingerprint, facts) of the current build, or None when there is none."""
    build = current_build(layout)
    if build is None:
        return None
    facts = build_facts(layout.build_dir(build))
    return build, fingerprint_of(facts), facts


def job_env(root: str, made_by: str = "job") -> dict[str, str]:
    """Env vars the launch path adds to a job; ``{}`` when no torch build is installed.

    Also creates the cache directories and marks them used now (for ``cache-info``).
    """
    layout = Layout(root)
    cur = current_fingerprint(layout)
    if cur is None:
        return {}
    build, fp, facts = cur
    paths = ensure_cache_dir(layout, fp, facts, build, made_by)
    touch_last_used(paths["dir"])
    return {ENV_INDUCTOR: paths["inductor"], ENV_TRITON: paths["triton"], ENV_BUILD: build,
            ENV_FINGERPRINT: fp, ENV_CACHE_DIR: paths["dir"], ENV_ARTIFACTS: paths["mega_cache"]}


def touch_last_used(cache_dir: str) -> None:
    path = os.path.join(cache_dir, LAST_USED)
    with open(path, "a", encoding="utf-8"):
        pass
    os.utime(path)


def outside_candidates() -> list[tuple[str, str]]:
    """Torch/Triton default cache locations a job without opsctl's env vars would use."""
    user = getpass.getuser()
    home = os.path.expanduser("~")
    tmp = tempfile.gettempdir()
    out = [(p, "torch inductor default cache (TORCHINDUCTOR_CACHE_DIR unset)")
           for p in sorted(glob.glob(os.path.join(tmp, "torchinductor_*")))]
    default_inductor = os.path.join(tmp, f"torchinductor_{user}")
    if all(p != default_inductor for p, _ in out):
        out.append((default_inductor, "torch inductor default cache (TORCHINDUCTOR_CACHE_DIR unset)"))
    out.append((os.path.join(home, ".triton", "cache"), "triton default cache (TRITON_CACHE_DIR unset)"))
    out.append((os.path.join(home, ".cache", "torch"), "torch user cache (kernels, AOT artifacts)"))
    return out


def cache_info(layout: Layout, outside: t.Sequence[tuple[str, str]] | None = None
               ) -> CacheInfoDoc:
    """Per fingerprint: size, files, created, last used, current or stale; outside caches."""
    warnings: list[str] = []
    try:
        cur = current_fingerprint(layout)
    except AgentFailure as exc:  # a broken build must not hide the caches
        cur = None
        warnings.append(f"cannot fingerprint the current build: {exc.message}")
    current_fp = cur[1] if cur else None
    caches: list[CacheRowDoc] = []
    names = sorted(os.listdir(layout.cache)) if os.path.isdir(layout.cache) else []
    for name in names:
        path = os.path.join(layout.cache, name)
        if name.startswith(".") or not os.path.isdir(path):
            continue
        size, files = dir_usage(path)
        prov = read_json(os.path.join(path, PROVENANCE), default={}) or {}
        last_used = None
        with contextlib.suppress(OSError):
            last_used = os.stat(os.path.join(path, LAST_USED)).st_mtime
        mega = os.path.join(path, MEGA_CACHE)
        caches.append({
            "fingerprint": name, "path": path, "size_bytes": size, "files": files,
            "created_at": prov.get("created_at"), "created_by": prov.get("created_by"),
            "build": prov.get("build"), "last_used_at": last_used,
            "current": name == current_fp, "status": "current" if name == current_fp else "stale",
            "mega_cache": mega if os.path.exists(mega) else None, "seed": prov.get("seed"),
        })
    outside_found: list[OutsideCacheDoc] = []
    for path, why in (outside_candidates() if outside is None else outside):
        if not os.path.exists(path):
            continue
        size, files = dir_usage(path)
        outside_found.append({"path": path, "size_bytes": size, "files": files, "why": why})
        warnings.append(f"{path} ({files} files, {size / 1e6:.1f} MB): {why}; a job run without "
                        "opsctl's cache env vars reuses it across torch builds and can hide bugs")
    return {"root": layout.root, "current_fingerprint": current_fp,
            "current_build": cur[0] if cur else None, "caches": caches,
            "outside": outside_found, "warnings": warnings}


def remove_tree(path: str) -> None:
    """Rename first so a half-deleted tree is never visible under its real name."""
    trash = os.path.join(os.path.dirname(path), f".trash-{os.path.basename(path)}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def cache_clear(layout: Layout, *, clear_all: bool = False, fingerprint: str | None = None
                ) -> CacheClearDoc:
    """Remove the current build's cache (default), one fingerprint's, or every cache.

    Raises
    ------
    AgentFailure
        ``JobRunning`` while a job runs; ``NoCurrentBuild`` when there is nothing to pick.
    """
    refuse_if_job_running(layout, "clear compile caches")
    with locked(layout):
        if clear_all:
            names = [n for n in (os.listdir(layout.cache) if os.path.isdir(layout.cache) else [])
                     if not n.startswith(".") and os.path.isdir(os.path.join(layout.cache, n))]
        elif fingerprint:
            names = [fingerprint]
        else:
            cur = current_fingerprint(layout)
            if cur is None:
                raise AgentFailure(ErrorType.NoCurrentBuild, "no current torch build, so no current cache;"
                                   " use --all", hint="opsctl cache clear --all")
            names = [cur[1]]
        removed: list[RemovedCacheDoc] = []
        for name in sorted(names):
            path = os.path.join(layout.cache, name)
            if os.path.basename(path) != name or not os.path.isdir(path):
                continue
            size, files = dir_usage(path)
            remove_tree(path)
            removed.append({"fingerprint": name, "path": path, "size_bytes": size, "files": files})
    return {"removed": removed, "freed_bytes": sum(r["size_bytes"] for r in removed)}
