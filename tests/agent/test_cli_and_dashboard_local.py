"""Honest refusals, no tracebacks, shell completion and the dashboard, with real processes
and sockets on this machine: the CLI in a child process, a TCP server on 127.0.0.1 that
accepts and never speaks SSH, the dashboard's HTTP server, the agent's swap verb against a
loopback wheel index. JSON and numbers are in ``tests/unit/test_json_and_numbers.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import typing as t
import urllib.error
import urllib.request
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli, dashboard
from tests.paths import REPO


def strict_loads(text: str) -> t.Any:
    """A strict JSON parser: NaN / Infinity are refused, as JavaScript's JSON.parse does."""
    def refuse(word: str) -> t.NoReturn:
        raise ValueError(f"not JSON: {word}")
    return json.loads(text, parse_constant=refuse)


def run_opsctl(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
               stdin: t.Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """The real command line, in a child process (stderr as a user's terminal gets it)."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "opsctl", *args], capture_output=True, text=True,
                          env=full, timeout=timeout, stdin=stdin, check=False)


@contextlib.contextmanager
def silent_server() -> t.Iterator[tuple[int, list[socket.socket]]]:
    """A TCP server on 127.0.0.1 that accepts and never says a word (not SSH, not HTTP)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def loop() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(srv.accept()[0])

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(2)
        for c in accepted:
            c.close()
        srv.close()


def write_inventory(home: Path, hosts: dict[str, dict[str, t.Any]]) -> None:
    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "edges.yaml").write_text(yaml.safe_dump({"hosts": hosts}))


# --- 6. Honest messages -------------------------------------------------------------------


class TestHonestMessages:
    def test_attach_without_tty_is_refused_locally(self, isolated_env):
        with silent_server() as (port, accepted):
            write_inventory(isolated_env, {"h": {"address": "127.0.0.1", "port": port,
                                                 "containers": {200: {}}}})
            res = run_opsctl("attach", "--host", "h", "--ct", "200",
                             env={"OPSCTL_HOME": str(isolated_env),
                                  "OPSCTL_INVENTORY_DIRS": str(isolated_env / "inventory")})
            time.sleep(0.3)  # scenario: a window for a connection that must never come
            assert accepted == []  # nothing sent: not even a TCP connection
        assert res.returncode == errors.USAGE, res.stderr
        assert "attach needs a terminal" in res.stderr and "Traceback" not in res.stderr

    def test_swap_torch_refuses_an_index_url_pip_cannot_use_before_connecting(self, isolated_env):
        with silent_server() as (port, accepted):
            write_inventory(isolated_env, {"h": {"address": "127.0.0.1", "port": port,
                                                 "containers": {200: {}}}})
            for url in ("ftp://127.0.0.1/simple", "data:,x", "/etc", "http:///nohost"):
                res = CliRunner().invoke(cli, ["swap-torch", "cu130", "--host", "h", "--ct", "200",
                                               "--dry-run", "--index-url", url])
                assert res.exit_code == errors.USAGE and "not an index URL" in res.output, url
            assert accepted == []


class TestSwapTorchDryRun:
    @pytest.fixture(scope="class")
    def index_url(self, tmp_path_factory: pytest.TempPathFactory) -> t.Iterator[str]:
        from tests.wheel_index import build_fake_torches, serve_index, write_simple_index

        base = tmp_path_factory.mktemp("index")
        write_simple_index(str(base / "index"), build_fake_torches(str(base / "wheels")))
        with serve_index(str(base / "index")) as url:
            yield url

    @staticmethod
    def tree(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    def test_swap_torch_dry_run_writes_nothing_and_checks_the_index(self, tmp_path, index_url):
        from tests.agent_helper import run_agent
        from tests.wheel_index import closed_port_url

        root = tmp_path / "root"
        root.mkdir()

        def dry(version: str, url: str) -> dict[str, t.Any]:
            run = run_agent(root, "swap", "--variant", "cu130", "--version", version,
                            "--index-url", url, "--pip-retries", "0", "--dry-run", timeout=120)
            return run.reply

        ok = dry("2.11.0", index_url)
        assert ok["ok"] and ok["data"]["action"] == "install" and ok["data"]["dry_run"] is True
        assert ok["data"]["checked"] == ["the index answers and has torch 2.11.0+cu130"]
        for version, url, reason in (("9.9.9", index_url, "no-such-version"),
                                     ("2.11.0", "file:///etc", "index-unreachable"),
                                     ("2.11.0", closed_port_url(), "index-unreachable"),
                                     ("2.11.0", "ftp://127.0.0.1/x", "index-unreachable")):
            bad = dry(version, url)
            assert not bad["ok"], (version, url)
            assert bad["error"]["type"] == "TorchInstallFailed"
            assert bad["error"]["fields"]["reason"] == reason
            assert "nothing was changed" in bad["error"]["message"]
        assert self.tree(root) == []  # no envs/, no envs/.lock, nothing at all

    def test_a_file_index_is_read_as_pep_503(self, tmp_path):
        from remote_payload.agent.torchenv import swap
        from tests.wheel_index import build_fake_torches, write_simple_index

        write_simple_index(str(tmp_path / "index"), build_fake_torches(str(tmp_path / "wheels")))
        view = swap.read_index(f"file://{tmp_path / 'index' / 'simple'}")
        assert view.error is None and "2.11.0+cu130" in (view.versions or ())
        assert swap.read_index(f"file://{tmp_path / 'wheels'}").error  # no torch/ in it


# --- 7. No tracebacks on stderr -------------------------------------------------------------


class TestNoTracebacks:
    def test_no_traceback_for_a_host_that_never_speaks_ssh(self, isolated_env, tmp_path):
        book = tmp_path / "p.yaml"
        book.write_text("name: p\ncommand: [python3, -c, pass]\n")
        with silent_server() as (port, _accepted):
            write_inventory(isolated_env, {"silent": {"address": "127.0.0.1", "port": port,
                                                      "connect_timeout_s": 1.5,
                                                      "containers": {200: {}}}})
            env = {"OPSCTL_HOME": str(isolated_env),
                   "OPSCTL_INVENTORY_DIRS": str(isolated_env / "inventory")}
            for args in (["hosts", "--check"], ["status", "--all"],
                         ["deploy", "--nodes", "silent:200", "--playbook", str(book)],
                         ["status", "--host", "silent", "--ct", "200"]):
                res = run_opsctl(*args, env=env, timeout=120)
                assert "Traceback" not in res.stderr, (args, res.stderr)
                assert "Exception (client)" not in res.stderr, (args, res.stderr)
                assert "silent" in res.stdout + res.stderr or "127.0.0.1" in res.stdout + res.stderr

    def test_dashboard_is_quiet_when_clients_disconnect(self, isolated_env):
        proc = subprocess.Popen(
            [sys.executable, "-m", "opsctl", "dashboard", "--port", "0"],
            env={**os.environ, "PYTHONPATH": str(REPO), "OPSCTL_HOME": str(isolated_env),
                 "OPSCTL_INVENTORY_DIRS": str(isolated_env / "inventory")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            port = _dashboard_port(proc)
            for i in range(30):  # requests abandoned at every stage
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                if i % 3:
                    s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
                if i % 2:  # a reset, not a polite close
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                s.close()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=10) as r:
                strict_loads(r.read().decode())
            time.sleep(0.5)  # scenario: a window for a late traceback on stderr
        finally:
            proc.terminate()
            _out, err = proc.communicate(timeout=10)
        assert "Traceback" not in err and "BrokenPipe" not in err and "ConnectionReset" not in err, err


def _dashboard_port(proc: subprocess.Popen[str]) -> int:
    """The port the dashboard says it serves on (its first line on stderr)."""
    deadline = time.monotonic() + 30
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()  # "dashboard on http://127.0.0.1:PORT/ ..."
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if m:
            return int(m.group(1))
    raise AssertionError("the dashboard did not say its URL")


# --- 8. Shell completion --------------------------------------------------------------------


class TestShellCompletion:
    def test_completion_prints_only_candidates(self, isolated_env, tmp_path):
        books = tmp_path / "playbooks"
        books.mkdir()
        for name in ("good", "evil\nname", "bell\x07", "tab\tname"):
            (books / f"{name}.yaml").write_text("name: x\ncommand: [true]\n")
        write_inventory(isolated_env, {"h1": {"address": "127.0.0.1", "known_hosts":
                                              str(tmp_path / "known_hosts")}})
        (tmp_path / "known_hosts").write_text("garbage that is not a key line\n")
        env = {"OPSCTL_HOME": str(isolated_env), "OPSCTL_INVENTORY_DIRS": str(isolated_env / "inventory"),
               "_OPSCTL_COMPLETE": "bash_complete"}
        full = {**os.environ, "PYTHONPATH": str(REPO), **env}
        cases = {("opsctl deploy --playbook ", "3"): {"plain,good"},
                 ("opsctl status --host ", "3"): {"plain,h1"},
                 ("opsctl status --host h1 --ct 200 ", "6"): set()}
        for (words, cword), want in cases.items():
            res = subprocess.run([sys.executable, "-m", "opsctl"], capture_output=True, text=True,
                                 cwd=tmp_path, timeout=60, check=False,
                                 env={**full, "COMP_WORDS": words, "COMP_CWORD": cword,
                                      "OPSCTL_COMPLETE_TIMEOUT_S": "3"})
            got = [ln for ln in res.stdout.split("\n") if ln]
            assert res.stderr == "", (words, res.stderr)
            bundled = {ln for ln in got if ln.startswith("plain,dflash")}
            assert set(got) - bundled == want, (words, got)
            assert all(wire_safe(ln) for ln in got)

    @pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-1", "x"])
    def test_a_silly_completion_timeout_falls_back_to_the_default(self, monkeypatch, value):
        from opsctl.cli import complete

        monkeypatch.setenv("OPSCTL_COMPLETE_TIMEOUT_S", value)
        ctx = click.Context(click.Command("x"))
        ctx.params = {"host": None, "ctid": None}
        start = time.monotonic()
        assert complete.jobs(ctx, t.cast(click.Parameter, None), "") == []
        assert time.monotonic() - start < complete.JOBS_TIMEOUT_S + 2


def wire_safe(line: str) -> bool:
    return all(ch >= " " and ch != "\x7f" for ch in line)


# --- 10. The dashboard ------------------------------------------------------------------------


class TestDashboard:
    def test_dashboard_answers_only_its_own_loopback_host_header(self):
        server = dashboard.serve(port=0, refresh_s=1.0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            port = server.server_address[1]
            codes = {}
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}",
                         "127.0.0.1", f"127.0.0.1:{port + 1}", f"evil.example:{port}",
                         f"[::1]:{port}", f"127.0.0.1:{port}.evil.example", ""):
                req = urllib.request.Request(f"http://127.0.0.1:{port}/status.json",
                                             headers={"Host": host})
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        codes[host] = r.status
                        strict_loads(r.read().decode())
                except urllib.error.HTTPError as exc:
                    codes[host] = exc.code
            assert {h for h, c in codes.items() if c == 200} == {
                f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"}, codes
            assert set(codes.values()) == {200, 403}
        finally:
            server.shutdown()
            server.server_close()

    @pytest.mark.parametrize("first, second", [("{ok}", "evil.example"), ("evil.example", "{ok}"),
                                               ("{ok}", "{ok}")])
    def test_a_request_with_two_host_headers_is_refused_whichever_comes_first(self, first, second):
        server = dashboard.serve(port=0, refresh_s=1.0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            port = server.server_address[1]
            ok = f"127.0.0.1:{port}"
            request = (f"GET /status.json HTTP/1.1\r\nHost: {first.format(ok=ok)}\r\n"
                       f"Host: {second.format(ok=ok)}\r\nConnection: close\r\n\r\n")
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(request.encode())
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
            status_line = reply.split(b"\r\n", 1)[0]
            assert status_line.split()[1] == b"400", reply[:200]
            assert b"more than one Host header" in reply
            assert b'"hosts"' not in reply
        finally:
            server.shutdown()
            server.server_close()

    def test_a_host_that_never_answers_does_not_block_each_refresh(self, isolated_env, monkeypatch):
        monkeypatch.setattr(dashboard, "REFRESH_WAIT_S", 1.0)
        with silent_server() as (port, _accepted):
            write_inventory(isolated_env, {"silent": {"address": "127.0.0.1", "port": port,
                                                      "connect_timeout_s": 30,
                                                      "containers": {200: {}}}})
            fleet = dashboard.Fleet()
            try:
                start = time.monotonic()
                first = fleet.snapshot()
                assert time.monotonic() - start < 3
                row = first.hosts[0].containers[0]
                assert row.error == "silent ct 200: no answer within 1 s"
                for _ in range(3):  # later refreshes do not wait for it again
                    start = time.monotonic()
                    snap = fleet.snapshot()
                    assert time.monotonic() - start < 0.5
                    assert "no answer" in (snap.hosts[0].containers[0].error or "")
            finally:
                fleet.close()

    def test_a_late_container_shows_its_last_data_as_stale(self, isolated_env, monkeypatch):
        write_inventory(isolated_env, {"pve1": {"address": "127.0.0.1", "containers": {120: {}}}})
        slow = threading.Event()
        release = threading.Event()

        def container(_fleet: dashboard.Fleet, host: str, ctid: int) -> dashboard.ContainerView:
            if slow.is_set():
                release.wait(30)  # pure logic: a container that stopped answering
            return dashboard.ContainerView(host, ctid, note="no job launched here yet")

        monkeypatch.setattr(dashboard.Fleet, "container", container)
        monkeypatch.setattr(dashboard, "REFRESH_WAIT_S", 0.3)
        fleet = dashboard.Fleet()
        try:
            assert fleet.snapshot().hosts[0].containers[0].stale_s is None
            slow.set()
            view = fleet.snapshot().hosts[0].containers[0]
            assert view.note == "no job launched here yet" and view.stale_s is not None
            assert view.stale_note and view.stale_note.startswith("stale: no answer for")
            assert "stale: no answer" in dashboard.render_fragment(fleet.snapshot())
            slow.clear()
            release.set()
            time.sleep(0.2)  # scenario: the released answer lands between two refreshes
            fleet.snapshot()  # it answered: this refresh asks again without waiting for it
            time.sleep(0.2)  # scenario: that refresh's question is answered in the background
            assert fleet.snapshot().hosts[0].containers[0].stale_s is None  # fresh again
        finally:
            release.set()
            fleet.close()
