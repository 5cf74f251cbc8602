"""The host kernel's NVRM Xid lines and OOM-killer lines, and what each Xid means.

Line formats, as the driver and the kernel print them (NVIDIA's Xid documentation; the
kernel's mm/oom_kill.c):

    NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:2b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error ...
    NVRM: Xid (0000:01:00): 13, Graphics Exception: ...         (older drivers: no "PCI:")
    oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=ns,mems_allowed=0,
        oom_memcg=/lxc/120,task_memcg=/lxc/120/ns/user.slice,task=python3,pid=4242,uid=0
    Memory cgroup out of memory: Killed process 4242 (python3) total-vm:..., anon-rss:...
    Out of memory: Killed process 4242 (python3) total-vm:...

each possibly behind a timestamp: ``journalctl -k -o short-iso-precise`` (``2026-12-01T16:11:09.262206+00:00
host kernel: ...``), ``dmesg --time-format iso`` (``2026-12-01T16:11:09,262206+00:00 ...``) or
plain ``dmesg`` (``[ 3.785353] ...``, seconds since boot: no wall time).
"""

from __future__ import annotations

import datetime as _dt
import re
import typing as t

# code -> (meaning, next action). From NVIDIA's Xid catalog ("Analyzing Xid Errors with the
# Xid Catalog", docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): the
# description column, and the resolution buckets (RESTART_APP, RESET_GPU, ...) in words.
XID_CATALOG: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing", "restart the job; contact support if it recurs"),
    13: ("graphics engine exception (usually the application: an illegal instruction or "
         "out-of-range access in a kernel)", "restart the job; if it recurs on this GPU only, "
         "drain it and run a GPU diagnostic (dcgmi diag -r 3)"),
    31: ("GPU memory page fault (MMU fault: an illegal memory access, almost always the "
         "application or a framework bug)", "restart the job; check the code for "
         "out-of-bounds accesses (compute-sanitizer); drain the GPU if it recurs with "
         "different programs"),
    32: ("invalid or corrupted push buffer stream (the PCIe bus)", "drain the GPU and check "
         "its PCIe link (reseat, riser, cable)"),
    38: ("driver firmware error", "reset the GPU; update the driver if it recurs"),
    43: ("GPU stopped processing (a channel was aborted after an application error)",
          "restart the job; the GPU itself is usually fine"),
    45: ("preemptive cleanup after a previous error or a killed process",
          "none on its own: look at the Xid before it"),
    48: ("double-bit ECC error (uncorrectable memory error)", "drain the GPU and reset it "
         "(nvidia-smi -r -i <index> with nothing running, or reboot the host) so the page is "
         "retired / the row remapped; replace the card if it recurs"),
    61: ("internal micro-controller breakpoint/warning", "reset the GPU (drain it first)"),
    62: ("internal micro-controller halt", "reset the GPU (drain it first)"),
    63: ("ECC page retirement or row remapping recorded", "reset the GPU when convenient "
         "so the remap takes effect; watch the count (nvidia-smi -q -d ROW_REMAPPER)"),
    64: ("ECC page retirement or row remapper recording failure", "drain the GPU, reset it; "
         "replace the card if it recurs"),
    68: ("video processor exception", "restart the job"),
    69: ("graphics engine class error", "restart the job"),
    74: ("NVLink error", "drain the GPU, reset it (all GPUs of the NVLink domain) and check "
         "the NVLink/NVSwitch state (nvidia-smi nvlink -s); replace if it recurs"),
    79: ("GPU has fallen off the bus (no longer reachable on PCIe)", "the GPU needs a host "
         "reset: drain it (no new jobs on it), then reboot the host or reset the GPU "
         "(nvidia-smi -r); check cooling, power and the PCIe seating; replace it if it recurs"),
    92: ("high single-bit ECC error rate", "watch it; drain and replace the card if the "
         "rate keeps rising"),
    94: ("contained ECC error (uncorrectable, contained to the application that used the "
         "memory)", "restart the job; the GPU keeps working; reset it when convenient so "
         "the row is remapped"),
    95: ("uncontained ECC error (every application on the GPU is affected)", "drain the GPU "
         "and reset it (nvidia-smi -r or a host reboot); replace the card if it recurs"),
    109: ("context switch timeout", "restart the job; contact support if it recurs"),
    119: ("GSP RPC timeout (the GPU System Processor did not answer)", "drain the GPU and "
          "reset it; update the driver if it recurs"),
    120: ("GSP error (the GPU System Processor reported an error)", "drain the GPU and reset "
          "it; update the driver if it recurs"),
    140: ("unrecovered ECC error", "drain the GPU and reset it; replace it if it recurs"),
    154: ("GPU recovery action changed (the line names the action: reset or reboot)",
          "do what the line asks (drain, then reset the GPU or reboot the host)"),
}
UNKNOWN_XID = ("an Xid NVIDIA's catalog lists with its own action",
               "look the code up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)")


def xid_meaning(code: int) -> tuple[str, str]:
    """(meaning, next action) of Xid ``code``."""
    return XID_CATALOG.get(code, UNKNOWN_XID)


class KernelEvent(t.NamedTuple):
    kind: str  # "xid" | "oom"
    at: float | None  # epoch seconds, None when the line carries no wall time
    line: str  # the message, timestamp stripped
    xid: int | None = None
    pci: str | None = None  # 0000:41:00
    pid: int | None = None
    process: str | None = None
    memcg: str | None = None  # the OOM victim's cgroup (task_memcg), /lxc/<ct>/... on PVE


_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:[.,](\d{1,9}))?([+-]\d{2}:?\d{2}|Z)?\s+")
_MONO = re.compile(r"^\[\s*\d+\.\d+\]\s*")
_HOST_KERNEL = re.compile(r"^\S+\s+kernel:\s*")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\):"
                  r"\s*(\d{1,4})\b(.*)$")
_PID = re.compile(r"pid=['\"]?(\d+)")
_NAME = re.compile(r"name=([^,\s]+)")
_OOM_KILL = re.compile(r"oom-kill:.*?task_memcg=([^,\s]*).*?task=([^,\s]*),pid=(\d+)")
_KILLED = re.compile(r"(?:Memory cgroup out of memory|Out of memory): Killed process (\d+) \(([^)]*)\)")


def _timestamp(line: str) -> tuple[float | None, str]:
    m = _ISO.match(line)
    if m:
        frac = (m[2] or "0")[:6].ljust(6, "0")
        tz = m[3] or "+00:00"
        if tz == "Z":
            tz = "+00:00"
        elif ":" not in tz:
            tz = f"{tz[:3]}:{tz[3:]}"
        try:
            at = _dt.datetime.fromisoformat(f"{m[1]}.{frac}{tz}").timestamp()
        except ValueError:
            at = None
        rest = line[m.end():]
        return at, _HOST_KERNEL.sub("", rest, count=1)
    m2 = _MONO.match(line)
    if m2:
        return None, line[m2.end():]
    return None, line


def parse_line(line: str) -> KernelEvent | None:
    """The Xid or OOM event of one kernel-log line, else None."""
    at, msg = _timestamp(line.strip())
    m = _XID.search(msg)
    if m:
        from remote_payload.gpufacts.nvidia import pci_key

        rest = m[3]
        pid = _PID.search(rest)
        name = _NAME.search(rest)
        return KernelEvent("xid", at, msg[m.start():], xid=int(m[2]), pci=pci_key(m[1]),
                           pid=int(pid[1]) if pid else None, process=name[1] if name else None)
    m = _OOM_KILL.search(msg)
    if m:
        return KernelEvent("oom", at, msg[m.start():], pid=int(m[3]), process=m[2] or None,
                           memcg=m[1] or None)
    m = _KILLED.search(msg)
    if m:
        return KernelEvent("oom", at, msg[m.start():], pid=int(m[1]), process=m[2] or None)
    return None


#: the lines :func:`parse` can use (the rest of a kernel log is never read past the host)
HOST_PATTERN = r"NVRM: Xid|oom-kill:|Killed process"

#: The host side of the cap (a fixed program; the caps and the log command are its arguments,
#: never text joined into it): keep the lines :func:`parse` can use, cut each at WIDTH bytes
#: with the cut marked, keep the newest LINES of them and at most BYTES in all, and exit with
#: the log command's own status. Every stage streams in linear time: awk (Debian's mawk) takes
#: minutes over one 50 MB line, so ``sed`` ends each line with a \001 (any \001 in it is
#: dropped first), ``fold`` splits it into 4096-byte pieces, and awk adds up a line's pieces
#: until the one that ends with the \001, keeping its first WIDTH bytes and its length.
CAP_SCRIPT = r"""n=$1; b=$2; w=$3; shift 3
cut='{ n += length($0); last = substr($0, length($0)) == "\001"; if (last) n--
       if (length(k) < w) k = k substr($0, 1, w - length(k))
       if (last) { sub(/\001$/, "", k)
         if (n > w) printf "%s\342\200\246[cut %d bytes]\n", k, n - w; else print k
         n = 0; k = "" } }'
exec 3>&1
rc=$( { { "$@"; echo $? >&4; } | grep -a -E "$HOST_PATTERN" \
      | LC_ALL=C sed 's/\x01//g; s/$/\x01/' | fold -b -w 4096 | LC_ALL=C awk -v w="$w" "$cut" \
      | tail -n "$n" | tail -c "$b" >&3; } 4>&1 )
exit "${rc:-1}"
"""


def capped_argv(argv: t.Sequence[str], *, lines: int, size: int, width: int) -> list[str]:
    """``argv`` (``journalctl -k …`` or ``dmesg …``) run on the host through
    :data:`CAP_SCRIPT`: at most ``lines`` lines and ``size`` bytes come back, each line cut at
    ``width`` bytes (``…[cut N bytes]``)."""
    return ["env", f"HOST_PATTERN={HOST_PATTERN}", "sh", "-c", CAP_SCRIPT, "sh", str(lines),
            str(size), str(width), *argv]


def parse(text: str) -> list[KernelEvent]:
    """Every Xid/OOM event of a kernel log; the two lines the OOM killer writes for one kill
    (``oom-kill:...`` then ``Killed process``) are one event, with the cgroup of the first."""
    events: list[KernelEvent] = []
    for line in text.splitlines():
        ev = parse_line(line)
        if ev is None:
            continue
        prev = events[-1] if events else None
        if (ev.kind == "oom" and prev is not None and prev.kind == "oom" and prev.pid == ev.pid
                and ev.memcg is None):
            continue  # the Killed-process line of the kill already recorded
        events.append(ev)
    return events


def in_window(events: t.Iterable[KernelEvent], since: float, until: float,
              slack_s: float = 5.0) -> list[KernelEvent]:
    """The events between ``since`` and ``until`` (with ``slack_s`` either side: the job's
    clock and the kernel's are the same machine's, but a fault is logged a moment before the
    process dies); events without wall time are left out."""
    return [e for e in events if e.at is not None and since - slack_s <= e.at <= until + slack_s]


def of_container(event: KernelEvent, ctid: int) -> bool:
    """Whether an OOM kill hit container ``ctid``: its cgroup is the container's (PVE puts
    a container under ``/lxc/<ct>``; plain LXC under ``lxc.payload.<ct>``)."""
    memcg = event.memcg or ""
    return bool(re.search(rf"(?:^|/)(?:lxc/|lxc\.payload\.){ctid}(?:/|$)", memcg))
