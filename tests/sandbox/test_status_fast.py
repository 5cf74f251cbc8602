"""`opsctl status` through a warm multiplexer reads no YAML and no pydantic, and says exactly
what the full path says (opsctl/ops/quickstatus.py, opsctl/remote/leanreply.py,
opsctl/config/targetcache.py)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl.cli import cli
from opsctl.cli.jsonout import print_json
from opsctl.config import inventory, targetcache
from opsctl.remote import leanreply, models, mux_socket
from opsctl.remote import mux_client as mux
from tests.paths import REPO

# --- the lean reading is pydantic's reading, or none -------------------------------------

A_STATUS = {
    "job_id": "j-1", "name": "train", "state": "RUNNING", "healthy": True, "phase": "train",
    "created_at": 1796062908.25, "started_at": 1796062909.5, "ended_at": None, "elapsed_s": 12.5,
    "pid": 123, "pgid": 123, "alive": True, "exit_code": None, "signal": None,
    "pane_tail": ["step 3"], "output_tail": ["step 3"], "output_log": "/opt/opsctl/jobs/j-1/output.log",
    "output_size": 42, "last_output_at": 1796062920.0, "last_step": {"step": 3, "loss": 2.5},
    "events_tail": [{"event": "step", "step": 3}],
    "gpus": [{"index": 0, "name": "H200", "util_pct": 97, "mem_used_mib": 1000.5, "extra": 1}],
    "gpu_error": None, "gpus_at": 1796062921.0,
    "diagnosis": [{"cause": "hang", "severity": "warning", "summary": "quiet", "evidence": ["x"]}],
    "evidence": [], "hang_threshold_s": 600, "errors": [], "transitions": [], "now": 1796062922.0,
    "hang": {"at": 1.0, "quiet_since": 0.5, "idle_s": 700, "threshold_s": 600.0,
             "processes": [{"pid": 7, "threads": 2, "where": "f.py:3"}]},
    "preflight": {"needed": [0], "busy": [{"index": 1, "processes": [{"pid": 9}]}]},
    "history": {"format": 1, "bucket_s": 2.0, "t": [1.0, 2], "loss": [None, 2.5],
                "marks": [{"t": 1.0, "kind": "hang", "label": "x"}]},
    "tmux": {"socket": "opsctl", "session": "j-1", "error": None},
    "attempt": 1, "max_restarts": None, "restarts": [{"attempt": 1, "at": 3, "reason": "r"}],
    "end_reason": None, "max_duration_s": None,
}

#: Values put in place of each field in turn: pydantic keeps, converts, repairs or refuses them.
ODD_VALUES = [None, 0, 7, 2**60, 2**70, 1.5, float("inf"), True, "", "RUNNING", "7", [], [1], [None],
              {}, {"index": 0}, [{"index": "0"}], [{"t": 1}], ["a"]]


def _pydantic(data: object) -> str | None:
    try:
        return json.dumps(models.JobStatus.model_validate(data).model_dump(mode="json"))
    except models.ValidationError:
        return None


def _lean(data: object) -> str | None:
    try:
        return json.dumps(leanreply.normalize(data, leanreply.shape_of(models.JobStatus)))
    except leanreply.Unsure:
        return None


def test_a_real_status_document_reads_the_same_without_pydantic_keys_in_order():
    lean = _lean(A_STATUS)
    assert lean is not None, "the agent's usual document must take the fast lane"
    assert lean == _pydantic(A_STATUS)


@pytest.mark.parametrize("field", sorted(A_STATUS))
def test_whatever_a_field_holds_the_lean_reading_is_pydantics_or_none(field):
    for value in ODD_VALUES:
        for data in ({**A_STATUS, field: value}, {k: v for k, v in A_STATUS.items() if k != field}):
            lean = _lean(data)
            assert lean is None or lean == _pydantic(data), (field, value, lean)


def test_values_pydantic_would_repair_or_coerce_leave_the_fast_lane():
    for field, value in [("history", {"t": "damaged"}), ("pid", "123"), ("alive", 1),
                         ("state", "SLEEPY"), ("elapsed_s", "1.5")]:
        assert _lean({**A_STATUS, field: value}) is None, field


def test_only_a_plain_successful_reply_is_read_without_pydantic():
    ok = json.dumps({"ok": True, "verb": "status", "agent_version": 1, "data": A_STATUS}).encode()
    assert leanreply.reply_data(b"noise\n" + ok + b"\n") == A_STATUS
    for bad in [b"", b"not json", json.dumps({"ok": False, "verb": "status", "error": {}}).encode(),
                json.dumps({"ok": "true", "verb": "status"}).encode(),
                b'{"ok": true, "verb": "status", "data": "\\ud800"}']:
        with pytest.raises(leanreply.Unsure):
            leanreply.reply_data(bad)


# --- the target cache follows the inventory files -------------------------------------------

def test_the_cached_target_is_dropped_when_an_inventory_file_changes_or_appears(isolated_env):
    inv = isolated_env / "inventory"
    inv.mkdir()
    (inv / "a.yaml").write_text("hosts:\n  pve1:\n    address: 10.0.0.1\n    port: 2222\n")
    spec = inventory.load().resolve("pve1")
    targetcache.store("pve1", spec)
    hit = targetcache.lookup("pve1")
    assert hit is not None and (hit.label, hit.ssh_label(), hit.known_hosts_path()) == \
        (spec.label, spec.ssh_label(), spec.known_hosts_path())
    assert mux_socket.key(hit) == mux_socket.key(spec), "the same mux serves both paths"
    (inv / "a.yaml").write_text("hosts:\n  pve1:\n    address: 10.0.0.2\n    port: 2222\n")
    assert targetcache.lookup("pve1") is None
    targetcache.store("pve1", inventory.load().resolve("pve1"))
    assert targetcache.lookup("pve1") is not None
    (inv / "b.yaml").write_text("hosts: {}\n")
    assert targetcache.lookup("pve1") is None


# --- through the sandbox --------------------------------------------------------------------

SPY = r"""
import base64, json, sys
from opsctl.remote import mux_client
replies = []
real = mux_client.call
def spy(*a, **k):
    reply = real(*a, **k)
    replies.append(reply)
    return reply
mux_client.call = spy
from opsctl.cli import cli
try:
    cli(sys.argv[1:], prog_name="opsctl")
except SystemExit as exc:
    code = exc.code
heavy = ("pydantic", "yaml", "paramiko", "fabric", "rich")
sys.stderr.write("\nSPY " + json.dumps({
    "code": code, "loaded": [m for m in heavy if m in sys.modules],
    "replies": [base64.b64encode(r.stdout).decode() for r in replies if r is not None]}) + "\n")
"""


def _spied(*args: str, mux_on: bool = True) -> tuple[str, dict[str, object]]:
    env = {**os.environ, "OPSCTL_MUX": "1" if mux_on else "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SPY, *args], capture_output=True, text=True,
                          env=env, timeout=60)
    spy = json.loads(proc.stderr.rsplit("\nSPY ", 1)[1])
    return proc.stdout, spy


@pytest.fixture
def warm_target(sandbox, isolated_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A long job in ct 200, deployed with the mux on (it stays warm for the test)."""
    monkeypatch.setenv("OPSCTL_MUX", "1")
    monkeypatch.setenv("OPSCTL_MUX_IDLE_S", "30")
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    book = tmp_path / "long.yaml"
    book.write_text(json.dumps({"name": "fast-status", "timeout_s": 60,
                                "command": ["python3", "-c", "import time\nprint('x', flush=True)\n"
                                            "time.sleep(120)\n"]}))
    res = CliRunner().invoke(cli, ["deploy", "--host", "sandbox", "--ct", "200", "--playbook",
                                   str(book), "--replace", "--no-wait"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert mux.wait_ready(inventory.load().resolve("sandbox")), "the deploy left no mux behind"
    yield "sandbox"
    CliRunner().invoke(cli, ["stop", "--grace", "1"])
    mux.stop_all()


def test_status_json_through_a_warm_mux_loads_no_yaml_pydantic_or_paramiko_and_prints_the_full_paths_document(
        warm_target, capsys):
    _spied("status", "--json")  # the first one builds the reply shape cache (pydantic, once)
    start = time.monotonic()
    out, spy = _spied("status", "--json")
    assert spy["code"] in (0, None), out
    assert spy["loaded"] == [], f"the fast lane imported {spy['loaded']} ({time.monotonic() - start:.2f} s)"
    (reply,) = spy["replies"]
    data = json.loads(base64.b64decode(reply).decode().strip().splitlines()[-1])["data"]
    print_json(models.JobStatus.model_validate(data).model_dump(mode="json"))
    assert out == capsys.readouterr().out, "the same JSON document, byte for byte"
    assert json.loads(out)["name"] == "fast-status"


def test_an_unknown_job_is_the_same_error_document_through_the_fast_lane_and_without_the_mux(
        warm_target):
    fast, spy = _spied("status", "--json", "no-such-job")
    assert spy["replies"], "it went through the mux"
    direct, direct_spy = _spied("status", "--json", "no-such-job", mux_on=False)
    assert not direct_spy["replies"]
    assert (spy["code"], json.loads(fast)) == (direct_spy["code"], json.loads(direct))
    assert spy["code"] == 26


def test_the_human_status_through_a_warm_mux_reads_as_without_it(warm_target):
    # its pydantic/rich imports run in a thread during the mux call: same view, same exit
    fast, spy = _spied("status")
    assert spy["replies"], "it went through the mux"
    direct, direct_spy = _spied("status", mux_on=False)
    assert spy["code"] in (0, None) and direct_spy["code"] in (0, None), (fast, direct)

    def shape(text: str) -> list[str]:  # ages and durations move between the two calls
        return [re.sub(r"\d+", "#", line) for line in text.splitlines()]

    assert "fast-status" in fast and shape(fast) == shape(direct), (fast, direct)
