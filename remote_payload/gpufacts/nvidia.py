"""NVIDIA driver and library versions, PCI addresses and device nodes, from text.

The doctor reads ``nvidia-smi`` itself (its query output); these parsers are for the
kernel's and the file system's views of the driver."""

from __future__ import annotations

import re

UNKNOWN = "unknown"

#: ``580.159.04``, ``550.54.15``, ``535.104.05``: the driver's version everywhere it shows.
_VERSION = r"\d{3,4}\.\d{1,3}(?:\.\d{1,3})?"
_PROC = re.compile(rf"^NVRM version:.*?\s({_VERSION})\s", re.M)
_LIB = re.compile(rf"(libnvidia-ml|libcuda)\.so\.({_VERSION})(?![\d.])")


def driver_from_proc(text: str) -> str:
    """The version in ``/proc/driver/nvidia/version`` (``NVRM version: ... 580.159.04 ...``)."""
    m = _PROC.search(text)
    return m[1] if m else UNKNOWN


def library_version_sets(text: str) -> dict[str, list[str]]:
    """Every version seen per library (two versions of libcuda in one container is itself
    a finding: which one the loader picks depends on the search order)."""
    found: dict[str, set[str]] = {}
    for lib, version in _LIB.findall(text):
        found.setdefault(lib, set()).add(version)
    return {lib: sorted(v, key=_key) for lib, v in found.items()}


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def pci_key(bus_id: str) -> str:
    """A PCI address as ``0000:41:00`` (domain:bus:device, 4-digit domain, lower case), the
    form the kernel's Xid lines use; nvidia-smi writes ``00000000:41:00.0``. ``unknown``
    when ``bus_id`` is not an address."""
    m = re.fullmatch(r"\s*(?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?\s*",
                     bus_id)
    if not m:
        return UNKNOWN
    return f"{int(m[1], 16):04x}:{m[2].lower()}:{m[3].lower()}"


# --- device nodes -----------------------------------------------------------------------

_LS_LINE = re.compile(r"^([bc])[-rwxsStT]{9}[.+@]?\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s+.*?\s(\S+)$")


def device_nodes(text: str) -> dict[str, tuple[int, int]]:
    """``{"/dev/nvidia0": (195, 0), ...}`` from ``ls -l`` of device nodes.

    Handles both ``ls -l /dev/nvidia*`` (absolute names) and a directory listing
    (``/dev/nvidia-caps:`` header, then bare names), as recorded on an H200 machine.
    Only NVIDIA nodes (``nvidia*``) are kept.
    """
    nodes: dict[str, tuple[int, int]] = {}
    directory = "/dev"
    for line in text.splitlines():
        line = line.rstrip()
        if line.endswith(":") and line.startswith("/") and " " not in line:
            directory = line[:-1].rstrip("/") or "/"
            continue
        m = _LS_LINE.match(line)
        if not m or m[1] != "c":
            continue
        name = m[4]
        path = name if name.startswith("/") else f"{directory}/{name}"
        if path.rsplit("/", 1)[-1].startswith("nvidia"):
            nodes[path] = (int(m[2]), int(m[3]))
    return nodes
