"""Output: one JSON event per line (``remote_payload.wire.format_event``) plus human lines.

Only rank 0 speaks, except errors, which every rank reports (a crash on rank 5 must not be
silent). Every line is flushed, so a pane or pipe shows it at once.
"""

from __future__ import annotations

import sys
import typing as t

from ..wire import format_event


class Log:
    def __init__(self, rank: int = 0, stream: t.TextIO | None = None):
        self.rank = rank
        self.gpu: str | None = None  # the physical GPU, once known: an error names it
        self.stream = stream or sys.stdout

    @property
    def enabled(self) -> bool:
        return self.rank == 0

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
        self._write(format_event("error", type=type_, message=message, rank=self.rank, gpu=self.gpu))
