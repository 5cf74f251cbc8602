"""`opsctl status --all`: every container of every inventory host, in parallel, one row each.

The hosts are aliases of the sandbox's sshd; the one that is down is an alias pointing at a
closed port on 127.0.0.1. The fan-out and the host selection are pure logic, tested alone.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from opsctl import errors
from opsctl.config import inventory
from opsctl.ops import fanout
from tests.cli_runner import run_cli as run


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nobody listens once it is closed


def fleet_inventory(sandbox, home: Path, up: list[str], down: list[str]) -> None:
    doc = yaml.safe_load(Path(sandbox.inventory_file).read_text())
    base = doc["hosts"]["sandbox"]
    # one container per host, whatever else other tests brought up in this sandbox
    base["containers"] = {200: base["containers"][200]}
    hosts = {name: copy.deepcopy(base) for name in up}
    for name in down:
        hosts[name] = {**copy.deepcopy(base), "port": closed_port()}
    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "fleet.yaml").write_text(yaml.safe_dump(
        {"hosts": hosts, "groups": {"pair": [up[0], down[0]]}}))


class TestStatusAllInTheSandbox:
    def test_a_down_host_is_a_row_with_its_error_and_the_others_report(self, sandbox, isolated_env):
        fleet_inventory(sandbox, isolated_env, up=["gpu-a", "gpu-b", "gpu-c"], down=["gpu-down"])
        res = run("status", "--all", "--json")
        assert res.exit_code == errors.FLEET_INCOMPLETE, res.output
        doc = json.loads(res.stdout)
        rows = {r["host"]: r for r in doc["rows"]}
        assert sorted(rows) == ["gpu-a", "gpu-b", "gpu-c", "gpu-down"]
        assert (doc["ok"], doc["errors"], doc["error"]["type"]) == (False, 1, "FleetIncomplete")
        down = rows["gpu-down"]
        assert (down["reachable"], down["ctid"], down["error"]["exit_code"]) == (False, 200, 10)
        assert "Connection refused" in down["error"]["message"]
        for name in ("gpu-a", "gpu-b", "gpu-c"):
            row = rows[name]
            assert row["reachable"] and row["error"] is None, row
            assert row["state"] is not None or row["note"] is not None, row

    def test_a_pattern_selects_hosts_and_all_reachable_is_exit_zero(self, sandbox, isolated_env):
        fleet_inventory(sandbox, isolated_env, up=["gpu-a", "gpu-b"], down=["gpu-down"])
        res = run("status", "--all", "--host", "gpu-[ab]")
        assert res.exit_code == 0, res.output
        assert "2 containers on 2 hosts" in res.stdout and "gpu-down" not in res.stdout

    def test_a_group_selects_its_members_in_order(self, sandbox, isolated_env):
        fleet_inventory(sandbox, isolated_env, up=["gpu-a", "gpu-b"], down=["gpu-down"])
        res = run("status", "--all", "--host", "pair", "--json")
        assert [r["host"] for r in json.loads(res.stdout)["rows"]] == ["gpu-a", "gpu-down"]


class TestHostSelection:
    INV = inventory.Inventory(hosts={n: inventory.HostSpec(address="10.0.0.1")
                                     for n in ("pve1", "pve2", "gpu-a")},
                              sources=(), torch_builds={}, groups={"big": ("pve2", "pve1"),
                                                                   "bad": ("nope",)})

    def test_no_pattern_is_every_host(self):
        assert self.INV.select(None) == ["gpu-a", "pve1", "pve2"]

    def test_a_glob_matches_host_names(self):
        assert self.INV.select("pve*") == ["pve1", "pve2"]

    def test_a_group_name_wins_and_keeps_its_order(self):
        assert self.INV.select("big") == ["pve2", "pve1"]

    @pytest.mark.parametrize("pattern", ["bad", "zzz*"])
    def test_an_unknown_member_or_no_match_is_a_config_error(self, pattern):
        with pytest.raises(errors.ConfigError):
            self.INV.select(pattern)


class TestFanOut:
    def test_a_call_past_its_deadline_is_abandoned_and_the_others_answer(self):
        hang = threading.Event()
        start = time.monotonic()
        res = fanout.run_all(["slow", "a", "b"], lambda k: hang.wait(30) if k == "slow" else k.upper(),
                             max_parallel=4, deadline_s=0.3)
        hang.set()
        assert time.monotonic() - start < 2
        assert res.ok == {"a": "A", "b": "B"} and isinstance(res["slow"], fanout.Abandoned)
        assert list(res) == ["slow", "a", "b"]

    def test_exceptions_are_results(self):
        def boom(k: int) -> int:
            raise ValueError(k)
        res = fanout.run_all([1, 2], boom, max_parallel=2, deadline_s=5)
        assert sorted(res.failed) == [1, 2] and res.ok == {}

    def test_no_more_than_max_parallel_run_at_once(self):
        lock, running, peak = threading.Lock(), [0], [0]

        def work(k: int) -> int:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)  # scenario: each call takes a while, so calls overlap
            with lock:
                running[0] -= 1
            return k

        res = fanout.run_all(range(12), work, max_parallel=3, deadline_s=5)
        assert peak[0] == 3 and res.ok == {k: k for k in range(12)}


def test_the_docs_give_one_exit_code_for_an_incomplete_fleet():
    """Every page names one exit code for one failure, the same in every place."""
    import re

    from tests.paths import REPO

    guide = (REPO / "docs" / "guide" / "fleet-and-files.md").read_text(encoding="utf-8")
    assert errors.FleetIncomplete.exit_code == errors.FLEET_INCOMPLETE == 27
    said = re.findall(r"exits 0 when no row is an error and (\d+) otherwise", guide)
    assert said == ["27"], said
    assert "with 26 the `FleetIncomplete` error" not in guide
    assert errors.EXIT_CODES[27].startswith("`status --all`")  # the generated exit-code table
