"""Webhooks from the container (``remote_payload/agent/notify.py``), against real HTTP servers
on 127.0.0.1: one URL that accepts and never answers, one that answers, one that says 500.

The rule: one silent URL never holds a later event back, the answering URL gets every event
(``healthy`` too), and ``notify.log`` has a line for every event dropped.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import typing as t
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload import wire
from remote_payload.agent import notify
from tests.waiting import wait_for

SECRET = "s3cr3t-T0KEN"


class Answering:
    """Keeps every JSON body POSTed to it; answers ``status``."""

    def __init__(self, status: int = 204) -> None:
        self.bodies: list[dict[str, t.Any]] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.bodies.append(json.loads(data))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: t.Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/{SECRET}?token={SECRET}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[str]:
        return [b["event"] for b in self.bodies]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Silent:
    """Accepts every connection and reads the request, never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://user:{SECRET}@127.0.0.1:{self.sock.getsockname()[1]}/x?key={SECRET}"
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.held.append(conn)

    def close(self) -> None:
        self.stop.set()
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def answering() -> t.Iterator[Answering]:
    server = Answering()
    yield server
    server.close()


@pytest.fixture
def silent() -> t.Iterator[Silent]:
    server = Silent()
    yield server
    server.close()


def doc(event: str) -> dict[str, t.Any]:
    return notify.body(event, spec={"job_id": "j-1", "name": "n", "target": {"host": "h", "ct": 200}},
                       status={"state": "RUNNING"})


def log_lines(job_dir: Path) -> list[str]:
    path = job_dir / notify.LOG
    return path.read_text().splitlines() if path.exists() else []


def wait_until(pred: t.Callable[[], bool], timeout: float) -> bool:
    return bool(wait_for(pred, timeout, interval=0.05))


def test_one_silent_webhook_never_blocks_the_others(tmp_path, silent, answering, monkeypatch):
    monkeypatch.setattr(notify, "TIMEOUT_S", 30.0)  # the silent URL holds its worker all along
    sender = notify.Notifier([silent.url, answering.url], str(tmp_path))
    for event in ("healthy", "restart", "failed"):
        sender.send(doc(event))
    assert wait_until(lambda: len(answering.bodies) == 3, 10), answering.events()
    assert answering.events() == ["healthy", "restart", "failed"]  # every event, in order
    assert answering.bodies[0] == {**doc("healthy"), "at": answering.bodies[0]["at"]}  # unchanged
    started = time.monotonic()
    sender.drain(timeout=1.0)
    assert time.monotonic() - started < 3, "drain is bounded"
    lines = log_lines(tmp_path)
    for event in ("healthy", "restart", "failed"):
        assert any(f"gave up on {event} to webhook 1 (http://127.0.0.1:" in ln for ln in lines), lines
        assert any(f"sent {event} to webhook 2" in ln for ln in lines), lines
    assert not any(SECRET in ln for ln in lines), lines


def test_a_silent_webhook_gives_up_each_event_within_its_budget(tmp_path, silent, monkeypatch):
    monkeypatch.setattr(notify, "BUDGET_S", 1.0)
    started = time.monotonic()
    assert notify.post(silent.url, doc("failed"), str(tmp_path)) is False
    assert time.monotonic() - started < 2.5
    give_ups = [ln for ln in log_lines(tmp_path) if "gave up on failed" in ln]
    assert len(give_ups) == 1 and "1 s for this event are spent" in give_ups[0], log_lines(tmp_path)
    assert not any(SECRET in ln for ln in log_lines(tmp_path))


def test_an_http_error_is_retried_then_one_give_up_line(tmp_path, monkeypatch):
    monkeypatch.setattr(notify, "RETRY_PAUSE_S", 0.01)
    server = Answering(status=500)
    try:
        assert notify.post(server.url, doc("hang"), str(tmp_path)) is False
    finally:
        server.close()
    assert len(server.bodies) == notify.TRIES
    lines = log_lines(tmp_path)
    gave_up = [ln for ln in lines if "gave up" in ln]
    assert len(gave_up) == 1, lines
    assert gave_up[0].endswith(f"gave up on hang to {notify.redact(server.url)}: HTTP 500 "
                               f"({notify.TRIES} tries)")


def test_a_full_queue_is_a_give_up_line_per_event(tmp_path, silent, monkeypatch):
    monkeypatch.setattr(notify, "QUEUE_MAX", 2)
    monkeypatch.setattr(notify, "TIMEOUT_S", 30.0)
    sender = notify.Notifier([silent.url], str(tmp_path))
    for event in ("healthy", "restart", "hang", "failed"):
        sender.send(doc(event))
    full = [ln for ln in log_lines(tmp_path) if "queue full" in ln]
    assert [ln.split(" gave up on ")[1].split(" ")[0] for ln in full] == ["hang", "failed"]
    sender.drain(timeout=0.2)
    assert sum("gave up on" in ln for ln in log_lines(tmp_path)) == 4  # every event, once


def test_the_lost_sender_process_gives_up_in_bounded_time_and_says_so(tmp_path, silent, answering,
                                                                      monkeypatch):
    monkeypatch.setattr(notify, "LOST_DRAIN_S", 1.0)
    monkeypatch.setattr(notify, "TIMEOUT_S", 30.0)
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(
        {"urls": [silent.url, answering.url], "body": doc("lost")}).encode())))
    started = time.monotonic()
    assert notify.main([str(tmp_path)]) == 0
    assert time.monotonic() - started < 3
    assert answering.events() == ["lost"]
    assert any("gave up on lost to webhook 1" in ln for ln in log_lines(tmp_path))


# --- what a log may show of a URL --------------------------------------------------------

urls = st.builds(
    lambda scheme, user, host, port, path, query: (
        f"{scheme}://{user + '@' if user else ''}{host}{':' + str(port) if port else ''}/{path}"
        f"{'?' + query if query else ''}"),
    st.sampled_from(["http", "https"]),
    st.text("abcXYZ019:-._~", max_size=12),
    st.sampled_from(["127.0.0.1", "hooks.example.com", "[::1]", "h"]),
    st.one_of(st.none(), st.integers(1, 65535)),
    st.text("abcXYZ019-._~/", max_size=30),
    st.text("abcXYZ019-._~=&", max_size=30))


@settings(max_examples=200, deadline=None)
@given(url=urls, secret=st.text("QWERTYUPKJHGFDSZXVNM", min_size=6, max_size=12))
def test_a_logged_url_never_shows_its_path_query_or_password(url, secret):
    base, _, tail = url.partition("://")
    host_part, _, rest = tail.partition("/")
    with_secret = f"{base}://{secret}:{secret}@{host_part.rpartition('@')[2]}/{secret}/{rest}?t={secret}"
    shown = notify.redact(with_secret)
    assert secret not in shown
    assert shown.startswith(base + "://")
    assert secret not in notify._scrub(f"URLError: cannot reach {with_secret}", with_secret)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=80))
def test_any_text_as_a_notify_url_is_a_yes_or_no_never_a_traceback(text):
    ok = wire.valid_notify_url(text)
    assert isinstance(ok, bool)
    if ok:
        notify.redact(text)  # and a valid URL can always be shown
        assert text.split(":")[0].lower() in ("http", "https")
