"""The programs opsctl sends as ``python3 -c`` text (``opsctl exec``'s guard, the payload
unpacker) run where no payload is installed, and carry the shared ``/proc`` and bounded
readers with them (``opsctl/remote/command.py`` ``standalone``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from opsctl.remote import command, payload

#: no PYTHONPATH, no site, cwd ``/``: nothing of this checkout is importable
BARE = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def test_the_exec_guard_runs_with_no_payload_importable():
    argv = command.guard_argv(["sh", "-c", "echo ran"], 20)
    argv[0] = sys.executable
    r = subprocess.run(argv, capture_output=True, env=BARE, cwd="/", timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"ran\n", b"")


def test_the_exec_guards_deadline_ends_a_setsid_child_found_through_proc():
    argv = command.guard_argv(["sh", "-c", "setsid sleep 60 & sleep 60"], 1)
    argv[0] = sys.executable
    start = time.monotonic()
    r = subprocess.run(argv, capture_output=True, env=BARE, cwd="/", timeout=60)
    assert r.returncode == 124, r.stderr
    assert time.monotonic() - start < 15


def test_the_unpacker_installs_a_payload_with_no_payload_importable(tmp_path: Path):
    root = tmp_path / "root"
    (root / "jobs" / "j1").mkdir(parents=True)
    (root / "jobs" / "j1" / "pid").symlink_to("/etc/hostname")  # not the agent's: refused
    manifest = payload.build_manifest()
    r = subprocess.run([sys.executable, "-c", payload.UNPACK_SCRIPT, str(root)],
                       input=payload.tar_bytes(manifest), capture_output=True, env=BARE,
                       cwd="/", timeout=120)
    doc = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert r.returncode == 0 and doc["ok"] and doc["digest"] == manifest.digest, r.stderr
    assert (root / "payload").is_symlink()
