"""``opsctl goodput``, its ``status`` line and ``--json`` through the real sandbox.

A trainer-like job in container 200 (the trainer's events, its ``--out-dir`` and ``--resume``
flags on its command line) crashes after step 12 on its first attempt; the restart policy runs
it again, and the second attempt resumes from step 8 (steps 9 to 12 are lost) and finishes.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from tests.cli_runner import run_cli as run

pytestmark = pytest.mark.sandbox

TRAINER = textwrap.dedent("""
    import json, os, sys, time
    def ev(**k): print(json.dumps(k), flush=True)
    marker = os.path.join(os.environ["OPSCTL_JOB_DIR"], "crashed-once")
    again = os.path.exists(marker)
    ev(event="phase", phase="loading")
    time.sleep(0.3)  # scenario: a start-up the ledger must find
    if again:
        ev(event="resume", step=8, path="ckpt-8", from_run="r1")
    start = 8 if again else 0
    ev(event="phase", phase="training", step=start, steps=20)
    time.sleep(0.1)  # scenario: the first optimizer step
    ev(event="startup", pg_ready_at=0.05, drafter_built_at=0.1, first_step_at=0.5)
    for step in range(start + 1, 21):
        time.sleep(0.1)  # scenario: one optimizer step
        ev(event="step", step=step, loss=1.0, tok_s=1000.0)
        if step == 8 and not again:
            ev(event="checkpoint", step=8, path="ckpt-8", blocked_s=0.05)
        if step == 12 and not again:
            open(marker, "w").close()
            sys.exit("crash after step 12")
    ev(event="done", step=20, reason="finished")
""")


@pytest.fixture
def crashed_and_resumed(sandbox, isolated_env: Path, tmp_path: Path) -> str:
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    book = tmp_path / "ledger.yaml"
    book.write_text(json.dumps({
        "name": "ledger", "timeout_s": 60, "healthy_when": {"event": "step"},
        "restart": {"max_restarts": 1},
        "command": ["python3", "-c", TRAINER, "--out-dir", "/tmp/opsctl-goodput-run",
                    "--resume", "auto"]}))
    res = run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(book), "--json")
    assert res.exit_code == 0, res.output
    job_id = json.loads(res.stdout)["job_id"]
    res = run("status", "--host", "sandbox", "--ct", "200", "--job", job_id, "--follow", "--json")
    assert res.exit_code == 0, res.output
    return job_id


def test_goodput_json_counts_the_crash_the_restart_and_the_lost_steps(crashed_and_resumed):
    res = run("goodput", crashed_and_resumed, "--host", "sandbox", "--ct", "200", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    schema = json.loads(run("schema", "goodput").stdout)
    assert [e.message for e in Draft202012Validator(schema).iter_errors(doc)] == []
    assert doc["ok"] is True and doc["jobs"] == [crashed_and_resumed]
    assert doc["out_dir"] == "/tmp/opsctl-goodput-run"
    assert (doc["crashes"], doc["restarts"]) == (1, 1)
    assert [a["lost_steps"] for a in doc["attempts"]] == [4, 0]
    assert doc["surviving_steps"] == 20 and doc["ended_at"] is not None
    assert sum(doc["causes"].values()) == pytest.approx(doc["wall_s"], abs=0.01)
    assert doc["causes"]["lost"] > 0.2 and doc["causes"]["restart_gap"] >= 0.9  # backoff 1 s
    assert 0 < doc["goodput"] < 1


def test_goodput_shows_the_table_and_the_timeline_and_status_its_line(crashed_and_resumed,
                                                                     tmp_path):
    png = tmp_path / "goodput.png"
    res = run("goodput", "--host", "sandbox", "--ct", "200", "--width", "60", "--png", str(png))
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert f"run {crashed_and_resumed}" in res.output
    assert "lost progress" in res.output and "restart gaps" in res.output
    assert "█ productive" in res.output
    res = run("status", "--host", "sandbox", "--ct", "200")
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("goodput "))
    assert "(1 crash)" in line and "start-up" in line
    status = json.loads(run("status", "--host", "sandbox", "--ct", "200", "--json").stdout)
    schema = json.loads(run("schema", "status").stdout)
    assert [e.message for e in Draft202012Validator(schema).iter_errors(status)] == []
    assert status["goodput"]["run_id"] == crashed_and_resumed
    res = run("jobs", "--host", "sandbox", "--ct", "200")
    assert "GOODPUT" in res.output


def test_goodput_of_a_run_that_is_not_there_is_a_one_line_error(crashed_and_resumed):
    res = run("goodput", "/no/such/out-dir", "--host", "sandbox", "--ct", "200")
    assert res.exit_code != 0
    assert "no run" in res.output and "Traceback" not in res.output
    res = run("goodput", "bad\x1bname", "--host", "sandbox", "--ct", "200")
    assert res.exit_code == 2 and "is not a run" in res.output
