"""`opsctl hosts [--check]` and `opsctl host trust`: inventory listing, reachability, keys."""

from __future__ import annotations

import time
import typing as t
from dataclasses import asdict, dataclass, field
from pathlib import Path

from opsctl.config import inventory
from opsctl.errors import HostKeyError, OpsctlError, TransportError
from opsctl.remote import knownhosts
from opsctl.remote.command import known_hosts_name
from opsctl.remote.transport import Remote, fingerprint, handshake_failure, load_known_hosts, words

if t.TYPE_CHECKING:
    from opsctl.remote.mux_client import MuxRow


@dataclass
class HostRow:
    name: str
    address: str
    port: int
    user: str
    containers: dict[int, int]  # ctid -> gpus (from the inventory)
    reachable: bool | None = None  # None: not checked
    latency_ms: float | None = None
    detail: str | None = None
    remote_containers: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, t.Any]:
        return asdict(self)


def _parse_pct_list(text: str) -> list[dict[str, str]]:
    rows = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2:
            rows.append({"vmid": parts[0], "status": parts[1], "name": parts[-1] if len(parts) > 2 else ""})
    return rows


def list_hosts(check: bool) -> list[HostRow]:
    inv = inventory.load()
    rows = []
    for name, spec in sorted(inv.hosts.items()):
        row = HostRow(name, spec.address, spec.port, spec.user,
                      {c: s.gpus for c, s in spec.targets().items()})
        if check:
            start = time.monotonic()
            try:
                resolved = inv.resolve(name)  # with ~/.ssh/config applied, as every command does
                quick = resolved.model_copy(
                    update={"connect_timeout_s": min(resolved.connect_timeout_s, 5)})
                with Remote(quick) as r:
                    if resolved.direct:  # no containers to list: the host is the target
                        res = r.run(["true"], timeout=10, step="connect")
                        row.reachable = True
                        row.latency_ms = round((time.monotonic() - start) * 1000, 1)
                        row.detail = ("direct host: the target is the host itself" if res.rc == 0
                                      else f"`true` failed (rc={res.rc}): {res.stderr_tail(1)}")
                        rows.append(row)
                        continue
                    res = r.run(["pct", "list"], timeout=10, step="pct list")
                row.reachable = True
                row.latency_ms = round((time.monotonic() - start) * 1000, 1)
                if res.rc == 0:
                    row.remote_containers = _parse_pct_list(res.stdout.decode("utf-8", "replace"))
                    row.detail = ", ".join(f"{c['vmid']}:{c['status']}" for c in row.remote_containers)
                else:
                    row.detail = f"pct list failed (rc={res.rc}): {res.stderr_tail(1)}"
            except OpsctlError as exc:
                row.reachable = False
                row.detail = exc.message
        rows.append(row)
    return rows


@dataclass(frozen=True)
class ShownKey:
    """The host key one connection presented: what `host trust` shows and then records."""

    spec: inventory.HostSpec
    key: t.Any  # paramiko.PKey
    fingerprint: str
    trusted: bool  # already in known_hosts

    @property
    def known_hosts_line(self) -> str:
        name = known_hosts_name(self.spec.address, self.spec.port)
        return f"{name} {self.key.get_name()} {self.key.get_base64()}"


def fetch_host_key(host: str) -> ShownKey:
    """Connect once (key exchange only, no login) and return the key the server presented.

    Raises:
        HostKeyError: the key differs from the one known_hosts has for the host (CHANGED),
            or from the inventory's pin.
        TransportError: the host cannot be reached.
    """

    import paramiko

    from opsctl.remote import liblog

    liblog.install()  # no paramiko traceback on stderr: the failure is raised, named, below

    spec = inventory.load().resolve(host)
    where = spec.ssh_label()
    remote = Remote(spec)
    gateway = remote._gateway()  # ProxyJump hops, each checked against known_hosts
    try:
        if gateway is not None:
            remote.open_hops()
            sock: t.Any = gateway.transport.open_channel(
                "direct-tcpip", (spec.address, spec.port), ("", 0))
        else:
            sock = Remote(spec)._dial()  # a peer that never speaks SSH is named as one
    except OpsctlError:
        raise
    except (OSError, paramiko.SSHException, EOFError) as exc:
        raise TransportError(f"cannot connect to {where}: "
                             f"{getattr(exc, 'strerror', None) or words(exc)}") from None
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=spec.connect_timeout_s)
        if not transport.initial_kex_done:  # start_client returns at its timeout regardless
            raise paramiko.SSHException("No existing session")
        key = transport.get_remote_server_key()
    except (paramiko.SSHException, EOFError) as exc:
        raise handshake_failure(spec, where, transport, exc) from None
    except OSError as exc:
        raise TransportError(f"cannot connect to {where}: {words(exc)}") from None
    finally:
        transport.close()
        if gateway is not None:
            gateway.close()
    fp = fingerprint(key)
    if spec.host_key_fingerprint is not None and fp != spec.host_key_fingerprint:
        raise HostKeyError(f"host key of {where} is {fp}, but the inventory pins "
                           f"{spec.host_key_fingerprint}",
                           hint="if the host was reinstalled, update host_key_fingerprint")
    kh = Path(spec.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()
    keys = paramiko.HostKeys()
    name = known_hosts_name(spec.address, spec.port)
    load_known_hosts(keys, kh, names=[name])
    known: t.Any = keys.lookup(name) or {}
    if key.get_name() in known and known[key.get_name()] != key:
        raise HostKeyError(
            f"host key of {where} CHANGED: known_hosts has "
            f"{fingerprint(known[key.get_name()])}, server sent {fp} — not recording it",
            hint=f"if the host was reinstalled: ssh-keygen -f {kh} -R '{name}', then "
                 f"`opsctl host trust --host {spec.label}`")
    return ShownKey(spec, key, fp, trusted=key.get_name() in known)


def record(shown: ShownKey) -> Path:
    """Append exactly the shown key to the host's known_hosts; returns the file.

    No second connection: a key swapped after it was shown is never recorded;
    the next connection then meets the recorded key and refuses a different one.
    """
    kh = Path(shown.spec.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()
    knownhosts.append(kh, shown.known_hosts_line,
                      what=f"the host key of {shown.spec.ssh_label()} ({shown.fingerprint})")
    return kh


def list_muxes() -> list[MuxRow]:
    """The live connection multiplexers of this OPSCTL_HOME (``opsctl mux status``)."""
    from opsctl.remote import mux_client

    return mux_client.list_muxes()


def stop_muxes() -> list[dict[str, t.Any]]:
    """Stop every live multiplexer (``opsctl mux stop``); the next command connects directly."""
    from opsctl.remote import mux_client

    return mux_client.stop_all()
