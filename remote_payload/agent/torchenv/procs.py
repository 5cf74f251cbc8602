"""Run a child with its output streamed to a log file and to stderr (the operator's view).

Long pip downloads print little while they work, so a heartbeat line reports elapsed
time and how many bytes the build directory has grown: the operator sees progress and
a stalled download is obvious.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import typing as t

from remote_payload.agent.torchenv.layout import dir_usage

# Variables that would make a child pip or python pick up settings from outside the build.
_SCRUB_PREFIXES = ("PIP_", "PYTHON", "VIRTUAL_ENV", "CONDA_", "UV_")
_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "SSL_CERT_FILE",
         "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
         "http_proxy", "https_proxy", "no_proxy", "CUDA_VISIBLE_DEVICES",
         "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")


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
    """Run ``argv``; append its output to ``log_path`` and echo it to stderr.

    Returns (returncode, last ~64 KB of output). ``returncode`` is -9 after a timeout.
    """
    done = threading.Event()
    t0 = time.monotonic()
    tail: list[str] = []
    with open(log_path, "a", encoding="utf-8", errors="replace") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=cwd, text=True,
                                errors="replace", bufsize=1)

        def heartbeat() -> None:
            while not done.wait(heartbeat_s):
                grown = dir_usage(watch_dir)[0] if watch_dir else 0
                line = (f"[{label}] still running after {time.monotonic() - t0:.0f}s"
                        + (f", {grown / 1e6:.0f} MB written" if watch_dir else ""))
                sys.stderr.write(line + "\n")
                sys.stderr.flush()

        def killer() -> None:
            if timeout_s is not None and not done.wait(timeout_s):
                proc.kill()

        threads = [threading.Thread(target=heartbeat, daemon=True),
                   threading.Thread(target=killer, daemon=True)]
        for th in threads:
            th.start()
        try:
            stdout = proc.stdout
            if stdout is None:
                raise RuntimeError("child has no stdout pipe")
            for line in stdout:
                log.write(line)
                log.flush()
                sys.stderr.write(f"[{label}] {line}")
                tail.append(line)
                if len(tail) > 800:
                    del tail[:400]
            rc = proc.wait()
        finally:
            done.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.write(f"[exit {rc} after {time.monotonic() - t0:.1f}s]\n")
    sys.stderr.flush()
    return rc, "".join(tail)[-65536:]
