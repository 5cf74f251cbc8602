"""Hosts and containers from ``inventory/*.yaml`` (pydantic at the boundary).

Files are read from ``$OPSCTL_INVENTORY``, the current directory's ``inventory/`` and
``$OPSCTL_HOME/inventory/`` (where ``opsctl sandbox up`` writes ``sandbox.yaml``)
(``opsctl/config/paths.py``); the first definition of a host name (or of a torch build's
field) wins. The package's own inventory is an example only (``opsctl hosts --example``).
``--host`` also takes a bare address (``10.1.2.6``, ``root@10.1.2.6:2222``, ``[::1]:2222``)
with defaults user=root, port 22. A host name that is an alias in ``~/.ssh/config`` gets its
HostName, User, Port, IdentityFile and ProxyJump unless the inventory or ``--host`` sets them
(opsctl/config/sshconfig.py). Any other name (in no inventory, named by no ``~/.ssh/config``
``Host`` line, not an IP address, not ``localhost``) is an error before any lookup: opsctl
never asks DNS about a name nobody configured.
"""

from __future__ import annotations

import re
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from opsctl.config import addresses, paths, sshconfig, yamlfile
from opsctl.config import ctid as ctid_rule
from opsctl.config.addresses import check_address, check_port
from opsctl.errors import ConfigError
from remote_payload import wire

DEFAULT_ROOT = wire.DEFAULT_ROOT

#: How a command enters the target (``opsctl/remote/entry.py`` has one entry per value):
#: ``pct``: ``pct exec`` into an LXC container of a Proxmox host; ``direct``: on the SSH
#: host itself, which is then the one target (no container id).
EnterKind = t.Literal["direct", "pct"]
ENTER_KINDS: tuple[str, ...] = t.get_args(EnterKind)

#: The container id a direct host's one target carries inside opsctl (jobs, state, fleet
#: rows): outside the Proxmox range, so it is never a container pct could be asked about.
DIRECT_CTID = 0

#: Fields that only mean something for ``enter: pct`` (a direct host given one is refused,
#: so a half-converted entry never silently keeps a Proxmox setting that does nothing).
PCT_ONLY_FIELDS = ("containers", "sudo", "pct_path", "node")


class ContainerSpec(BaseModel):
    """One LXC container of a host, by its Proxmox id."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    # strict: YAML's `true` is no count (lax pydantic would read it as 1)
    gpus: int = Field(default=0, ge=0, le=1024, strict=True, description="how many GPUs the container has")
    description: str | None = Field(default=None, description="one line for `opsctl hosts`")
    playbook: str | None = Field(default=None, description=(
        "what `opsctl deploy` runs here when `--playbook` is not given"))
    notify: list[str] = Field(default_factory=list, description=(
        "webhooks for every job here, before the host's and the playbook's (guide/babysitting.md)"))

    @field_validator("notify")
    @classmethod
    def _notify_urls(cls, v: list[str]) -> list[str]:
        return wire.check_notify_urls(v)
    socket_ifname: str | None = Field(default=None, pattern=r"^\^?=?[A-Za-z0-9_.:@,-]{1,64}$", description=(
        "multi-node runs: the network interface NCCL and gloo use (`NCCL_SOCKET_IFNAME`, "
        "`GLOO_SOCKET_IFNAME`) and whose address the rendezvous announces; wins over the host's"))


class HostSpec(BaseModel):
    """One host reached over SSH: a Proxmox node whose LXC containers are the targets
    (``enter: pct``), or a plain server that is the target itself (``enter: direct``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    name: str = Field(default="", description=(
        "set from the key under `hosts:` (written in the file, it is replaced)"))
    address: str = Field(description="an IP address, a DNS name or an `~/.ssh/config` alias")
    port: int = Field(default=22, ge=1, le=65535, strict=True, description="SSH port")
    # the pattern: as ``user@`` of ``--host`` takes it, never an ssh option (``-oProxyCommand``)
    user: str = Field(default="root", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$", description=(
        "SSH user; on a pct host a non-root one needs `sudo: true` and one sudoers line (a "
        "direct host needs neither)"))
    identity_file: str | None = Field(default=None, description="the SSH private key (`~` expands)")
    proxy_jump: str | None = Field(default=None, description=(
        "OpenSSH ProxyJump: `[user@]host[:port][,…]`, hops in order"))
    known_hosts: str | None = Field(default=None, description=(
        "the known_hosts file the host key is checked against; null: `~/.ssh/known_hosts`"))
    host_key_fingerprint: str | None = Field(default=None, description=(
        "`SHA256:…`: the host key pinned, checked on every connect (`opsctl host trust`)"))
    enter: EnterKind = Field(default="pct", description=(
        "how a command enters the target: `pct` (`pct exec` into the LXC container `--ct` "
        "names) or `direct` (on this SSH host itself: a bare-metal server or a VM, no `--ct`, "
        "no Proxmox; [direct hosts](#direct-hosts))"))
    target: ContainerSpec | None = Field(default=None, description=(
        "`enter: direct` only: the host's one target, as a container entry is for `pct` "
        "(`gpus`, `playbook`, `notify`, `socket_ifname`)"))
    sudo: bool = Field(default=False, description="run pct, and only pct, with `sudo -n` (non-root user)")
    pct_path: str = Field(default="/usr/sbin/pct", description=(
        "the pct the sudoers rule allows (the rule: docs, Host requirements); used with sudo"))
    node: str | None = Field(default=None, description="the Proxmox node name (informational)")
    root: str = Field(default=DEFAULT_ROOT, pattern=r"^/[^\x00\n]*$", description=(
        "opsctl's directory inside the containers (a direct host: on the host itself; a "
        "non-root user needs one it owns); an absolute path"))
    # finite and bounded: `.inf` reached int() in the connect call (OverflowError)
    connect_timeout_s: float = Field(default=10.0, gt=0, le=600, allow_inf_nan=False, description=(
        "seconds to wait for the SSH connection"))
    containers: dict[int, ContainerSpec] = Field(default_factory=dict, description=(
        "the host's containers by Proxmox id (100-999999999)"))
    torch_builds: dict[str, t.Any] | None = Field(default=None, description=(
        "this host's overrides of the torch builds table, by variant, field by field (a mirror "
        "`index_url`, `wheelhouse: true`): [torch builds](#torch-builds)"))
    notify: list[str] = Field(default_factory=list, description="webhooks for every job on this host")

    @field_validator("notify")
    @classmethod
    def _notify_urls(cls, v: list[str]) -> list[str]:
        return wire.check_notify_urls(v)
    socket_ifname: str | None = Field(default=None, pattern=r"^\^?=?[A-Za-z0-9_.:@,-]{1,64}$", description=(
        "multi-node runs: the network interface of this host's containers (a container's wins)"))

    @field_validator("containers")
    @classmethod
    def _container_ids(cls, v: dict[int, ContainerSpec]) -> dict[int, ContainerSpec]:
        for ctid in v:  # the one rule (opsctl/config/ctid.py), as for --ct
            if not ctid_rule.MIN_CTID <= ctid <= ctid_rule.MAX_CTID:
                raise ValueError(f"container id {ctid} is not valid: Proxmox ids are "
                                 f"{ctid_rule.RANGE_TEXT}")
        return v

    @field_validator("address")
    @classmethod
    def _address_is_a_host(cls, v: str) -> str:
        try:
            return check_address(v, what="address")
        except ConfigError as exc:
            raise ValueError(exc.message.removeprefix("address: ")) from None

    @model_validator(mode="after")
    def _one_kind(self) -> HostSpec:
        if self.enter == "direct":
            mixed = [f for f in PCT_ONLY_FIELDS if f in self.model_fields_set]
            if mixed:
                raise ValueError(f"enter: direct runs commands on the host itself, so "
                                 f"{', '.join(mixed)} (for pct and its containers) does not "
                                 "apply: remove it, or give the one target as `target:`")
        elif "target" in self.model_fields_set:
            raise ValueError("target: is the one target of an `enter: direct` host; a pct "
                             "host lists its containers under containers:")
        return self

    @property
    def direct(self) -> bool:
        """Commands run on the SSH host itself (no container, no pct)."""
        return self.enter == "direct"

    def targets(self) -> dict[int, ContainerSpec]:
        """The targets the inventory lists, by container id (a direct host: its one target,
        as :data:`DIRECT_CTID`)."""
        if self.direct:
            return {DIRECT_CTID: self.target or ContainerSpec()}
        return dict(self.containers)

    def target_spec(self, ctid: int) -> ContainerSpec | None:
        """What the inventory says of target ``ctid`` (None: nothing)."""
        return self.targets().get(ctid)

    def target_label(self, ctid: int) -> str:
        """How errors and reports name a target: ``pve1 ct 200``, or a direct host's name."""
        return self.label if self.direct else f"{self.label} ct {ctid}"

    @property
    def label(self) -> str:
        return self.name or self.address

    def known_hosts_path(self) -> Path:
        """The known_hosts file this host's key is checked against (direct and mux alike)."""
        return addresses.known_hosts_path(self.known_hosts)

    def notify_urls(self, ctid: int) -> list[str]:
        """Webhooks for a job in container ``ctid``: the container's, then the host's."""
        ct = self.target_spec(ctid)
        return list(dict.fromkeys([*(ct.notify if ct else []), *self.notify]))

    def ssh_label(self) -> str:
        return addresses.ssh_label(self.user, self.address, self.port)


class InventoryFile(BaseModel):
    """One inventory file: hosts, groups of them, and torch build overrides."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    hosts: dict[str, HostSpec] = Field(default_factory=dict, description="hosts by name (`--host NAME`)")
    groups: dict[str, list[str]] = Field(default_factory=dict, description=(
        "named sets of host names, for fleet commands (`opsctl status --all --host GROUP`)"))
    torch_builds: dict[str, t.Any] | None = Field(default=None, description=(
        "overrides of the torch builds table for every host, by variant, field by field: "
        "[torch builds](#torch-builds)"))


@dataclass(frozen=True)
class Inventory:
    hosts: dict[str, HostSpec]
    sources: tuple[str, ...]  # files read, in lookup order
    torch_builds: dict[str, t.Any]
    origins: dict[str, str] = field(default_factory=dict)  # host name -> the file defining it
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # group -> host names
    searched: tuple[str, ...] = ()  # the directories read, in lookup order (for errors)

    def select(self, pattern: str | None) -> list[str]:
        """Host names for a fleet command: every host, a group's members, or a glob on names.

        A name that is a group selects its members (in the group's order); anything else is a
        shell-style pattern (``fnmatch``: ``gpu-*``, ``pve[12]``) matched against host names.

        Raises:
            ConfigError: a group names a host the inventory does not define, or nothing matches.
        """
        import fnmatch

        if pattern is None:
            return sorted(self.hosts)
        if pattern in self.groups:
            unknown = [h for h in self.groups[pattern] if h not in self.hosts]
            if unknown:
                raise ConfigError(f"inventory group {pattern!r} names unknown hosts: "
                                  f"{', '.join(unknown)}",
                                  hint=f"known hosts: {', '.join(sorted(self.hosts)) or '(none)'}")
            return list(self.groups[pattern])
        names = sorted(h for h in self.hosts if fnmatch.fnmatchcase(h, pattern))
        if not names:
            raise ConfigError(f"no inventory host or group matches {pattern!r}",
                              hint=f"hosts: {', '.join(sorted(self.hosts)) or '(none)'}; groups: "
                                   f"{', '.join(sorted(self.groups)) or '(none)'}")
        return names

    def resolve(self, host: str, *, configured: bool = False) -> HostSpec:
        """An inventory name, or a bare ``[user@]address[:port]``.

        A name that is not an IP address must be configured somewhere: an inventory host's
        name or ``address``, or an ``~/.ssh/config`` ``Host`` (:func:`.sshconfig.configures`),
        or ``localhost``. Nothing is looked up in DNS here, and an unknown name never reaches
        ssh (which would). ``configured``: the text itself comes from a configuration (a
        ProxyJump hop the inventory or ``~/.ssh/config`` names), so any host name is fine.

        Raises:
            ConfigError: neither a known name nor an address; the message names the
                inventory directories searched.
        """
        if host in self.hosts:
            spec = self.hosts[host]
            return _with_ssh_config(spec, spec.model_fields_set)
        m = _BARE.fullmatch(host)
        if m is None:
            raise self._unknown(host)
        address = check_address(m["bracketed"] or m["address"], what=f"--host {host!r}")
        port = None if m["port"] is None else check_port(m["port"], what=f"--host {host!r}")
        by_address = [h for h in self.hosts.values()
                      if h.address == address and (port is None or port == h.port)]
        if not (configured or by_address or _is_ip(address) or address == "localhost"
                or any(h.address == address for h in self.hosts.values())
                or sshconfig.configures(address)):
            raise self._unknown(host)
        if by_address:
            # the inventory's host at that address, as another user if one is given: still
            # its kind of target (a direct host is never sent `pct exec`), root and keys
            spec = by_address[0]
            if m["user"] is None:
                return _with_ssh_config(spec, spec.model_fields_set)
            spec = spec.model_copy(update={"name": host, "user": m["user"]})
            return _with_ssh_config(spec, spec.model_fields_set | {"user"})
        given: dict[str, t.Any] = {"name": host, "address": address}
        if m["user"] is not None:
            given["user"] = m["user"]
        if port is not None:
            given["port"] = port
        return _with_ssh_config(HostSpec(**given), given)


    def _unknown(self, host: str) -> ConfigError:
        searched = ", ".join(self.searched) or "(no inventory directory)"
        known = ", ".join(sorted(self.hosts)) or "(none)"
        return ConfigError(f"unknown host {host!r}: not in the inventory and not an address "
                           f"(inventories searched: {searched}; not named in ~/.ssh/config); "
                           "nothing was looked up",
                           hint=f"known hosts: {known}; add it to ~/.opsctl/inventory/hosts.yaml "
                                "(`opsctl hosts --example`) or pass an address like 10.1.2.6")


def _is_ip(address: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


# [user@]address[:port]; address is a host name, an IPv4 address, or a bracketed IPv6/IPv4
# address (``[::1]:2222``, ``[127.0.0.1]:2222`` as known_hosts and host-key hints write it).
_BARE = re.compile(r"(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]*)@)?"
                   r"(?:\[(?P<bracketed>[0-9A-Fa-f:.]+)\]|(?P<address>[A-Za-z0-9_.-]+))"
                   r"(?::(?P<port>[0-9]{1,8}))?")


def _with_ssh_config(spec: HostSpec, explicit: t.Collection[str]) -> HostSpec:
    """``spec`` with what ``~/.ssh/config`` says for its address filled into unset fields."""
    updates = sshconfig.overrides(spec.address, explicit)
    return spec.model_copy(update=updates) if updates else spec


def load(dirs: t.Sequence[Path] | None = None) -> Inventory:
    """Read every ``*.yaml`` inventory file.

    Raises:
        ConfigError: a file is not valid (message names file, line and field).
    """
    hosts: dict[str, HostSpec] = {}
    origins: dict[str, str] = {}
    builds: dict[str, t.Any] = {}
    groups: dict[str, tuple[str, ...]] = {}
    searched = list(dirs if dirs is not None else paths.inventory_dirs())
    files = [path for d in searched if d.is_dir() for path in sorted(d.glob("*.yaml"))]
    for path in reversed(files):  # read last first, so that the first definition wins
        data, lines = yamlfile.load(path)
        parsed = yamlfile.validate(InventoryFile, data or {}, path, lines)
        for name, spec in parsed.hosts.items():
            hosts[name] = spec.model_copy(update={"name": name})
            origins[name] = str(path)
        groups.update({name: tuple(members) for name, members in parsed.groups.items()})
        for variant, row in (parsed.torch_builds or {}).items():
            if isinstance(row, dict) and isinstance(builds.get(variant), dict):
                builds[variant] = {**builds[variant], **row}
            else:
                builds[variant] = row
    return Inventory(hosts=hosts, sources=tuple(str(p) for p in files), torch_builds=builds,
                     origins=origins, groups=groups, searched=tuple(map(str, searched)))
