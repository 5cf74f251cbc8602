"""The last resolution of a ``--host`` name, as JSON, so `opsctl status` reads no YAML.

Why: reading the inventory (PyYAML, then the pydantic models of :mod:`.inventory`) cost
~60 ms of a ~300 ms `opsctl status` round trip, every time, for an answer that changes only
when a file does. :func:`store` keeps what ``inventory.load().resolve(name)`` returned,
with a *stamp* of every file that answer depends on: each ``*.yaml`` of the inventory lookup
order (:func:`opsctl.config.paths.inventory_dirs`, so the current directory and the
``OPSCTL_INVENTORY*`` variables are part of it) and ``~/.ssh/config``. :func:`lookup`
answers only while the stamp is unchanged: an edited, added or removed file, or another
lookup order, is a miss, and the caller resolves in full (and stores again).

Only a successful full resolution is stored, so an invalid inventory file still fails
every command as before. An ``~/.ssh/config`` with ``Include`` or ``Match`` is never
stored: what it includes or tests is not in the stamp.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import typing as t
from pathlib import Path

from opsctl.config import addresses, paths, sshconfig

if t.TYPE_CHECKING:
    from opsctl.config.inventory import HostSpec

_VERSION = 1
_UNSTAMPED = re.compile(r"^\s*(include|match)\b", re.I | re.M)


class CachedHost(t.NamedTuple):
    """The fields of a :class:`~opsctl.config.inventory.HostSpec` that a multiplexed call uses.

    A NamedTuple, not a dataclass: `dataclasses` imports `inspect`, which the first `status`
    would load before its ssh starts (docs/benchmarks.md).
    """

    name: str
    address: str
    port: int
    user: str
    identity_file: str | None
    proxy_jump: str | None
    known_hosts: str | None
    host_key_fingerprint: str | None
    sudo: bool
    pct_path: str
    root: str
    connect_timeout_s: float
    #: the whole stored ``HostSpec.model_dump(mode="json")`` (what a mux is started with)
    dump: dict[str, t.Any]

    @property
    def label(self) -> str:
        return self.name or self.address

    def known_hosts_path(self) -> Path:
        return addresses.known_hosts_path(self.known_hosts)

    def ssh_label(self) -> str:
        return addresses.ssh_label(self.user, self.address, self.port)

    def model_dump_json(self) -> str:
        """As ``HostSpec.model_dump_json()`` (:func:`opsctl.remote.mux_client.spawn` sends it)."""
        return json.dumps(self.dump)


def path() -> Path:
    """Where the resolutions are kept."""
    return paths.home() / "cache" / "targets.json"


def _stat(p: Path) -> list[int] | None:
    try:
        st = p.stat()
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino]


def stamp() -> list[t.Any]:
    """What a resolution depends on, as it is now (a few ``stat`` calls, no reads)."""
    files: list[t.Any] = [str(sshconfig.config_path()), _stat(sshconfig.config_path())]
    for d in paths.inventory_dirs():
        files.append([str(d), [[p.name, _stat(p)] for p in _yaml_files(d)] if d.is_dir() else None])
    return files


def _yaml_files(d: Path) -> list[Path]:
    return sorted(d.glob("*.yaml"))


def stamp_paths() -> list[Path]:
    """The paths :func:`stamp` looks at: ``~/.ssh/config``, each inventory directory (an
    added or removed file changes its mtime) and each of its ``*.yaml`` files."""
    found = [sshconfig.config_path()]
    for d in paths.inventory_dirs():
        found += [d, *(_yaml_files(d) if d.is_dir() else ())]
    return found


def _read() -> dict[str, t.Any]:
    try:
        doc = json.loads(path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc.get("hosts", {}) if isinstance(doc, dict) and doc.get("version") == _VERSION else {}


def lookup(name: str) -> CachedHost | None:
    """The stored resolution of ``name`` if nothing it depends on changed since; else None."""
    entry = _read().get(name)
    if not isinstance(entry, dict) or entry.get("stamp") != stamp():
        return None
    spec = entry.get("spec")
    if not isinstance(spec, dict):
        return None
    try:
        return CachedHost(**{f: spec[f] for f in CachedHost._fields if f != "dump"}, dump=spec)
    except (TypeError, KeyError):
        return None


def store(name: str, spec: HostSpec) -> None:
    """Remember ``spec`` as the resolution of ``name`` (no-op when already stored; never raises)."""
    try:
        cfg = sshconfig.config_path().read_text(encoding="utf-8", errors="replace")
    except OSError:
        cfg = ""
    if _UNSTAMPED.search(cfg):
        return
    entry = {"stamp": stamp(), "spec": spec.model_dump(mode="json")}
    hosts = _read()
    if hosts.get(name) == json.loads(json.dumps(entry)):
        return
    hosts[name] = entry
    target = path()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):  # a cache: failing to write it costs speed, nothing else
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"version": _VERSION, "hosts": hosts}), encoding="utf-8")
        tmp.replace(target)
