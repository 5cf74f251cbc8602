"""``opsctl status`` sparklines, ``opsctl plot`` and ``--png`` through the real sandbox.

A trainer-like job in container 200 logs step events; its wrapper keeps the bounded history
(``history.json``) that ``status`` carries a small copy of and ``plot`` asks for in full.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.cli_runner import run_cli as run

pytestmark = pytest.mark.sandbox

TRAINER = textwrap.dedent("""
    import json, time
    def ev(**k): print(json.dumps(k), flush=True)
    ev(event="phase", phase="compiling")
    ev(event="compile", name="drafter_step", seconds=0.1)
    ev(event="phase", phase="training")
    for step in range(1, 31):
        ev(event="step", step=step, loss=round(3.0 / step, 4), tok_s=20000.0 if step < 20 else 4600.0,
           eta_s=30 - step, lr=1e-3, mfu=0.4, mem_gib=1.5)
        time.sleep(0.1)
    print("done", flush=True)
""")


#: the bundled CPU smoke job's events (playbooks/dflash-cpu-smoke.yaml: 40 steps, a step event
#: every 5, all within a few seconds), without its torch install
SMOKE_LOSSES = [6.9412, 6.5203, 6.2281, 6.0105, 5.837, 5.6622, 5.5159, 5.4057]
SMOKE_TRAINER = textwrap.dedent(f"""
    import json, time
    def ev(**k): print(json.dumps(k), flush=True)
    ev(event="phase", phase="training")
    for i, loss in enumerate({SMOKE_LOSSES!r}):
        ev(event="step", step=5 * (i + 1), loss=loss, tok_s=1800.0 + i, lr=3e-3, mem_gib=0.4)
        time.sleep(0.05)
    print("done", flush=True)
""")


def _finished(sandbox, isolated_env: Path, tmp_path: Path, name: str, script: str) -> str:
    """The job ``name`` running ``script`` in ct 200, deployed and followed to its end."""
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    book = tmp_path / f"{name}.yaml"
    book.write_text(json.dumps({"name": name, "command": ["python3", "-c", script],
                                "timeout_s": 60, "healthy_when": {"event": "step"}}))
    res = run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(book), "--json")
    assert res.exit_code == 0, res.output
    job_id = json.loads(res.stdout)["job_id"]
    res = run("status", "--host", "sandbox", "--ct", "200", "--job", job_id, "--follow", "--json")
    assert res.exit_code == 0, res.output
    return job_id


@pytest.fixture
def finished_job(sandbox, isolated_env: Path, tmp_path: Path) -> str:
    return _finished(sandbox, isolated_env, tmp_path, "curves", TRAINER)


@pytest.fixture
def finished_smoke_job(sandbox, isolated_env: Path, tmp_path: Path) -> str:
    return _finished(sandbox, isolated_env, tmp_path, "smoke-events", SMOKE_TRAINER)


def test_status_carries_a_small_history_and_shows_it_as_sparklines(finished_job):
    res = run("status", "--host", "sandbox", "--ct", "200", "--json")
    doc = json.loads(res.stdout)
    hist = doc["history"]
    assert hist is not None and 1 <= len(hist["t"]) <= 120
    assert set(hist) >= {"t", "loss", "tok_s", "marks"}
    loss = [x for x in hist["loss"] if x is not None]
    assert loss[0] > loss[-1]
    kinds = [m["kind"] for m in hist["marks"]]
    assert "compile" in kinds and kinds[-1] == "end"

    res = run("status", "--host", "sandbox", "--ct", "200")
    assert res.exit_code == 0
    line = next(x for x in res.output.splitlines() if x.strip().startswith("loss"))
    assert "█" in line and "▁" in line
    assert "C compile" in res.output and "X end" in res.output


def test_plot_draws_the_job_and_writes_the_same_charts_as_png(finished_job, tmp_path):
    res = run("plot", "--host", "sandbox", "--ct", "200", "--metric", "loss,tok_s", "--width", "80")
    assert res.exit_code == 0, res.output
    assert f"job {finished_job}" in res.output and "SUCCEEDED" in res.output
    assert "Ktok/s" in res.output and "minutes since start" in res.output

    png = tmp_path / "curves.png"
    res = run("plot", "--host", "sandbox", "--ct", "200", "--png", str(png), "--since", "1h")
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:4] == b"\x89PNG"

    res = run("plot", finished_job, "--host", "sandbox", "--ct", "200", "--json")
    doc = json.loads(res.stdout)
    assert doc["job_id"] == finished_job and doc["source"] == "history.json"
    assert len(doc["history"]["t"]) >= 2 and "mfu" in doc["history"]



def test_a_finished_40_step_jobs_plot_and_sparkline_end_at_its_final_loss(finished_smoke_job):
    """Its 8 step events fit in one or two 2 s buckets: the plot is drawn from the events
    themselves and ends at the last one, as the metrics line does."""
    job = finished_smoke_job
    res = run("plot", job, "--host", "sandbox", "--ct", "200", "--json")
    assert res.exit_code == 0, res.output
    hist = json.loads(res.stdout)["history"]
    assert hist["last"]["loss"] == {"t": hist["last"]["loss"]["t"], "v": 5.4057, "step": 40}
    assert hist["steps"]["step"] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert hist["steps"]["loss"] == SMOKE_LOSSES

    res = run("status", "--host", "sandbox", "--ct", "200", "--job", job)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "loss 5.4057" in next(x for x in lines if x.startswith("metrics:"))
    spark = next(x for x in lines if x.strip().startswith("loss"))
    assert " 5.4057  (5.4057…6.9412)" in spark, spark

    for by, axis in (("time", "minutes since start"), ("step", "step")):
        res = run("plot", job, "--host", "sandbox", "--ct", "200", "--by", by,
                  "--metric", "loss,tok_s", "--width", "80")
        assert res.exit_code == 0, res.output
        assert axis in res.output and "Ktok/s" in res.output
