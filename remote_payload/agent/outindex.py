"""A sparse time → byte-offset index of a job's ``output.log`` (``output.idx``).

Why: ``opsctl logs --since 10m`` needs to know where in the raw log the last ten minutes
start, but output.log is the job's bytes, exactly as printed, with no times in it (and must
stay so: ``logs`` is byte-exact). The wrapper already sees every chunk of output as it
arrives, so it notes ``<unix time> <offset of the chunk's first byte>`` here, at most once
per :data:`RESOLUTION_S`. A week of chatty output costs ~600 K lines worst case (~15 MB);
a job that prints once a minute writes one line a minute.

The answer is "from the first chunk written at or after T", to within the resolution: a
chunk is whatever one read of the job's pipe returned, so it usually starts a line (a
trainer writes whole lines) but may not. A job launched before the index existed has none;
then :func:`offset_since` says so and the caller shows everything.
"""

from __future__ import annotations

import os

from remote_payload import boundedread

INDEX = "output.idx"
RESOLUTION_S = 1.0
#: the longest index line read (``<time> <offset>``: under 40 bytes; a longer one is torn)
MAX_INDEX_LINE = 256


class Writer:
    """Appends ``time offset`` lines; never raises (the index is a convenience, not the log)."""

    def __init__(self, job_path: str):
        self.path = os.path.join(job_path, INDEX)
        self.last = 0.0
        self.broken = False

    def note(self, now: float, fd: int) -> None:
        """Record that output appended to ``fd`` (output.log, O_APPEND) from its current end
        on is written at ``now`` (rate-limited: the size is read only when a line is due)."""
        if self.broken or now - self.last < RESOLUTION_S:
            return
        self.last = now
        try:
            offset = os.fstat(fd).st_size
            with open(self.path, "a", encoding="ascii") as f:
                f.write(f"{now:.3f} {offset}\n")
        except OSError:  # disk full: output.log matters more; --since falls back to "all"
            self.broken = True


def offset_since(job_path: str, since: float, size: int) -> int | None:
    """Offset of the first output written at or after ``since``; ``size`` when none was;
    None when the job has no index (launched by an older agent)."""
    try:
        for raw in boundedread.lines(os.path.join(job_path, INDEX), MAX_INDEX_LINE):
            parts = raw.decode("ascii", "replace").split()
            if len(parts) != 2:
                continue  # a torn last line of a full disk
            try:
                at, offset = float(parts[0]), int(parts[1])
            except ValueError:
                continue
            if at >= since:
                return min(offset, size)
    except FileNotFoundError:
        return None
    except OSError:  # a link, a FIFO or a device in the job dir: no index of the wrapper's
        return None
    return size


def offset_of_last_lines(path: str, n: int, size: int) -> int:
    """Offset where the last ``n`` lines of ``path`` start (a final line without a newline
    counts), read backwards in blocks so a huge log costs only its tail."""
    if n <= 0:
        return size
    block = 64 * 1024
    pos = size
    newlines = 0
    try:
        with boundedread.open_binary(path) as f:
            # a log that ends with "\n" has its last line before that newline
            f.seek(max(0, size - 1))
            skip_last = size > 0 and f.read(1) == b"\n"
            end = size - 1 if skip_last else size
            pos = end
            while pos > 0:
                start = max(0, pos - block)
                f.seek(start)
                data = f.read(pos - start)
                idx = len(data)
                while True:
                    idx = data.rfind(b"\n", 0, idx)
                    if idx < 0:
                        break
                    newlines += 1
                    if newlines == n:
                        return start + idx + 1
                pos = start
    except FileNotFoundError:
        return 0
    return 0
