"""The sandbox waits for a started container's boot, and names a boot that never ends.

Pure logic: ``_lxc`` answers as ``systemctl is-system-running --wait`` does (the real
container's answers are covered in tests/sandbox/test_sandbox.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from opsctl.errors import ContainerError
from opsctl.sandbox import host

BUS_DOWN = "Failed to connect to bus: No such file or directory"


def answers(monkeypatch: pytest.MonkeyPatch, replies: list[tuple[str, str]]) -> list[float]:
    """Make ``_lxc`` give these (stdout, stderr) in turn (the last one forever); the timeouts
    it was called with are returned."""
    timeouts: list[float] = []

    def fake(layout: object, tool: str, name: str, *args: str, check: bool = True,
             timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        timeouts.append(float(timeout or 0))
        out, err = replies[min(len(timeouts), len(replies)) - 1]
        return subprocess.CompletedProcess([tool], 0 if out == "running" else 1, out, err)

    monkeypatch.setattr(host, "_lxc", fake)
    monkeypatch.setattr(host.time, "sleep", lambda s: None)
    return timeouts


LAYOUT = host._Layout(home=Path("/nonexistent"), state_dir=Path("/nonexistent/sandbox"))


def test_a_bus_that_is_not_up_yet_is_asked_again_until_the_boot_is_over(monkeypatch):
    calls = answers(monkeypatch, [("", BUS_DOWN), ("", BUS_DOWN), ("running\n", "")])
    host._wait_booted(LAYOUT, "200")
    assert len(calls) == 3


@pytest.mark.parametrize("state", ["running", "degraded"])
def test_a_booted_state_ends_the_wait(monkeypatch, state):
    calls = answers(monkeypatch, [(state + "\n", "")])
    host._wait_booted(LAYOUT, "200")
    assert len(calls) == 1


def test_a_boot_that_never_ends_is_named_with_the_last_answer(monkeypatch):
    monkeypatch.setattr(host, "CONTAINER_BOOT_TIMEOUT_S", 0.05)
    answers(monkeypatch, [("", BUS_DOWN)])
    with pytest.raises(ContainerError, match="container 200 did not finish booting within "
                       r"0.05 s \(systemctl is-system-running: Failed to connect to bus"):
        host._wait_booted(LAYOUT, "200")


def test_a_container_stuck_in_maintenance_is_not_waited_for(monkeypatch):
    calls = answers(monkeypatch, [("maintenance\n", "")])
    with pytest.raises(ContainerError, match="is-system-running: maintenance"):
        host._wait_booted(LAYOUT, "200")
    assert len(calls) == 1


def test_a_wait_that_hangs_is_cut_at_the_deadline(monkeypatch):
    def hang(*args: object, timeout: float | None = None, **kw: object) -> None:
        raise subprocess.TimeoutExpired("lxc-attach", timeout or 0)

    monkeypatch.setattr(host, "_lxc", hang)
    with pytest.raises(ContainerError, match="did not finish booting"):
        host._wait_booted(LAYOUT, "200")


def test_offline_right_after_a_start_is_asked_again_not_a_failed_boot(monkeypatch):
    """``sandbox down`` then ``up`` at once: systemctl answers "offline" (on stdout, rc 1) while
    it cannot reach PID 1's bus, whether the new PID 1 is not up yet or the old container is
    still going away. That is a boot still to come, not one that failed."""
    calls = answers(monkeypatch, [("offline\n", BUS_DOWN), ("offline\n", ""),
                                  ("starting\n", ""), ("running\n", "")])
    host._wait_booted(LAYOUT, "200")
    assert len(calls) == 4


def test_a_boot_that_stays_offline_is_named_at_the_deadline_with_its_real_length(monkeypatch):
    monkeypatch.setattr(host, "CONTAINER_BOOT_TIMEOUT_S", 0.05)
    answers(monkeypatch, [("offline\n", BUS_DOWN)])
    with pytest.raises(ContainerError, match=r"within 0.05 s \(systemctl is-system-running: offline"):
        host._wait_booted(LAYOUT, "200")


def test_a_failed_boot_state_says_how_long_it_took_not_the_whole_deadline(monkeypatch):
    answers(monkeypatch, [("maintenance\n", "")])
    with pytest.raises(ContainerError, match=r"ended its boot in state maintenance after 0 s"):
        host._wait_booted(LAYOUT, "200")


def test_a_half_made_base_is_stopped_before_it_is_made_again(monkeypatch, tmp_path):
    """lxc-destroy refuses a running container; a rootfs made anew under a base that still
    runs leaves it running on a deleted tree, which never boots."""
    layout = host._Layout(home=tmp_path, state_dir=tmp_path / "sandbox")
    (layout.lxc_path / host.BASE).mkdir(parents=True)  # no .opsctl-ready: half-made
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(host, "_lxc", lambda _l, tool, name, *args, **kw: calls.append(
        (tool, *args)) or subprocess.CompletedProcess([tool], 0, "", ""))
    monkeypatch.setattr(host, "_make_base", lambda _l: calls.append(("make",)) or (
        layout.lxc_path / host.BASE).mkdir())
    host._ensure_base(layout)
    assert calls == [("lxc-stop", "--kill"), ("lxc-destroy",), ("make",)]


def test_a_base_whose_boot_fails_is_left_stopped(monkeypatch, tmp_path):
    layout = host._Layout(home=tmp_path, state_dir=tmp_path / "sandbox")
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(host, "_lxc", lambda _l, tool, name, *args, **kw: calls.append(
        (tool, *args)) or subprocess.CompletedProcess([tool], 0, "", ""))
    monkeypatch.setattr(host, "_configure_base", lambda _d: None)

    def no_boot(_l: object, _n: str) -> None:
        raise ContainerError("did not finish booting")

    monkeypatch.setattr(host, "_start", no_boot)
    with pytest.raises(ContainerError):
        host._make_base(layout)
    assert calls[-1] == ("lxc-stop", "--kill")


def test_health_counts_the_containers_up_was_asked_to_run_and_no_other():
    info = host.SandboxInfo(port=1, identity_file=Path("k"), known_hosts_file=Path("h"),
                            host_key_fingerprint="SHA256:x", containers=(200, 201),
                            pct_path=Path("pct"), state_dir=Path("s"), lxc_path=Path("l"),
                            inventory_file=Path("i"))
    states = {200: "running", 201: "stopped"}
    assert host.SandboxStatus(info, True, states).healthy  # 201: a test's, or `pct stop`ped
    assert not host.SandboxStatus(info, True, states, wanted_running=(200, 201)).healthy
    assert not host.SandboxStatus(info, False, states).healthy
    assert not host.SandboxStatus(info, True, {**states, 200: "stopped"}).healthy
    assert not host.SandboxStatus(info, True, {201: "stopped"}, wanted_running=(200,)).healthy


def test_a_damaged_record_of_wanted_containers_counts_as_the_default(tmp_path):
    layout = host._Layout(home=tmp_path, state_dir=tmp_path)
    for text in ('{"wanted_running": "201"}', "[]", "not json", '{"port": 1}'):
        layout.state_file.write_text(text)
        assert host._wanted_running(layout) == host.DEFAULT_CONTAINERS
    layout.state_file.write_text('{"wanted_running": [true, "x", 201, 201]}')
    assert host._wanted_running(layout) == (201,)
    layout.state_file.write_text('{"port": 5, "wanted_running": [200, 201]}')
    host._want_running(layout, 201, False)
    host._want_running(layout, 200, True)
    assert host._read_state(layout) == {"port": 5, "wanted_running": [200]}
