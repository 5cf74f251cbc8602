"""How much of another program's output opsctl reads, and how one line of evidence is cut.

One definition on both sides (the agent, the trainer and the CLI import it; stdlib only, so
the container's Python 3.10 can): a kernel log of 300 MB of Xid lines, an ``nvidia-smi`` that
prints without end or a job that writes one 100 KB line must cost a bounded time and memory,
and a line shown as evidence is cut where a reader can still see it was cut
(``…[cut 99871 bytes]``). docs/input-limits.md lists these numbers.

Each cap can be lowered (or raised) for one process through its environment variable
(:func:`cap`), which the tests use to show a cap at work on a small input.
"""

from __future__ import annotations

import math
import os

#: bytes of one stream of a child's output kept (nvidia-smi, tmux, a torch check); the rest
#: is read and dropped, so the child never blocks on a full pipe
CHILD_OUTPUT_BYTES = 1 << 20
#: bytes of the host's kernel log read (the newest Xid/OOM lines, after the host's own filter)
KERNLOG_BYTES = 4 << 20
#: lines of the host's kernel log read (the newest)
KERNLOG_LINES = 20_000
#: characters of one line shown as evidence
EVIDENCE_LINE_CHARS = 300
#: bytes of an agent verb's reply the CLI keeps (a hostile or broken agent that prints
#: without end costs this much memory, then its reply is an error naming the cap)
REPLY_BYTES = 64 << 20
#: bytes of one ``/proc/<pid>/cmdline`` or ``environ`` read (the kernel's own limit on a
#: process's arguments and environment is a quarter of its stack limit, 2 MiB by default)
PROC_FILE_BYTES = 4 << 20
#: bytes of ``jobs/current`` the agent reads (a job id and a newline; more is not its file)
CURRENT_JOB_BYTES = 4096
#: bytes of one saved log of a failed step (``~/.opsctl/logs``): its first and last halves
#: are kept, with a line naming how many bytes were cut between them
LOG_FILE_BYTES = 1 << 20
#: bytes all of opsctl's saved logs may hold together; the oldest are removed first
LOGS_TOTAL_BYTES = 64 << 20
#: bytes of file data one ``opsctl tensorboard`` copy of a job's event files may hold (a
#: scalar-only run writes a few MB; a container that grows its event files without end
#: stops the copy with an error naming the cap, never fills this machine's disk)
PULLED_EVENT_BYTES = 1 << 30
#: levels of directories below a copied tree's root that ``push``/``pull`` list, write and
#: walk (a hostile stream's 2000-deep tree, or a legitimate one, is one error naming this cap,
#: never a RecursionError); ``remote_payload/tarsync.py`` carries the same number as it runs
#: alone in the container, and a test holds the two equal
TREE_DEPTH = 256
#: bytes of the job's last ``trackers`` event line read (the logdir it names fits many times)
TRACKERS_LINE_BYTES = 64 << 10

_ENV = {
    "CHILD_OUTPUT_BYTES": "OPSCTL_CHILD_OUTPUT_BYTES",
    "KERNLOG_BYTES": "OPSCTL_KERNLOG_BYTES",
    "KERNLOG_LINES": "OPSCTL_KERNLOG_LINES",
    "EVIDENCE_LINE_CHARS": "OPSCTL_EVIDENCE_LINE_CHARS",
    "REPLY_BYTES": "OPSCTL_REPLY_BYTES",
    "PROC_FILE_BYTES": "OPSCTL_PROC_FILE_BYTES",
    "LOG_FILE_BYTES": "OPSCTL_LOG_FILE_BYTES",
    "LOGS_TOTAL_BYTES": "OPSCTL_LOGS_TOTAL_BYTES",
    "PULLED_EVENT_BYTES": "OPSCTL_PULLED_EVENT_BYTES",
    "TRACKERS_LINE_BYTES": "OPSCTL_TRACKERS_LINE_BYTES",
}


#: the most an override may raise a cap to (times its default): a mistyped
#: ``OPSCTL_KERNLOG_BYTES=99999999999999`` must not lift the bound altogether
CEILING_FACTOR = 64


def cap(name: str) -> int:
    """The cap ``name`` (one of the constants above), or its environment override when that
    is a whole number of ASCII digits; an override is kept within 1 and
    :data:`CEILING_FACTOR` times the default. Anything else (``-1``, ``1e9``, ``²``) leaves
    the default: an override can move a cap, never remove it."""
    value = int(globals()[name])
    raw = os.environ.get(_ENV[name], "").strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 30:
        return value
    return min(max(int(raw), 1), value * CEILING_FACTOR)


def cut_marker(dropped: int) -> str:
    """What stands where a line was cut (the host's awk prints the same: no separators)."""
    return f"…[cut {dropped} bytes]"


def cut_line(line: str, limit: int | None = None) -> str:
    """``line`` whole when it has at most ``limit`` characters (None: the evidence cap), else
    its first ``limit`` characters and the marker naming how many bytes were left out."""
    width = cap("EVIDENCE_LINE_CHARS") if limit is None else limit
    if len(line) <= width:
        return line
    dropped = len(line[width:].encode("utf-8", "surrogateescape"))
    return line[:width] + cut_marker(dropped)


def clamp(value: object, low: float, high: float) -> float | None:
    """``value`` as a number a view can draw: None for what is no number (nan, a string),
    else kept inside ``[low, high]`` (inf and 1e308 land on the edge)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    if math.isnan(number):
        return None
    return min(max(number, low), high)


#: A fixed program run on the host: the first BYTES of a command's output, and the command's
#: own exit status (141, SIGPIPE, where it printed more and was cut off). The cap and the
#: command are its arguments, never text joined into it.
HEAD_SCRIPT = r"""b=$1; shift
exec 3>&1
rc=$( { { "$@"; echo $? >&4; } | head -c "$b" >&3; } 4>&1 )
exit "${rc:-1}"
"""


def head_argv(argv: list[str], size: int | None = None) -> list[str]:
    """``argv`` run on a host with its standard output capped at ``size`` bytes (None: the
    child-output cap): what a hung or chatty ``nvidia-smi`` prints never reaches the client
    whole."""
    return ["sh", "-c", HEAD_SCRIPT, "sh", str(cap("CHILD_OUTPUT_BYTES") if size is None
                                                else size), *argv]
