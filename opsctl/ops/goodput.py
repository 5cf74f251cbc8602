"""Fetch a run's goodput ledger: the agent's ``goodput`` verb, checked against its wire shape.

The operation behind ``opsctl goodput``; no click, no rich.
"""

from __future__ import annotations

from opsctl.remote.agent_client import Agent
from remote_payload.wire_shapes import GoodputDoc


def fetch(agent: Agent, run: str | None) -> GoodputDoc:
    """The ledger of ``run`` (a job id or prefix, a ``--run-id``, an out-dir; default: the
    current job's run).

    Raises:
        AgentError: e.g. ``NoSuchJob``; an agent without the verb answers ``UsageError``.
        ReplyShapeError: the reply is not a :class:`GoodputDoc`.
    """
    args = ["--run", run] if run else []
    return agent.call("goodput", *args, timeout=120)
