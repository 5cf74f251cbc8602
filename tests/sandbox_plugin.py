"""pytest plugin: the real sandbox (loopback sshd + LXC containers) as session fixtures.

One sandbox home is shared by every test session on the machine (``/var/tmp/opsctl-test-
sandbox``, or ``$OPSCTL_TEST_SANDBOX_HOME``), so the containers are made once and reused;
``sandbox.up`` serializes parallel sessions with a file lock. Tests that use the ``sandbox``
fixture get the ``sandbox`` marker automatically (``-m "not sandbox"`` deselects them) and are
skipped, naming exactly what is missing, when the machine cannot run it — except when
``$CI`` or ``$OPSCTL_REQUIRE_SANDBOX`` is set, where a missing prerequisite fails the run.

Parallel runs (``./scripts/test`` runs ``pytest -n 3``, see ``tests/xdist_plugin.py``): every
xdist worker past the first has a sandbox of its own under the home, ``<home>/workers/gwN``
(own sshd port, own containers 200/201, own sudo user), so each worker is exactly one plain
session and tests never share a container with a test running at the same time. A worker
makes its sandbox on first use from a copy of the session sandbox's template (made once, with
every package the containers need, under that sandbox's lock: ``sandbox.up(template_from=)``),
so a worker's cold start is a copy and a boot; ``.ci/run`` destroys them with the home.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.sandbox import host as sandbox_mod

DEFAULT_HOME = Path("/var/tmp/opsctl-test-sandbox")
STOPPED_CT = 201  # kept stopped; tests must not start it (use their own ctid for that)
MISSING_CT = 999  # never created


def session_home() -> Path:
    """The sandbox home of the whole test session (the first worker's sandbox lives there)."""
    return Path(os.environ.get("OPSCTL_TEST_SANDBOX_HOME") or DEFAULT_HOME)


def sandbox_home() -> Path:
    """This session's sandbox home: the shared one, or an xdist worker's own below it."""
    home = session_home()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # set by xdist in each worker
    return home if worker == "gw0" else worker_homes_dir(home) / worker


def worker_homes_dir(home: Path) -> Path:
    """Where xdist workers past the first keep their sandboxes (``.ci/run`` destroys them)."""
    return home / "workers"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.sandbox)


def _require_sandbox() -> None:
    missing = sandbox_mod.check_prerequisites()
    if not missing:
        return
    reason = "sandbox unavailable: " + "; ".join(missing)
    if os.environ.get("CI") or os.environ.get("OPSCTL_REQUIRE_SANDBOX"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def sandbox() -> Iterator[sandbox_mod.SandboxInfo]:
    """The running sandbox host with container 200 up; left running for the next session."""
    _require_sandbox()
    # workers copy the session sandbox's template: one debootstrap and apt run for all of them
    yield sandbox_mod.up(sandbox_home(), containers=(200,), template_from=session_home())


@pytest.fixture
def stopped_ct(sandbox: sandbox_mod.SandboxInfo) -> int:
    """A container that exists and is stopped (ctid 201)."""
    return sandbox_mod.ensure_container(STOPPED_CT, running=False, home=sandbox_home())


@pytest.fixture
def missing_ct(sandbox: sandbox_mod.SandboxInfo) -> int:
    """A ctid with no container behind it (999)."""
    sandbox_mod.remove_container(MISSING_CT, home=sandbox_home())
    return MISSING_CT


def use_private_root(sandbox: sandbox_mod.SandboxInfo, home: Path, root: str) -> None:
    """Write the sandbox host into this test's inventory with its own opsctl ``root`` in the
    container, so a test can break or fill it without touching other tests' jobs."""
    import yaml

    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(Path(sandbox.inventory_file).read_text())
    doc["hosts"]["sandbox"]["root"] = root
    (inv / "sandbox.yaml").write_text(yaml.safe_dump(doc))


@contextlib.contextmanager
def private_home(sandbox: sandbox_mod.SandboxInfo, home: Path, root: str,
                 mux: bool = False) -> Iterator[Path]:
    """A module's own ``OPSCTL_HOME`` (inventory only from it) and opsctl ``root`` in the
    container, for a module-scoped fixture (``monkeypatch`` is function-scoped)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPSCTL_HOME", str(home))
        mp.setenv("OPSCTL_INVENTORY_DIRS", str(home / "inventory"))
        if not mux:
            mp.setenv("OPSCTL_MUX", "0")
        use_private_root(sandbox, home, root)
        yield home
