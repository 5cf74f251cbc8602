"""Remember the last target (host, container, job) so `opsctl status` needs no flags.

A multi-node deploy (``--nodes``) also records its node list (``HOST:CT`` strings, node 0
first; ``host``/``ctid`` are node 0's), so ``status`` and ``stop`` without flags address every
node of that run.

The name is remembered with what it resolved to (``user@address[:port]``, and each node's):
a later ``./inventory`` (or ``~/.ssh/config``) that defines the same name elsewhere does not
silently redirect a flagless ``status``/``stop``: :func:`check_address` refuses, naming both,
and the user says which with ``--host``/``--ct``.
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

from opsctl.config import paths
from opsctl.errors import ConfigError, LocalWriteError
from remote_payload import boundedread, safe_write

#: the most bytes of ``last-target.json`` read (64 nodes of names and addresses are ~20 KiB)
MAX_BYTES = 1 << 20


class LastTarget(t.NamedTuple):
    host: str
    ctid: int
    job_id: str | None = None
    nodes: tuple[str, ...] = ()  # a multi-node run's HOST:CT list, node 0 first
    #: what ``host`` resolved to at the deploy (``user@address[:port]``); None: not known
    address: str | None = None
    node_addresses: tuple[str, ...] = ()  # the same, per node of ``nodes``


def path() -> Path:
    """Where the last target is kept."""
    return paths.home() / "last-target.json"


def save(target: LastTarget) -> None:
    """Remember ``target`` (:func:`remote_payload.safe_write.write_text`: whole or not at all).

    Raises:
        LocalWriteError: opsctl's home cannot be written (a link there, full, read-only).
    """
    try:
        safe_write.write_text(path(), json.dumps(target._asdict()), make_parents=True)
    except safe_write.DestinationError as exc:
        raise LocalWriteError.of(exc) from None


def load() -> LastTarget | None:
    """What :func:`save` wrote; None for anything else there: missing, damaged, a link (never
    one :func:`save` made), a FIFO or a device (never waited on or read without end), larger
    than :data:`MAX_BYTES`, a ``ctid`` that is not a whole number."""
    try:
        data = json.loads(boundedread.read_text(path(), MAX_BYTES))
        nodes = data.get("nodes") or ()
        address = data.get("address")
        if type(data["ctid"]) is not int:  # 1e400, true, "200": not what save() writes
            raise TypeError(data["ctid"])
        return LastTarget(host=str(data["host"]), ctid=data["ctid"], job_id=data.get("job_id"),
                          nodes=tuple(str(n) for n in nodes),
                          address=None if address is None else str(address),
                          node_addresses=tuple(str(a) for a in data.get("node_addresses") or ()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remembers_run() -> bool:
    """The last deploy was a multi-node run (``deploy --nodes``): a command given no target
    addresses the whole run, not one container."""
    last = load()
    return last is not None and bool(last.nodes)


def resolve(host: str | None, ctid: int | None) -> LastTarget:
    """Explicit flags win; otherwise the last deploy's target. A host taken from memory comes
    with the address it resolved to then (``address``), for :func:`check_address`.

    Raises:
        ConfigError: nothing given and nothing remembered.
    """
    last = load()
    remembered = None
    if host is None and last is not None:
        host, remembered = last.host, last.address
    if ctid is None and last is not None and host == last.host:
        ctid = last.ctid
    if host is not None and ctid is None:  # a host named, not the remembered one
        other = f"; the remembered target is on {last.host}" if last is not None else ""
        raise ConfigError(f"no container: --host {host} is a Proxmox host, so --ct says which "
                          f"of its containers{other}", hint=f"e.g. --host {host} --ct 200")
    if host is None or ctid is None:
        raise ConfigError("no target: pass --host and --ct (nothing remembered from a deploy yet)",
                          hint="e.g. opsctl status --host sandbox --ct 200")
    job = last.job_id if last is not None and ((last.host, last.ctid) == (host, ctid)
                                               or f"{host}:{ctid}" in last.nodes) else None
    return LastTarget(host=host, ctid=ctid, job_id=job, address=remembered)


def check_address(name: str, remembered: str | None, now: str, origin: str | None = None) -> None:
    """Refuse a remembered target whose name now resolves somewhere else.

    Raises:
        ConfigError: ``remembered`` (what ``name`` resolved to at the deploy) differs from
            ``now``; nothing was contacted.
    """
    if remembered is None or remembered == now:
        return
    where = f" ({origin})" if origin else ""
    raise ConfigError(f"the remembered target {name!r} was {remembered} at the last deploy, but "
                      f"{name!r} now resolves to {now}{where}; not following the new definition "
                      "silently", hint=f"say which: --host {name} (as defined now) or --host "
                                       f"{remembered}, with --ct")
