"""A host that accepts the TCP connection but never speaks SSH (says nothing, says garbage,
trickles bytes, hangs up) is named as such within its connect timeout, with the transport's
exit code, and nothing is consumed from a real server's banner (opsctl/remote/sshbanner.py).
Peers are loopback sockets run by the test."""

from __future__ import annotations

import json
import socket
import threading
import time
import typing as t
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from opsctl import errors
from opsctl.cli import cli
from opsctl.config.inventory import HostSpec
from opsctl.remote import sshbanner
from opsctl.remote.transport import Remote

Behaviour = t.Callable[[socket.socket], None]


class Peer:
    """A loopback TCP server that treats every connection with ``behaviour``."""

    def __init__(self, behaviour: Behaviour):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        try:
            self.behaviour(conn)
        except OSError:
            pass  # the client hung up: what it does next is the test's question

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for c in self.conns:
            c.close()
        self.thread.join(timeout=5)


def _mute(conn: socket.socket) -> None:
    time.sleep(30)  # scenario: the peer stays connected and says nothing more


def _http(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    time.sleep(30)  # scenario: the peer stays connected and says nothing more


def _trickle(conn: socket.socket) -> None:
    for _ in range(300):  # a byte every 0.1 s, never a newline: paramiko would wait forever
        conn.sendall(b"x")
        time.sleep(0.1)  # scenario: a byte every 0.1 s


def _flood(conn: socket.socket) -> None:
    conn.sendall(b"garbage line\n" * 2000)
    time.sleep(30)  # scenario: the peer stays connected and says nothing more


def _hang_up(conn: socket.socket) -> None:
    conn.close()


def _escape(conn: socket.socket) -> None:
    conn.sendall(b"\x1b]0;owned\x07\x1b[2J\r\n")  # a terminal's title and clear-screen
    time.sleep(30)  # scenario: the peer stays connected and says nothing more


@pytest.fixture
def peer(request: pytest.FixtureRequest) -> t.Iterator[Peer]:
    p = Peer(request.param)
    yield p
    p.close()


def _host(port: int, timeout_s: float = 1.0) -> HostSpec:
    return HostSpec(name="mute", address="127.0.0.1", port=port, connect_timeout_s=timeout_s)


def _connect(port: int, timeout_s: float = 1.0) -> tuple[errors.TransportError, float]:
    start = time.monotonic()
    with pytest.raises(errors.TransportError) as caught, \
            Remote(_host(port, timeout_s), use_mux=False) as remote:
        remote.run(["true"], timeout=5)
    return caught.value, time.monotonic() - start


@pytest.mark.parametrize("peer, why", [
    (_mute, "no SSH banner within 1 s"),
    (_http, "no SSH banner within 1 s; it sent b'HTTP/1.1 400 Bad Request"),
    (_trickle, "no SSH banner within 1 s; it sent b'x"),
    (_hang_up, "it closed the connection"),
], indirect=["peer"])
def test_a_peer_that_never_speaks_ssh_is_named_within_the_connect_timeout(peer, why):
    exc, took = _connect(peer.port)
    assert type(exc) is errors.TransportError and exc.exit_code == errors.TRANSPORT
    assert exc.message.startswith(f"host 127.0.0.1:{peer.port} accepted the connection but "
                                  f"never spoke SSH ({why}"), exc.message
    assert took < 3.0, f"bounded by the 1 s connect timeout, took {took:.1f} s"
    assert exc.hint and "port" in exc.hint


@pytest.mark.parametrize("peer", [_flood], indirect=True)
def test_kilobytes_of_garbage_are_refused_without_waiting_for_the_deadline(peer):
    exc, took = _connect(peer.port, timeout_s=20.0)
    assert "never spoke SSH (no SSH banner in its first 8192 bytes" in exc.message, exc.message
    assert took < 5.0, f"refused on the size bound, not the 20 s deadline: {took:.1f} s"


@pytest.mark.parametrize("peer", [_escape], indirect=True)
def test_what_the_peer_sent_is_shown_escaped_never_raw(peer):
    exc, _ = _connect(peer.port)
    assert "\x1b" not in exc.message and "\\x1b]0;owned" in exc.message, exc.message


def test_a_refused_connection_is_still_a_plain_connect_error():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed at the end of the block: nothing listens
    exc, took = _connect(port)
    assert exc.message == f"cannot connect to root@127.0.0.1:{port}: Connection refused"
    assert took < 3.0


def _status_of(port: int, home: Path) -> dict[str, t.Any]:
    """``opsctl status --json`` of ct 200 on a host at 127.0.0.1:``port``: its error document."""
    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"h": {
        "address": "127.0.0.1", "port": port, "connect_timeout_s": 1, "containers": {200: {}}}}}))
    res = CliRunner().invoke(cli, ["status", "--json", "--host", "h", "--ct", "200"])
    assert res.exit_code == errors.TRANSPORT, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), "no traceback"
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "TransportError"
    return t.cast(dict[str, t.Any], doc["error"])


@pytest.mark.parametrize("peer", [_mute], indirect=True)
def test_status_against_a_mute_host_is_one_error_document_with_exit_10(peer, isolated_env: Path):
    assert "accepted the connection but never spoke SSH" in _status_of(peer.port, isolated_env)["message"]


def test_status_against_a_dead_host_is_one_error_document_with_exit_10(isolated_env: Path):
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    assert _status_of(port, isolated_env)["message"].endswith("Connection refused")


def test_a_real_banner_is_seen_and_left_for_paramiko_to_read():
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"a greeting line first\r\nSSH-2.0-OpenSSH_9.2\r\n")
        sshbanner.wait_for_banner(a, 1.0, "pair")
        assert a.recv(100) == b"a greeting line first\r\nSSH-2.0-OpenSSH_9.2\r\n", "nothing consumed"


_LINE = st.binary(max_size=40).filter(lambda b: b"\n" not in b)


@given(lines=st.lists(_LINE.filter(lambda b: not b.startswith(b"SSH-")), max_size=6))
def test_a_banner_after_any_other_lines_is_a_banner(lines):
    pre = b"".join(line + b"\r\n" for line in lines)
    assert sshbanner.is_banner(pre + b"SSH-2.0-x\r\n")


@given(seen=st.binary(max_size=200))
def test_bytes_without_a_line_starting_ssh_are_never_a_banner(seen):
    starts = [line[:4] for line in seen.split(b"\n")]
    assert sshbanner.is_banner(seen) == (b"SSH-" in starts)


def _banner_then_silence(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
    time.sleep(30)  # scenario: the peer stays connected and says nothing more


def _banner_then_hang_up(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
    conn.close()


def _banner_then_garbage(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n" + b"\xff" * 64 + b"garbage\r\n" * 100)
    time.sleep(30)  # scenario: the peer stays connected and says nothing more


_AFTER_BANNER = [
    (_banner_then_silence, "did not complete the key exchange within 1 s"),
    (_banner_then_hang_up, "then closed the connection"),
    (_banner_then_garbage, "the key exchange failed (Invalid packet blocking)"),
]


@pytest.mark.parametrize("peer, then", _AFTER_BANNER, indirect=["peer"])
def test_a_peer_that_stops_after_its_banner_is_named_with_the_banner_it_sent(peer, then):
    exc, took = _connect(peer.port)
    assert exc.message == (f"host root@127.0.0.1:{peer.port} sent the SSH banner "
                           f"'SSH-2.0-OpenSSH_9.2' but {then}"), exc.message
    assert took < 3.0, f"bounded by the 1 s connect timeout, took {took:.1f} s"
    assert exc.hint


@pytest.mark.parametrize("peer, then", [
    (_mute, "never spoke SSH (no SSH banner within 1 s"), *_AFTER_BANNER], indirect=["peer"])
def test_host_trust_names_a_peer_that_never_finishes_the_handshake(peer, then, isolated_env: Path):
    from opsctl.ops.hosts import fetch_host_key

    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"h": {
        "address": "127.0.0.1", "port": peer.port, "connect_timeout_s": 1}}}))
    start = time.monotonic()
    with pytest.raises(errors.TransportError) as caught:
        fetch_host_key("h")
    assert then in caught.value.message and caught.value.message.startswith("host "), caught.value.message
    assert time.monotonic() - start < 3.0


def _status_behind_hop(hop_port: int, home: Path) -> tuple[dict[str, t.Any], float]:
    """``opsctl status --json`` of a target behind the ProxyJump hop 127.0.0.1:``hop_port``."""
    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"h": {
        "address": "127.0.0.1", "port": 22, "connect_timeout_s": 1,
        "proxy_jump": f"root@127.0.0.1:{hop_port}", "containers": {200: {}}}}}))
    start = time.monotonic()
    res = CliRunner().invoke(cli, ["status", "--json", "--host", "h", "--ct", "200"])
    took = time.monotonic() - start
    assert res.exit_code == errors.TRANSPORT, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), "no traceback"
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "TransportError"
    return t.cast(dict[str, t.Any], doc["error"]), took


@pytest.mark.parametrize("peer, why", [
    (_mute, "never spoke SSH (no SSH banner within 1 s)"),
    (_http, "never spoke SSH (no SSH banner within 1 s; it sent b'HTTP/1.1"),
    (_banner_then_hang_up, "sent the SSH banner 'SSH-2.0-OpenSSH_9.2' but then closed the connection"),
    (_banner_then_silence, "but did not complete the key exchange within 1 s"),
], indirect=["peer"])
def test_a_proxyjump_hop_that_fails_the_handshake_is_named_as_the_hop_within_the_target_timeout(
        peer, why, isolated_env: Path):
    error, took = _status_behind_hop(peer.port, isolated_env)
    assert f"ProxyJump hop root@127.0.0.1:{peer.port} of h" in error["message"], error["message"]
    assert why in error["message"], error["message"]
    assert took < 4.0, f"bounded by the target's 1 s connect timeout, took {took:.1f} s"


def test_a_dead_proxyjump_hop_is_named_as_the_hop(isolated_env: Path):
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    error, _ = _status_behind_hop(port, isolated_env)
    assert error["message"] == (f"ProxyJump hop root@127.0.0.1:{port} of h: cannot connect to "
                                f"root@127.0.0.1:{port}: Connection refused"), error["message"]


def test_ctrl_c_during_the_connect_of_status_json_is_one_interrupted_document_with_exit_130(
        isolated_env: Path, monkeypatch):
    def interrupted(self: Remote) -> socket.socket:
        raise KeyboardInterrupt

    monkeypatch.setattr(Remote, "_dial", interrupted)
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"h": {
        "address": "127.0.0.1", "port": 9, "containers": {200: {}}}}}))
    res = CliRunner().invoke(cli, ["status", "--json", "--host", "h", "--ct", "200"])
    assert res.exit_code == errors.INTERRUPTED, res.output
    doc = json.loads(res.stdout)
    assert doc == {"ok": False, "error": {
        "type": "Interrupted", "message": "interrupted (the remote job, if any, keeps running)",
        "exit_code": errors.INTERRUPTED, "hint": None, "log_path": None}}
    assert res.stderr == "interrupted (the remote job, if any, keeps running)\n"
