"""The ``env`` verb, the vendored libtmux wheel and the job's sitecustomize hook."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

from remote_payload.agent import jobstore as jobs
from remote_payload.agent import vendor
from tests.agent_helper import run_agent
from tests.paths import REPO

HOOK = REPO / "remote_payload" / "sitehook"


def _agent(root: Path, verb: str, *args: str) -> dict:
    return run_agent(root, verb, *[a for a in args if a != "--json"], timeout=60).reply


def test_env_reports_python_tmux_payload_digest_and_disk(tmp_path: Path) -> None:
    (tmp_path / "payload").mkdir()
    (tmp_path / "payload" / "MANIFEST.json").write_text(json.dumps(
        {"files": {}, "digest": "ab" * 32}))
    reply = _agent(tmp_path, "env", "--json")
    assert reply["ok"] is True, reply
    data = reply["data"]
    assert data["python"] == sys.executable
    assert data["python_version"].startswith("3.")
    assert data["root"] == str(tmp_path)
    assert data["payload_digest"] == "ab" * 32
    assert data["current_job"] is None
    assert data["disk_free_bytes"] > 0
    assert isinstance(data["gpus"], list)
    assert data["tmux"].startswith("tmux ")
    assert data["libtmux"] == "0.62.0"


def test_env_without_a_payload_has_no_digest(tmp_path: Path) -> None:
    data = _agent(tmp_path, "env")["data"]
    assert data["payload_digest"] is None


def test_the_vendored_libtmux_wheel_imports_from_the_zip_without_site_packages() -> None:
    (whl,) = Path(vendor.WHEELS_DIR).glob("libtmux-*.whl")
    with zipfile.ZipFile(whl) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [ln for ln in zf.read(meta).decode().splitlines()
                    if ln.startswith("Requires-Python:")]
    assert requires == ["Requires-Python: <4.0,>=3.10"]  # the container runs python 3.11
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from remote_payload.agent import vendor; vendor.add_wheels()\n"
            "import libtmux; print(libtmux.__file__)")
    out = subprocess.run([sys.executable, "-S", "-c", code, str(REPO)], capture_output=True,
                         text=True, check=True, env={"PATH": os.environ.get("PATH", "")})
    assert out.stdout.strip().startswith(str(whl) + os.sep)


def _run_with_hook(tmp_path: Path, code: str, *extra_path: Path) -> subprocess.CompletedProcess:
    # hook dir first, then the payload, as the wrapper sets a job's PYTHONPATH (wrapper.py); the
    # payload entry keeps the hook's own imports from depending on an installed opsctl
    env = {"PATH": os.environ.get("PATH", ""),
           "PYTHONPATH": os.pathsep.join([str(HOOK), str(REPO), *map(str, extra_path)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=30, check=False, cwd=tmp_path)


CHECK_USR1 = ("import os, signal, sys; sys.path.insert(0, {repo!r})\n"
              "from remote_payload.agent import jobstore as jobs\n"
              "print('usr1', jobs.catches_signal(os.getpid(), signal.SIGUSR1))")


def test_the_sitehook_arms_SIGUSR1_for_stack_dumps(tmp_path: Path) -> None:
    out = _run_with_hook(tmp_path, CHECK_USR1.format(repo=str(REPO)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["usr1 True"]


def test_the_sitehook_chains_to_the_next_sitecustomize(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.CHAINED = 'yes'\n")
    code = CHECK_USR1.format(repo=str(REPO)) + "\nimport builtins; print(builtins.CHAINED)"
    out = _run_with_hook(tmp_path, code, other)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["usr1 True", "yes"]


def test_a_broken_chained_sitecustomize_never_breaks_the_job(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('broken site config')\n")
    out = _run_with_hook(tmp_path, "print('job ran')", other)
    assert out.returncode == 0
    assert out.stdout == "job ran\n"
    assert "RuntimeError: broken site config" in out.stderr


def test_catches_signal_reads_the_handler_mask_of_a_live_process() -> None:
    # set both here: a test runner (or an earlier test in this worker) may have changed them
    old = signal.signal(signal.SIGINT, signal.default_int_handler), signal.signal(
        signal.SIGUSR2, signal.SIG_DFL)
    try:
        assert jobs.catches_signal(os.getpid(), signal.SIGINT) is True  # KeyboardInterrupt
        assert jobs.catches_signal(os.getpid(), signal.SIGUSR2) is False
    finally:
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGUSR2, old[1])
