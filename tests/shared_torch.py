"""One real CPU torch install per test session, shared by every sandbox container that needs it.

Installing torch 2.13.0+cpu into a container through ``swap-torch`` (wheelhouse download on
this side, push, pip, the verification's real ``torch.compile``) costs 60-150 s of a 2-core
machine, and three groups of tests need the real build in a container: the distributed jobs
(``REAL_TORCH_GROUP``) and the README demo (``REAL_TORCH_DEMO_GROUP``) on ct 200's default root,
and the multi-node run's private root. They run in different xdist workers, each with a
sandbox of its own, and each installing it again would cost minutes.

The first one to ask installs it the product's way (``opsctl swap-torch``, so the real
install path stays tested end to end: ``tests/sandbox/test_torch_sandbox.py`` checks that
install's recorded reply), and publishes the finished build into the sandbox home
(``<home>/shared/``, destroyed with the home by ``.ci/run``); every later one hard-links it into
its own root (``cp -al``: every sandbox's rootfs is on the same filesystem, the containers are
privileged, so owners match) and runs the same ``swap-torch``, which then finds the build
installed and only switches to it. A build is relocatable for opsctl: every launch is
``python -m``, ``envs/current`` is a relative link, and the build's marker holds no path
(``remote_payload/agent/torchenv/layout.py``). A file lock orders the workers: the second
waits for the first's install instead of doing its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import typing as t
from collections.abc import Iterator
from pathlib import Path

from click.testing import CliRunner

from opsctl.cli import cli
from opsctl.config.inventory import DEFAULT_ROOT
from opsctl.sandbox import host as sandbox_mod
from tests.sandbox_plugin import session_home

BUILD = "torch-2.13.0-cpu"
INSTALL_REPLY = "install-reply.json"
#: the build and the requirements the CPU jobs of the suite import (the bundled smoke playbook's)
SWAP_ARGS = ("cpu", "--version", "2.13.0", "--requirement", "transformers==5.24.0",
             "--requirement", "safetensors==0.8.0")


def _shared_dir() -> Path:
    """Below the session's sandbox home (not a worker's): every worker sees the same one."""
    return session_home() / "shared"


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    shared = _shared_dir()
    shared.mkdir(parents=True, exist_ok=True)
    with open(shared / "real-torch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield shared


def real_cpu_build(sandbox: sandbox_mod.SandboxInfo, ct: int, root: str,
                   env: dict[str, str]) -> dict[str, t.Any]:
    """Make the real CPU build current in ``root`` of container ``ct``; returns swap's reply.

    ``env`` is the CLI's environment (``OPSCTL_HOME`` and an inventory that names ``root``)."""
    envs_dir = Path(sandbox.lxc_path) / str(ct) / "rootfs" / root.lstrip("/") / "envs"
    with _locked() as shared:
        cached = shared / BUILD
        if cached.is_dir() and not (shared / INSTALL_REPLY).is_file():
            shutil.rmtree(cached)  # published by an older suite: no record of its install
        if cached.is_dir() and not (envs_dir / BUILD).exists():
            envs_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-al", str(cached), str(envs_dir / BUILD)], check=True)
        reply = _swap(ct, env)
        if not cached.is_dir():
            if reply["action"] != "install":  # a reused sandbox had it: the record needs a real one
                reply = _swap(ct, env, "--reinstall")
            staging = shared / f".staging-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            subprocess.run(["cp", "-al", str(envs_dir / BUILD), str(staging)], check=True)
            (shared / INSTALL_REPLY).write_text(json.dumps(reply))
            staging.rename(cached)
        return reply


def link_published_build(envs_dir: Path) -> bool:
    """Hard-link the session's published build into ``envs_dir`` of a root on this machine (the
    sandbox's direct host), waiting for an install under way; False when none is published yet
    or this machine's ``/usr/bin/python3`` is not the build's (its venv links that python), in
    which case the caller's deploy installs the build the product's way."""
    with _locked() as shared:
        cached = shared / BUILD
        if not (cached.is_dir() and (shared / INSTALL_REPLY).is_file()):
            return False
        cfg = (cached / "pyvenv.cfg").read_text()
        here = subprocess.run(["/usr/bin/python3", "-c", "import platform; print(platform.python_version())"],
                              capture_output=True, text=True, check=False).stdout.strip()
        if f"version = {here}\n" not in cfg:
            return False
        if not (envs_dir / BUILD).exists():
            envs_dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-al", str(cached), str(envs_dir / BUILD)], check=True)
        return True


def _swap(ct: int, env: dict[str, str], *extra: str) -> dict[str, t.Any]:
    res = CliRunner().invoke(cli, ["swap-torch", *SWAP_ARGS, "--host", "sandbox", "--ct", str(ct),
                                   "--json", *extra], catch_exceptions=False, env=env)
    assert res.exit_code == 0, res.output[-3000:]
    return t.cast(dict[str, t.Any], json.loads(res.stdout))


def install_reply() -> dict[str, t.Any]:
    """``swap-torch --json``'s reply for the session's one real install (wheelhouse download,
    pip, verification), kept with the shared build for the tests that check it."""
    return t.cast(dict[str, t.Any], json.loads((_shared_dir() / INSTALL_REPLY).read_text()))


def real_cpu_build_in_default_root(sandbox: sandbox_mod.SandboxInfo, home: Path) -> dict[str, t.Any]:
    """The real CPU build current in ct 200's default root (``/opt/opsctl``), as the README demo
    and the distributed jobs use it; ``home`` is a scratch ``OPSCTL_HOME``."""
    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    env = {"OPSCTL_HOME": str(home), "OPSCTL_INVENTORY_DIRS": str(inv), "OPSCTL_MUX": "0"}
    # a job another test left in this worker's /opt/opsctl would make the switch wait or refuse
    CliRunner().invoke(cli, ["stop", "--host", "sandbox", "--ct", "200", "--grace", "1"], env=env)
    return real_cpu_build(sandbox, 200, DEFAULT_ROOT, env)
