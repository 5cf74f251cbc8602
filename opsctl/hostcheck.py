"""`opsctl hosts [--check]` and `opsctl host trust`: inventory listing, reachability, keys."""

from __future__ import annotations

import time
import typing as t
from dataclasses import asdict, dataclass, field

from opsctl import inventory
from opsctl.errors import HostKeyError, OpsctlError
from opsctl.transport import Remote


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
                      {c: s.gpus for c, s in spec.containers.items()})
        if check:
            start = time.monotonic()
            try:
                quick = spec.model_copy(update={"connect_timeout_s": min(spec.connect_timeout_s, 5)})
                with Remote(quick) as r:
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


def fetch_fingerprint(host: str) -> tuple[str, bool]:
    """(fingerprint, already trusted). Connects without trusting an unknown key."""
    spec = inventory.load().resolve(host)
    try:
        with Remote(spec) as r:
            return r.server_fingerprint(), True
    except HostKeyError as exc:
        if "CHANGED" in exc.message:
            raise
    import paramiko

    sock_transport = paramiko.Transport((spec.address, spec.port))
    try:
        sock_transport.start_client(timeout=spec.connect_timeout_s)
        from opsctl.transport import fingerprint

        return fingerprint(sock_transport.get_remote_server_key()), False
    finally:
        sock_transport.close()


def trust(host: str) -> None:
    spec = inventory.load().resolve(host)
    with Remote(spec, accept_new_host_key=True) as r:
        r.server_fingerprint()
