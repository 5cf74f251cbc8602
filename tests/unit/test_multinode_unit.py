"""Multi-node runs, the pure parts: the node list, torchrun's argv, the run's verdict, the
address a container announces, and the trainer speaking on every node."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.config.nodes import NodeRef, parse_nodes
from opsctl.errors import ConfigError, FleetIncomplete
from opsctl.ops import multinode, torchrun
from opsctl.ops.multinode import NodeRow
from remote_payload import wire
from remote_payload.agent.verbs.net import choose_address
from tests.replies import diagnosis, status_doc

SMOKE = ["python3", "-m", "remote_payload.trainer", "--preset", "tiny", "--nproc", "2"]
RDZV = torchrun.Rendezvous("10.0.0.5", 29400, "run-1", 2)


class TestNodeList:
    def test_host_ct_pairs_parse_in_order(self):
        assert parse_nodes("pve1:200, pve2:201") == (NodeRef("pve1", 200), NodeRef("pve2", 201))

    def test_the_container_id_is_after_the_last_colon_so_a_port_can_stay(self):
        assert parse_nodes("admin@10.1.2.6:2222:200,[::1]:22:300") == (
            NodeRef("admin@10.1.2.6:2222", 200), NodeRef("[::1]:22", 300))

    def test_a_node_prints_as_the_host_ct_it_was_parsed_from(self):
        text = "sandbox:200,sandbox:202"
        assert ",".join(map(str, parse_nodes(text))) == text

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
    st = status_doc(job_id="run-1", state=state, ended_at=ended_at, **extra)
    return NodeRow(index, f"h:{200 + index}", f"h ct {200 + index}", status=st)


class TestRunVerdict:
    def test_the_node_that_ended_first_is_the_cause(self):
        rows = [row(0, "FAILED", 105.0, exit_code=1), row(1, "FAILED", 100.0, signal="SIGKILL",
                diagnosis=[diagnosis("killed", "Killed by SIGKILL")])]
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


# --- a run has an id; --nodes acts on one run only -----------------------


def member(index: int, job_id: str, run: dict[str, object] | None, state: str = "RUNNING") -> NodeRow:
    st = status_doc(job_id=job_id, state=state, run=run)
    return NodeRow(index, f"h:{200 + index}", f"h ct {200 + index}", status=st)


def unreached(index: int, error: str = "connection refused", exit_code: int = 10) -> NodeRow:
    return NodeRow(index, f"h:{200 + index}", f"h ct {200 + index}", error=error,
                   error_exit_code=exit_code)


class TestNodesCommandsActOnlyOnOneRun:
    """``status``/``stop --nodes`` find the run by the id every node's job carries."""

    def test_nodes_commands_act_only_on_one_run(self):
        rows = [member(0, "r-1", {"id": "r-1", "node": 0, "nodes": 2}),
                member(1, "r-1", {"id": "r-1", "node": 1, "nodes": 2})]
        assert multinode.one_run(rows, None) == "r-1"

    def test_two_unrelated_single_jobs_are_not_a_run(self):
        rows = [member(0, "hello-a", None), member(1, "hello-b", None)]
        with pytest.raises(ConfigError, match="are not one run") as exc:
            multinode.one_run(rows, None)
        assert "job hello-a, not part of a multi-node run" in exc.value.message
        assert "--job RUN_ID" in (exc.value.hint or "")

    @pytest.mark.parametrize("second", [
        {"id": "r-2", "node": 1, "nodes": 2},  # another run's node
        {"id": "r-1", "node": 0, "nodes": 2},  # the same node index twice
        {"id": "r-1", "node": 1, "nodes": 3},  # a run of three, two named
    ], ids=["other-run", "same-index", "subset"])
    def test_jobs_of_different_runs_or_a_partial_run_are_refused(self, second):
        rows = [member(0, "r-1", {"id": "r-1", "node": 0, "nodes": 2}),
                member(1, str(second["id"]), second)]
        with pytest.raises(ConfigError, match="are not one run"):
            multinode.one_run(rows, None)

    def test_a_node_without_the_runs_job_is_not_part_of_it(self):
        rows = [member(0, "r-1", {"id": "r-1", "node": 0, "nodes": 2}),
                unreached(1, "job r-1 does not exist under /opt/opsctl", exit_code=26)]
        with pytest.raises(ConfigError, match="job r-1 are not one run"):
            multinode.one_run(rows, "r-1")

    def test_an_unreached_node_does_not_hide_the_run_of_the_others(self):
        rows = [member(0, "r-1", {"id": "r-1", "node": 0, "nodes": 2}), unreached(1)]
        assert multinode.one_run(rows, None) == "r-1"
        assert multinode.one_run([unreached(0), unreached(1)], None) is None


class TestNodesWithAnUnreachableNodeAreNeverOk:
    def test_nodes_with_an_unreachable_node_is_never_ok(self):
        report = multinode.RunReport("r-1", [member(0, "r-1", {"id": "r-1", "node": 0, "nodes": 2},
                                                    state="CANCELLED"), unreached(1)])
        multinode._verdict(report)
        assert not report.complete and report.to_dict()["complete"] is False
        assert report.summary != "run r-1 was stopped"
        assert "node 1 (h ct 201) not reached: connection refused" in report.summary
        with pytest.raises(FleetIncomplete) as exc:
            multinode._refuse_incomplete(report, "stop")
        assert exc.value.exit_code == 27 and exc.value.report is report

    def test_every_node_answering_is_complete(self):
        report = multinode.RunReport("r-1", [member(0, "r-1", {"id": "r-1", "node": 0, "nodes": 1})])
        multinode._refuse_incomplete(report, "status")  # no error
        assert report.complete


class TestRunMembershipOnTheWire:
    def test_the_agent_keeps_a_valid_membership_and_refuses_a_bad_one(self):
        assert wire.validate_run(None) is None
        assert wire.validate_run({"id": "r-1", "node": 1, "nodes": 2}) == {"id": "r-1", "node": 1,
                                                                          "nodes": 2}
        for bad in ({"id": "r-1", "node": 2, "nodes": 2}, {"id": "../x", "node": 0, "nodes": 1},
                    {"id": "r\n", "node": 0, "nodes": 1}, {"id": "r", "node": True, "nodes": 1},
                    {"id": "r", "node": 0, "nodes": 65}, {"id": "r", "node": 0}, "r-1", []):
            with pytest.raises(ValueError):
                wire.validate_run(bad)

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.none(), st.text(max_size=20), st.integers(),
                     st.dictionaries(st.sampled_from(["id", "node", "nodes", "x"]),
                                     st.one_of(st.text(max_size=10), st.integers(-5, 100),
                                               st.booleans(), st.none()))))
    def test_any_membership_is_kept_whole_or_refused_with_a_value_error(self, raw):
        try:
            kept = wire.validate_run(raw)
        except ValueError:
            return
        assert kept is None or (0 <= kept["node"] < kept["nodes"] <= wire.MAX_RUN_NODES)


class TestSameContainerNamedTwoWays:
    @pytest.fixture
    def inventory_dir(self, isolated_env):
        inv = isolated_env / "inventory"
        inv.mkdir(parents=True, exist_ok=True)
        (inv / "sb.yaml").write_text("hosts:\n  sb:\n    address: 127.0.0.1\n    port: 2222\n"
                                     "    user: opsadmin\n    containers: {200: {}, 201: {}}\n")
        return inv

    @pytest.mark.parametrize("nodes", [
        "127.0.0.1:2222:201,sb:201", "sb:200,sb:201,root@127.0.0.1:2222:200",
        "sb:201,[127.0.0.1]:2222:201"])
    def test_same_container_named_two_ways_is_refused(self, inventory_dir, nodes, monkeypatch):
        import socket

        def no_network(*args: object, **kwargs: object) -> None:
            raise AssertionError("a refused node list contacted the network")

        monkeypatch.setattr(socket, "create_connection", no_network)
        monkeypatch.setattr(socket, "getaddrinfo", no_network)
        with pytest.raises(ConfigError, match="are the same container") as exc:
            multinode.open_nodes(parse_nodes(nodes))
        assert "one job per container" in exc.value.message

    def test_the_cli_refuses_before_launch_with_exit_2(self, inventory_dir, tmp_path):
        from click.testing import CliRunner

        from opsctl.cli import cli

        book = tmp_path / "b.yaml"
        book.write_text('{"name": "b", "command": ["python3", "-c", "pass"]}')
        res = CliRunner().invoke(cli, ["deploy", "--nodes", "127.0.0.1:2222:201,sb:201",
                                       "--playbook", str(book), "--json"])
        assert res.exit_code == 2, res.output
        assert "are the same container" in res.output

    def test_different_containers_of_one_host_are_fine(self, inventory_dir):
        nodes = multinode.open_nodes(parse_nodes("sb:200,127.0.0.1:2222:201"))
        try:
            assert [multinode.container_key(n) for n in nodes] == [
                ("127.0.0.1", 2222, None, 200), ("127.0.0.1", 2222, None, 201)]
        finally:
            multinode.close_nodes(nodes)


# --- property tests: the node list is untrusted text ---------------------------------------

_LABEL = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9-]{0,10}", fullmatch=True)
_HOSTS = st.one_of(
    _LABEL,
    st.builds(lambda u, h, p: f"{u}@{h}:{p}", _LABEL, _LABEL, st.integers(1, 65535)),
    st.ip_addresses(v=4).map(str),
    st.builds(lambda a, p: f"[{a}]:{p}", st.ip_addresses(v=6).map(str), st.integers(1, 65535)))


class TestNodeListProperties:
    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.tuples(_HOSTS, st.integers(100, 999_999_999)), min_size=1, max_size=8,
                    unique=True))
    def test_a_well_formed_list_parses_in_order_and_prints_back(self, pairs):
        text = ",".join(f"{h}:{c}" for h, c in pairs)
        nodes = parse_nodes(text)
        assert [(n.host, n.ctid) for n in nodes] == pairs
        assert parse_nodes(",".join(map(str, nodes))) == nodes

    @settings(max_examples=500, deadline=None)
    @given(st.text(max_size=80))
    def test_any_text_parses_or_is_a_usage_error(self, text):
        try:
            nodes = parse_nodes(text)
        except ConfigError as exc:
            assert exc.exit_code == 2 and exc.message.startswith("--nodes")
            return
        assert 1 <= len(nodes) <= 64 and len(set(nodes)) == len(nodes)
        assert all(100 <= n.ctid <= 999_999_999 and n.host for n in nodes)


# --- property tests: JOB prefixes (the agent resolves them inside the container) ----------


class TestJobPrefixes:
    @settings(max_examples=200, deadline=None)
    @given(ids=st.lists(st.from_regex(r"[a-z0-9][a-z0-9.-]{0,12}", fullmatch=True), min_size=1,
                        max_size=6, unique=True),
           prefix=st.one_of(st.text(max_size=16), st.from_regex(r"[a-z0-9]{1,4}", fullmatch=True)))
    def test_a_prefix_names_the_exact_job_or_the_one_it_starts_or_fails_typed(self, tmp_path_factory,
                                                                            ids, prefix):
        from remote_payload.agent import jobstore
        from remote_payload.agent.common import AgentFailure

        root = tmp_path_factory.mktemp("root")
        for job in ids:
            (root / "jobs" / job).mkdir(parents=True)
        try:
            found = jobstore.resolve_job(str(root), prefix)
        except AgentFailure:
            matching = [j for j in ids if j.startswith(prefix)]
            assert (prefix not in ids and len(matching) != 1) or prefix == ""
            return
        assert found in ids
        assert found == prefix or [j for j in ids if j.startswith(prefix)] == [found]

    def test_a_job_id_with_a_trailing_newline_is_no_job_id(self, tmp_path):
        from remote_payload.agent import jobstore
        from remote_payload.agent.common import AgentFailure

        (tmp_path / "jobs" / "abc").mkdir(parents=True)
        with pytest.raises(AgentFailure, match="invalid job id"):
            jobstore.job_dir(str(tmp_path), "abc\n")
