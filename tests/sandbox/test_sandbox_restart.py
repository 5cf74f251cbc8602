"""Restarting the sandbox's sshd while a session holds its port keeps the port: the
inventory written before the restart stays right, and the command in flight on
the old connection finishes."""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import signal
import time

import pytest

from opsctl.config import inventory
from opsctl.remote.transport import Remote
from opsctl.sandbox import host as sandbox_mod
from tests.sandbox_plugin import sandbox_home
from tests.waiting import wait_for

pytestmark = pytest.mark.sandbox


def test_an_sshd_restart_with_a_session_in_flight_keeps_the_port(sandbox, isolated_env):
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    spec = inventory.load().resolve("sandbox")

    def in_flight() -> bytes:
        with Remote(spec, use_mux=False) as r:
            return r.pct_exec(200, ["sh", "-c", "sleep 3; echo done"], timeout=30).stdout

    with cf.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(in_flight)
        time.sleep(1.0)  # scenario: the session is established on sandbox.port
        listener = int((sandbox.state_dir / "sshd.pid").read_text().strip())
        os.kill(listener, signal.SIGTERM)  # the listener dies; the session's sshd lives on
        wait_for(lambda: not os.path.exists(f"/proc/{listener}"), 5, interval=0.05)
        again = sandbox_mod.up(sandbox_home(), containers=(200,))
        assert again.port == sandbox.port
        assert fut.result() == b"done\n"
    with Remote(spec, use_mux=False) as r:
        assert r.pct_exec(200, ["true"], timeout=30).rc == 0


def test_sandbox_down_then_up_at_once_boots_every_time(sandbox, isolated_env):
    """Right after ``down``, ``up`` starts the container again and asks systemd whether it
    booted while PID 1's bus may not answer yet ("offline"): that is a boot still to come,
    waited for, never a failed boot."""
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    spec = inventory.load().resolve("sandbox")
    for _ in range(3):
        sandbox_mod.down(sandbox_home())
        sandbox_mod.up(sandbox_home(), containers=(200,))
        with Remote(spec, use_mux=False) as r:
            assert r.pct_exec(200, ["systemctl", "is-system-running"], timeout=30).stdout in (
                b"running\n", b"degraded\n")
