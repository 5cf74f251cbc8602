"""The connection multiplexer (opsctl/remote/mux_client.py) against the real sandbox sshd: later calls
reuse it, results are byte-identical to a direct call, it exits when idle, stale sockets
are replaced, and host-key policy still decides who may be reached."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import threading
import time

import paramiko
import pytest
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from opsctl.config import inventory
from opsctl.remote import mux_client as mux
from opsctl.remote import mux_socket
from opsctl.remote.transport import Remote
from tests.second_sshd import sshd_serving
from tests.waiting import wait_for

pytestmark = pytest.mark.sandbox


@pytest.fixture
def spec(sandbox, isolated_env, monkeypatch):
    monkeypatch.setenv("OPSCTL_MUX", "1")
    monkeypatch.setenv("OPSCTL_MUX_IDLE_S", "20")
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    yield inventory.load().resolve("sandbox")
    mux.stop_all()


def start_mux(spec) -> None:
    """One direct command leaves a mux behind; wait until it answers."""
    with Remote(spec) as r:
        assert r.pct_exec(200, ["true"], timeout=30).via == "ssh"
    assert mux.wait_ready(spec, 20), "no mux answered after a direct command"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# hostile argv, binary stdout, stderr, a non-zero exit code and stdin, in one command
PROBE = ["sh", "-c", 'printf "%s\\0" "$@"; head -c 3000 /dev/urandom | base64 >&2; cat; exit 3', "x",
         "it's", '"q"', "$(id)", "", "ünï ✓", "a\nb"]
STDIN = bytes(range(256)) * 300


def test_the_second_call_uses_the_mux_and_is_byte_identical_to_a_direct_call(spec):
    start_mux(spec)
    with Remote(spec) as r:
        via_mux = r.pct_exec(200, PROBE, timeout=30, stdin=STDIN)
    with Remote(spec, use_mux=False) as r:
        direct = r.pct_exec(200, PROBE, timeout=30, stdin=STDIN)
    assert (via_mux.via, direct.via) == ("mux", "ssh")
    assert via_mux.command == direct.command  # the same string reached the host
    assert via_mux.rc == direct.rc == 3
    assert via_mux.stdout == direct.stdout
    assert via_mux.stdout.endswith(STDIN)
    assert len(base64.b64decode(via_mux.stderr)) == len(base64.b64decode(direct.stderr)) == 3000


def test_cli_commands_after_the_first_go_through_the_mux(spec):
    runner = CliRunner()
    first = runner.invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--", "echo", "one"],
                          catch_exceptions=False)
    assert first.exit_code == 0 and first.stdout == "one\n"
    assert mux.wait_ready(spec, 20)
    second = runner.invoke(cli, ["exec", "--host", "sandbox", "--ct", "200", "--", "sh", "-c",
                                 "echo two; exit 42"], catch_exceptions=False)
    assert second.exit_code == 42 and second.stdout == "two\n"
    [row] = mux.list_muxes()
    assert row["calls"] == 1, row
    status = runner.invoke(cli, ["mux", "status"], catch_exceptions=False)
    assert "sandbox" in status.stdout and "1 calls" in status.stdout


def test_an_idle_mux_exits_and_removes_its_socket(spec, monkeypatch):
    monkeypatch.setenv("OPSCTL_MUX_IDLE_S", "1")
    start_mux(spec)
    [row] = mux.list_muxes()
    path = mux_socket.socket_path(spec)
    assert wait_for(lambda: not pid_alive(row["pid"]), 10), "mux still running after its idle time"
    assert not path.exists()


def test_mux_stop_ends_it_and_the_next_call_connects_directly(spec):
    start_mux(spec)
    [row] = mux.list_muxes()
    res = CliRunner().invoke(cli, ["mux", "stop"], catch_exceptions=False)
    assert res.stdout == "stopped 1 multiplexer(s)\n"
    assert wait_for(lambda: not pid_alive(row["pid"]), 10)
    with Remote(spec) as r:
        assert r.pct_exec(200, ["true"], timeout=30).via == "ssh"


def test_a_stale_socket_is_removed_and_replaced(spec):
    path = mux_socket.socket_path(spec)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(os.fspath(path))  # bound, never listening: what a killed mux leaves
    dead.close()
    with Remote(spec) as r:
        res = r.pct_exec(200, ["echo", "ok"], timeout=30)
        assert (res.via, res.stdout) == ("ssh", b"ok\n")
        assert not path.exists(), "stale socket left in place"
    assert mux.wait_ready(spec, 20)
    with Remote(spec) as r:
        assert r.pct_exec(200, ["true"], timeout=30).via == "mux"


def test_a_changed_host_key_is_refused_although_a_mux_is_running(spec, tmp_path):
    kh = tmp_path / "known_hosts"
    shutil.copy(spec.known_hosts, kh)
    unpinned = spec.model_copy(update={"host_key_fingerprint": None, "known_hosts": str(kh)})
    start_mux(unpinned)
    [row] = mux.list_muxes()
    # the host "was reinstalled": known_hosts now holds another key for it
    name = kh.read_text().split()[0]
    other = paramiko.Ed25519Key.from_private_key_file(spec.identity_file)
    kh.write_text(f"{name} {other.get_name()} {other.get_base64()}\n")
    with pytest.raises(errors.HostKeyError, match="CHANGED"), Remote(unpinned) as r:
        r.pct_exec(200, ["true"], timeout=30)
    # nothing went through the old mux (a known_hosts edit changes the key, so it may also have
    # retired by now: tests/sandbox/test_mux_retire_sandbox.py)
    assert row["calls"] == 0
    assert all(r["calls"] == 0 for r in mux.list_muxes())


def test_a_deadline_through_the_mux_kills_the_remote_process_group(spec):
    start_mux(spec)
    marker = f"{time.time_ns() % 100000 + 400000}"
    with Remote(spec) as r:
        with pytest.raises(errors.DeadlineExceeded):
            r.pct_exec(200, ["sh", "-c", f"sleep {marker} & sleep {marker}; wait"], timeout=2)
        wait_for(lambda: f"sleep {marker}" not in r.pct_exec(200, ["ps", "-eo", "args"],
                                                             timeout=10).stdout.decode(), 10)
        ps = r.pct_exec(200, ["ps", "-eo", "args"], timeout=10)
    assert ps.via == "mux"
    assert f"sleep {marker}" not in ps.stdout.decode()


def test_ctrl_c_in_the_client_closes_the_remote_channel(spec):
    start_mux(spec)
    marker = f"opsctl-mux-{time.time_ns() % 100000}"
    # the loop ends when its stdout is gone: proof that the channel was closed (pct's python
    # ignores SIGPIPE for its children, so a failed write, not a signal, ends it)
    script = f"echo started; while echo {marker}; do sleep 0.2; done"

    def interrupt(data: bytes) -> None:
        if b"started" in data:
            raise KeyboardInterrupt

    with Remote(spec) as r:
        with pytest.raises(KeyboardInterrupt):
            r.pct_exec(200, ["sh", "-c", script], timeout=60, on_stdout=interrupt)

        def gone() -> bool:
            return marker not in r.pct_exec(200, ["ps", "-eo", "args"], timeout=10).stdout.decode()

        assert wait_for(gone, 10), "the remote loop kept running after the client hung up"


def test_concurrent_calls_share_one_mux(spec):
    start_mux(spec)
    results: list[bytes] = []

    def one(i: int) -> None:
        with Remote(spec) as r:
            res = r.pct_exec(200, ["sh", "-c", f"sleep 0.3; echo {i}"], timeout=30)
            assert res.via == "mux"
            results.append(res.stdout)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(results) == [f"{i}\n".encode() for i in range(4)]
    assert mux.list_muxes()[0]["calls"] == 4


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_mux_whose_connection_drops_exits_and_the_next_call_connects_directly(spec):
    start_mux(spec)
    [row] = mux.list_muxes()
    os.kill(sshd_serving(row["pid"]), signal.SIGKILL)  # the session our mux opened, nothing else
    assert wait_for(lambda: not pid_alive(row["pid"]), 10), "mux survived its connection"
    assert not mux_socket.socket_path(spec).exists()
    with Remote(spec) as r:
        res = r.pct_exec(200, ["echo", "back"], timeout=30)
    assert (res.via, res.stdout) == ("ssh", b"back\n")
