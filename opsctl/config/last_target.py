"""Remember the last target (host, container, job) so `opsctl status` needs no flags.

A multi-node deploy (``--nodes``) also records its node list (``HOST:CT`` strings, node 0
first; ``host``/``ctid`` are node 0's), so ``status`` and ``stop`` without flags address every
node of that run.
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

from opsctl.config import paths
from opsctl.errors import ConfigError


# A NamedTuple, not a dataclass: `dataclasses` imports `inspect`, and every `status` starts
# here (docs/benchmarks.md).
class LastTarget(t.NamedTuple):
    host: str
    ctid: int
    job_id: str | None = None
    nodes: tuple[str, ...] = ()  # a multi-node run's HOST:CT list, node 0 first


def path() -> Path:
    """Where the last target is kept."""
    return paths.home() / "last-target.json"


def save(target: LastTarget) -> None:
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(target._asdict()), encoding="utf-8")
    tmp.replace(p)


def load() -> LastTarget | None:
    try:
        data = json.loads(path().read_text(encoding="utf-8"))
        nodes = data.get("nodes") or ()
        return LastTarget(host=str(data["host"]), ctid=int(data["ctid"]), job_id=data.get("job_id"),
                          nodes=tuple(str(n) for n in nodes))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remembers_run() -> bool:
    """The last deploy was a multi-node run (``deploy --nodes``): a command given no target
    addresses the whole run, not one container."""
    last = load()
    return last is not None and bool(last.nodes)


def resolve(host: str | None, ctid: int | None) -> LastTarget:
    """Explicit flags win; otherwise the last deploy's target.

    Raises:
        ConfigError: nothing given and nothing remembered.
    """
    last = load()
    if host is None and last is not None:
        host = last.host
    if ctid is None and last is not None and host == last.host:
        ctid = last.ctid
    if host is None or ctid is None:
        raise ConfigError("no target: pass --host and --ct (nothing remembered from a deploy yet)",
                          hint="e.g. opsctl status --host sandbox --ct 200")
    job = last.job_id if last is not None and ((last.host, last.ctid) == (host, ctid)
                                               or f"{host}:{ctid}" in last.nodes) else None
    return LastTarget(host=host, ctid=ctid, job_id=job)
