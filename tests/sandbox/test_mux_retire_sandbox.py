"""A multiplexer follows the trust state it verified: touching known_hosts
changes nothing (no second mux), editing it retires the old mux once its calls in flight
have finished — never by killing them — so exactly one mux per host stays live."""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import time

import pytest

from opsctl.config import inventory
from opsctl.remote import mux_client as mux
from opsctl.remote.transport import Remote
from tests.waiting import wait_for

pytestmark = pytest.mark.sandbox


@pytest.fixture
def spec(sandbox, isolated_env, tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_MUX", "1")
    monkeypatch.setenv("OPSCTL_MUX_IDLE_S", "30")
    known = tmp_path / "known_hosts"
    shutil.copy(sandbox.known_hosts_file, known)
    inv = isolated_env / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    text = sandbox.inventory_file.read_text().replace(str(sandbox.known_hosts_file), str(known))
    (inv / "sandbox.yaml").write_text(text)
    spec = inventory.load().resolve("sandbox")
    with Remote(spec) as r:
        r.pct_exec(200, ["true"], timeout=30)
    assert mux.wait_ready(spec, 20)
    yield spec
    mux.stop_all()


def run_in(spec, argv: list[str]):
    with Remote(spec) as r:
        return r.pct_exec(200, argv, timeout=60)


def live_pids() -> list[int]:
    return sorted(int(m["pid"]) for m in mux.list_muxes())


def process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not reaped yet
    except FileNotFoundError:
        return True


def test_touching_known_hosts_keeps_the_one_mux(spec):
    before = live_pids()
    assert len(before) == 1
    for _ in range(3):
        os.utime(spec.known_hosts)
        assert run_in(spec, ["true"]).via == "mux"
    assert live_pids() == before
    assert not process_gone(before[0])


def test_editing_known_hosts_retires_the_old_mux_after_its_calls_finish(spec):
    [old] = live_pids()
    with cf.ThreadPoolExecutor(1) as pool:
        long = pool.submit(run_in, spec, ["sh", "-c", "sleep 3; echo finished"])
        time.sleep(0.5)  # scenario: the call is in flight on the old mux before the edit
        with open(spec.known_hosts, "a", encoding="utf-8") as f:
            f.write("# edited\n")
        assert run_in(spec, ["true"]).via == "ssh"  # new trust state: verified afresh
        res = long.result()
    assert (res.rc, res.stdout, res.via) == (0, b"finished\n", "mux")
    assert mux.wait_ready(spec, 20)
    assert wait_for(lambda: process_gone(old), 10), f"the old mux {old} is still running"
    assert len(live_pids()) == 1
