"""watch.wait: stops at healthy/terminal/timeout; connection errors back off and reconnect."""

from __future__ import annotations

import types
import typing as t

import pytest

from opsctl.errors import TransportError
from opsctl.ops import watch
from tests.replies import status_doc


class ScriptedAgent:
    """Replies scripted per call (pure-logic unit test: no remote involved)."""

    def __init__(self, replies: list[t.Any]):
        self.replies = list(replies)
        self.remote = self
        self.host = types.SimpleNamespace(label="h")  # what a reply's error names
        self.ctid = 200
        self.closed = 0

    def call(self, verb: str, *args: str, timeout: float = 0) -> t.Any:
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        self.closed += 1


def doc(state: str, healthy: bool = False) -> dict[str, t.Any]:
    return {**status_doc(), "job_id": "j", "state": state, "healthy": healthy}


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(watch.time, "sleep", lambda s: None)


def test_waiting_for_healthy_stops_at_the_first_healthy_status():
    agent = ScriptedAgent([doc("SETTING_UP"), doc("COMPILING"), doc("RUNNING", True), doc("RUNNING")])
    out = watch.wait(agent, "j", until="healthy", timeout_s=None)  # type: ignore[arg-type]
    assert (out.reason, out.status["state"], out.polls) == ("healthy", "RUNNING", 3)


def test_a_terminal_state_ends_any_wait():
    agent = ScriptedAgent([doc("RUNNING", True), doc("FAILED")])
    out = watch.wait(agent, "j", until="terminal", timeout_s=None)  # type: ignore[arg-type]
    assert (out.reason, out.status["state"]) == ("terminal", "FAILED")


def test_connection_errors_reconnect_and_the_watch_goes_on():
    seen: list[str | None] = []
    agent = ScriptedAgent([doc("SETTING_UP"), TransportError("connection lost"),
                           TransportError("connection lost"), doc("RUNNING", True)])
    out = watch.wait(agent, "j", until="healthy", timeout_s=None,  # type: ignore[arg-type]
                     on_update=lambda st, el, problem: seen.append(problem))
    assert out.reason == "healthy" and agent.closed == 2
    assert [p is not None for p in seen] == [False, True, True, False]
    assert "retrying in 0.5 s" in (seen[1] or "") and "retrying in 1 s" in (seen[2] or "")


def test_an_outage_longer_than_the_limit_is_raised(monkeypatch):
    clock = iter(range(0, 10_000, 50))
    monkeypatch.setattr(watch.time, "monotonic", lambda: float(next(clock)))
    agent = ScriptedAgent([TransportError("down")] * 10)
    with pytest.raises(TransportError):
        watch.wait(agent, "j", until="healthy", timeout_s=None)  # type: ignore[arg-type]
