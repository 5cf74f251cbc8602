"""Re-deploy speed path: an unchanged payload is checked by `launch` itself (one round trip);
a missing or different payload is still shipped and verified before anything launches."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from tests.agent_helper import run_agent
from tests.cli_runner import run_cli as run
from tests.sandbox_plugin import use_private_root

SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(120)"


@pytest.fixture
def private_root(sandbox, isolated_env: Path):
    """The sandbox host with its own opsctl root in the container, so tests can break it freely."""
    root = f"/tmp/opsctl-redeploy-{uuid.uuid4().hex[:8]}"
    use_private_root(sandbox, isolated_env, root)
    yield root
    run("stop", "--host", "sandbox", "--ct", "200", "--grace", "1")
    run("exec", "--host", "sandbox", "--ct", "200", "--", "rm", "-rf", root)


def deploy(tmp_path: Path, **extra: object) -> dict:
    book = tmp_path / "sleeper.yaml"
    book.write_text(json.dumps({"name": "sleeper", "command": ["python3", "-c", SLEEPER], **extra}))
    res = run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(book), "--replace",
              "--no-wait", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def steps(report: dict) -> list[str]:
    return [s["step"] for s in report["steps"]]


@pytest.mark.sandbox
def test_first_deploy_ships_then_an_unchanged_redeploy_is_a_single_launch(private_root, tmp_path):
    first = deploy(tmp_path)
    assert first["payload"]["sent"] is True
    assert "payload" in steps(first)  # the fast launch found no payload, so it was shipped
    assert first["status"]["state"] in ("SETTING_UP", "RUNNING")

    again = deploy(tmp_path)
    assert again["payload"]["sent"] is False
    assert steps(again) == ["launch", "payload-done"]  # no separate manifest read
    assert again["payload"]["digest"] == first["payload"]["digest"]
    assert again["status"]["state"] in ("SETTING_UP", "RUNNING")
    assert again["job_id"] != first["job_id"]


@pytest.mark.sandbox
def test_a_different_installed_payload_is_replaced_before_the_launch(private_root, tmp_path):
    first = deploy(tmp_path)
    manifest = f"{private_root}/payload/MANIFEST.json"
    res = run("exec", "--host", "sandbox", "--ct", "200", "--", "sed", "-i",
              's/"digest": "[0-9a-f]*"/"digest": "0000"/', manifest)
    assert res.exit_code == 0, res.output
    again = deploy(tmp_path)
    assert again["payload"]["sent"] is True
    assert steps(again)[:3] == ["launch", "payload", "payload-done"]
    installed = run("exec", "--host", "sandbox", "--ct", "200", "--", "cat", manifest).stdout
    assert json.loads(installed)["digest"] == first["payload"]["digest"]
    assert again["status"]["state"] in ("SETTING_UP", "RUNNING")


@pytest.mark.sandbox
def test_an_installed_payload_that_no_longer_imports_is_replaced_and_the_job_launches(
        private_root, tmp_path):
    first = deploy(tmp_path)
    # what a payload shipped from a half-edited tree looks like: another digest, and an agent
    # that dies at import, before it can answer anything
    broken = f"{private_root}/payload/remote_payload/agent/__main__.py"
    manifest = f"{private_root}/payload/MANIFEST.json"
    res = run("exec", "--host", "sandbox", "--ct", "200", "--", "sh", "-c",
              f"echo 'def broken(:' > {broken} && "
              f"sed -i 's/\"digest\": \"[0-9a-f]*\"/\"digest\": \"0000\"/' {manifest}")
    assert res.exit_code == 0, res.output
    again = deploy(tmp_path)
    assert again["payload"]["sent"] is True
    assert steps(again)[:3] == ["launch", "payload", "payload-done"]
    assert again["payload"]["digest"] == first["payload"]["digest"]
    assert again["status"]["state"] in ("SETTING_UP", "RUNNING")


@pytest.mark.sandbox
def test_a_playbook_with_a_cache_policy_still_runs_the_prepare_step(private_root, tmp_path):
    deploy(tmp_path)
    book = tmp_path / "clear.yaml"
    book.write_text(json.dumps({"name": "clear", "command": ["python3", "-c", SLEEPER],
                                "cache": "clear"}))
    res = run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(book), "--replace",
              "--no-wait", "--json")
    # this root has no torch build, so cache-clear refuses: proof that prepare ran (the
    # one-round-trip path would have launched without it)
    assert res.exit_code == 25, res.output
    assert "cache-clear" in json.loads(res.stdout)["error"]["message"]


def test_launch_with_another_payload_digest_is_refused_before_touching_any_job(tmp_path):
    root = tmp_path / "root"
    spec = {"job_id": "t-1", "name": "t", "command": [sys.executable, "-c", "pass"]}
    reply = run_agent(root, "launch", "--spec-json", json.dumps(spec), "--payload-digest", "f" * 64,
                      tmux_socket=f"opsctl-test-{os.getpid()}", timeout=60).reply
    assert reply["ok"] is False, reply
    assert reply["error"]["type"] == "PayloadMismatch"
    assert reply["error"]["fields"]["want"] == "f" * 64
    assert not (root / "jobs").exists()
