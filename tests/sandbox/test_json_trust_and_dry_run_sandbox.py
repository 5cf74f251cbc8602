"""Against the real sandbox: a job that logs a NaN loss gives strict JSON everywhere, `host
trust` without a terminal needs ``-y``, and ``swap-torch --dry-run`` writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest
import yaml

from opsctl import errors
from tests.cli_runner import run_cli as run
from tests.paths import REPO
from tests.sandbox_plugin import use_private_root

pytestmark = pytest.mark.sandbox

ROOT = "/opt/opsctl-test-edges"  # this module's jobs, away from other tests'
T = ["--host", "sandbox", "--ct", "200"]
NAN_LOSS = ("import json\n"
            "print(json.dumps({'event': 'step', 'step': 1, 'loss': float('nan'), "
            "'tok_s': float('inf')}), flush=True)\n"
            "print(json.dumps({'event': 'eval', 'val_loss': float('-inf')}), flush=True)\n")


def strict_loads(text: str) -> t.Any:
    def refuse(word: str) -> t.NoReturn:
        raise ValueError(f"not JSON: {word}")
    return json.loads(text, parse_constant=refuse)


def test_json_never_contains_nan_or_infinity_for_a_job_that_logged_a_nan_loss(
        sandbox, isolated_env: Path, tmp_path: Path) -> None:
    use_private_root(sandbox, isolated_env, ROOT)
    book = tmp_path / "nan.json"
    book.write_text(json.dumps({"name": "nan-loss", "command": ["python3", "-u", "-c", NAN_LOSS],
                                "timeout_s": 60, "healthy_when": {"event": "step"}}))
    res = run("deploy", *T, "--playbook", str(book), "--json", "--replace")
    assert res.exit_code == 0, res.output
    job = strict_loads(res.stdout)["job_id"]
    run("status", job, *T, "--follow", "--poll", "0.3")
    for args in (["status", job, "--json"], ["jobs", "--json"], ["plot", job, "--json"],
                 ["--json", "status", job]):
        res = run(*args, *T)
        assert res.exit_code == 0, (args, res.output)
        strict_loads(res.stdout)  # parses with a strict parser, whatever the command
    status = strict_loads(run("status", job, *T, "--json").stdout)
    step = status["last_step"]
    assert step["loss"] is None and step["tok_s"] is None and step["step"] == 1
    assert step["nonfinite"] == ["loss", "tok_s"]
    # the real command line too (its fast path prints without click)
    proc = subprocess.run([sys.executable, "-m", "opsctl", "status", "--json", *T],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert strict_loads(proc.stdout)["last_step"]["nonfinite"] == ["loss", "tok_s"]
    # and the container's own record: events.jsonl holds null, never the bare word NaN
    res = run("exec", *T, "--", "cat", f"{ROOT}/jobs/{status['job_id']}/events.jsonl")
    events = [strict_loads(line) for line in res.stdout.splitlines() if line.strip()]
    evaluated = next(e for e in events if e["event"] == "eval")
    assert evaluated["val_loss"] is None and evaluated["nonfinite"] == ["val_loss"]


def test_host_trust_without_tty_needs_yes(sandbox, isolated_env: Path, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "h.yaml").write_text(yaml.safe_dump({"hosts": {"h": {
        "address": "127.0.0.1", "port": sandbox.port, "user": "root",
        "identity_file": str(sandbox.identity_file), "known_hosts": str(known)}}}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPSCTL_HOME": str(isolated_env),
           "OPSCTL_INVENTORY_DIRS": str(inv)}

    def trust(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "opsctl", "host", "trust", "--host", "h", *extra],
                              capture_output=True, text=True, timeout=120, check=False, env=env,
                              stdin=subprocess.DEVNULL)

    refused = trust()
    assert refused.returncode == errors.USAGE, refused.stderr
    assert sandbox.host_key_fingerprint in refused.stdout  # shown, so a person can check it
    assert "no terminal to ask on" in refused.stderr and "--yes" in refused.stderr
    assert "Aborted" not in refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    assert known.read_text() == ""  # nothing recorded
    ok = trust("-y")
    assert ok.returncode == 0, ok.stderr
    assert "recorded in known_hosts" in ok.stdout and known.read_text().strip()


def test_swap_torch_dry_run_writes_nothing_and_checks_the_index(
        sandbox, isolated_env: Path, tmp_path: Path) -> None:
    from opsctl.ops import jobs
    from tests.wheel_index import build_fake_torches, serve_index, write_simple_index

    root = f"/opt/opsctl-test-edges-dry-{os.getpid()}"
    use_private_root(sandbox, isolated_env, root)

    def tree() -> str:
        res = run("exec", *T, "--", "sh", "-c", f"find {root} -printf '%p %s %T@\\n' 2>&1 | sort")
        return str(res.stdout)

    try:
        # no payload in the container: a dry run ships none, says so, and creates nothing
        res = run("swap-torch", "cu130", *T, "--dry-run", "--index-url", "http://127.0.0.1:9/")
        assert res.exit_code == errors.USAGE and "no current opsctl payload" in res.output
        assert "No such file" in tree()
        with jobs.open_target("sandbox", 200) as tgt:
            tgt.agent.ensure_payload()  # what any deploy does first
        base = tmp_path / "index"
        write_simple_index(str(base / "index"), build_fake_torches(str(base / "wheels")))
        with serve_index(str(base / "index")) as url:  # the sandbox container shares 127.0.0.1
            before = tree()
            res = run("swap-torch", "cu130", *T, "--dry-run", "--version", "2.11.0", "--index-url", url)
            assert res.exit_code == 0, res.output
            assert "dry run: would install torch-2.11.0-cu130" in res.output
            assert "pip + verify" not in res.output and "installing" not in res.output
            assert "checked: the index answers and has torch 2.11.0+cu130" in res.output
            res = run("swap-torch", "cu130", *T, "--dry-run", "--version", "9.9.9", "--index-url", url)
            assert res.exit_code == errors.TORCH_ENV, res.output
            assert "9.9.9+cu130 is not on" in res.output and "nothing was changed" in res.output
            res = run("swap-torch", "cu130", *T, "--dry-run", "--version", "2.11.0",
                      "--index-url", "file:///etc")
            assert res.exit_code == errors.TORCH_ENV and "not a PEP 503 index" in res.output
            assert tree() == before  # not a file more, none changed: no envs/.lock
    finally:
        run("exec", *T, "--", "rm", "-rf", root)
