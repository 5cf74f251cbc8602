"""Multi-node runs, the pure parts: the node list, torchrun's argv, the run's verdict, the
address a container announces, and the trainer speaking on every node."""

from __future__ import annotations

import io
import json

import pytest

from opsctl.config.nodes import NodeRef, format_nodes, parse_nodes
from opsctl.errors import ConfigError
from opsctl.ops import multinode, torchrun
from opsctl.ops.multinode import NodeRow
from opsctl.remote.models import DiagnosisItem, JobStatus
from remote_payload.agent.verbs.net import choose_address

SMOKE = ["python3", "-m", "remote_payload.trainer", "--preset", "tiny", "--nproc", "2"]
RDZV = torchrun.Rendezvous("10.0.0.5", 29400, "run-1", 2)


class TestNodeList:
    def test_host_ct_pairs_parse_in_order(self):
        assert parse_nodes("pve1:200, pve2:201") == (NodeRef("pve1", 200), NodeRef("pve2", 201))

    def test_the_container_id_is_after_the_last_colon_so_a_port_can_stay(self):
        assert parse_nodes("admin@10.1.2.6:2222:200,[::1]:22:300") == (
            NodeRef("admin@10.1.2.6:2222", 200), NodeRef("[::1]:22", 300))

    def test_format_is_the_inverse_of_parse(self):
        text = "sandbox:200,sandbox:202"
        assert format_nodes(parse_nodes(text)) == text

    @pytest.mark.parametrize("text, says", [
        ("", "HOST:CT items"), ("pve1:200,", "HOST:CT items"), ("pve1", "is not HOST:CT"),
        (":200", "is not HOST:CT"), ("pve1:abc", "is not HOST:CT"),
        ("pve1:99", "Proxmox ids are 100-999999999"), ("pve1:1000000000", "100-999999999"),
        ("pve1:200,pve1:200", "listed twice"), ("pve1:２００", "is not HOST:CT"),
    ])
    def test_a_bad_node_list_is_a_usage_error_naming_the_item(self, text, says):
        with pytest.raises(ConfigError, match=says):
            parse_nodes(text)


class TestTorchrunArgv:
    def test_node_0_hosts_the_store_and_every_node_announces_its_address(self):
        argv = torchrun.launcher_command(SMOKE, RDZV, node_index=0, nproc=2, local_addr="10.0.0.5")
        assert argv == ["python3", "-m", "torch.distributed.run", "--nnodes=2",
                        "--nproc-per-node=2", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=10.0.0.5:29400", "--rdzv-id=run-1",
                        "--rdzv-conf=is_host=1", "--local-addr=10.0.0.5", "--max-restarts=0",
                        "-m", "remote_payload.trainer", "--preset", "tiny", "--nproc", "2"]

    def test_other_nodes_join_without_hosting(self):
        argv = torchrun.launcher_command(SMOKE, RDZV, node_index=1, nproc=2, local_addr="10.0.0.6")
        assert "--rdzv-conf=is_host=0" in argv and "--local-addr=10.0.0.6" in argv

    def test_a_script_stays_a_script_and_an_ipv6_endpoint_is_bracketed(self):
        rdzv = torchrun.Rendezvous("fd00::5", 29400, "r", 2)
        argv = torchrun.launcher_command(["/usr/bin/python3", "train.py", "--x"], rdzv,
                                         node_index=1, nproc=1, local_addr="fd00::6")
        assert argv[-2:] == ["train.py", "--x"] and "--rdzv-endpoint=[fd00::5]:29400" in argv

    @pytest.mark.parametrize("command", [["bash", "-c", "x"], ["python3"], ["python3", "-u", "t.py"],
                                         ["python3", "-m"]])
    def test_only_python_programs_run_under_torchrun(self, command):
        with pytest.raises(ConfigError):
            torchrun.launcher_command(command, RDZV, node_index=0, nproc=1, local_addr="a")

    @pytest.mark.parametrize("gpus, command, nproc", [
        (8, SMOKE, 8), (0, SMOKE, 2), (0, ["python3", "t.py", "--nproc=3"], 3), (0, ["python3", "t.py"], 1)])
    def test_ranks_per_node_are_the_gpus_else_the_playbooks_nproc_else_one(self, gpus, command, nproc):
        assert torchrun.nproc_per_node(gpus, command) == nproc

    def test_a_bad_nproc_is_refused(self):
        with pytest.raises(ConfigError, match="--nproc"):
            torchrun.nproc_per_node(0, ["python3", "t.py", "--nproc", "zero"])

    def test_socket_interface_goes_to_nccl_and_to_gloo_when_gloo_can_read_it(self):
        assert torchrun.socket_env("eth1") == {"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1"}
        assert torchrun.socket_env("^docker,lo") == {"NCCL_SOCKET_IFNAME": "^docker,lo"}
        assert torchrun.socket_env(None) == {}


def row(index: int, state: str, ended_at: float | None = None, **extra: object) -> NodeRow:
    st = JobStatus(job_id="run-1", state=state, ended_at=ended_at, **extra)  # type: ignore[arg-type]
    return NodeRow(index, f"h:{200 + index}", f"h ct {200 + index}", status=st)


class TestRunVerdict:
    def test_the_node_that_ended_first_is_the_cause(self):
        rows = [row(0, "FAILED", 105.0, exit_code=1), row(1, "FAILED", 100.0, signal="SIGKILL",
                diagnosis=[DiagnosisItem(cause="killed", summary="Killed by SIGKILL")])]
        report = multinode.RunReport("run-1", rows)
        multinode._verdict(report)
        assert report.failed_node == 1 and report.state == "FAILED"
        assert report.summary.startswith("run run-1 failed: node 1 (h ct 201) FAILED (SIGKILL): "
                                         "Killed by SIGKILL — then node 0: FAILED")

    def test_one_failed_node_fails_a_run_whose_other_nodes_still_run(self):
        assert multinode.run_state([row(0, "RUNNING"), row(1, "LOST", 1.0)]) == "FAILED"

    def test_a_stopped_run_is_cancelled_not_failed(self):
        report = multinode.RunReport("run-1", [row(0, "CANCELLED", 2.0), row(1, "CANCELLED", 1.0)])
        multinode._verdict(report)
        assert report.state == "CANCELLED" and report.summary == "run run-1 was stopped"

    def test_an_unreachable_node_makes_the_state_unknown_and_is_named(self):
        rows = [row(0, "RUNNING"), NodeRow(1, "h:201", "h ct 201", error="connection refused")]
        report = multinode.RunReport("run-1", rows)
        multinode._verdict(report)
        assert report.state == "UNKNOWN" and report.summary == "node 1 (h ct 201): connection refused"

    def test_the_run_is_as_far_as_its_slowest_node(self):
        assert multinode.run_state([row(0, "RUNNING"), row(1, "SETTING_UP")]) == "SETTING_UP"
        assert multinode.run_state([row(0, "SUCCEEDED"), row(1, "SUCCEEDED")]) == "SUCCEEDED"


IFACES = [{"name": "lo", "address": "127.0.0.1", "up": True, "loopback": True},
          {"name": "eth0", "address": "192.0.2.10", "up": True, "loopback": False},
          {"name": "eth1", "address": "198.51.100.7", "up": True, "loopback": False},
          {"name": "eth2", "address": "203.0.113.1", "up": False, "loopback": False}]


class TestAnnouncedAddress:
    @pytest.mark.parametrize("ifname, address", [
        (None, "192.0.2.10"), ("eth1", "198.51.100.7"), ("^eth0", "198.51.100.7"),
        ("=eth", None), ("eth2", None), ("lo", "127.0.0.1")])
    def test_the_interface_named_else_the_first_up_non_loopback(self, ifname, address):
        assert choose_address(IFACES, ifname) == address


def test_local_rank_0_of_every_node_speaks_and_other_ranks_only_report_errors():
    from remote_payload.trainer.events import Log

    out = io.StringIO()
    for rank, local in ((0, 0), (2, 0), (3, 1)):
        Log(rank, out, local_rank=local).event("step", step=1)
    Log(3, out, local_rank=1).error("RuntimeError", "boom")
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["step", "step", "error"]
    assert events[2]["rank"] == 3
