"""The one harness of the benchmark scripts: timing, medians, and a result that says where it
was measured.

Every script in ``benchmarks/`` measures with :func:`timed` (or :func:`median` of its own
samples) and ends with :func:`write_result`, so every result file has the same envelope::

    {"benchmark": "fleet_status", "date": "2026-12-02T20:40:11Z",
     "git_revision": "d3ef6df…" (+ "-dirty" for uncommitted changes),
     "machine": {"hostname", "platform", "python", "cpu", "cores", "gpus"},
     "params": {...the command line's settings...}, "result": {...the script's numbers...}}

and a number in the docs can always be traced to the code and the machine that produced it
(docs/benchmarks.md, docs/trainer-performance.md). pytest-benchmark and asv were considered:
both want to own the loop and the runner (asv builds environments per commit), while these
scripts drive SSH sessions, tmux jobs and multi-minute GPU runs they must schedule themselves;
what they share is only this envelope and a median, so a module of stdlib is enough.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import typing as t
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed run, and their median, minimum and maximum."""

    samples: tuple[float, ...]
    median_s: float
    min_s: float
    max_s: float

    def as_dict(self, digits: int = 4) -> dict[str, t.Any]:
        return {k: (round(v, digits) if isinstance(v, float) else [round(s, digits) for s in v])
                for k, v in asdict(self).items()}


def median(samples: t.Sequence[float]) -> float:
    """The median of ``samples`` (the figure every table reports: one slow run moves it
    least). Raises ValueError for no samples: a median of nothing is a bug, not 0."""
    if not samples:
        raise ValueError("a median needs at least one sample")
    return float(statistics.median(samples))


def timed(fn: t.Callable[[], object], runs: int, warmup: int = 0) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``runs`` times timed (``perf_counter``)."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return Timing(tuple(samples), median(samples), min(samples), max(samples))


def git_revision(root: Path = REPO) -> str:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it; ``unknown``
    outside a git checkout (a copy shipped to a GPU machine without ``.git``)."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("OPSCTL_BENCH_REVISION", "unknown")
    return head + ("-dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> list[str]:
    """GPU names as ``nvidia-smi`` lists them; empty without one (or when it fails)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def machine() -> dict[str, t.Any]:
    """What the numbers were measured on."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": platform.python_version(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "gpus": _gpus()}


def now_utc() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def result(benchmark: str, data: t.Any, params: t.Mapping[str, t.Any] | None = None) -> dict[str, t.Any]:
    """The result envelope: the script's ``data`` with date, git revision and machine."""
    return {"benchmark": benchmark, "date": now_utc(), "git_revision": git_revision(),
            "machine": machine(), "params": dict(params or {}), "result": data}


def write_result(benchmark: str, data: t.Any, path: str | Path | None = None,
                 params: t.Mapping[str, t.Any] | None = None) -> dict[str, t.Any]:
    """Write the envelope of ``data`` to ``path`` (a new file; its folder is made), or print
    it on stdout when ``path`` is None. Returns the envelope."""
    doc = result(benchmark, data, params)
    text = json.dumps(doc, indent=1, default=str) + "\n"
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, target)  # never half a result file
    return doc
