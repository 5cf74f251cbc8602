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

Nothing keeps running after the session: a session that brought a sandbox up registers
itself in ``<home>/test-sessions/`` and, when it ends, stops that sandbox's containers and
sshd (``sandbox.down``: built containers stay on disk, so the next run only boots them) unless
another live session still uses it. ``./scripts/test`` also calls :func:`stop_idle_sandboxes`
when pytest ends, for a worker that died before its own end could run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
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


def _sessions_dir(home: Path) -> Path:
    """One file per live test session using the sandbox of ``home``, named by its pid."""
    return home / "test-sessions"


def _started_at(pid: int) -> str | None:
    """Process ``pid``'s start time in clock ticks since boot (``/proc/PID/stat`` field 22),
    which tells a live session from a new process that reused a dead one's pid; None: gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


@contextlib.contextmanager
def _sessions_locked(home: Path) -> Iterator[Path]:
    folder = _sessions_dir(home)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        # damaged (a file or a link where the registry belongs): set aside, never deleted,
        # so a session can still register and the last one still stops the sandbox
        folder.rename(folder.with_name(f"{folder.name}.damaged-{time.time_ns()}"))
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _registered_start(entry: Path) -> str | None:
    """The start time a registration file holds; None for anything else under its name (a
    directory, a FIFO, a link: never opened, so a FIFO cannot hang the session's end)."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 64).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def _live_sessions(folder: Path) -> list[int]:
    """The pids registered in ``folder`` that still run; a dead one's file is removed (and
    so is any other non-directory under a pid's name; a directory is left alone)."""
    live = []
    for entry in folder.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        started = _started_at(pid)
        if started is not None and started == _registered_start(entry):
            live.append(pid)
        elif entry.is_symlink() or not entry.is_dir():
            entry.unlink(missing_ok=True)
    return live


def register_session(home: Path) -> None:
    """Note that this process uses the sandbox of ``home`` (before it brings it up)."""
    with _sessions_locked(home) as folder:
        (folder / str(os.getpid())).write_text(f"{_started_at(os.getpid())}\n")


def release_session(home: Path) -> bool:
    """This process is done with the sandbox of ``home``: stop it unless another live session
    uses it. Returns whether it was stopped."""
    with _sessions_locked(home) as folder:
        (folder / str(os.getpid())).unlink(missing_ok=True)
        if _live_sessions(folder):
            return False
        sandbox_mod.down(home)
        return True


def stop_idle_sandboxes(home: Path | None = None) -> list[Path]:
    """Stop every sandbox of the session home (its own and each worker's) that no live test
    session uses; returns those stopped. For the end of ``./scripts/test``."""
    home = home or session_home()
    homes = [home, *sorted(p for p in worker_homes_dir(home).glob("gw*") if p.is_dir())]
    stopped = []
    for h in homes:
        if not (h / "sandbox").is_dir():
            continue
        with _sessions_locked(h) as folder:
            if _live_sessions(folder):
                continue
            sandbox_mod.down(h)
            stopped.append(h)
    return stopped


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
    """The running sandbox host with container 200 up; stopped (not removed) when the session
    ends, so the next session only boots it."""
    _require_sandbox()
    home = sandbox_home()
    register_session(home)
    try:
        # workers copy the session sandbox's template: one debootstrap and apt run for all
        yield sandbox_mod.up(home, containers=(200,), template_from=session_home())
    finally:
        release_session(home)


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
