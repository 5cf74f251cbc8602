"""Swap the current torch build: switch to an installed one, or install, verify, then switch.

The rule that matters: until the new build has been installed AND verified in its own
venv, nothing the current build uses is touched. Any failure removes the half-made venv
and says which step failed, with the full output saved to a log file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import shutil
import stat
import sys
import time
import typing as t

from remote_payload import boundedread, procgroup, safe_write, wire
from remote_payload.agent.common import AgentFailure, write_json_atomic
from remote_payload.agent.torchenv.fingerprint import (
    INSPECT_SCRIPT,
    fingerprint_of,
    parse_inspect_output,
    store_facts,
)
from remote_payload.agent.torchenv.jobguard import refuse_if_job_running, running_job
from remote_payload.agent.torchenv.layout import (
    MARKER,
    Layout,
    append_history,
    build_name,
    check_pin,
    current_build,
    dir_usage,
    expected_cuda,
    locked,
    read_marker,
    switch_current,
)
from remote_payload.agent.torchenv.procs import clean_env, run_logged
from remote_payload.torchindex import (  # noqa: F401 (the agent's names for them)
    INDEX_SCHEMES,
    IndexView,
    missing_version_detail,
    read_index,
)
from remote_payload.wire import ErrorType


@dataclasses.dataclass(frozen=True)
class SwapRequest:
    """What the local side resolved from the builds table (the agent never reads it)."""

    version: str  # "2.11.0", no local tag
    variant: str  # "cu130" | "cu128" | "cpu"
    index_url: str | None = None  # the build's index; ignored with a wheelhouse
    wheelhouse: str | None = None  # dir of streamed wheels: --no-index --find-links
    requirements: tuple[str, ...] = ()  # the playbook's extra packages
    requirements_index_url: str | None = None  # "the normal index" for them (None: PyPI)
    reinstall: bool = False
    dry_run: bool = False
    # install + verify without switching (allowed while a job runs: it does not touch the
    # current build); a later swap of the same build is then just the symlink switch
    install_only: bool = False
    pip_retries: int = 3
    pip_timeout_s: float = 60.0  # per socket operation
    install_timeout_s: float = 3600.0
    verify_timeout_s: float = 900.0


class _StepFailed(Exception):
    def __init__(self, step: str, message: str, reason: str = "error"):
        super().__init__(message)
        self.step, self.message, self.reason = step, message, reason


def has_gpus() -> bool:
    """True when the container sees an NVIDIA GPU (then cuda must work in a CUDA build)."""
    if glob.glob("/dev/nvidia[0-9]*"):
        return True
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        done = procgroup.run([exe, "-L"], 15)
    except OSError:  # TimeoutError included: a hung nvidia-smi was ended
        return False
    return done.rc == 0 and b"GPU" in done.out


def pip_failure_reason(output: str) -> str:
    """Name the cause from pip's output, so the operator does not have to read it first."""
    text = output.lower()
    if "no space left on device" in text:
        return "disk-full"
    if any(s in text for s in ("connection refused", "failed to establish a new connection",
                               "name or service not known", "temporary failure in name resolution",
                               "read timed out", "connecttimeout", "network is unreachable")):
        return "index-unreachable"
    if "resolutionimpossible" in text:
        return "conflict"
    if "no matching distribution found" in text or "could not find a version" in text:
        return "no-such-version"
    return "pip-error"


_REASON_TEXT = {
    "disk-full": "the container's disk is full",
    "index-unreachable": "the package index is unreachable",
    "no-such-version": "the index has no such torch version",
    "conflict": "pip found conflicting requirements",
    "pip-error": "pip failed",
}


DRY_RUN_INDEX_TIMEOUT_S = 20.0  # a dry run's look at the index: never a hang


def preflight_index(index_url: str, pinned: str, timeout_s: float = 15.0) -> None:
    """Fail fast, before a venv is made, when the index is down or lacks the version.

    Raises
    ------
    _StepFailed
        step ``index``: ``index-unreachable`` or ``no-such-version``.
    """
    view = read_index(index_url, timeout_s=timeout_s)
    if view.error is not None:
        raise _StepFailed("index", f"{_REASON_TEXT['index-unreachable']}: {view.error}",
                          "index-unreachable")
    if view.versions is not None and pinned not in view.versions:
        raise _StepFailed("index", missing_version_detail(index_url, pinned, view.versions),
                          "no-such-version")


def dry_run(layout: Layout, build: str, req: SwapRequest) -> dict[str, t.Any]:
    """What a swap would do, checked as far as it can be without writing anything: no lock
    file, no directory (it once created ``envs/.lock`` while saying nothing changed). For
    an install from an index: the index answers and has the version, within a time bound.

    Raises
    ------
    AgentFailure
        ``TorchInstallFailed`` (step ``index``): the index is unreachable or lacks the version.
    """
    t0 = time.monotonic()
    previous, action = _plan(layout, build, req.reinstall, req.requirements)
    checked: list[str] = []
    marker = read_marker(layout, build)
    if marker is not None and missing_requirements(marker, req.requirements):
        checked.append(f"{build} lacks {', '.join(missing_requirements(marker, req.requirements))}"
                       ": it would be built again with them")
    if action == "install" and not req.wheelhouse and req.index_url:
        pinned = f"{req.version}+{req.variant}"
        try:
            preflight_index(str(req.index_url), pinned,
                            timeout_s=min(req.pip_timeout_s, DRY_RUN_INDEX_TIMEOUT_S))
        except _StepFailed as exc:
            raise AgentFailure(ErrorType.TorchInstallFailed,
                               f"dry run: installing {build} would fail at step {exc.step}: "
                               f"{exc.message}; nothing was changed", step=exc.step,
                               reason=exc.reason, build=build, current=previous,
                               dry_run=True) from None
        checked.append(f"the index answers and has torch {pinned}")
    job = None if req.install_only else running_job(layout)
    if job is not None:
        checked.append(f"job {job[0]} is {job[1]}: the real swap is refused until it ends")
    return {"action": action, "build": build, "previous": previous, "dry_run": True,
            "path": layout.build_dir(build), "log_path": None, "verification": None,
            "install_seconds": None, "switch_seconds": None, "current": previous,
            "checked": checked, "seconds": round(time.monotonic() - t0, 3)}


def wheelhouse_pin(wheelhouse: str, version: str, variant: str) -> str:
    """The torch version the streamed wheel really has (e.g. ``2.13.0+cpu``).

    Raises
    ------
    _StepFailed
        No torch wheel, or one whose version does not match the requested build.
    """
    found = []
    try:
        names = sorted(os.listdir(wheelhouse))
    except OSError as exc:
        raise _StepFailed("wheelhouse", f"cannot read wheelhouse {wheelhouse}: {exc}",
                          "no-such-version") from None
    for name in names:
        m = wire.TORCH_WHEEL_RE.match(name)
        if m:
            found.append(m.group(1))
    want = {f"{version}+{variant}", version}
    matching = [v for v in found if v in want]
    if not matching:
        raise _StepFailed("wheelhouse", f"no torch wheel for {version}+{variant} in {wheelhouse} "
                          f"(found: {', '.join(found) or 'none'})", "no-such-version")
    return sorted(matching, key=lambda v: "+" not in v)[0]  # prefer the exact local tag


def _plan(layout: Layout, build: str, reinstall: bool,
          requirements: t.Sequence[str] = ()) -> tuple[str | None, str]:
    """The current build, and what a swap to ``build`` does: noop, switch or install (the
    dry run and the real swap decide it by this one rule). An installed build that lacks
    some of ``requirements`` (its marker lists what it was built with) is built again
    (:func:`missing_requirements`): a playbook's new requirements are never skipped."""
    previous = current_build(layout)
    marker = read_marker(layout, build)
    if marker is not None and missing_requirements(marker, requirements):
        return previous, "install"
    if previous == build and not reinstall:
        return previous, "noop"
    if marker is not None and not reinstall:
        return previous, "switch"
    return previous, "install"


def missing_requirements(marker: t.Mapping[str, t.Any], requirements: t.Sequence[str]
                         ) -> list[str]:
    """The requirements an installed build was not built with (its marker's list, read back:
    anything but a list of strings counts as none)."""
    had = marker.get("requirements")
    have = set(had) if isinstance(had, list) and all(isinstance(r, str) for r in had) else set()
    return [r for r in requirements if r not in have]


def with_kept_requirements(layout: Layout, build: str, req: SwapRequest) -> SwapRequest:
    """``req`` for a rebuild of an installed build: its requirements are the build's own
    (from its marker) followed by the new ones, so a rebuild never drops a package an
    earlier playbook installed."""
    marker = read_marker(layout, build) or {}
    had = marker.get("requirements")
    old = [r for r in had if isinstance(r, str)] if isinstance(had, list) else []
    merged = tuple(dict.fromkeys([*old, *req.requirements]))
    return dataclasses.replace(req, requirements=merged)


def _rewrite_bin(venv: str, old: str, new: str) -> None:
    """Console scripts and activate files embed the venv path; the venv moved from ``old``."""
    bindir = os.path.join(venv, "bin")
    for name in os.listdir(bindir):
        path = os.path.join(bindir, name)
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:
            continue
        try:
            data = boundedread.read_regular(path, 1 << 20)
        except OSError:  # became a link or grew meanwhile: not a script of the venv's
            continue
        if old.encode() in data:  # rewritten whole, its mode kept (less the umask)
            safe_write.write_bytes(path, data.replace(old.encode(), new.encode()),
                                   mode=stat.S_IMODE(os.stat(path).st_mode), durable=False)


def _remove_stale_builds(layout: Layout) -> None:
    """Half-made venvs of an install that was killed (we hold the lock: none is running).

    A ``.trash-<build>-<pid>`` whose build is missing is that build, moved aside by a
    reinstall killed before the new copy took its name: it is put back, never removed."""
    for name in sorted(os.listdir(layout.envs)):
        path = os.path.join(layout.envs, name)
        if name.startswith(".trash-"):
            build = name[len(".trash-"):].rpartition("-")[0]
            if build and not os.path.lexists(layout.build_dir(build)):
                os.rename(path, layout.build_dir(build))
                continue
        if name.startswith((".building-", ".trash-")):
            shutil.rmtree(path, ignore_errors=True)


def _summary(checks: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    return "; ".join(f"{c['name']}: {c['detail']}" for c in checks if not c.get("ok"))


def swap(layout: Layout, req: SwapRequest) -> dict[str, t.Any]:
    """Make ``torch-<version>-<variant>`` the current build.

    Returns the reply of the ``swap`` verb (see docs/contracts.md).

    Raises
    ------
    AgentFailure
        ``JobRunning`` (a job uses the current build), ``TorchEnvBusy`` (another swap),
        ``TorchInstallFailed`` with ``step`` / ``reason`` / ``log_path`` (current kept).
    """
    check_pin(req.version, req.variant)
    build = build_name(req.version, req.variant)
    if not req.wheelhouse and not req.index_url:
        raise AgentFailure(ErrorType.TorchInstallFailed, "need --index-url or --wheelhouse",
                           step="args", build=build)
    if req.dry_run:
        return dry_run(layout, build, req)
    if not req.install_only:
        refuse_if_job_running(layout, f"swap torch to {build}")
    t0 = time.monotonic()
    with locked(layout):
        if not req.dry_run:
            _remove_stale_builds(layout)
        previous, action = _plan(layout, build, req.reinstall, req.requirements)
        marker = read_marker(layout, build)
        missing = missing_requirements(marker, req.requirements) if marker is not None else []
        if missing:  # built again with them (and with what it had): never skipped
            if req.install_only and build == previous:
                # the live jobs run on the current build: it is never rebuilt under them
                refuse_if_job_running(layout, f"install {', '.join(missing)} into {build}")
            req = with_kept_requirements(layout, build, req)
        reply: dict[str, t.Any] = {
            "action": action, "build": build, "previous": previous, "dry_run": req.dry_run,
            "path": layout.build_dir(build), "log_path": None, "verification": None,
            "install_seconds": None, "switch_seconds": None,
            "requirements_added": missing,
        }
        if req.dry_run or action == "noop":
            reply.update(current=previous, seconds=round(time.monotonic() - t0, 3))
            return reply
        if req.install_only:
            if action == "install":
                reply.update(_install(layout, build, req, previous))
                append_history(layout, {"time": time.time(), "from": previous, "to": build,
                                        "action": "install-only", "result": "ok",
                                        "log_path": reply["log_path"],
                                        "seconds": round(time.monotonic() - t0, 3)})
            reply.update(action="install-only" if action == "install" else "present",
                         current=previous, seconds=round(time.monotonic() - t0, 3))
            return reply
        if action == "install":
            reply.update(_install(layout, build, req, previous))
        t_switch = time.monotonic()
        switch_current(layout, build)
        reply["switch_seconds"] = round(time.monotonic() - t_switch, 4)
        reply["current"] = current_build(layout)
        reply["seconds"] = round(time.monotonic() - t0, 3)
        reply["python"] = os.path.join(layout.build_dir(build), "bin", "python")
        append_history(layout, {"time": time.time(), "from": previous, "to": build,
                                "action": action, "result": "ok", "log_path": reply["log_path"],
                                "seconds": reply["seconds"]})
    return reply


def _install(layout: Layout, build: str, req: SwapRequest, previous: str | None
             ) -> dict[str, t.Any]:
    os.makedirs(layout.envs, exist_ok=True)
    log_path = layout.new_log("install", build)
    tmp = os.path.join(layout.envs, f".building-{build}-{os.getpid()}")
    final = layout.build_dir(build)
    t0 = time.monotonic()
    step = "wheelhouse" if req.wheelhouse else "index"
    try:
        if req.wheelhouse:
            pinned = wheelhouse_pin(req.wheelhouse, req.version, req.variant)
            source = ["--no-index", "--find-links", req.wheelhouse]
        else:
            pinned = f"{req.version}+{req.variant}"
            source = ["--index-url", str(req.index_url)]
            preflight_index(str(req.index_url), pinned)
        step = "venv"
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        rc, out = run_logged([sys.executable, "-m", "venv", tmp], log_path=log_path,
                             env=clean_env(), label="venv", timeout_s=300)
        if rc != 0:
            hint = " (install python3-venv in the container)" if "ensurepip" in out else ""
            raise _StepFailed("venv", f"python -m venv failed{hint}")
        scratch = os.path.join(tmp, ".opsctl-tmp")
        os.makedirs(scratch)
        python = os.path.join(tmp, "bin", "python")
        # --no-compile: byte-compiling all of torch doubles the install time; the modules a
        # job imports get compiled on first import (verification already imports torch).
        pip = [python, "-m", "pip", "install", "--isolated", "--no-cache-dir", "--no-input",
               "--no-compile", "--disable-pip-version-check", "--retries", str(req.pip_retries),
               "--timeout", str(req.pip_timeout_s)]
        step = "pip-install"
        # --isolated skips user config and PIP_* vars but still reads /etc/pip.conf & co;
        # PIP_CONFIG_FILE=/dev/null makes pip skip every config file.
        env = clean_env(TMPDIR=scratch, PIP_CONFIG_FILE=os.devnull)
        rc, out = run_logged([*pip, *source, f"torch=={pinned}"], log_path=log_path, env=env,
                             label="pip", timeout_s=req.install_timeout_s, watch_dir=tmp)
        if rc != 0:
            reason = pip_failure_reason(out)
            detail = f"{_REASON_TEXT[reason]} (pip exit {rc})"
            if not req.wheelhouse and reason in ("no-such-version", "pip-error"):
                view = read_index(str(req.index_url))
                if view.error is not None:
                    reason, detail = "index-unreachable", f"{view.error} (pip exit {rc})"
            raise _StepFailed(step, detail, reason)
        if req.requirements:
            step = "requirements"
            constraints = os.path.join(scratch, "constraints.txt")
            with open(constraints, "w", encoding="utf-8") as f:
                f.write(f"torch=={pinned}\n")  # extras must never replace the pinned torch
            if req.wheelhouse:
                extra_src = source
            elif req.requirements_index_url:
                extra_src = ["--index-url", req.requirements_index_url]
            else:
                extra_src = []
            rc, out = run_logged([*pip, *extra_src, "-c", constraints, *req.requirements],
                                 log_path=log_path, env=env, label="pip",
                                 timeout_s=req.install_timeout_s, watch_dir=tmp)
            if rc != 0:
                reason = pip_failure_reason(out)
                raise _StepFailed(step, f"extra requirements: {_REASON_TEXT[reason]} "
                                  f"(pip exit {rc})", reason)
        step = "verify"
        verification = _verify(python, pinned, req, scratch, log_path)
        step = "finalize"
        shutil.rmtree(scratch, ignore_errors=True)
        _rewrite_bin(tmp, tmp, final)
        size, files = dir_usage(tmp)
        install_s = round(time.monotonic() - t0, 2)
        write_json_atomic(os.path.join(tmp, MARKER), {
            "build": build, "version": req.version, "variant": req.variant, "pin": pinned,
            "index_url": None if req.wheelhouse else req.index_url,
            "wheelhouse": req.wheelhouse, "requirements": list(req.requirements),
            "installed_at": time.time(), "install_seconds": install_s, "log_path": log_path,
            "size_bytes": size, "files": files, "verification": verification,
        })
        if os.path.exists(final) and safe_write.exchange(tmp, final):
            # --reinstall: the new build and the old one trade places in one step, so a kill
            # at any moment leaves a whole build at its name; the old one, now at ``tmp``, goes
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(final):  # no renameat2: two renames, and a kill between them
            trash = os.path.join(layout.envs, f".trash-{build}-{os.getpid()}")  # leaves the
            os.replace(final, trash)  # old build at .trash-, which the next swap puts back
            try:
                os.replace(tmp, final)
            except OSError:
                os.replace(trash, final)
                raise
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        facts = dict(verification["facts"], executable=os.path.join(final, "bin", "python"))
        verification["facts"] = facts
        store_facts(final, facts)
    except (_StepFailed, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, _StepFailed):
            step, message, reason = exc.step, exc.message, exc.reason
        else:
            reason = "disk-full" if getattr(exc, "errno", None) == 28 else "os-error"
            message = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(f"\n[opsctl] FAILED at step {step}: {message}\n")
            append_history(layout, {"time": time.time(), "from": previous, "to": build,
                                    "action": "install", "result": "failed", "step": step,
                                    "reason": reason, "error": message, "log_path": log_path,
                                    "seconds": round(time.monotonic() - t0, 2)})
        raise AgentFailure(ErrorType.TorchInstallFailed,
                           f"installing {build} failed at step {step}: {message}; "
                           f"{previous or 'no build'} stays current; full output: {log_path}",
                           step=step, reason=reason, build=build, current=previous,
                           log_path=log_path) from None
    return {"log_path": log_path, "install_seconds": install_s, "verification": verification,
            "fingerprint": fingerprint_of(verification["facts"])}


def _verify(python: str, pinned: str, req: SwapRequest, scratch: str, log_path: str
            ) -> dict[str, t.Any]:
    cuda = expected_cuda(req.variant)
    argv = [python, "-I", INSPECT_SCRIPT, "--verify", "--expect-version", pinned,
            "--expect-cuda", cuda or "none"]
    if cuda is not None and has_gpus():
        argv.append("--require-cuda")
    # The tiny compile writes to a throwaway cache, never to the builds' caches or /tmp.
    env = clean_env(TMPDIR=scratch, TORCHINDUCTOR_CACHE_DIR=os.path.join(scratch, "inductor"),
                    TRITON_CACHE_DIR=os.path.join(scratch, "triton"))
    rc, out = run_logged(argv, log_path=log_path, env=env, label="verify",
                         timeout_s=req.verify_timeout_s)
    result = parse_inspect_output(out)
    if result is None:
        raise _StepFailed("verify", f"the verification script printed no result (exit {rc})",
                          "verify-crashed")
    checks = result.get("checks") or []
    if rc != 0 or not result.get("ok"):
        raise _StepFailed("verify", f"verification failed: {_summary(checks)}", "verify-failed")
    return {"checks": checks, "facts": result.get("facts") or {}}
