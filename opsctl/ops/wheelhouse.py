"""Download a torch build's wheels on this machine, for a container that cannot reach an index.

``swap-torch --wheelhouse`` (or a builds-table entry with ``wheelhouse: true``): ``pip
download`` runs here, with the operator's own pip configuration (it reaches indexes or caches
the container cannot), and :mod:`opsctl.remote.wheelhouse` then streams the wheels in. It runs
a process and writes files, so it is a use case's step, not configuration: it left
``opsctl/config/torch_builds.py``, which only reads the builds table.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
import typing as t
from pathlib import Path

from opsctl.config import paths
from opsctl.config.torch_builds import TorchBuild
from opsctl.errors import TorchEnvError
from remote_payload import procgroup, wire

_SAVED_RE = re.compile(r"^\s*(?:Saved|File was already downloaded)\s+(\S.*\S)\s*$")


@dataclasses.dataclass(frozen=True)
class Wheelhouse:
    """Wheels downloaded on the operator's machine, ready to stream into the container."""

    directory: Path
    files: tuple[Path, ...]
    torch_version: str  # what the torch wheel really is, e.g. "2.13.0+cpu"
    total_bytes: int
    seconds: float
    log_path: Path


def prepare_wheelhouse(build: TorchBuild, dest: Path, *, requirements: t.Sequence[str] = (),
                       python_version: str | None = None, platform: str | None = None,
                       pip: t.Sequence[str] = (sys.executable, "-m", "pip"),
                       timeout_s: float = 3600.0,
                       on_line: t.Callable[[str], None] | None = None) -> Wheelhouse:
    """``pip download`` torch (exact pin) + its dependencies + ``requirements`` into ``dest``.

    Runs with the operator's own pip configuration (that is the point: it reaches indexes or
    caches the container cannot), plus ``--index-url`` when the build sets
    ``download_index_url``. ``python_version``/``platform`` target a container whose
    python differs from the operator's (binary wheels only then).

    Raises:
        TorchEnvError: pip failed (log path attached) or no matching torch wheel came back.
    """
    dest.mkdir(parents=True, exist_ok=True)
    log_path = paths.new_log(f"wheelhouse-{build.name}-{time.strftime('%Y%m%d-%H%M%S')}.log")
    argv = [*pip, "download", "--dest", str(dest), "--no-input", "--disable-pip-version-check",
            build.requirement, *requirements]
    if build.download_index_url:
        argv += ["--index-url", build.download_index_url]
    if python_version or platform:
        argv += ["--only-binary=:all:"]
        if python_version:
            argv += ["--python-version", python_version]
        if platform:
            argv += ["--platform", platform]
    t0 = time.monotonic()
    files: list[Path] = []
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(argv)}\n")

        def line(text: str) -> None:
            log.write(text + "\n")
            if on_line is not None:
                on_line(text)
            m = _SAVED_RE.match(text)
            if m:
                files.append(Path(m.group(1)).resolve())

        try:
            rc = procgroup.Group(argv, stderr=procgroup.STDOUT).stream(timeout_s, line)
        except procgroup.ChildTimeout:
            log.write(f"[timed out after {timeout_s:g}s: pip and its processes were ended]\n")
            raise TorchEnvError(f"pip download of {build.requirement} did not finish within "
                                f"{timeout_s:g} s: pip and its processes were ended",
                                log_path=str(log_path),
                                hint="check that its index is reachable from this machine, "
                                     "or allow it more time") from None
    if rc != 0:
        raise TorchEnvError(f"pip download of {build.requirement} failed (exit {rc})",
                            log_path=str(log_path),
                            hint="check the operator's pip configuration or set "
                                 "download_index_url in the builds table")
    if not files:  # older pip versions word it differently: fall back to the directory
        files = sorted(p.resolve() for p in dest.glob("*.whl"))
    files = sorted(set(files))
    torch_versions = [m.group(1) for f in files if (m := wire.TORCH_WHEEL_RE.match(f.name))]
    if build.pin not in torch_versions and build.version not in torch_versions:
        raise TorchEnvError(f"pip download returned no torch wheel for {build.pin} "
                            f"(got: {', '.join(torch_versions) or 'none'})", log_path=str(log_path))
    torch_version = build.pin if build.pin in torch_versions else build.version
    return Wheelhouse(directory=dest, files=tuple(files), torch_version=torch_version,
                      total_bytes=sum(os.path.getsize(f) for f in files),
                      seconds=round(time.monotonic() - t0, 2), log_path=log_path)
