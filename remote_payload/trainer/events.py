"""Output: one JSON event per line (``remote_payload.wire.format_event``) plus human lines.

Rank 0 speaks, and so does local rank 0 of every other node of a multi-node run (torchrun's
``LOCAL_RANK``): each node's agent watches its own job, so each needs the phase and step
events (the same, global numbers: they come after the all-reduce every drafter joins). On one
node that is rank 0 alone. Errors are reported by every rank (a crash on rank 5 must not be
silent). Every line is flushed, so a pane or pipe shows it at once.

Listeners (the experiment trackers, :mod:`.trackers`) see every event this process prints,
after it is printed: what a tracker records is what the job's events say. Lines are written
under a lock, since a tracker's warning comes from its own thread.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import typing as t

from .. import procfs, wire
from ..wire import format_event


class Log:
    def __init__(self, rank: int = 0, stream: t.TextIO | None = None, local_rank: int | None = None):
        self.rank = rank
        self.local_rank = rank if local_rank is None else local_rank
        self.gpu: str | None = None  # the physical GPU, once known: an error names it
        self.stream = stream or sys.stdout
        #: called with (event, fields) after each event this process prints; must not block
        self.listeners: list[t.Callable[[str, dict[str, t.Any]], None]] = []
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rank == 0 or self.local_rank == 0

    def _write(self, line: str) -> None:
        with self._lock:
            try:
                self.stream.write(line + "\n")
            except UnicodeEncodeError:  # a file name that is not UTF-8 (or text an ASCII stdout
                # cannot hold): shown escaped (\udcff) rather than a crash after the work is done
                enc = getattr(self.stream, "encoding", None) or "utf-8"
                self.stream.write(line.encode(enc, "backslashreplace").decode(enc) + "\n")
            self.stream.flush()

    def event(self, event: str, /, **fields: t.Any) -> None:
        if self.enabled:
            self._write(format_event(event, **fields))
            for listen in self.listeners:
                listen(event, fields)

    def say(self, text: str) -> None:
        if self.enabled:
            self._write(text)

    def error(self, type_: str, message: str) -> None:
        """Reported by any rank, with the GPU it drives."""
        self._write(format_event(wire.EVENT_ERROR, type=type_, message=message, rank=self.rank, gpu=self.gpu))


_IMPORTED = time.monotonic()


def process_age() -> float:
    """Seconds since this process started, as the kernel counts (``/proc/self/stat``'s start
    time against ``/proc/uptime``, 10 ms ticks), so the start-up breakdown includes the
    interpreter's start and ``import torch``; elsewhere, since this module was imported.
    """
    st, uptime = procfs.stat("self"), procfs.uptime()
    if st is None or uptime is None:
        return time.monotonic() - _IMPORTED
    try:
        return max(0.0, uptime - st.start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return time.monotonic() - _IMPORTED


class Marks:
    """When each start-up phase ended, in seconds since the process started (the
    ``startup`` event; docs/trainer.md, "Start-up")."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.sent = False

    def mark(self, name: str) -> float:
        self.at[name] = round(process_age(), 3)
        return self.at[name]
