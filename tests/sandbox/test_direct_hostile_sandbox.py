"""A direct host (``enter: direct``) is the user's own machine: what opsctl removes there is
only what it made, whatever a clumsy user or the job put in its root. Through the real
sandbox's direct target (``sandbox-direct``: commands run on this machine, so the test
arranges the root with plain file operations)."""

from __future__ import annotations

import json
import os
import time
import typing as t
from pathlib import Path

import pytest

from opsctl.sandbox import host as sandbox_mod
from tests.cli_runner import run_cli as run
from tests.sandbox.test_direct_target_sandbox import END_SESSIONS, TRAINER, private_roots

pytestmark = pytest.mark.sandbox
FLAGS = ["--host", sandbox_mod.DIRECT_HOST]


@pytest.fixture
def root(sandbox: sandbox_mod.SandboxInfo, isolated_env: Path) -> t.Iterator[Path]:
    """The direct target's opsctl root, this test's own (made empty)."""
    path = Path(private_roots(sandbox, isolated_env)[sandbox_mod.DIRECT_HOST])
    path.mkdir(parents=True)
    yield path
    run("stop", *FLAGS, "--grace", "1")
    run("exec", *FLAGS, "--", "sh", "-c", END_SESSIONS, "_", str(path))
    run("exec", *FLAGS, "--", "rm", "-rf", str(path))


def _deploy(tmp_path: Path) -> t.Any:
    book = tmp_path / "steps.json"
    book.write_text(json.dumps({"name": "steps", "timeout_s": 60, "healthy_when": {"event": "step"},
                                "command": ["python3", "-c", TRAINER]}))
    return run("deploy", *FLAGS, "--playbook", str(book), "--json")


def test_a_payloads_dir_linked_to_a_disk_keeps_every_directory_opsctl_did_not_make(root, tmp_path):
    """``payloads`` a link to a bigger disk (or the job's link to the user's home): the deploy
    prunes old payloads there, never the datasets beside them, however old."""
    disk = root.parent / f"{root.name}-disk"
    (disk / "datasets" / "imagenet").mkdir(parents=True)
    (disk / "datasets" / "imagenet" / "train.bin").write_bytes(b"precious")
    (disk / ".cache" / "hf").mkdir(parents=True)
    day_ago = time.time() - 86400
    os.utime(disk / ".cache", (day_ago, day_ago))
    (disk / "0123456789abcdef").mkdir()  # an old payload of opsctl's: pruned
    (root / "payloads").symlink_to(disk)
    try:
        res = _deploy(tmp_path)
        assert res.exit_code == 0, res.output
        assert (disk / "datasets" / "imagenet" / "train.bin").read_bytes() == b"precious"
        assert (disk / ".cache" / "hf").is_dir()
        assert not (disk / "0123456789abcdef").exists()
        assert os.readlink(root / "payload").startswith("payloads/")
    finally:
        run("exec", *FLAGS, "--", "rm", "-rf", str(disk))


def test_a_payload_dir_that_is_not_opsctls_link_is_refused_and_kept(root, tmp_path):
    """A ``root`` such as a home that already holds a ``payload`` directory of the user's:
    the deploy says so in one line (exit 25) and removes nothing."""
    (root / "payload").mkdir()
    (root / "payload" / "notes.txt").write_text("mine\n")
    res = _deploy(tmp_path)
    assert res.exit_code == 25, res.output
    error = json.loads(res.stdout)["error"]["message"]
    assert f"{root}/payload is not the link opsctl keeps there; nothing was removed" in error
    assert (root / "payload" / "notes.txt").read_text() == "mine\n"
