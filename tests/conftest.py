"""Test isolation, and the folders by kind.

Every test gets its own OPSCTL_HOME, no inherited TMUX, no real inventory.

The tests sit in folders by kind, and each folder's tests get its markers here
(:data:`KIND_MARKERS`), so a selection by marker is a selection by kind:

- ``tests/unit/``: pure logic, no process or network of its own; seconds in all.
- ``tests/agent/``: the container agent run on this machine (real tmux, real processes,
  fake torch builds); marked ``agent`` and ``slow``.
- ``tests/sandbox/``: through the real sandbox (loopback sshd, LXC, pct stand-in); ``sandbox``.
- ``tests/trainer/``: real torch on CPU (training, the recipe, compile probes); ``trainer``
  and ``slow``.
- ``tests/gpu/``: the integration checks that need NVIDIA GPUs (the agent driving a trainer
  job, GPU history, multi-GPU layouts, multi-node torchrun); ``gpu`` and ``slow``, skipped
  without a GPU. On a GPU machine: ``python3 -m pytest tests/gpu``.

``pytest -m "not slow and not sandbox"`` is then the fast selection: the unit tests alone.

The shipped inventory names a real 10.x host; tests must never contact it, so
``OPSCTL_INVENTORY_DIRS`` points only at the test's own inventory dir.
"""

from __future__ import annotations

import os
import signal

import pytest

pytest_plugins = ["tests.sandbox_plugin", "tests.xdist_plugin", "tests.leftovers"]

#: folder -> the markers every test in it gets
KIND_MARKERS: dict[str, tuple[str, ...]] = {
    "unit": (), "agent": ("agent", "slow"), "sandbox": ("sandbox",), "trainer": ("trainer", "slow"),
    "gpu": ("gpu", "slow"),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.relative_to(item.config.rootpath).parts
        kind = parts[1] if len(parts) > 2 and parts[0] == "tests" else None
        if kind not in KIND_MARKERS:
            raise pytest.UsageError(f"{item.nodeid}: a test sits in a folder by kind "
                                    f"({', '.join(f'tests/{k}/' for k in KIND_MARKERS)})")
        for name in KIND_MARKERS[kind]:
            item.add_marker(getattr(pytest.mark, name))


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path_factory.mktemp("opsctl-home")
    monkeypatch.setenv("OPSCTL_HOME", str(home))
    monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", str(home / "inventory"))
    # No background connection multiplexers by default (each test has its own OPSCTL_HOME, so
    # each would leave one behind); tests/sandbox/test_mux_sandbox.py turns it on, the sandbox CLI
    # workflows (tests/sandbox/test_cli_sandbox.py) run both ways, and OPSCTL_TEST_MUX=1 runs the whole
    # suite through it.
    monkeypatch.setenv("OPSCTL_MUX", os.environ.get("OPSCTL_TEST_MUX", "0"))
    monkeypatch.setenv("OPSCTL_MUX_IDLE_S", "5")
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.delenv("TMUX_PANE", raising=False)
    return home


#: What a test starts with for the signals a job, a trainer or Ctrl-C is about.
_SIGNALS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


@pytest.fixture(autouse=True)
def default_signal_handlers():
    """Every test starts with Python's own SIGINT/SIGTERM handling. Code run in-process (the
    trainer's ``main`` installs its stop flag) may leave another handler behind, and an
    ignored signal is inherited by every child: a terminal's Ctrl-C would not reach an
    ``opsctl forward`` a later test spawns in the same worker."""
    for sig, handler in _SIGNALS.items():
        signal.signal(sig, handler)
    yield
