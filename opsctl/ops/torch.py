"""Local side of torch builds and compile caches: swap-torch, envs, cache ops, deploy's prepare step.

The work happens in the container (``remote_payload/torchenv`` through agent verbs);
this module picks the build from the builds table, prepares and streams a
wheelhouse for air-gapped builds, and turns replies into reports.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import threading
import time
import typing as t
from pathlib import Path

from opsctl.config import inventory, paths, torch_builds
from opsctl.errors import AgentError, RemoteCommandFailed
from opsctl.remote.agent_client import Agent
from opsctl.remote.transport import save_log

if t.TYPE_CHECKING:
    from opsctl.config.playbook import Playbook
    from opsctl.ops.jobs import Target

Progress = t.Callable[[str], None]
SWAP_TIMEOUT_S = 3600.0

# Runs in the container: `python3 -c LIST_SCRIPT <dir>` -> {"name": size} of the wheels there.
LIST_SCRIPT = r"""
import json, os, sys
d = sys.argv[1]
out = {}
if os.path.isdir(d):
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if n.endswith(".whl") and os.path.isfile(p):
            out[n] = os.path.getsize(p)
print(json.dumps(out))
"""

# Runs in the container: stdin is an uncompressed tar of wheels; each lands atomically in <dir>.
RECEIVE_SCRIPT = r"""
import hashlib, json, os, sys, tarfile
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
got = {}
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
    for m in tar:
        name = os.path.basename(m.name)
        if not m.isfile() or name != m.name or not name.endswith(".whl"):
            print(json.dumps({"ok": False, "error": "unexpected member %r" % m.name})); sys.exit(3)
        src = tar.extractfile(m)
        tmp = os.path.join(d, ".incoming-" + name)
        h = hashlib.sha256()
        with open(tmp, "wb") as f:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                h.update(b); f.write(b)
        os.replace(tmp, os.path.join(d, name))
        got[name] = h.hexdigest()
print(json.dumps({"ok": True, "files": got}))
"""


def builds_table(tgt: Target) -> torch_builds.BuildsTable:
    inv = inventory.load()
    return torch_builds.load_table(inv.torch_builds, tgt.host.torch_builds)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def push_wheels(agent: Agent, files: t.Sequence[Path], dest: str,
                progress: Progress | None = None) -> dict[str, t.Any]:
    """Stream the wheels the container lacks (by name and size) into ``dest``; verify sha256.

    Raises:
        RemoteCommandFailed: transfer or checksum failed (output saved).
    """
    r = agent.remote.pct_exec(agent.ctid, [agent.python, "-c", LIST_SCRIPT, dest], timeout=30,
                              step="list wheelhouse")
    try:
        have = json.loads(r.stdout or b"{}")
    except ValueError:
        have = {}
    missing = [f for f in files if have.get(f.name) != f.stat().st_size]
    total = sum(f.stat().st_size for f in missing)
    if not missing:
        return {"sent": 0, "bytes": 0, "present": len(files)}
    if progress:
        progress(f"streaming {len(missing)} wheels ({total / 1e6:.0f} MB) into the container")
    rfd, wfd = os.pipe()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(wfd, "wb") as w, tarfile.open(fileobj=w, mode="w|") as tar:
                for f in missing:
                    tar.add(str(f), arcname=f.name)
        except BaseException as exc:  # surfaced below; the reader sees EOF
            errors.append(exc)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    start = time.monotonic()
    with os.fdopen(rfd, "rb") as reader:
        res = agent.remote.pct_exec(agent.ctid, [agent.python, "-c", RECEIVE_SCRIPT, dest],
                                    timeout=1800, stdin=reader, step="push wheels")
    writer.join()
    try:
        doc = json.loads(res.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        doc = {"ok": False, "error": "no reply"}
    bad = [f.name for f in missing if doc.get("files", {}).get(f.name) != _sha256(f)]
    if res.rc != 0 or not doc.get("ok") or bad or errors:
        path = save_log("push-wheels", res)
        why = doc.get("error") or (f"checksum mismatch: {bad[:3]}" if bad else
                                   (repr(errors[0]) if errors else res.stderr_tail(1)))
        raise RemoteCommandFailed(
            f"{agent.remote.host.label} ct {agent.ctid}: wheel transfer failed: {why}",
            log_path=str(path))
    return {"sent": len(missing), "bytes": total, "present": len(files) - len(missing),
            "seconds": round(time.monotonic() - start, 2)}


def swap(tgt: Target, variant: str, *, version: str | None = None, index_url: str | None = None,
         wheelhouse: bool | None = None, requirements: t.Sequence[str] = (), dry_run: bool = False,
         reinstall: bool = False, install_only: bool = False,
         progress: Progress | None = None) -> dict[str, t.Any]:
    """Make ``variant`` the container's current torch build (install if needed).

    ``install_only`` installs and verifies the build without switching to it; the agent
    allows that while a job runs, since the running job's build is not touched.

    Raises:
        ConfigError: unknown variant (lists the known ones).
        TorchEnvError: download, install or verification failed; the old build stays current.
    """
    build = builds_table(tgt).resolve(variant, version=version, index_url=index_url,
                                      wheelhouse=wheelhouse)
    report: dict[str, t.Any] = {"build": build.name, "pin": build.pin}
    tgt.agent.ensure_payload()
    envs = tgt.agent.call("envs", timeout=60)
    installed = {b["name"] for b in envs.get("builds", [])}
    wheel_dir = None
    if build.wheelhouse and (build.name not in installed or reinstall) and not dry_run:
        dest = paths.home() / "wheelhouse" / build.name
        if progress:
            progress(f"downloading {build.requirement} and its dependencies on this machine")
        wh = torch_builds.prepare_wheelhouse(build, dest, requirements=requirements,
                                             on_line=_pip_progress(progress))
        wheel_dir = torch_builds.remote_wheelhouse_dir(tgt.host.root, build)
        report["wheelhouse"] = {"files": len(wh.files), "bytes": wh.total_bytes,
                                "download_s": wh.seconds, "log_path": str(wh.log_path),
                                **push_wheels(tgt.agent, wh.files, wheel_dir, progress)}
    elif build.wheelhouse:
        wheel_dir = torch_builds.remote_wheelhouse_dir(tgt.host.root, build)
    args = torch_builds.swap_args(build, wheelhouse_dir=wheel_dir, requirements=requirements,
                                  reinstall=reinstall, dry_run=dry_run, install_only=install_only)
    if progress:
        action = "switching to" if build.name in installed and not reinstall else "installing"
        progress(f"{action} {build.name} in the container" +
                 ("" if build.name in installed else " (pip + verify: minutes)"))
    report.update(tgt.agent.call("swap", *args, timeout=SWAP_TIMEOUT_S,
                                 on_stderr=_line_progress(progress)))
    return report


def _pip_progress(progress: Progress | None) -> t.Callable[[str], None] | None:
    if progress is None:
        return None

    def on_line(line: str) -> None:
        if line.startswith(("Collecting", "Saved", "Downloading", "File was already")):
            progress(line.strip()[:120])

    return on_line


def _line_progress(progress: Progress | None) -> t.Callable[[bytes], None] | None:
    if progress is None:
        return None
    buf = bytearray()

    def on_stderr(chunk: bytes) -> None:
        buf.extend(chunk)
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            text = line.decode("utf-8", "replace").strip()
            if text:
                progress(text[:120])

    return on_stderr


def envs(tgt: Target, history: int) -> dict[str, t.Any]:
    """The container's torch builds and the last ``history`` swaps (payload shipped first)."""
    tgt.agent.ensure_payload()
    return dict(tgt.agent.call("envs", "--history", str(history), timeout=60))


def cache_info(tgt: Target) -> dict[str, t.Any]:
    tgt.agent.ensure_payload()
    return dict(tgt.agent.call("cache-info", timeout=120))


def cache_clear(tgt: Target, *, clear_all: bool) -> dict[str, t.Any]:
    tgt.agent.ensure_payload()
    return dict(tgt.agent.call("cache-clear", *(["--all"] if clear_all else []), timeout=300))


def seed_cache(tgt: Target, book: Playbook, timeout_s: float,
               progress: Progress | None = None) -> dict[str, t.Any]:
    """``opsctl cache seed``: the current payload, then :func:`cache_seed`."""
    tgt.agent.ensure_payload()
    if progress:
        progress("compiling every shape bucket cold, then again from the seeded cache…")
    return cache_seed(tgt, book, timeout_s)


def cache_seed(tgt: Target, book: Playbook, timeout_s: float = 1800.0) -> dict[str, t.Any]:
    """Warm the current build's cache with ``book``'s exact shapes; proves reuse by hit counters."""
    args = ["--command-json", json.dumps(book.command), "--env-json", json.dumps(book.env),
            "--timeout", f"{timeout_s:g}"]
    if book.workdir:
        args += ["--workdir", book.workdir]
    return dict(tgt.agent.call("cache-seed", *args, timeout=timeout_s * 2 + 60))


def prepare_needed(book: Playbook) -> bool:
    """Whether :func:`prepare` has remote work for ``book`` (keep in step with it).

    Without it, deploy takes its one-round-trip path (launch checks the payload digest).
    """
    return book.torch is not None or book.cache in ("clear", "seed")


def prepare(tgt: Target, book: Playbook, steps: list[dict[str, t.Any]],
            progress: Progress | None = None, replace: bool = False) -> dict[str, t.Any]:
    """Deploy's step before launch: the playbook's torch build current, its cache policy applied.

    Idempotent: a build that is already current is not touched, and ``cache: seed`` does
    nothing when the current build's cache already holds a mega-cache. A running job blocks
    a build switch or a cache change; with ``replace`` it is stopped first (only then).
    Returns launch overrides (none needed: the agent's launch uses ``envs/current``'s python
    and the build's cache env by itself).
    """
    if book.torch is not None:
        t0 = time.monotonic()
        want = builds_table(tgt).resolve(book.torch.variant, version=book.torch.version).name
        current = tgt.agent.call("envs", "--history", "0", timeout=60).get("current")
        if current == want:
            steps.append({"step": "torch", "build": want, "action": "noop", "seconds": 0.0})
        else:
            spec = book.torch

            def do_swap(install_only: bool = False) -> dict[str, t.Any]:
                return swap(tgt, spec.variant, version=spec.version, requirements=book.requirements,
                            install_only=install_only, progress=progress)

            # with a job running, the new build is installed and verified *before* the job is
            # stopped: a failed download or verification leaves the job running (nothing lost)
            rep = _unless_running(tgt, replace, progress, do_swap,
                                  before_stop=lambda: do_swap(install_only=True))
            steps.append({"step": "torch", "build": rep["build"], "action": rep.get("action"),
                          "seconds": round(time.monotonic() - t0, 2)})
    if book.cache == "clear":
        rep2 = _unless_running(tgt, replace, progress,
                               lambda: tgt.agent.call("cache-clear", timeout=120))
        steps.append({"step": "cache-clear", "freed_bytes": rep2.get("freed_bytes")})
    elif book.cache == "seed":
        info = tgt.agent.call("cache-info", timeout=120)
        if any(c.get("current") and c.get("mega_cache") for c in info.get("caches", [])):
            steps.append({"step": "cache-seed", "action": "already seeded"})
        else:
            try:
                rep3 = _unless_running(tgt, replace, progress, lambda: cache_seed(tgt, book))
            except AgentError as exc:
                if exc.remote_type == "JobRunning":
                    raise
                # seeding only saves compile time: the job still launches (and compiles cold)
                steps.append({"step": "cache-seed", "error": exc.message, "log_path": exc.log_path})
                if progress:
                    progress(f"cache seed failed, launching with a cold cache: {exc.message}")
            else:
                steps.append({"step": "cache-seed", "speedup": rep3.get("speedup"),
                              "reuse_proven": rep3.get("reuse_proven")})
    return {}


R = t.TypeVar("R")


def _unless_running(tgt: Target, replace: bool, progress: Progress | None,
                    action: t.Callable[[], R], before_stop: t.Callable[[], t.Any] | None = None) -> R:
    """Run ``action``; if a running job blocks it and ``replace`` was asked, stop that job once.

    ``before_stop`` runs first (while the job still runs): whatever can fail without the
    job's help fails before the job is stopped.

    Raises:
        AgentError: ``JobRunning`` without ``replace`` (with a hint), or the action's own error.
    """
    try:
        return action()
    except AgentError as exc:
        if exc.remote_type != "JobRunning":
            raise
        job = exc.fields.get("job_id")
        if not replace:
            exc.hint = (f"job {job} is running: `opsctl stop` it, or deploy with --replace "
                        "(it is stopped only if the torch build or cache must change)")
            raise
    if before_stop is not None:
        before_stop()
    if progress:
        progress(f"stopping job {job} (--replace) before changing the torch build/cache")
    tgt.agent.call("stop", "--job", str(job), "--grace", "30", timeout=90)
    return action()
