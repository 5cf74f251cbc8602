"""Attach, shell, forward and the confirmation questions, driven through a real PTY (pexpect)
against the sandbox: what a person at a terminal sees and types."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from opsctl import errors
from tests.cli_runner import run_cli as run
from tests.sandbox_plugin import private_home, use_private_root
from tests.waiting import wait_for

pexpect = pytest.importorskip("pexpect")
pytestmark = pytest.mark.sandbox

ROOT = "/opt/opsctl-test-interactive"
T = ["--host", "sandbox", "--ct", "200"]
TICK = textwrap.dedent("""
    import time
    for i in range(3000):
        print(f"tick {i:04d}", flush=True)
        time.sleep(0.2)
""")


def opsctl_pty(*args: str) -> pexpect.spawn:
    """``opsctl ARGS`` on a fresh pseudo-terminal (this test's OPSCTL_HOME and inventory)."""
    return pexpect.spawn(sys.executable, ["-m", "opsctl", *args], timeout=30,
                         env={**os.environ, "TERM": "xterm"}, dimensions=(40, 120))


@pytest.fixture(scope="module")
def job(sandbox, tmp_path_factory: pytest.TempPathFactory):
    """One running job for the module, in a private root."""
    home = tmp_path_factory.mktemp("interactive-home")
    with private_home(sandbox, home, ROOT):
        book = home / "tick.json"
        book.write_text(json.dumps({"name": "tick", "command": ["python3", "-u", "-c", TICK],
                                    "timeout_s": 60, "healthy_when": {"started": True}}))
        res = run("deploy", *T, "--playbook", str(book), "--replace", "--json")
        yield json.loads(res.stdout)["job_id"]
        run("stop", *T, "-y", "--grace", "1")


@pytest.fixture
def target(sandbox, job, isolated_env: Path) -> str:
    use_private_root(sandbox, isolated_env, ROOT)
    return job


def state(job: str) -> str:
    return json.loads(run("status", *T, job, "--json").stdout)["state"]


def test_attach_shows_the_pane_and_detaching_leaves_the_job_running(target):
    term = opsctl_pty("attach", *T, target)
    term.expect(rb"tick \d{4}")  # the job's own pane, drawn by tmux on our terminal
    term.send(b"\x02d")  # Ctrl-b d: tmux's detach
    term.expect(rb"\[detached")
    term.expect(pexpect.EOF)
    term.close()
    assert term.exitstatus == 0
    assert state(target) == "RUNNING"


def test_shell_is_a_login_shell_in_the_container_with_its_exit_code(target):
    term = opsctl_pty("shell", *T)
    term.expect(rb"[#$] ")
    term.sendline(b"echo home=$HOME answer=$((6*7)); test -t 0 && echo on-a-tty; exit 3")
    term.expect(rb"home=/root answer=42")
    term.expect(rb"on-a-tty")
    term.expect(pexpect.EOF)
    term.close()
    assert term.exitstatus == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_forward_serves_a_port_of_the_container_on_127_0_0_1_until_ctrl_c(target):
    remote, local = _free_port(), _free_port()
    web = f"/tmp/opsctl-forward-{remote}"
    server = subprocess.Popen(  # an HTTP server in the container, for as long as this test
        [sys.executable, "-m", "opsctl", "exec", *T, "--", "sh", "-c",
         f"mkdir -p {web} && echo served-from-ct-{remote} > {web}/index.html && "
         f"exec python3 -m http.server {remote} --bind 127.0.0.1 --directory {web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fwd = opsctl_pty("forward", f"{local}:{remote}", *T)
    try:
        fwd.expect(rb"forwarding 127\.0\.0\.1:\d+ -> ")
        def page() -> bytes:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.html", timeout=5) as r:
                    return r.read()
            except OSError:  # the server in the container is still starting
                return b""

        body = wait_for(page, 15, interval=0.2)
        assert body == f"served-from-ct-{remote}\n".encode()
        fwd.sendintr()
        fwd.expect(rb"forward stopped")
        fwd.expect(pexpect.EOF)
        fwd.close()
        assert fwd.exitstatus == 0
    finally:
        fwd.close(force=True)
        run("exec", *T, "--", "pkill", "-f", f"http.server {remote}")
        server.wait(10)


def _tunnels_to(local: int) -> list[int]:
    """Live ``ssh`` processes forwarding 127.0.0.1:``local``."""
    needle = f"127.0.0.1:{local}:".encode()
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"ssh") and any(needle in a for a in argv):
            found.append(int(name))
    return found


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", errors.TERMINATED),
                                           ("SIGHUP", errors.HANGUP)])
def test_forward_ended_by_a_signal_leaves_no_tunnel_listening(target, sig, code):
    import signal

    remote, local = _free_port(), _free_port()
    fwd = opsctl_pty("forward", f"{local}:{remote}", *T)
    try:
        fwd.expect(rb"forwarding 127\.0\.0\.1:\d+ -> ")
        assert _tunnels_to(local)
        os.kill(fwd.pid, getattr(signal, sig))
        fwd.expect(pexpect.EOF)
        fwd.close()
        assert fwd.exitstatus == code
        assert f"opsctl: terminated by {sig}".encode() in fwd.before
        assert not _tunnels_to(local)
        with socket.socket() as s:
            s.bind(("127.0.0.1", local))  # nothing listens on it any more
    finally:
        fwd.close(force=True)
        for pid in _tunnels_to(local):
            os.kill(pid, 9)


def test_forward_killed_with_sigkill_leaves_no_tunnel_listening(target):
    """SIGKILL runs no handler: the tunnel was started to die with its parent."""
    remote, local = _free_port(), _free_port()
    fwd = opsctl_pty("forward", f"{local}:{remote}", *T)
    try:
        fwd.expect(rb"forwarding 127\.0\.0\.1:\d+ -> ")
        assert _tunnels_to(local)
        os.kill(fwd.pid, 9)
        assert wait_for(lambda: not _tunnels_to(local), 10, what="the tunnel to end"), _tunnels_to(local)
    finally:
        fwd.close(force=True)
        for pid in _tunnels_to(local):
            os.kill(pid, 9)


def test_stop_asks_on_a_terminal_and_no_leaves_the_job_running(target):
    term = opsctl_pty("stop", *T, target)
    term.expect(rb"stop job \S+ \(RUNNING, no step yet\)\? \[y/N\]")
    term.sendline(b"n")
    term.expect(rb"not confirmed: nothing was done")
    term.expect(pexpect.EOF)
    term.close()
    assert term.exitstatus == errors.INTERRUPTED
    assert state(target) == "RUNNING"


def test_deploy_replace_asks_on_a_terminal_and_no_keeps_the_running_job(target, tmp_path):
    book = tmp_path / "other.json"
    book.write_text(json.dumps({"name": "other", "command": ["python3", "-c", "print(1)"]}))
    term = opsctl_pty("deploy", *T, "--playbook", str(book), "--replace", "-d")
    term.expect(rb"replace job \S+ \(RUNNING, no step yet\)\? \[y/N\]")
    term.sendline(b"n")
    term.expect(pexpect.EOF)
    term.close()
    assert term.exitstatus == errors.INTERRUPTED
    assert state(target) == "RUNNING"
    assert json.loads(run("status", *T, "--json").stdout)["job_id"] == target  # still current


def test_without_a_terminal_stop_asks_nothing_and_stops(sandbox, isolated_env, tmp_path):
    use_private_root(sandbox, isolated_env, ROOT + "-notty")  # its own job: this one is stopped
    book = tmp_path / "tick.json"
    book.write_text(json.dumps({"name": "tick", "command": ["python3", "-u", "-c", TICK],
                                "healthy_when": {"started": True}}))
    job = json.loads(run("deploy", *T, "--playbook", str(book), "--replace", "--json").stdout)["job_id"]
    res = run("stop", *T, job, "--grace", "1")  # CliRunner's stdin is no terminal
    assert res.exit_code == 0 and "[y/N]" not in res.output
    assert state(job) == "CANCELLED"
