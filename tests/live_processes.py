"""The live processes of this machine that carry one ``NAME=value`` in their environment.

Tests mark the processes they start (``PGTEST=<token>``, ``PYTHONPYCACHEPREFIX=<prefix>``)
and ask here which of them still run: a zombie or a dead process does not count.
"""

from __future__ import annotations

import os


def with_env(entry: str) -> set[int]:
    """Pids of live processes (not this one) whose environment holds ``entry`` exactly."""
    needle = entry.encode()
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
        except OSError:
            continue
        found.add(int(name))
    return found
