"""Plain `opsctl status` (no --follow/--all/--nodes): one agent ``status`` call through the one
transport, directly on the first command of a session or through a warm mux after it. Either
way it prints the same document and ends with the same errors and exit codes; the first
command refuses unknown and changed host keys like every other (opsctl/cli/jobs.py,
opsctl/remote/transport.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from opsctl import errors
from opsctl.cli import cli
from opsctl.config import inventory
from opsctl.remote import mux_client as mux
from opsctl.remote import shapes
from remote_payload.wire_shapes import StatusDoc
from tests.paths import REPO


def _opsctl(*args: str, mux_on: bool = False) -> subprocess.CompletedProcess[str]:
    """``opsctl ARGS`` in its own process (a real exit, a real stderr)."""
    env = {**os.environ, "OPSCTL_MUX": "1" if mux_on else "0", "OPSCTL_MUX_IDLE_S": "30",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "opsctl", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _printed(doc: dict) -> str:
    """What ``print_json`` writes for the validated status ``doc`` (the CLI's own writer)."""
    proc = subprocess.run([sys.executable, "-c", "import json, sys\n"
                           "from opsctl.cli.jsonout import print_json\n"
                           "from opsctl.remote import shapes\n"
                           "from remote_payload.wire_shapes import StatusDoc\n"
                           "print_json(shapes.validate(StatusDoc, json.load(sys.stdin), where='test'))"],
                          input=json.dumps(doc), capture_output=True, text=True, check=True)
    return proc.stdout


def _no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def home(sandbox, tmp_path_factory: pytest.TempPathFactory):
    """One long job in ct 200 for the module (its own home and opsctl root, mux off)."""
    from tests.sandbox_plugin import private_home

    home = tmp_path_factory.mktemp("status-home")
    with private_home(sandbox, home, "/opt/opsctl-status"):
        book = home / "long.yaml"
        book.write_text(json.dumps({"name": "plain-status", "timeout_s": 120, "command": [
            "python3", "-c", "import time\nprint('x', flush=True)\ntime.sleep(300)\n"]}))
        res = CliRunner().invoke(cli, ["deploy", "--host", "sandbox", "--ct", "200", "--playbook",
                                       str(book), "--replace", "--no-wait"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        yield home
        CliRunner().invoke(cli, ["stop", "--grace", "1"])
        mux.stop_all()


@pytest.fixture(autouse=True)
def in_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test (and every opsctl it starts) uses the module's home and inventory."""
    monkeypatch.setenv("OPSCTL_HOME", str(home))
    monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", str(home / "inventory"))
    return home


@pytest.fixture
def warm(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A live mux for the sandbox host (left by a first command with the mux on)."""
    monkeypatch.setenv("OPSCTL_MUX", "1")  # this process asks it too (wait_ready)
    first = _opsctl("status", "--json", mux_on=True)
    assert first.returncode == 0, first.stderr
    assert mux.wait_ready(inventory.load().resolve("sandbox")), "the first command left no mux"
    return home


def test_the_first_status_of_a_session_prints_the_agents_status_document(home):
    proc = _opsctl("status", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["name"] == "plain-status" and doc["state"] in ("RUNNING", "SETTING_UP", "COMPILING")
    assert proc.stdout == _printed(doc), "the shape's document, as print_json writes it"
    assert set(doc) - {"ok"} <= set(t.get_type_hints(StatusDoc)), "the shape's keys, nothing else"
    assert shapes.validate(StatusDoc, doc, where="test") is not None


def test_status_through_a_warm_mux_is_the_same_document(warm):
    direct = json.loads(_opsctl("status", "--json").stdout)
    proc = _opsctl("status", "--json", mux_on=True)
    assert proc.returncode == 0, proc.stderr
    through = json.loads(proc.stdout)
    assert list(through) == list(direct), "same fields, same order"
    assert (through["job_id"], through["name"]) == (direct["job_id"], direct["name"])


def test_an_unknown_job_is_the_same_error_document_with_and_without_the_mux(warm):
    through = _opsctl("status", "--json", "no-such-job", mux_on=True)
    direct = _opsctl("status", "--json", "no-such-job")
    assert through.returncode == direct.returncode == errors.UNKNOWN_JOB
    assert json.loads(through.stdout) == json.loads(direct.stdout)
    assert json.loads(direct.stdout)["ok"] is False
    _no_traceback(through)


def test_the_human_status_reads_the_same_with_and_without_the_mux(warm):
    through = _opsctl("status", mux_on=True)
    direct = _opsctl("status")
    assert through.returncode == direct.returncode == 0, (through.stderr, direct.stderr)

    def shape(text: str) -> list[str]:  # ages and durations move between the two calls
        return [re.sub(r"\d+", "#", line) for line in text.splitlines()]

    assert "plain-status" in direct.stdout and shape(through.stdout) == shape(direct.stdout)


def test_a_missing_container_is_its_exit_code_and_one_error_document(home, missing_ct):
    proc = _opsctl("status", "--json", "--host", "sandbox", "--ct", str(missing_ct))
    assert proc.returncode == errors.ContainerMissing.exit_code, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "ContainerMissing"
    assert f"container {missing_ct} does not exist" in proc.stderr
    _no_traceback(proc)


def _host_with_known_hosts(sandbox, home: Path, known: Path) -> None:
    (home / "inventory" / "h.yaml").write_text(yaml.safe_dump({"hosts": {"h": {
        "address": "127.0.0.1", "port": sandbox.port, "user": "root", "known_hosts": str(known),
        "identity_file": str(sandbox.identity_file), "root": "/opt/opsctl-status",
        "containers": {200: {}}}}}))


def test_an_unknown_host_key_on_the_first_command_is_refused_with_exit_12(sandbox, home, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    _host_with_known_hosts(sandbox, home, known)
    proc = _opsctl("status", "--json", "--host", "h", "--ct", "200")
    assert proc.returncode == errors.HOST_KEY, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["type"] == "HostKeyError" and "is not in" in error["message"]
    assert "opsctl host trust --host h" in proc.stderr
    assert known.read_text() == "", "nothing was recorded"
    _no_traceback(proc)


def test_accept_new_host_key_on_the_first_command_records_the_key_and_answers(sandbox, home, tmp_path):
    known = tmp_path / "known_hosts"
    _host_with_known_hosts(sandbox, home, known)
    proc = _opsctl("status", "--json", "--accept-new-host-key", "--host", "h", "--ct", "200")
    assert proc.returncode == 0, proc.stderr
    assert known.read_text().startswith(f"[127.0.0.1]:{sandbox.port} ")
    again = _opsctl("status", "--json", "--host", "h", "--ct", "200")
    assert again.returncode == 0, "the recorded key is trusted from now on"


def test_a_changed_host_key_on_the_first_command_is_refused_with_exit_12(sandbox, home, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sandbox.port} " + " ".join(
        Path(f"{other}.pub").read_text().split()[:2]) + "\n")
    _host_with_known_hosts(sandbox, home, known)
    for mux_on in (False, True):  # the mux is bound to the verified key: no way around it
        proc = _opsctl("status", "--json", "--host", "h", "--ct", "200", mux_on=mux_on)
        assert proc.returncode == errors.HOST_KEY, proc.stderr
        assert "CHANGED" in json.loads(proc.stdout)["error"]["message"]
        _no_traceback(proc)
