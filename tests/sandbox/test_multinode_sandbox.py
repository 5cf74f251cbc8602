"""One training run across two containers: ``deploy --nodes``, torchrun, a c10d rendezvous.

``opsctl sandbox up --ct 200 --ct 201`` brings both containers up; they share the host's
network, so opsctl's rendezvous is 127.0.0.1 (it sees both in one network namespace). Each
node runs one CPU/gloo rank of the tiny trainer, under torchrun: one world of two ranks.

Set-up, once for the module: the real CPU torch build becomes current under a private opsctl
root in ct 200 (``tests/shared_torch.py``: installed once per session by ``swap-torch``, linked
into every other sandbox that needs it), then that root's ``envs/`` is copied into ct 201's
rootfs with hard links (``cp -al`` on the host, ~1 s), so the deploy finds the same build
current in both and installs nothing. The sandbox plugin keeps 201
stopped for its own tests (``stopped_ct``): the module stops it again when it is done.
"""

from __future__ import annotations

import json
import subprocess
import typing as t
import uuid
from pathlib import Path

import pytest

from opsctl.sandbox import host as sandbox_mod
from tests.cli_runner import run_cli as run
from tests.sandbox_plugin import STOPPED_CT, sandbox_home, use_private_root
from tests.shared_torch import real_cpu_build
from tests.waiting import wait_for_value

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

SECOND_CT = 201  # the two nodes: ct 200 and ct 201
NODES = f"sandbox:200,sandbox:{SECOND_CT}"
TWO_NODES = {  # one rank per node (gpus: 0, no --nproc): a world of two over gloo
    "name": "two-nodes",
    "command": ["python3", "-m", "remote_payload.trainer", "--preset", "tiny", "--device", "cpu",
                "--attn", "sdpa", "--compile", "off", "--steps", "5000", "--warmup-steps", "1",
                "--token-budget", "768", "--seq-buckets", "48,96", "--log-every", "1",
                "--out-dir", "/tmp/opsctl-two-nodes"],
    "env": {"OMP_NUM_THREADS": "1"}, "healthy_when": {"event": "step"}, "timeout_s": 240,
    "torch": {"variant": "cpu", "version": "2.13.0"},
    "requirements": ["transformers==5.24.0", "safetensors==0.8.0"]}


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
    real_cpu_build(sandbox, 200, root, env)  # installed once per session (tests/shared_torch.py)
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


def test_a_two_node_run_trains_one_world_and_a_killed_node_fails_it_by_name(book):
    """One real two-node run (each deploy starts four torch processes: the suite's budget keeps
    it to one): it trains one world; then node 1 is killed and the run fails naming it, with no
    rank left on either node. ``stop`` ending every node's job is
    ``test_nodes_commands_act_only_on_one_run``'s (same code path, plain jobs)."""
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

    pids = trainer_pids(SECOND_CT)  # torchrun and its rank (a session of its own)
    assert len(pids) == 2, pids
    killed = run("exec", "--host", "sandbox", "--ct", str(SECOND_CT), "--", "kill", "-KILL", *pids)
    assert killed.exit_code == 0, killed.output

    def ended(st: dict[str, t.Any]) -> bool:
        return all(n["status"]["state"] in ("FAILED", "LOST", "SUCCEEDED") for n in st["nodes"])

    st = wait_for_value(status, ended, 90, interval=1)
    assert ended(st), json.dumps(st)[-3000:]
    assert st["state"] == "FAILED" and st["failed_node"] == 1, st["summary"]
    assert st["summary"].startswith(f"run {st['job_id']} failed: node 1 (sandbox ct {SECOND_CT}) "
                                    "FAILED (SIGKILL)"), st["summary"]
    assert st["nodes"][0]["status"]["state"] == "FAILED", "torchrun: the other node fails too"
    assert trainer_pids(200) == [] and trainer_pids(SECOND_CT) == [], "no rank left anywhere"

    # `stop` with no flags (the last deploy --nodes) on a run that already failed: it changes
    # nothing and says so (never a false CANCELLED)
    stopped = run("stop", "--grace", "1", "--json")
    assert stopped.exit_code == 0, stopped.output[-3000:]
    assert [n["stop"]["state"] for n in json.loads(stopped.stdout)["nodes"]] == \
        ["FAILED", "FAILED"], stopped.stdout


# --- --nodes acts on one run only, and is never "ok" with a node unreached ---
# Plain shell jobs (no torch): each launched through the real agent with the run membership a
# `deploy --nodes` gives it (wire.RUN_FIELD), or none (a single-container deploy).

HELLO = ["sh", "-c", "echo ready; exec sleep 300"]


@pytest.fixture(scope="module")
def pair(sandbox, tmp_path_factory) -> t.Iterator[str]:
    """Both containers up (no torch needed); yields a private opsctl root for this module."""
    up = run("sandbox", "up", "--ct", "200", "--ct", str(SECOND_CT), "--json",
             env={"OPSCTL_HOME": str(sandbox_home())})
    assert up.exit_code == 0, up.output[-2000:]
    root = f"/opt/opsctl-test-pair-{uuid.uuid4().hex[:8]}"
    yield root
    for ct in (200, SECOND_CT):
        subprocess.run(["lxc-attach", "-P", str(sandbox.lxc_path), "-n", str(ct), "--",
                        "rm", "-rf", root], check=False)
    sandbox_mod.ensure_container(STOPPED_CT, running=False, home=sandbox_home())  # as found


@pytest.fixture
def pair_env(sandbox, pair: str, isolated_env: Path) -> t.Iterator[None]:
    use_private_root(sandbox, isolated_env, pair)
    yield
    for ct in (200, SECOND_CT):
        run("stop", "--host", "sandbox", "--ct", str(ct), "--grace", "0", "--yes")


def launch(ct: int, job_id: str, membership: dict[str, t.Any] | None) -> None:
    """A job in ``ct`` through the agent's own launch verb (what deploy sends)."""
    from opsctl.ops import deploy as deploy_ops
    from opsctl.ops import jobs
    from remote_payload import wire

    spec: dict[str, t.Any] = {"job_id": job_id, "name": "pair", "command": HELLO,
                              "healthy_when": {"regex": "^ready$"}, "timeout_s": 60}
    if membership is not None:
        spec[wire.RUN_FIELD] = membership
    with jobs.open_target("sandbox", ct) as tgt:
        tgt.agent.ensure_payload()
        deploy_ops._launch(tgt, spec, True, False, {})


def state_of(ct: int, job_id: str) -> str:
    res = run("status", job_id, "--host", "sandbox", "--ct", str(ct), "--json", "-n", "0")
    return str(json.loads(res.stdout)["state"])


def test_nodes_commands_act_only_on_one_run(pair_env):
    tag = uuid.uuid4().hex[:6]
    # two unrelated single-container jobs: not one run, so neither status nor stop acts
    launch(200, f"solo-a-{tag}", None)
    launch(SECOND_CT, f"solo-b-{tag}", None)
    both = f"sandbox:200,sandbox:{SECOND_CT}"
    for verb in ("status", "stop"):
        res = run(verb, "--nodes", both, "--json", "--grace", "0") if verb == "stop" else \
            run(verb, "--nodes", both, "--json")
        assert res.exit_code == 2, res.output[-2000:]
        doc = json.loads(res.stdout)
        assert doc["ok"] is False and "are not one run" in doc["error"]["message"], doc
        assert f"job solo-a-{tag}, not part of a multi-node run" in doc["error"]["message"]
    assert (state_of(200, f"solo-a-{tag}"), state_of(SECOND_CT, f"solo-b-{tag}")) == \
        ("RUNNING", "RUNNING"), "a refused stop stopped nothing"

    # one run on both nodes: status is the run's, stop stops exactly its jobs
    run_id = f"pair-{tag}"
    launch(200, run_id, {"id": run_id, "node": 0, "nodes": 2})
    launch(SECOND_CT, run_id, {"id": run_id, "node": 1, "nodes": 2})
    st = run("status", "--nodes", both, "--json")
    assert st.exit_code == 0, st.output[-2000:]
    doc = json.loads(st.stdout)
    assert doc["ok"] is True and doc["job_id"] == run_id and doc["complete"] is True
    assert [n["status"]["run"] for n in doc["nodes"]] == [
        {"id": run_id, "node": 0, "nodes": 2}, {"id": run_id, "node": 1, "nodes": 2}]
    stopped = run("stop", "--nodes", both, "--grace", "1", "--json")
    assert stopped.exit_code == 0, stopped.output[-2000:]
    assert [n["stop"]["job_id"] for n in json.loads(stopped.stdout)["nodes"]] == [run_id, run_id]
    assert state_of(200, run_id) == state_of(SECOND_CT, run_id) == "CANCELLED"


def test_nodes_with_an_unreachable_node_is_never_ok(pair_env):
    run_id = f"half-{uuid.uuid4().hex[:6]}"
    launch(200, run_id, {"id": run_id, "node": 0, "nodes": 2})
    dead = f"sandbox:200,127.0.0.1:1:{SECOND_CT}"  # loopback port 1: nothing listens
    st = run("status", "--nodes", dead, "--json")
    assert st.exit_code == 27, st.output[-2000:]
    doc = json.loads(st.stdout)
    assert doc["ok"] is False and doc["complete"] is False and doc["error"]["exit_code"] == 27
    assert doc["nodes"][0]["status"]["state"] == "RUNNING" and doc["nodes"][1]["error"]

    stopped = run("stop", "--nodes", dead, "--grace", "1", "--json")
    assert stopped.exit_code == 27, stopped.output[-2000:]
    doc = json.loads(stopped.stdout)
    assert doc["ok"] is False and doc["nodes"][0]["stop"]["state"] == "CANCELLED"
    assert "not reached" in doc["summary"] and "was stopped" not in doc["summary"], doc["summary"]
    text = run("stop", "--nodes", dead, "--grace", "0")
    assert text.exit_code == 27 and "could not be asked" in text.output, text.output


def test_same_container_named_two_ways_is_refused_before_launch(sandbox, pair_env):
    res = run("deploy", "--nodes", f"127.0.0.1:{sandbox.port}:{SECOND_CT},sandbox:{SECOND_CT}",
              "--playbook", "dflash-cpu-smoke", "--json")
    assert res.exit_code == 2, res.output[-2000:]
    assert "are the same container" in json.loads(res.stdout)["error"]["message"]
    jobs_doc = json.loads(run("jobs", "--host", "sandbox", "--ct", str(SECOND_CT), "--json").stdout)
    assert not any(j["name"] == "dflash-cpu-smoke" and j["state"] in ("PENDING", "SETTING_UP",
                                                                      "RUNNING")
                   for j in jobs_doc.get("jobs", []))
