"""``OPSCTL_TRACE=1``: where one command's time went, one line per phase on stderr.

Why: `status` is measured against a raw ``ssh`` in tens of milliseconds (docs/benchmarks.md), and
``-X importtime`` sees only imports. With the variable set, :func:`mark` notes the end of a
phase (``imports``, ``target``, ``mux round trip``, ``parse``, …) and :func:`dump`, at the
end, writes ``trace: <phase> <ms>`` lines; the first phase runs from the kernel's start time
of the process (so ``start-up``, marked on entering ``main``, is the interpreter's own start).
Without it, :func:`mark` is one test of a flag and nothing is written.
"""

from __future__ import annotations

import itertools
import os
import sys
import time

ENV = "OPSCTL_TRACE"
_on = os.environ.get(ENV, "").strip().lower() not in ("", "0", "no", "false", "off")
_marks: list[tuple[str, float]] = []


def enabled() -> bool:
    return _on


def _process_start() -> float | None:
    """This process's start on the ``time.monotonic`` clock (Linux /proc; else None)."""
    try:
        with open(f"/proc/{os.getpid()}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        return ticks / os.sysconf("SC_CLK_TCK") - time.clock_gettime(time.CLOCK_BOOTTIME) \
            + time.monotonic()
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def mark(phase: str) -> None:
    """Note that ``phase`` ended now."""
    if _on:
        if not _marks:
            start = _process_start()
            _marks.append(("process start", start if start is not None else time.monotonic()))
        _marks.append((phase, time.monotonic()))


def dump() -> None:
    """Write the phases (ms each, and the total) to stderr; once."""
    if not _on or len(_marks) < 2:
        return
    lines = [f"trace: {name:<18s} {1000 * (t1 - t0):8.1f} ms"
             for (_, t0), (name, t1) in itertools.pairwise(_marks)]
    lines.append(f"trace: {'total':<18s} {1000 * (_marks[-1][1] - _marks[0][1]):8.1f} ms")
    sys.stderr.write("\n".join(lines) + "\n")
    _marks.clear()
