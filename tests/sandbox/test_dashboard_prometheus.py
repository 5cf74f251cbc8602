"""A real Prometheus scrapes ``opsctl dashboard``'s ``/metrics`` and serves the series back.

Debian's ``prometheus`` runs on 127.0.0.1 with a config of its own (every second, the
dashboard as its one target, the example alerting rules loaded), its storage in the test's
temporary directory. The fleet is the real sandbox: one host with a job that sends a NaN loss,
one host whose port nobody listens on; the dashboard runs a doctor on each container
(``--doctor-every``). Everything is read back through Prometheus' HTTP API.
"""

from __future__ import annotations

import copy
import json
import math
import socket
import subprocess
import typing as t
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from opsctl.cli import cli, dashboard
from tests import dashboard_server
from tests.paths import REPO
from tests.prometheus_tools import need
from tests.waiting import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

# steps with a loss the JSON cannot hold (NaN) until the test says "go" (a file in the container)
NAN_TRAINER = """
import json, os, time
def ev(**k): print(json.dumps(k), flush=True)
ev(event="phase", phase="training")
step, deadline = 0, time.time() + 120
while not os.path.exists(GO) and time.time() < deadline:
    step += 1
    ev(event="step", step=step, loss=float("nan"), tok_s=1000.0 + step, eta_s=1)
    time.sleep(0.3)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fleet(sandbox, isolated_env: Path) -> t.Iterator[str]:
    doc = yaml.safe_load(Path(sandbox.inventory_file).read_text())
    base = doc["hosts"]["sandbox"]
    base["containers"] = {200: base["containers"][200]}
    hosts = {"gpu-a": copy.deepcopy(base), "gpu-down": {**copy.deepcopy(base), "port": free_port()}}
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "fleet.yaml").write_text(yaml.safe_dump({"hosts": hosts}))
    yield "gpu-a"
    CliRunner().invoke(cli, ["stop", "--host", "gpu-a", "--ct", "200", "--grace", "1"])


@pytest.fixture
def served(fleet: str) -> t.Iterator[dashboard.Server]:
    with dashboard_server.serving(refresh_s=1.0, lines=5, doctor_every_s=3600.0) as server:
        yield server


@pytest.fixture
def prometheus(served: dashboard.Server, tmp_path: Path) -> t.Iterator[str]:
    """A real Prometheus scraping the dashboard every second; yields its API's base URL."""
    binary = need("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(REPO / "docs" / "examples" / "opsctl-alerts.yml")],
        "scrape_configs": [{"job_name": "opsctl", "static_configs": [
            {"targets": [f"127.0.0.1:{served.server_address[1]}"]}]}]}))
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        assert proc.returncode is not None  # no Prometheus left behind


def api(base: str, path: str, **params: str) -> t.Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read().decode())
    except OSError:  # not listening yet
        return None


def query(base: str, expr: str) -> list[dict[str, t.Any]]:
    doc = api(base, "/api/v1/query", query=expr)
    return doc["data"]["result"] if doc and doc.get("status") == "success" else []


def by_host(results: list[dict[str, t.Any]]) -> dict[str, float]:
    return {r["metric"]["host"]: float(r["value"][1]) for r in results}


def test_prometheus_scrapes_the_fleet_and_serves_its_series_back(fleet, served, prometheus, tmp_path):
    go = f"/tmp/opsctl-prom-go-{uuid.uuid4().hex[:8]}"
    book = tmp_path / "nan.yaml"
    book.write_text(json.dumps({"name": "nan-loss", "timeout_s": 60, "healthy_when": {"event": "step"},
                                "command": ["python3", "-c", NAN_TRAINER.replace("GO", repr(go))]}))
    res = CliRunner().invoke(cli, ["deploy", "--host", fleet, "--ct", "200", "--playbook", str(book),
                                   "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    job_id = json.loads(res.stdout)["job_id"]

    up = wait_for(lambda: (lambda h: h if h == {"gpu-a": 1.0, "gpu-down": 0.0} else None)(
        by_host(query(prometheus, "opsctl_host_up"))), 90, what="opsctl_host_up of both hosts")
    assert up == {"gpu-a": 1.0, "gpu-down": 0.0}

    step = wait_for(lambda: query(prometheus, 'opsctl_job_step{host="gpu-a"} > 1'), 60,
                    what="a step of the sandbox job")
    labels = step[0]["metric"]
    assert (labels["job"], labels["instance"]) == ("opsctl", f"127.0.0.1:{served.server_address[1]}")
    assert (labels["container"], labels["job_id"]) == ("200", job_id)
    running = query(prometheus, 'opsctl_job_state{host="gpu-a",state="RUNNING"}')
    assert [float(r["value"][1]) for r in running] == [1.0]
    loss = query(prometheus, 'opsctl_job_loss{host="gpu-a"}')
    assert len(loss) == 1 and math.isnan(float(loss[0]["value"][1]))  # NaN, not a dropped scrape
    assert float(query(prometheus, 'opsctl_job_tokens_per_second{host="gpu-a"}')[0]["value"][1]) > 1000
    ratio = query(prometheus, 'opsctl_run_goodput_ratio{host="gpu-a"}')  # its run's ledger
    assert len(ratio) == 1 and 0.0 <= float(ratio[0]["value"][1]) <= 1.0, ratio
    queue = wait_for(lambda: query(prometheus, 'opsctl_queue_length{host="gpu-a"}'), 30,
                     what="the queue length of ct 200")
    assert [float(r["value"][1]) for r in queue] == [0.0]
    # --doctor-every: the container's doctor checks (the sandbox has no NVIDIA driver: its GPU
    # checks are skipped, not failed), the ssh check among them
    checks = wait_for(lambda: query(prometheus, 'opsctl_doctor_check_failing{host="gpu-a"}'), 90,
                      what="the doctor checks of ct 200")
    by_check = {r["metric"]["check"]: float(r["value"][1]) for r in checks}
    assert by_check["ssh"] == 0.0 and "host-driver" in by_check, by_check
    failing = query(prometheus, 'opsctl_doctor_failing_checks{host="gpu-a"}')
    assert [float(r["value"][1]) for r in failing] == [sum(by_check.values())]
    # the unreachable host: only its up series, no stale job values
    assert query(prometheus, '{host="gpu-down", __name__=~"opsctl_.+", '
                             '__name__!~"opsctl_(host|container)_up"}') == []
    # ... and the example rules see it: the host-down alert is pending (it fires after 2 min)
    alerts = wait_for(lambda: query(prometheus, 'ALERTS{alertname="OpsctlHostDown"}'), 30,
                      what="the host-down alert")
    assert [(a["metric"]["host"], a["metric"]["alertstate"]) for a in alerts] == [
        ("gpu-down", "pending")]
    # the scrape itself is healthy, and the example rules loaded
    targets = api(prometheus, "/api/v1/targets")["data"]["activeTargets"]
    assert [tg["health"] for tg in targets] == ["up"], targets
    health = {"OpsctlJobFailed": "ok", "OpsctlNoStepFor10Minutes": "ok",
              "OpsctlGpuIdle5Minutes": "ok", "OpsctlHostDown": "ok",
              "OpsctlGoodputBelow80Percent": "ok"}
    wait_for(lambda: {r["name"]: r["health"] for g in api(prometheus, "/api/v1/rules")["data"]["groups"]
                      for r in g["rules"]} == health, 30, what="the example rules evaluated")
    CliRunner().invoke(cli, ["exec", "--host", fleet, "--ct", "200", "--", "touch", go])
