"""Output: one JSON event per line (``remote_payload.wire.format_event``) plus human lines.

Rank 0 speaks, and so does local rank 0 of every other node of a multi-node run (torchrun's
``LOCAL_RANK``): each node's agent watches its own job, so each needs the phase and step
events (the same, global numbers: they come after the all-reduce every drafter joins). On one
node that is rank 0 alone. Errors are reported by every rank (a crash on rank 5 must not be
silent). Every line is flushed, so a pane or pipe shows it at once.
"""

from __future__ import annotations

import sys
import typing as t

from .. import wire
from ..wire import format_event


class Log:
    def __init__(self, rank: int = 0, stream: t.TextIO | None = None, local_rank: int | None = None):
        self.rank = rank
        self.local_rank = rank if local_rank is None else local_rank
        self.gpu: str | None = None  # the physical GPU, once known: an error names it
        self.stream = stream or sys.stdout

    @property
    def enabled(self) -> bool:
        return self.rank == 0 or self.local_rank == 0

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def event(self, event: str, /, **fields: t.Any) -> None:
        if self.enabled:
            self._write(format_event(event, **fields))

    def say(self, text: str) -> None:
        if self.enabled:
            self._write(text)

    def error(self, type_: str, message: str) -> None:
        """Reported by any rank, with the GPU it drives."""
        self._write(format_event(wire.EVENT_ERROR, type=type_, message=message, rank=self.rank, gpu=self.gpu))
