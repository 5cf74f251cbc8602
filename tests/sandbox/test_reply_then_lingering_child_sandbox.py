"""A verb that has answered is answered: an agent that prints its one reply line and exits,
leaving a forked child that holds its stdout open, is reported by its reply within a short
grace (:data:`opsctl.remote.channel.EXIT_GRACE_S`), never as "did not answer" at the verb's
deadline, whether the command goes over its own connection or through the multiplexer."""

from __future__ import annotations

import time

import pytest

from opsctl.config import inventory as inventory_mod
from opsctl.remote import channel
from opsctl.remote import mux_client as mux
from opsctl.remote.transport import Remote
from tests.cli_runner import run_cli as run
from tests.fake_agent import plant_agent
from tests.sandbox_plugin import use_private_root

pytestmark = pytest.mark.sandbox
T = ["--host", "sandbox", "--ct", "200"]
ROOT = "/opt/opsctl-reply-linger"
#: answers (a typed error reply), exits, and leaves a child holding stdout for a while
LINGER = ("import os, time\n"
          "print('{\"ok\": false, \"verb\": \"status\", \"agent_version\": 1, "
          "\"error\": {\"type\": \"NoSuchJob\", \"message\": \"no job named lingerer\"}}', "
          "flush=True)\n"
          "if os.fork() == 0:\n    time.sleep(40)\n")


def _start_mux(spec: inventory_mod.HostSpec) -> None:
    """One direct command leaves a mux behind; wait until it answers."""
    with Remote(spec) as r:
        r.pct_exec(200, ["true"], timeout=30)
    assert mux.wait_ready(spec, 30), "no mux answered after a direct command"


@pytest.mark.parametrize("mux_on", ["0", "1"], ids=["direct", "mux"])
def test_a_reply_followed_by_a_child_holding_stdout_is_used_within_the_grace(
        sandbox, isolated_env, monkeypatch, mux_on):
    use_private_root(sandbox, isolated_env, ROOT)
    monkeypatch.setenv("OPSCTL_MUX", mux_on)
    plant_agent(ROOT, LINGER)
    if mux_on == "1":
        _start_mux(inventory_mod.load().resolve("sandbox"))
    try:
        start = time.monotonic()
        res = run("status", *T)
        took = time.monotonic() - start
    finally:
        mux.stop_all()
    assert "Traceback" not in res.output
    assert "did not answer" not in res.output, res.output
    assert "no job named lingerer" in res.output, res.output
    assert took < 10 + channel.EXIT_GRACE_S, (took, res.output)


@pytest.mark.parametrize("via", ["ssh", "mux"])
def test_a_command_that_exited_is_ended_by_the_grace_and_says_so(target, monkeypatch, via):
    monkeypatch.setenv("OPSCTL_MUX", "1" if via == "mux" else "0")
    monkeypatch.setenv("OPSCTL_MUX_IDLE_S", "20")
    spec = inventory_mod.load().resolve(target)
    try:
        if via == "mux":
            _start_mux(spec)
        start = time.monotonic()
        with Remote(spec, use_mux=via == "mux") as r:
            res = r.pct_exec(200, ["sh", "-c", "echo answered; sleep 30 &"], timeout=30)
        took = time.monotonic() - start
    finally:
        mux.stop_all()
    assert (res.via, res.rc, res.stdout) == (via, 0, b"answered\n"), res
    assert res.stderr.endswith(channel.LINGERED), res.stderr
    assert took < 10 + channel.EXIT_GRACE_S, took
