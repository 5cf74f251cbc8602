"""Run one container-agent verb as a subprocess, the way the transport does, and parse its reply.

The contract every caller checks here, once: exactly one JSON document on stdout, and the exit
status 0 for ``ok`` replies and ``wire.AGENT_ERROR_RC`` for error replies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

from remote_payload import wire

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class AgentRun:
    reply: dict[str, t.Any]
    stderr: str
    wall_s: float

    @property
    def data(self) -> t.Any:
        """The ``data`` of an ``ok`` reply (fails the test otherwise)."""
        assert self.reply["ok"] is True, self.reply
        return self.reply["data"]


def agent_env() -> dict[str, str]:
    """The test's environment for the agent: payload on PYTHONPATH, no tmux or pip settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("TMUX", "TMUX_PANE")}
    env["PYTHONPATH"] = str(REPO)
    return env


def run_agent(root: Path | str, verb: str, *args: str, python: str = sys.executable,
              tmux_socket: str | None = None, env: t.Mapping[str, str] | None = None,
              timeout: float = 120) -> AgentRun:
    """``python -m remote_payload.agent --root ROOT [--tmux-socket S] VERB ARGS --json``.

    ``env``: the whole environment instead of :func:`agent_env` (a test's fake tools on PATH).
    """
    argv = [python, "-m", "remote_payload.agent", "--root", str(root)]
    if tmux_socket is not None:
        argv += ["--tmux-socket", tmux_socket]
    t0 = time.monotonic()
    proc = subprocess.run([*argv, verb, *args, "--json"], capture_output=True, text=True,
                          env=dict(env) if env is not None else agent_env(), timeout=timeout, check=False)
    wall = time.monotonic() - t0
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"agent must print one JSON document, got {proc.stdout!r}, " \
                            f"stderr {proc.stderr[-2000:]!r}"
    reply = json.loads(lines[0])
    assert isinstance(reply, dict) and "ok" in reply, reply
    want_rc = 0 if reply["ok"] else wire.AGENT_ERROR_RC
    assert proc.returncode == want_rc, (proc.returncode, reply, proc.stderr[-2000:])
    if reply["ok"]:  # what the real agent answers, its shape (bounds and patterns) accepts
        from opsctl.remote.agent_client import check_reply

        check_reply(verb, reply["data"], where=f"agent {verb}")
    return AgentRun(reply, proc.stderr, wall)
