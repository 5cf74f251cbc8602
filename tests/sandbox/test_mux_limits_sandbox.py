"""One multiplexer failure never kills the other commands in flight on that host.

Against a loopback sshd with OpenSSH's default ``MaxSessions 10``: more parallel calls than
sessions all succeed (queued on the shared connection, or on their own connection), a
refused channel fails nothing, and an argv the remote side cannot take is refused locally
with exit 2 instead of making sshd drop the shared connection.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest
import yaml
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from opsctl.config import inventory
from opsctl.remote import mux_client as mux
from opsctl.remote import mux_socket
from opsctl.remote.transport import Remote
from tests.second_sshd import second_sshd

pytestmark = pytest.mark.sandbox


@pytest.fixture
def spec(sandbox, isolated_env, tmp_path, monkeypatch):
    """Host `h10`: container 200 behind an sshd with MaxSessions 10, and a live mux to it."""
    monkeypatch.setenv("OPSCTL_MUX", "1")
    monkeypatch.setenv("OPSCTL_MUX_IDLE_S", "30")
    with second_sshd(sandbox, tmp_path / "sshd10", extra=("MaxSessions 10",)) as sshd:
        known = tmp_path / "known_hosts"
        known.write_text(sshd.known_hosts_line + "\n")
        inv = isolated_env / "inventory"
        inv.mkdir(parents=True, exist_ok=True)
        (inv / "h10.yaml").write_text(yaml.safe_dump({"hosts": {"h10": {
            "address": "127.0.0.1", "port": sshd.port, "user": "root", "known_hosts": str(known),
            "identity_file": str(sandbox.identity_file), "containers": {200: {}}}}}))
        spec = inventory.load().resolve("h10")
        with Remote(spec) as r:
            r.pct_exec(200, ["true"], timeout=30)
        assert mux.wait_ready(spec, 20), "no mux answered after a direct command"
        yield spec
        mux.stop_all()


def mux_info(spec) -> dict:
    path = mux_socket.socket_path(spec, create=False)
    info = mux.query(path, "ping") if path is not None else None
    assert info is not None, "the mux is gone"
    return info


def mux_pid(spec) -> int:
    return int(mux_info(spec)["pid"])


def run_in(spec, argv: list[str]):
    with Remote(spec) as r:
        return r.pct_exec(200, argv, timeout=60)


def test_more_parallel_calls_than_max_sessions_all_succeed_and_the_long_exec_survives(spec):
    pid = mux_pid(spec)
    with cf.ThreadPoolExecutor(16) as pool:
        long = pool.submit(run_in, spec, ["sh", "-c", "sleep 6; echo long-done"])
        time.sleep(0.5)  # scenario: the long exec is in flight first
        short = [pool.submit(run_in, spec, ["sh", "-c", f"sleep 1; echo {i}"]) for i in range(14)]
        results = [f.result() for f in short]
        assert [(r.rc, r.stdout) for r in results] == [(0, f"{i}\n".encode()) for i in range(14)]
        assert any(r.via == "mux" for r in results)
        done = long.result()
    assert (done.rc, done.stdout, done.via) == (0, b"long-done\n", "mux")
    assert mux_pid(spec) == pid  # the shared connection was never torn down


def test_when_every_session_is_busy_a_call_runs_at_once_on_a_second_connection(spec):
    with cf.ThreadPoolExecutor(11) as pool:
        busy = [pool.submit(run_in, spec, ["sh", "-c", "sleep 8; echo busy"]) for _ in range(10)]
        time.sleep(1.5)  # scenario: every session is busy before the extra call
        start = time.monotonic()
        extra = run_in(spec, ["echo", "extra"])
        assert (extra.rc, extra.stdout) == (0, b"extra\n")
        assert time.monotonic() - start < 8  # it did not wait for the busy ones to end
        assert mux_info(spec)["connections"] == 2
        assert [(f.result().rc, f.result().stdout) for f in busy] == [(0, b"busy\n")] * 10


def test_fifty_parallel_calls_all_succeed_next_to_a_long_exec(spec):
    with cf.ThreadPoolExecutor(51) as pool:
        long = pool.submit(run_in, spec, ["sh", "-c", "sleep 6; echo long-done"])
        time.sleep(0.5)  # scenario: the long exec is in flight first
        results = list(pool.map(lambda i: run_in(spec, ["echo", str(i)]), range(50)))
        assert [(r.rc, r.stdout) for r in results] == [(0, f"{i}\n".encode()) for i in range(50)]
        assert (long.result().rc, long.result().stdout) == (0, b"long-done\n")
    assert mux_info(spec)["connections"] <= mux.MAX_CONNECTIONS


def test_an_argv_over_the_remote_limit_exits_2_and_spares_the_commands_in_flight(spec):
    with cf.ThreadPoolExecutor(1) as pool:
        long = pool.submit(run_in, spec, ["sh", "-c", "sleep 3; echo still-here"])
        time.sleep(0.5)  # scenario: the long exec is in flight first
        res = CliRunner().invoke(cli, ["exec", "--host", "h10", "--ct", "200", "--", "echo",
                                       *(["y" * 1000] * 960)])
        assert res.exit_code == errors.USAGE, res.output
        assert "nothing was sent" in res.output
        assert (long.result().rc, long.result().stdout) == (0, b"still-here\n")
