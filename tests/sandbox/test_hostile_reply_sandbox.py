"""A hostile container's agent reply through the real transport (sshd, the pct stand-in, a
container): a reply without end is kept up to the cap and named, a reply with NaN and a key
carrying an escape sequence is one ``ReplyShapeError`` line, never a traceback or a raw escape.
The "agent" here is a shell script given as the container's python."""

from __future__ import annotations

import time

import pytest

from opsctl import errors
from opsctl.remote import shapes
from opsctl.remote.agent_client import Agent
from opsctl.remote.transport import Remote
from remote_payload.wire_shapes import StatusDoc
from tests.replies import _STATUS
from tests.sandbox.test_pct_host_sandbox import spec

pytestmark = pytest.mark.sandbox

FAKE = "/tmp/opsctl-hostile-agent"


def _fake_agent(r: Remote, script: str) -> Agent:
    res = r.pct_exec(200, ["sh", "-c", f'printf "%s" "$1" > {FAKE} && chmod +x {FAKE}',
                           "sh", f"#!/bin/sh\n{script}\n"], timeout=20)
    assert res.rc == 0, res.stderr
    return Agent(r, 200, python=FAKE)


def test_a_reply_without_end_is_kept_to_the_cap_and_named(sandbox, monkeypatch):
    monkeypatch.setenv("OPSCTL_REPLY_BYTES", "100000")
    with Remote(spec(sandbox), use_mux=False) as r:
        agent = _fake_agent(r, "head -c 20000000 /dev/zero | tr '\\0' a")
        start = time.monotonic()
        with pytest.raises(errors.RemoteCommandFailed,
                           match="over the 100000 bytes a reply may have") as exc:
            agent.call("status", timeout=60)
    assert exc.value.exit_code == 25 and time.monotonic() - start < 60


def test_a_reply_with_nan_and_an_escape_in_a_key_is_one_inert_reply_shape_error(sandbox):
    import json

    data = json.dumps({**_STATUS, "phase_budgets_s": {"\x1b]0;pwn\x07": 1}})
    reply = '{"ok": true, "verb": "status", "data": ' + data.replace('"elapsed_s": 0.0',
                                                                      '"elapsed_s": NaN') + "}"
    with Remote(spec(sandbox), use_mux=False) as r:
        agent = _fake_agent(r, "cat <<'EOF'\n" + reply + "\nEOF")
        doc = agent.call("status", timeout=30)
    with pytest.raises(errors.ReplyShapeError, match="elapsed_s: Input should be a finite number"):
        shapes.validate(StatusDoc, doc, where="sandbox ct 200: status")
    with pytest.raises(errors.ReplyShapeError) as exc:
        shapes.validate(StatusDoc, {**doc, "elapsed_s": 1.0, "phase_budgets_s": {"\x1b]0;pwn\x07": "x"}},
                        where="sandbox ct 200: status")
    assert "\x1b" not in exc.value.message and "\\x1b" in exc.value.message
