"""Where torch builds, their logs and swap history live under the opsctl root.

One place knows the paths so the agent verbs, the launch path and the tests agree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
import typing as t

from remote_payload import boundedread, safe_write, wire
from remote_payload.agent.common import AgentFailure
from remote_payload.wire import ErrorType

BUILD_PREFIX = wire.TORCH_BUILD_PREFIX
MARKER = ".opsctl-build.json"  # written last: a venv without it is not a build
#: the most of a build marker, or of the builds' history's tail, read
MAX_RECORD_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Layout:
    """Paths of one opsctl root (default ``/opt/opsctl``)."""

    root: str

    @property
    def envs(self) -> str:
        return os.path.join(self.root, "envs")

    @property
    def current_link(self) -> str:
        return os.path.join(self.envs, "current")

    @property
    def history(self) -> str:
        return os.path.join(self.envs, "history.jsonl")

    @property
    def logs(self) -> str:
        return os.path.join(self.envs, ".logs")

    @property
    def lock(self) -> str:
        return os.path.join(self.envs, ".lock")

    @property
    def cache(self) -> str:
        return os.path.join(self.root, "cache")

    @property
    def jobs(self) -> str:
        return os.path.join(self.root, "jobs")

    @property
    def payload(self) -> str:
        return os.path.join(self.root, "payload")

    def build_dir(self, build: str) -> str:
        return os.path.join(self.envs, build)

    def new_log(self, kind: str, build: str) -> str:
        os.makedirs(self.logs, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return os.path.join(self.logs, f"{kind}-{build}-{stamp}-{os.getpid()}.log")


build_name = wire.torch_build_name


def check_pin(version: str, variant: str) -> None:
    """Reject pins the agent cannot verify (the local side validates first; this is a guard).

    Raises
    ------
    AgentFailure
        ``TorchInstallFailed`` with ``step="args"``.
    """
    if not wire.TORCH_VARIANT_RE.match(variant):
        raise AgentFailure(ErrorType.TorchInstallFailed, f"variant {variant!r} is not cpu or cuNNN",
                           step="args", variant=variant)
    if "+" in version or not wire.TORCH_RELEASE_RE.match(version):
        raise AgentFailure(ErrorType.TorchInstallFailed,
                           f"version {version!r} must be a plain release like 2.11.0 "
                           "(the variant supplies the +local tag)", step="args", version=version)


expected_cuda = wire.cuda_for_variant


def current_build(layout: Layout) -> str | None:
    """Name of the build ``envs/current`` points at, or None (no link, dangling link)."""
    try:
        target = os.readlink(layout.current_link)
    except (FileNotFoundError, OSError):
        return None
    name = os.path.basename(target.rstrip("/"))
    return name if os.path.isfile(os.path.join(layout.envs, name, MARKER)) else None


def current_python(root: str) -> str | None:
    """The current build's python, resolved through ``envs/current`` (None: no build).

    The resolved path names the build, so a job's recorded command says which torch ran.
    """
    layout = Layout(root)
    build = current_build(layout)
    if build is None:
        return None
    python = os.path.join(layout.build_dir(build), "bin", "python")
    return python if os.path.exists(python) else None


def read_marker(layout: Layout, build: str) -> dict[str, t.Any] | None:
    try:
        data = json.loads(boundedread.read_regular(os.path.join(layout.build_dir(build), MARKER),
                                                   MAX_RECORD_BYTES))
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def list_builds(layout: Layout) -> list[str]:
    """Complete builds (with a marker), sorted by name."""
    try:
        names = os.listdir(layout.envs)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(BUILD_PREFIX)
                  and os.path.isfile(os.path.join(layout.envs, n, MARKER)))


def switch_current(layout: Layout, build: str) -> None:
    """Point ``envs/current`` at ``build`` atomically
    (:func:`remote_payload.safe_write.write_link`: a new link, renamed over)."""
    safe_write.write_link(layout.current_link, build)  # relative: the root may be bind-mounted


def append_history(layout: Layout, entry: dict[str, t.Any]) -> None:
    """One JSON line at the end of ``envs/history.jsonl``
    (:func:`remote_payload.safe_write.append_text`: never through a link)."""
    os.makedirs(layout.envs, exist_ok=True)
    safe_write.append_text(layout.history, json.dumps(entry, sort_keys=True) + "\n")


def read_history(layout: Layout, last: int = 20) -> list[dict[str, t.Any]]:
    try:
        tail = boundedread.read_tail(layout.history, MAX_RECORD_BYTES)[0] if last > 0 else b""
    except FileNotFoundError:
        return []
    lines = tail.decode("utf-8", "replace").splitlines()[-last:] if last > 0 else []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


@contextlib.contextmanager
def locked(layout: Layout) -> t.Iterator[None]:
    """Serialize swaps and cache changes: two installs must never race on ``current``."""
    os.makedirs(layout.envs, exist_ok=True)
    with open(layout.lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AgentFailure(ErrorType.TorchEnvBusy, "another swap or cache change is in progress",
                               lock=layout.lock) from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def dir_usage(path: str) -> tuple[int, int]:
    """(bytes, files) under ``path``; symlinks are not followed."""
    total = files = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
    return total, files
