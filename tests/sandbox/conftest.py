"""Fixtures every sandbox test module shares: the sandbox as this test's target host.

``target`` puts the session's sandbox into this test's own inventory (``isolated_env``) and
gives the host's name; ``stopping_target`` also stops whatever job the test left running on ct
200 when it ends, so the next test finds the container idle; ``via`` runs a test once over
direct connections and once through a warm multiplexer. A module that needs more (its own
opsctl root: ``tests.sandbox_plugin.use_private_root``; a real torch build) builds its own
``target`` on these.
"""

from __future__ import annotations

import shutil
import typing as t
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl.cli import cli
from opsctl.sandbox import host as sandbox_mod

HOST = "sandbox"


def put_sandbox_in_inventory(sandbox: sandbox_mod.SandboxInfo, home: Path) -> str:
    """Copy the sandbox's inventory file into ``home``'s inventory; the host's name."""
    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / f"{HOST}.yaml")
    return HOST


@pytest.fixture
def target(sandbox: sandbox_mod.SandboxInfo, isolated_env: Path) -> str:
    """The sandbox in this test's inventory; its host name."""
    return put_sandbox_in_inventory(sandbox, isolated_env)


@pytest.fixture
def stopping_target(target: str) -> t.Iterator[str]:
    """``target``, and a cleanup that stops any job left running on ct 200."""
    yield target
    # best effort: a failing stop must not hide the test's own result
    CliRunner().invoke(cli, ["stop", "--host", target, "--ct", "200", "--grace", "1"])


@pytest.fixture(params=["direct", "mux"])
def via(request: pytest.FixtureRequest, sandbox: sandbox_mod.SandboxInfo, isolated_env: Path,
        monkeypatch: pytest.MonkeyPatch) -> t.Iterator[str]:
    """The test runs twice: each remote command over its own connection (``direct``), then
    through a warm connection multiplexer (``mux``); the sandbox is ``sandbox`` in this
    test's inventory, and a child ``python -m opsctl`` imports this checkout."""
    from opsctl.config import inventory, paths
    from opsctl.remote import mux_client as mux
    from opsctl.remote.transport import Remote

    put_sandbox_in_inventory(sandbox, isolated_env)
    monkeypatch.setenv("PYTHONPATH", str(paths.REPO_ROOT))
    if request.param == "mux":
        monkeypatch.setenv("OPSCTL_MUX", "1")
        monkeypatch.setenv("OPSCTL_MUX_IDLE_S", "60")
        spec = inventory.load().resolve(HOST)
        with Remote(spec) as r:
            r.pct_exec(200, ["true"], timeout=30)
        assert mux.wait_ready(spec, 20), "no mux answered after a direct command"
    else:
        monkeypatch.setenv("OPSCTL_MUX", "0")
    yield request.param
    if request.param == "mux":
        mux.stop_all()
