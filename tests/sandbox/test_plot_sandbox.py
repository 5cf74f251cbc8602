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


@pytest.fixture
def finished_job(sandbox, isolated_env: Path, tmp_path: Path) -> str:
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox.inventory_file, inv / "sandbox.yaml")
    book = tmp_path / "curves.yaml"
    book.write_text(json.dumps({"name": "curves", "command": ["python3", "-c", TRAINER],
                                "timeout_s": 60, "healthy_when": {"event": "step"}}))
    res = run("deploy", "--host", "sandbox", "--ct", "200", "--playbook", str(book), "--json")
    assert res.exit_code == 0, res.output
    job_id = json.loads(res.stdout)["job_id"]
    res = run("status", "--host", "sandbox", "--ct", "200", "--job", job_id, "--follow", "--json")
    assert res.exit_code == 0, res.output
    return job_id


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

