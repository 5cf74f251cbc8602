"""``--nodes HOST:CT,HOST:CT,...``: the containers of one multi-node run, in rank order.

Node 0 hosts the run's c10d rendezvous store. ``HOST`` is whatever ``--host`` takes (an
inventory name or ``[user@]address[:port]``), so the container id is the text after the
*last* colon: ``admin@10.1.2.6:2222:200`` is port 2222, ct 200.
"""

from __future__ import annotations

from dataclasses import dataclass

from opsctl.config.ctid import parse_ctid
from opsctl.errors import ConfigError
from remote_payload import wire

MAX_NODES = wire.MAX_RUN_NODES  # far above any one cluster's GPU containers; a typo guard


@dataclass(frozen=True)
class NodeRef:
    """One node of a run: a host (as the user named it) and a container on it."""

    host: str
    ctid: int

    def __str__(self) -> str:
        return f"{self.host}:{self.ctid}"


def parse_nodes(text: str) -> tuple[NodeRef, ...]:
    """``"pve1:200,pve2:200"`` -> ``(NodeRef("pve1", 200), NodeRef("pve2", 200))``.

    Raises:
        ConfigError: an empty list or item, an item without ``:CT``, a container id that is
            not a Proxmox id (:mod:`opsctl.config.ctid`), the same node twice (as written;
            :func:`opsctl.ops.multinode.refuse_duplicates` catches one container named two
            ways), or more than :data:`MAX_NODES`.
    """
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ConfigError(f"--nodes {text!r}: give HOST:CT items separated by commas, "
                          "e.g. pve1:200,pve2:200")
    if len(items) > MAX_NODES:
        raise ConfigError(f"--nodes: {len(items)} nodes; at most {MAX_NODES}")
    nodes: list[NodeRef] = []
    for item in items:
        host, sep, ct = item.rpartition(":")
        if not sep or not host or not ct.isdigit() or not ct.isascii():
            raise ConfigError(f"--nodes: {item!r} is not HOST:CT (e.g. pve1:200)")
        ctid = parse_ctid(ct, what=f"--nodes: {item!r}")
        node = NodeRef(host, ctid)
        if node in nodes:
            raise ConfigError(f"--nodes: {item} is listed twice (one job per container)")
        nodes.append(node)
    return tuple(nodes)
