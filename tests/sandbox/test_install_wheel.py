"""A normal install works: the wheel carries playbooks, the torch builds table, the example
inventory and the vendored libtmux wheel, and the installed (non-editable) opsctl deploys to
the sandbox from any directory.

Slow (builds a wheel and a venv: about 20 s); the venv sees the system site-packages so
fabric/torch are not downloaded again, but opsctl itself comes only from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.paths import REPO
from tests.sandbox_plugin import sandbox_home

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

_NOT_SOURCE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache",
                                     ".hypothesis", ".venv", "out")

HELLO = {"name": "wheel-hello", "command": ["sh", "-c", "echo ready; sleep 120"],
         "healthy_when": {"regex": "^ready$"}, "timeout_s": 60}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (outside the repo) with opsctl installed from a freshly built wheel; its bin dir."""
    base = tmp_path_factory.mktemp("wheel-install")
    src = base / "src"  # a clean copy: a stale build/ in the checkout must not leak into the wheel
    shutil.copytree(REPO, src, symlinks=True, ignore=_NOT_SOURCE)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(base / "dist"), str(src)], check=True, cwd=base)
    (wheel,) = (base / "dist").glob("opsctl-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(base / "venv")],
                   check=True)
    pip = [str(base / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
           "--no-index", "--force-reinstall", str(wheel)]
    subprocess.run(pip, check=True, cwd=base)
    return base / "venv" / "bin"


def opsctl(bin_dir: Path, *args: str, cwd: Path, home: Path,
           inventory_dirs: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "OPSCTL_INVENTORY_DIRS", "OPSCTL_INVENTORY")}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", OPSCTL_HOME=str(home), OPSCTL_MUX="0",
               HOME=str(home))
    if inventory_dirs is not None:
        env["OPSCTL_INVENTORY_DIRS"] = inventory_dirs
    return subprocess.run([str(bin_dir / "opsctl"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_wheel_carries_playbooks_the_example_inventory_and_the_libtmux_wheel(installed):
    wheel = next((installed.parent.parent / "dist").glob("opsctl-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"opsctl/bundled/playbooks/dflash-8gpu.yaml", "opsctl/bundled/playbooks/dflash-cpu-smoke.yaml",
            "opsctl/bundled/examples/hosts.yaml", "opsctl/bundled/torch-builds.yaml",
            "opsctl/sandbox/pct.py"} <= names
    assert not any(n.startswith("opsctl/bundled/inventory/") for n in names)
    assert any(n.startswith("remote_payload/wheels/libtmux-") and n.endswith(".whl") for n in names)


def test_the_installed_opsctl_is_the_wheel_not_the_checkout(installed, tmp_path):
    python = installed / "python"
    where = subprocess.run([str(python), "-c", "import opsctl, remote_payload; "
                            "print(opsctl.__file__); print(remote_payload.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout.split()
    for path in where:
        assert Path(path).is_relative_to(installed.parent), where


def test_bundled_playbooks_are_found_from_any_directory(installed, tmp_path):
    home = tmp_path / "home"
    listed = json.loads(opsctl(installed, "playbooks", "--json", cwd=tmp_path, home=home).stdout)
    origins = {p["name"]: p["origin"] for p in listed["playbooks"]}
    bundled = {p.stem for p in (REPO / "opsctl" / "bundled" / "playbooks").glob("*.yaml")}
    assert {"dflash-8gpu", "dflash-cpu-smoke", "dflash-chain"} <= bundled
    assert origins == dict.fromkeys(bundled, "bundled")


def test_fresh_install_dials_no_host(installed, tmp_path):
    """The installed package has no active host; its example is shown."""
    home = tmp_path / "home"
    hosts = json.loads(opsctl(installed, "hosts", "--json", cwd=tmp_path, home=home).stdout)
    assert hosts["hosts"] == []
    fleet = opsctl(installed, "status", "--all", "--json", cwd=tmp_path, home=home)
    assert fleet.returncode == 0 and json.loads(fleet.stdout)["rows"] == [], fleet.stderr
    example = opsctl(installed, "hosts", "--example", cwd=tmp_path, home=home)
    assert example.returncode == 0 and "pve1:" in example.stdout and "10.1.2.6" in example.stdout
    unknown = opsctl(installed, "status", "--host", "pve1", "--ct", "200", cwd=tmp_path, home=home)
    assert unknown.returncode == 2 and "unknown host 'pve1'" in unknown.stderr, unknown.stderr
    # the torch builds table is still shipped, and found without any inventory
    pin = subprocess.run([str(installed / "python"), "-c", "from opsctl.config.torch_builds import "
                          "load_table; print(load_table().resolve('cu130').name)"],
                         cwd=tmp_path, capture_output=True, text=True, check=False,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert pin.returncode == 0 and "cu130" in pin.stdout, pin.stderr


def test_a_playbook_in_the_current_directory_shadows_a_bundled_one(installed, tmp_path):
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "dflash-8gpu.yaml").write_text(json.dumps({**HELLO, "name": "dflash-8gpu"}))
    res = opsctl(installed, "playbooks", "--json", cwd=tmp_path, home=tmp_path / "home")
    rows = [(p["name"], p["origin"], p["active"]) for p in json.loads(res.stdout)["playbooks"]]
    assert ("dflash-8gpu", "cwd", True) in rows and ("dflash-8gpu", "bundled", False) in rows


def test_sandbox_up_and_deploy_work_from_a_temporary_directory(installed, sandbox, tmp_path):
    up = opsctl(installed, "sandbox", "up", "--json", cwd=tmp_path, home=sandbox_home())
    assert up.returncode == 0, up.stderr
    work = tmp_path / "project"
    (work / "inventory").mkdir(parents=True)
    (work / "playbooks").mkdir()
    shutil.copy(sandbox_home() / "inventory" / "sandbox.yaml", work / "inventory")
    (work / "playbooks" / "wheel-hello.yaml").write_text(json.dumps(HELLO))
    home = tmp_path / "home"
    try:
        res = opsctl(installed, "deploy", "--host", "sandbox", "--ct", "200", "--playbook",
                     "wheel-hello", "--replace", "--json", cwd=work, home=home)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert (doc["outcome"], doc["status"]["state"]) == ("healthy", "RUNNING")
    finally:
        opsctl(installed, "stop", "--host", "sandbox", "--ct", "200", "--grace", "1", cwd=work,
               home=home)
