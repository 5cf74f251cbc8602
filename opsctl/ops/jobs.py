"""A container's job: the resolved target, logs and stop (deploy: :mod:`.deploy`; status: :mod:`.watch`).

Kept free of click and rich so tests and other tools can call them directly.
"""

from __future__ import annotations

import base64
import time
import typing as t
from dataclasses import dataclass

from opsctl.config import inventory as inventory_mod
from opsctl.config import last_target as target_mod
from opsctl.config.inventory import HostSpec, Inventory
from opsctl.errors import ConfigError
from opsctl.remote.agent_client import Agent
from opsctl.remote.models import LogsChunk, StopResult
from opsctl.remote.transport import Remote

if t.TYPE_CHECKING:
    pass


@dataclass
class Target:
    """A resolved host + container, with its connection and agent."""

    name: str  # what the user typed (inventory name or address)
    host: HostSpec
    ctid: int
    remote: Remote
    agent: Agent
    inventory: Inventory  # loaded once per command, here

    @property
    def label(self) -> str:
        return f"{self.host.label} ct {self.ctid}"

    def close(self) -> None:
        self.remote.close()

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_target(host: str | None, ctid: int | None, *, accept_new_host_key: bool = False) -> Target:
    """Resolve flags (or the remembered target) to a :class:`Target`; connects lazily.

    Raises:
        ConfigError: unknown host, no target, or a container id the host does not list.
    """
    last = target_mod.resolve(host, ctid)
    inv = inventory_mod.load()
    spec = inv.resolve(last.host)
    if last.ctid < 100:
        raise ConfigError(f"container id {last.ctid} is not valid: Proxmox ids start at 100")
    remote = Remote(spec, accept_new_host_key=accept_new_host_key)
    return Target(last.host, spec, last.ctid, remote, Agent(remote, last.ctid, spec.root), inv)


# --- logs / stop ------------------------------------------------------------------------


def read_logs(tgt: Target, job_id: str | None, offset: int,
              max_bytes: int = 1 << 20) -> tuple[bytes, LogsChunk]:
    args = ["--offset", str(offset), "--max-bytes", str(max_bytes)]
    if job_id:
        args += ["--job", job_id]
    chunk = LogsChunk.model_validate(tgt.agent.call("logs", *args, timeout=30))
    return base64.b64decode(chunk.data_b64), chunk


def follow_logs(tgt: Target, job_id: str | None, write: t.Callable[[bytes], None], *,
                follow: bool, offset: int = 0, poll_s: float = 1.0) -> LogsChunk:
    """Stream output.log from ``offset``; with ``follow`` until the job ends.

    Bound to one job: without ``job_id`` the first chunk names the current job and
    every later read asks for it by id, so another job launched meanwhile is never
    spliced into this stream.
    """
    while True:
        data, chunk = read_logs(tgt, job_id, offset)
        job_id = chunk.job_id
        if data:
            write(data)
        offset = chunk.next_offset
        if not chunk.eof:
            continue
        if not follow or chunk.terminal:
            return chunk
        time.sleep(poll_s)


def stop(tgt: Target, job_id: str | None, grace_s: float) -> StopResult:
    args = ["--grace", f"{grace_s:g}"]
    if job_id:
        args += ["--job", job_id]
    return StopResult.model_validate(tgt.agent.call("stop", *args, timeout=grace_s + 30))
