"""The example alerting rules (docs/examples/opsctl-alerts.yml) are valid, fire as their test
file says (``promtool test rules``), and name only series the dashboard serves."""

from __future__ import annotations

import re
import subprocess

import yaml

from opsctl.cli import prometheus_metrics
from tests.paths import REPO
from tests.prometheus_tools import need

RULES = REPO / "docs" / "examples" / "opsctl-alerts.yml"
RULES_TEST = REPO / "tests" / "unit" / "prometheus" / "opsctl-alerts.test.yml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need("promtool"), *args], capture_output=True, text=True, timeout=60,
                          check=False, cwd=RULES_TEST.parent)


def test_promtool_check_rules_accepts_the_example_rules():
    res = promtool("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 5 rules found" in res.stdout


def test_promtool_test_rules_passes_the_rules_test_file():
    """Job FAILED, no step for 10 minutes while RUNNING, a GPU at 0 % for 5 minutes while a
    job runs, a host down, a run's goodput below 0.8 for an hour: each fires when it should
    and not before."""
    res = promtool("test", "rules", RULES_TEST.name)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_test_rules_fails_when_an_expectation_is_wrong(tmp_path):
    """The rules test can fail: the same file expecting the FAILED alert a minute early."""
    wrong = tmp_path / "wrong.test.yml"
    text = RULES_TEST.read_text().replace("../../../docs/examples/opsctl-alerts.yml", str(RULES))
    wrong.write_text(text.replace("- eval_time: 2m\n        alertname: OpsctlJobFailed",
                                  "- eval_time: 3m\n        alertname: OpsctlJobFailed", 1))
    assert wrong.read_text() != text
    res = promtool("test", "rules", str(wrong))
    assert res.returncode != 0 and "FAILED" in res.stdout + res.stderr


def test_the_rules_name_only_series_the_dashboard_serves():
    """A renamed metric family fails here instead of leaving an alert that never fires."""
    served = {name for name, _, _ in prometheus_metrics.FAMILIES}
    doc = yaml.safe_load(RULES.read_text())
    exprs = [rule["expr"] for group in doc["groups"] for rule in group["rules"]]
    named = {m for e in exprs for m in re.findall(r"\bopsctl_[a-z_]+\b", e)}
    assert named and named <= served, named - served
    labels = {lab for _, _, labs in prometheus_metrics.FAMILIES for lab in labs}
    for e in exprs:
        for group in re.findall(r"on \(([^)]*)\)", e):
            assert {x.strip() for x in group.split(",")} <= labels, e
