"""An inventory ``identity_file`` that is not a private key (missing, a directory, a FIFO, a
device, garbage) is a configuration error naming it (exit 2), at once and before any
connection; never a hang, never "cannot connect" (opsctl/remote/identity.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from opsctl.remote import identity


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "absent"


def _directory(tmp_path: Path) -> Path:
    (tmp_path / "dir").mkdir()
    return tmp_path / "dir"


def _fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "fifo")
    return tmp_path / "fifo"


def _device(tmp_path: Path) -> Path:
    (tmp_path / "zero").symlink_to("/dev/zero")
    return tmp_path / "zero"


def _garbage(tmp_path: Path) -> Path:
    (tmp_path / "garbage").write_text("not a key\n")
    return tmp_path / "garbage"


@pytest.mark.parametrize("make, says", [
    (_missing, "does not exist"),
    (_directory, "is not a regular file"),
    (_fifo, "is not a regular file"),
    (_device, "is not a regular file"),
    (_garbage, "is not a private key paramiko can read"),
])
def test_status_json_with_an_unusable_identity_file_is_a_config_error_naming_it(
        make, says, tmp_path, isolated_env: Path):
    path = make(tmp_path)
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yaml").write_text(yaml.safe_dump({"hosts": {"h": {
        "address": "127.0.0.1", "port": 9, "identity_file": str(path), "containers": {200: {}}}}}))
    start = time.monotonic()
    res = CliRunner().invoke(cli, ["status", "--json", "--host", "h", "--ct", "200"])
    assert time.monotonic() - start < 5.0, "never waits on a FIFO or a device"
    assert res.exit_code == errors.USAGE, res.output
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "ConfigError"
    assert doc["error"]["message"].startswith(f"h: identity_file {path} {says}"), doc["error"]


def test_a_key_with_a_passphrase_passes_the_check_for_the_connect_to_report(tmp_path):
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)], check=True)
    assert identity.check(str(key), "h") == str(key)


def test_a_working_key_passes_with_its_home_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id")],
                   check=True)
    assert identity.check("~/id", "h") == str(tmp_path / "id")
