"""What the Proxmox host itself shows about its GPUs: each function is one host command
(an argv run by :meth:`opsctl.remote.transport.Remote.run`, never a shell line) and its
parse (:mod:`remote_payload.gpufacts`). The container agent cannot see any of it.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from remote_payload import limits
from remote_payload.gpufacts import kernlog, nvidia

if t.TYPE_CHECKING:
    from opsctl.remote.command import CommandResult
    from opsctl.remote.transport import Remote


#: how :attr:`HostGpus.smi_error` begins for an nvidia-smi that never answered
SMI_HUNG = "nvidia-smi did not answer within"


def _text(res: CommandResult) -> str:
    return res.stdout.decode("utf-8", "replace")


def first_line(text: str) -> str:
    return limits.cut_line(next((ln.strip() for ln in text.splitlines() if ln.strip()), ""))


@dataclass(frozen=True)
class HostGpus:
    """The host's driver and GPUs; ``driver`` None: no NVIDIA driver loaded."""

    driver: str | None
    evidence: str
    bus_to_index: dict[str, int] = field(default_factory=dict)  # 0000:41:00 -> host index
    smi_error: str | None = None


def gpus(remote: Remote, timeout: float) -> HostGpus:
    """``/proc/driver/nvidia/version`` and, with a driver, ``nvidia-smi``'s bus ids.

    An ``nvidia-smi`` that does not answer within ``timeout`` is the answer's ``smi_error``
    (what a wedged driver or a GPU fallen off the bus does), not an error: the host still
    answers, and its other checks (the kernel's Xid lines above all) say why.

    Raises:
        TransportError, DeadlineExceeded: from the transport (the driver version's read).
    """
    from opsctl.errors import DeadlineExceeded

    res = remote.run(["cat", "/proc/driver/nvidia/version"], timeout=timeout,
                     step="host driver version")
    if res.rc != 0:
        return HostGpus(None, first_line(res.stderr.decode("utf-8", "replace")))
    text = _text(res)
    version = nvidia.driver_from_proc(text)
    try:
        smi = remote.run(limits.head_argv(["nvidia-smi", "--query-gpu=index,pci.bus_id",
                                           "--format=csv,noheader"]),
                         timeout=timeout, step="host nvidia-smi")
    except DeadlineExceeded:
        return HostGpus(version if version != nvidia.UNKNOWN else None, first_line(text), {},
                        f"{SMI_HUNG} {timeout:g} s (ended): a wedged driver or a GPU that "
                        "fell off the bus hangs it")
    mapping: dict[str, int] = {}
    err = None
    if smi.rc == 0:
        for line in _text(smi).splitlines():
            idx, _, bus = line.partition(",")
            if idx.strip().isdigit() and nvidia.pci_key(bus) != nvidia.UNKNOWN:
                mapping[nvidia.pci_key(bus)] = int(idx)
    else:
        err = first_line(_text(smi) + "\n" + smi.stderr.decode("utf-8", "replace")) or \
            f"nvidia-smi exited {smi.rc}"
    return HostGpus(version if version != nvidia.UNKNOWN else None, first_line(text), mapping, err)


def device_nodes(remote: Remote, timeout: float) -> tuple[dict[str, tuple[int, int]], str]:
    """The host's NVIDIA device nodes (``ls -l /dev /dev/nvidia-caps``) and the listing."""
    res = remote.run(["ls", "-l", "/dev", "/dev/nvidia-caps"], timeout=timeout,
                     step="host device nodes")
    text = _text(res)
    return nvidia.device_nodes(text), text


@dataclass(frozen=True)
class KernelLog:
    """The Xid/OOM events of the host's kernel log in a window, and how it was read."""

    events: list[kernlog.KernelEvent]
    source: str  # "journalctl" | "dmesg" | "" (unreadable)
    error: str | None = None  # why it could not be read


def kernel_events(remote: Remote, since: float, until: float, *, timeout: float) -> KernelLog:
    """The host's NVRM Xid and OOM-killer lines between ``since`` and ``until`` (epoch s).

    ``journalctl -k`` when the host keeps a journal, else ``dmesg --time-format iso``
    (whichever the host has; the container cannot read either). Never raises for a log it
    cannot read: the answer says why (``error``).

    Raises:
        TransportError, DeadlineExceeded: from the transport.
    """
    res = remote.run(_capped(["journalctl", "-k", "-q", "--no-pager", "-o", "short-iso-precise",
                              "--since", f"@{int(since)}", "--until", f"@{int(until) + 1}"]),
                     timeout=timeout, step="host kernel log (journalctl)")
    err_text = res.stderr.decode("utf-8", "replace")
    if res.rc == 0 and "No journal files were found" not in err_text and res.stdout.strip():
        return KernelLog(kernlog.in_window(kernlog.parse(_capped_text(res)), since, until),
                         "journalctl")
    res = remote.run(_capped(["dmesg", "--time-format", "iso"]), timeout=timeout,
                     step="host kernel log (dmesg)")
    if res.rc != 0:
        why = first_line(res.stderr.decode("utf-8", "replace")) or f"dmesg exited {res.rc}"
        return KernelLog([], "", f"neither journalctl -k nor dmesg is readable: {why}")
    return KernelLog(kernlog.in_window(kernlog.parse(_capped_text(res)), since, until), "dmesg")


def _capped(argv: list[str]) -> list[str]:
    """``argv`` filtered and capped on the host (:data:`remote_payload.limits`): a kernel log
    of 300 MB of Xid lines costs the client at most the byte cap, never the whole log."""
    return kernlog.capped_argv(argv, lines=limits.cap("KERNLOG_LINES"),
                               size=limits.cap("KERNLOG_BYTES"),
                               width=limits.cap("EVIDENCE_LINE_CHARS"))


def _capped_text(res: CommandResult) -> str:
    """The capped log's text; a first line the byte cap cut into is left out."""
    data = res.stdout
    if len(data) >= limits.cap("KERNLOG_BYTES"):
        data = data.partition(b"\n")[2]
    return data.decode("utf-8", "replace")


def command_text(remote: Remote, argv: list[str], *, timeout: float, step: str) -> tuple[int, str]:
    """(rc, stdout or else stderr) of one host command."""
    res = remote.run(argv, timeout=timeout, step=step)
    out = _text(res)
    return res.rc, out if out.strip() else res.stderr.decode("utf-8", "replace")
