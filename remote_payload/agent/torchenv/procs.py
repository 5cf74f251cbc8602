"""Run a child with its output streamed to a log file and to stderr (the operator's view).

Long pip downloads print little while they work, so a heartbeat line reports elapsed
time and how many bytes the build directory has grown: the operator sees progress and
a stalled download is obvious.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import typing as t

from remote_payload.agent.torchenv.layout import dir_usage
from remote_payload.procgroup import STDOUT, ChildTimeout, Group

# Variables that would make a child pip or python pick up settings from outside the build.
_SCRUB_PREFIXES = ("PIP_", "PYTHON", "VIRTUAL_ENV", "CONDA_", "UV_")
_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "SSL_CERT_FILE",
         "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
         "http_proxy", "https_proxy", "no_proxy", "CUDA_VISIBLE_DEVICES",
         "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")

#: how much of a child's output :func:`run_logged` returns (the failure reasons are read from it)
_TAIL_CHARS = 65536


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment: no PIP_*/PYTHON* settings leak into an install or a check."""
    env = {k: v for k, v in os.environ.items()
           if k in _KEEP and not k.startswith(_SCRUB_PREFIXES)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(extra)
    return env


def run_logged(argv: t.Sequence[str], *, log_path: str, env: dict[str, str], label: str,
               cwd: str | None = None, timeout_s: float | None = None,
               watch_dir: str | None = None, heartbeat_s: float = 15.0) -> tuple[int, str]:
    """Run ``argv`` as a process group (:mod:`remote_payload.procgroup`); append its output
    to ``log_path`` and echo it to stderr.

    The deadline holds whatever the child does (a silent pip, a grandchild that keeps the
    output pipe open), and the whole tree is ended before this returns.

    Returns (returncode, last ~64 KB of output). ``returncode`` is -9 after a timeout.
    """
    t0 = time.monotonic()
    tail: list[str] = []
    held = [0]  # characters in tail
    with open(log_path, "a", encoding="utf-8", errors="replace") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()

        def line(text: str) -> None:
            log.write(text + "\n")
            log.flush()
            sys.stderr.write(f"[{label}] {text}\n")
            tail.append(text + "\n")
            held[0] += len(tail[-1])
            while held[0] > _TAIL_CHARS and len(tail) > 1:
                held[0] -= len(tail.pop(0))

        def heartbeat() -> None:
            grown = dir_usage(watch_dir)[0] if watch_dir else 0
            sys.stderr.write(f"[{label}] still running after {time.monotonic() - t0:.0f}s"
                             + (f", {grown / 1e6:.0f} MB written" if watch_dir else "") + "\n")
            sys.stderr.flush()

        group = Group(argv, env=env, cwd=cwd, stderr=STDOUT)
        try:
            rc = group.stream(timeout_s, line, on_tick=heartbeat, tick_s=heartbeat_s)
        except ChildTimeout:
            rc = -signal.SIGKILL
            log.write(f"[timed out after {timeout_s:g}s: its processes were ended]\n")
        log.write(f"[exit {rc} after {time.monotonic() - t0:.1f}s]\n")
    sys.stderr.flush()
    return rc, "".join(tail)[-_TAIL_CHARS:]
