"""One training run across two containers: ``deploy --nodes``, torchrun, a c10d rendezvous.

``opsctl sandbox up --ct 200 --ct 201`` brings both containers up; they share the host's
network, so opsctl's rendezvous is 127.0.0.1 (it sees both in one network namespace). Each
node runs one CPU/gloo rank of the tiny trainer, under torchrun: one world of two ranks.

Set-up, once for the module: the CPU torch build is installed under a private opsctl root in
ct 200 (``swap-torch``, ~50 s on an idle machine: the slow part), then that root's ``envs/``
is copied into ct 201's rootfs with hard links (``cp -al`` on the host, ~1 s), so the deploy
finds the same build current in both and installs nothing. The sandbox plugin keeps 201
stopped for its own tests (``stopped_ct``): the module stops it again when it is done.
"""

from __future__ import annotations

import json
import subprocess
import time
import typing as t
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from opsctl.cli import cli
from opsctl.sandbox import host as sandbox_mod
from tests.sandbox_plugin import STOPPED_CT, sandbox_home, use_private_root

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

SECOND_CT = 201  # the pair: ct 200 and ct 201
NODES = f"sandbox:200,sandbox:{SECOND_CT}"
TORCH = ["cpu", "--version", "2.13.0", "--requirement", "transformers==5.24.0",
         "--requirement", "safetensors==0.8.0"]
TWO_NODES = {  # one rank per node (gpus: 0, no --nproc): a world of two over gloo
    "name": "two-nodes",
    "command": ["python3", "-m", "remote_payload.trainer", "--preset", "tiny", "--device", "cpu",
                "--attn", "sdpa", "--compile", "off", "--steps", "5000", "--warmup-steps", "1",
                "--token-budget", "768", "--seq-buckets", "48,96", "--log-every", "1",
                "--out-dir", "/tmp/opsctl-two-nodes"],
    "env": {"OMP_NUM_THREADS": "1"}, "healthy_when": {"event": "step"}, "timeout_s": 240,
    "torch": {"variant": "cpu", "version": "2.13.0"},
    "requirements": ["transformers==5.24.0", "safetensors==0.8.0"]}


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, env=env)


@pytest.fixture(scope="module")
def two_containers(sandbox, tmp_path_factory) -> t.Iterator[str]:
    """Both containers up, the torch build in both; yields the private opsctl root."""
    up = run("sandbox", "up", "--ct", "200", "--ct", str(SECOND_CT), "--json",
             env={"OPSCTL_HOME": str(sandbox_home())})
    assert up.exit_code == 0, up.output[-2000:]
    assert {200, SECOND_CT} <= set(json.loads(up.stdout)["containers"])
    root = f"/opt/opsctl-test-nodes-{uuid.uuid4().hex[:8]}"
    home = tmp_path_factory.mktemp("nodes-home")
    use_private_root(sandbox, home, root)
    env = {"OPSCTL_HOME": str(home), "OPSCTL_INVENTORY_DIRS": str(home / "inventory"),
           "OPSCTL_MUX": "0"}
    swapped = run("swap-torch", *TORCH, "--host", "sandbox", "--ct", "200", "--json", env=env)
    assert swapped.exit_code == 0, swapped.output[-3000:]
    rootfs = {ct: Path(sandbox.lxc_path) / str(ct) / "rootfs" for ct in (200, SECOND_CT)}
    (rootfs[SECOND_CT] / root.lstrip("/")).mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(rootfs[200] / root.lstrip("/") / "envs"),
                    str(rootfs[SECOND_CT] / root.lstrip("/") / "envs")], check=True)
    yield root
    for ct in (200, SECOND_CT):
        subprocess.run(["lxc-attach", "-P", str(sandbox.lxc_path), "-n", str(ct), "--",
                        "rm", "-rf", root], check=False)
    sandbox_mod.ensure_container(STOPPED_CT, running=False, home=sandbox_home())  # as found


@pytest.fixture
def book(sandbox, two_containers: str, isolated_env: Path, tmp_path: Path) -> t.Iterator[str]:
    use_private_root(sandbox, isolated_env, two_containers)
    path = tmp_path / "two-nodes.yaml"
    path.write_text(json.dumps(TWO_NODES))
    yield str(path)
    run("stop", "--nodes", NODES, "--grace", "1")


def status() -> dict[str, t.Any]:
    result = run("status", "--json")  # no flags: the last deploy --nodes, every node
    assert result.exit_code == 0, result.output[-3000:]
    return t.cast(dict[str, t.Any], json.loads(result.stdout))


def trainer_pids(ct: int) -> list[str]:
    ps = run("exec", "--host", "sandbox", "--ct", str(ct), "--", "ps", "-eo", "pid=,args=").stdout
    return [line.split()[0] for line in ps.splitlines() if "remote_payload.trainer" in line]


def step_losses(ct: int) -> dict[int, float]:
    out = run("logs", "--host", "sandbox", "--ct", str(ct)).stdout
    events = [json.loads(line) for line in out.splitlines() if line.startswith('{"event":"step"')]
    return {e["step"]: e["loss"] for e in events}


def test_a_two_node_run_trains_one_world_on_both_nodes_and_stop_stops_every_node(book):
    deployed = run("deploy", "--nodes", NODES, "--playbook", book, "--json")
    assert deployed.exit_code == 0, deployed.output[-3000:]
    doc = json.loads(deployed.stdout)
    assert doc["ok"] and doc["outcome"] == "healthy" and doc["state"] == "RUNNING", doc["summary"]
    assert doc["rendezvous"].startswith("127.0.0.1:"), "shared network: loopback rendezvous"
    assert [n["label"] for n in doc["nodes"]] == ["sandbox ct 200", f"sandbox ct {SECOND_CT}"]
    assert {n["status"]["job_id"] for n in doc["nodes"]} == {doc["job_id"]}, "one id, every node"

    st = status()
    assert st["job_id"] == doc["job_id"] and [n["status"]["state"] for n in st["nodes"]] == \
        ["RUNNING", "RUNNING"]
    assert all(n["status"]["last_step"]["step"] >= 1 for n in st["nodes"]), st
    # one world: both nodes log the same all-reduced loss for the same step
    first, second = step_losses(200), step_losses(SECOND_CT)
    common = sorted(set(first) & set(second))
    assert common and all(first[s] == second[s] for s in common), (first, second)

    stopped = run("stop", "--grace", "5", "--json")
    assert stopped.exit_code == 0, stopped.output[-3000:]
    assert [n["stop"]["state"] for n in json.loads(stopped.stdout)["nodes"]] == \
        ["CANCELLED", "CANCELLED"]
    assert status()["state"] == "CANCELLED"
    assert trainer_pids(200) == [] and trainer_pids(SECOND_CT) == []


def test_a_node_killed_mid_run_fails_the_run_and_the_diagnosis_names_it(book):
    deployed = run("deploy", "--nodes", NODES, "--playbook", book, "--json")
    assert deployed.exit_code == 0, deployed.output[-3000:]
    pids = trainer_pids(SECOND_CT)  # torchrun and its rank (a session of its own)
    assert len(pids) == 2, pids
    killed = run("exec", "--host", "sandbox", "--ct", str(SECOND_CT), "--", "kill", "-KILL", *pids)
    assert killed.exit_code == 0, killed.output

    deadline = time.monotonic() + 90
    while True:
        st = status()
        if all(n["status"]["state"] in ("FAILED", "LOST", "SUCCEEDED") for n in st["nodes"]):
            break
        assert time.monotonic() < deadline, json.dumps(st)[-3000:]
        time.sleep(1)
    assert st["state"] == "FAILED" and st["failed_node"] == 1, st["summary"]
    assert st["summary"].startswith(f"run {st['job_id']} failed: node 1 (sandbox ct {SECOND_CT}) "
                                    "FAILED (SIGKILL)"), st["summary"]
    assert st["nodes"][0]["status"]["state"] == "FAILED", "torchrun: the other node fails too"
