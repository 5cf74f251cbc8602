"""GPU passthrough entries of ``pct config <ct>``: which device nodes a container may open
and which it gets.

``pct config`` prints ``key: value`` lines, the container's own keys sorted, then its raw
``lxc.*`` keys in file order (pve-container src/PVE/CLI/pct.pm, cmddef ``config``). Two ways
give a container a GPU node:

- raw LXC keys (every PVE version): ``lxc.cgroup2.devices.allow: c 195:* rwm`` lets it open
  the major, and ``lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file``
  puts the node there;
- PVE 8.1+ device passthrough: ``dev0: /dev/nvidia0[,gid=..,mode=..,uid=..]`` does both.
"""

from __future__ import annotations

import re
import typing as t

_ALLOW = re.compile(r"^\s*([abc])(?:\s+(\*|\d+):(\*|\d+))?(?:\s+([rwm]+))?\s*$")


class DeviceEntries(t.NamedTuple):
    allow: list[tuple[str, str, str]]  # (type, major, minor), ``*`` for any; ("a", "*", "*")
    mounts: list[str]  # container-side paths of lxc.mount.entry binds, as /dev/...
    devs: list[str]  # host paths of devN: entries


def parse(text: str) -> DeviceEntries:
    """The device entries of a ``pct config`` output (anything else is ignored)."""
    allow: list[tuple[str, str, str]] = []
    mounts: list[str] = []
    devs: list[str] = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
            m = _ALLOW.match(value)
            if m:
                allow.append((m[1], m[2] or "*", m[3] or "*"))
        elif key == "lxc.mount.entry":
            parts = value.split()
            if len(parts) >= 2:
                mounts.append("/" + parts[1].lstrip("/"))
        elif re.fullmatch(r"dev\d+", key):
            path = value.split(",", 1)[0].strip()
            if path.startswith("path="):
                path = path[5:]
            if path:
                devs.append(path)
    return DeviceEntries(allow, mounts, devs)


def allowed(entries: DeviceEntries, major: int, minor: int) -> bool:
    """Whether the container may open character device ``major:minor``."""
    for kind, maj, mnr in entries.allow:
        if kind == "a" or (kind == "c" and maj in ("*", str(major)) and mnr in ("*", str(minor))):
            return True
    return False


def missing_lines(entries: DeviceEntries, path: str, major: int, minor: int) -> list[str]:
    """The config lines ``path`` (a host node ``major:minor``) still needs; [] when it is
    passed through (a ``devN:`` entry, or an allow rule plus a bind mount)."""
    if path in entries.devs:
        return []
    need = []
    if not allowed(entries, major, minor):
        need.append(f"lxc.cgroup2.devices.allow: c {major}:* rwm")
    if path not in entries.mounts:
        kind = "dir" if path.endswith("nvidia-caps") else "file"
        need.append(f"lxc.mount.entry: {path} {path.lstrip('/')} none bind,optional,create={kind}")
    return need
