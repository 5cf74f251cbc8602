"""benchmarks/harness.py: one median, one timer, and a result that names its date, git
revision and machine; every benchmark script writes its result through it."""

from __future__ import annotations

import ast
import json
import os
import subprocess

import pytest

from benchmarks import harness
from tests.paths import REPO


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert harness.median([3.0, 1.0, 2.0]) == 2.0
    assert harness.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_a_median_of_nothing_is_an_error_not_zero():
    with pytest.raises(ValueError, match="at least one sample"):
        harness.median([])


def test_timed_runs_the_warmups_untimed_then_the_runs():
    calls = []
    timing = harness.timed(lambda: calls.append(1), runs=5, warmup=2)
    assert len(calls) == 7 and len(timing.samples) == 5
    assert timing.min_s <= timing.median_s <= timing.max_s
    assert set(timing.as_dict()) == {"samples", "median_s", "min_s", "max_s"}


@pytest.mark.parametrize("runs", [0, -1])
def test_timed_refuses_fewer_than_one_run(runs):
    with pytest.raises(ValueError, match="at least 1"):
        harness.timed(lambda: None, runs=runs)


def test_a_result_names_its_date_revision_and_machine(tmp_path):
    path = tmp_path / "deep" / "out.json"
    doc = harness.write_result("example", {"x_s": 1.5}, path, params={"runs": 3})
    assert json.loads(path.read_text()) == doc
    assert list(doc) == ["benchmark", "date", "git_revision", "machine", "params", "result"]
    assert doc["result"] == {"x_s": 1.5} and doc["params"] == {"runs": 3}
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert doc["git_revision"].removesuffix("-dirty") == head
    assert doc["date"].endswith("Z") and doc["machine"]["cores"] == os.cpu_count()
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]  # no temporary left


def test_without_git_the_revision_is_unknown_or_the_one_given(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git, no nvidia-smi
    monkeypatch.delenv("OPSCTL_BENCH_REVISION", raising=False)
    assert harness.git_revision() == "unknown"
    monkeypatch.setenv("OPSCTL_BENCH_REVISION", "abc1234")
    assert harness.git_revision() == "abc1234"
    assert harness.machine()["gpus"] == []


def test_outside_a_checkout_the_revision_is_unknown(tmp_path, monkeypatch):
    monkeypatch.delenv("OPSCTL_BENCH_REVISION", raising=False)
    assert harness.git_revision(tmp_path) == "unknown"


def test_without_a_path_the_result_goes_to_stdout(capsys):
    harness.write_result("example", [1, 2])
    assert json.loads(capsys.readouterr().out)["result"] == [1, 2]


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "benchmarks").glob("*.py")
                                          if p.name != "harness.py"))
def test_every_benchmark_script_writes_its_result_through_the_harness(script):
    tree = ast.parse((REPO / "benchmarks" / script).read_text(encoding="utf-8"))
    calls = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
             and node.func.value.id == "harness"}
    assert "write_result" in calls


def test_the_operations_benchmark_prints_its_rows_and_writes_the_harness_envelope(tmp_path, capsys):
    from benchmarks import ops

    path = tmp_path / "ops.json"
    ops._report({"revision": "abc1234", "status_ratio": 1.1, "status_cold_ratio": 2.5}, str(path),
                {"runs": 3, "baseline": "main"})
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["revision", "abc1234"]
    assert rows[1].endswith("✓") and "✗ (target ≤ 2.0)" in rows[2]
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "ops" and doc["params"] == {"runs": 3, "baseline": "main"}
    assert doc["result"]["status_ratio"] == 1.1 and doc["git_revision"] and doc["machine"]["cores"]
