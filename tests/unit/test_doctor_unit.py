"""The container-side doctor checks and the host-kernel diagnosis entries, as pure logic
(the facts passed in; the sandbox tests run them for real: tests/sandbox/test_doctor_sandbox.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import typing as t
from pathlib import Path
from types import SimpleNamespace

import pytest

from opsctl.ops import doctor as doctor_ops
from remote_payload import wire
from remote_payload.agent import doctor
from remote_payload.gpufacts import kernlog, shm
from tests.paths import FIXTURES, REPO

FIX = FIXTURES / "h200-gpu-facts"
H200_NODES = {"/dev/nvidia0": (195, 0), "/dev/nvidiactl": (195, 255), "/dev/nvidia-uvm": (238, 0),
              "/dev/nvidia-uvm-tools": (238, 1)}


def test_libraries_of_the_driver_version_are_ok() -> None:
    row = doctor.check_libraries("580.159.04", (FIX / "libs.txt").read_text())
    assert row["status"] == "ok", row


def test_a_host_driver_update_without_the_container_libraries_fails_with_the_nvml_message() -> None:
    row = doctor.check_libraries("580.159.04", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.15\n"
                                 "/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15")
    assert row["status"] == "fail"
    assert "Driver/library version mismatch" in row["reason"]
    assert "libcuda.so.570.86.15" in row["evidence"] and "driver 580.159.04" in row["evidence"]
    assert "NVIDIA-Linux-x86_64-580.159.04.run --no-kernel-module" in row["fix"]


def test_without_a_driver_every_gpu_check_is_skip_not_a_crash() -> None:
    for row in (doctor.check_libraries(None, ""), doctor.check_device_nodes(None, {}),
                doctor.check_gpu_count(None, [], None, 8), doctor.check_persistence(None, []),
                doctor.check_torch(None, "/nonexistent", 5), doctor.check_leftovers(None)):
        assert (row["status"], row["reason"]) == ("skip", "no NVIDIA driver on the host"), row


def test_a_missing_nvidia_uvm_says_cuda_finds_no_device_and_how_to_create_it() -> None:
    nodes = {k: v for k, v in H200_NODES.items() if "uvm" not in k}
    row = doctor.check_device_nodes("580.159.04", nodes, ctid="120")
    assert row["status"] == "fail"
    assert "/dev/nvidia-uvm" in row["reason"] and "CUDA finds no device" in row["reason"]
    assert "nvidia-modprobe -u -c=0" in row["fix"] and "/etc/pve/lxc/120.conf" in row["fix"]
    assert doctor.check_device_nodes("580.159.04", H200_NODES)["status"] == "ok"


def test_dev_shm_of_64_mib_fails_for_nccl_at_8_ranks_and_128_gib_is_ok() -> None:
    row = doctor.check_shm(8, 64 * shm.MIB)
    assert row["status"] == "fail" and "8 ranks" in row["reason"]
    assert "mount -o remount,size=4G /dev/shm" in row["fix"]
    assert doctor.check_shm(8, 3 * shm.GIB)["status"] == "warn"
    assert doctor.check_shm(8, 128 * shm.GIB)["status"] == "ok"
    assert doctor.check_shm(0, 64 * shm.MIB)["status"] == "skip"


def test_a_nearly_full_disk_under_the_root_fails() -> None:
    row = doctor.check_disk("/opt/opsctl", (100 * shm.GIB, 1 * shm.GIB))
    assert row["status"] == "fail" and "1.0 GiB free" in row["evidence"]
    assert doctor.check_disk("/opt/opsctl", (100 * shm.GIB, 10 * shm.GIB))["status"] == "warn"
    assert doctor.check_disk("/opt/opsctl", (100 * shm.GIB, 90 * shm.GIB))["status"] == "ok"


def test_persistence_off_is_a_warning_with_the_host_command() -> None:
    rows, err = doctor.parse_smi_rows("0, 00000000:41:00.0, Disabled, NVIDIA H200\n")
    assert err is None
    row = doctor.check_persistence("580.159.04", rows)
    assert row["status"] == "warn" and "nvidia-persistenced" in row["fix"]


@pytest.mark.parametrize("garbage", ["Failed to initialize NVML: Driver/library version mismatch",
                                     "\x00\xff<html>", "0, , ,", "9" * 5000])
def test_garbage_nvidia_smi_output_is_a_failing_row_never_an_exception(garbage: str) -> None:
    rows, err = doctor.parse_smi_rows(garbage)
    row = doctor.check_gpu_count("580.159.04", rows, err, 8)
    assert row["status"] == "fail", row


def test_the_gpu_count_is_checked_against_the_inventory() -> None:
    rows, _ = doctor.parse_smi_rows("0, 00000000:41:00.0, Enabled, NVIDIA H200\n")
    assert doctor.check_gpu_count("580.159.04", rows, None, 8)["status"] == "fail"
    assert doctor.check_gpu_count("580.159.04", rows, None, 1)["status"] == "ok"


def test_the_leftovers_row_is_the_launch_preflight_result() -> None:
    check = {"needed": None, "error": None, "busy": [
        {"index": 0, "mem_used_mib": 60761.0, "why": "1 process(es) from outside this job: pid 2444 "
         "/usr/bin/python3", "processes": [{"pid": 2444, "mem_mib": 60752.0, "name": "/usr/bin/python3"}]}]}
    row = doctor.leftovers_row(check)
    assert row["status"] == "fail" and "kill 2444" in row["fix"]
    assert row["evidence"] == "GPU 0: 1 process(es) from outside this job: pid 2444 /usr/bin/python3"
    assert doctor.leftovers_row({"busy": [], "error": None})["status"] == "ok"


# --- host kernel events as diagnosis -------------------------------------------------------


def test_xid_79_names_the_gpu_and_says_drain_it() -> None:
    events = kernlog.parse("NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, "
                           "GPU has fallen off the bus.")
    (item,) = doctor_ops.diagnosis_items(events, {"0000:41:00": 3}, 120, live=False)
    assert item["cause"] == "host-xid" and item["severity"] == "error"
    assert "Xid 79 on GPU 3 (0000:41:00)" in item["summary"] and "fallen off the bus" in item["summary"]
    assert "drain it" in item["hint"] and "reset" in item["hint"]
    (live,) = doctor_ops.diagnosis_items(events, {}, 120, live=True)
    assert live["severity"] == "warning" and "GPU at 0000:41:00" in live["summary"]


def test_an_oom_kill_of_another_container_is_not_this_jobs() -> None:
    events = kernlog.parse("oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/lxc/121/ns,"
                           "task=python3,pid=7,uid=0")
    assert doctor_ops.diagnosis_items(events, {}, 120, live=False) == []
    (item,) = doctor_ops.diagnosis_items(events, {}, 121, live=False)
    assert item["cause"] == "host-oom" and "pct set 121 --memory" in item["hint"]


def test_the_doctor_verb_on_this_machine_answers_skip_rows_without_a_driver(tmp_path: Path) -> None:
    if os.path.exists(doctor.PROC_VERSION):
        pytest.skip("this machine has an NVIDIA driver")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "remote_payload.agent", "--root", str(tmp_path),
                          "doctor", "--expect-gpus", "8"], capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout
    rows = {r["name"]: r for r in json.loads(out)["data"]["rows"]}
    assert rows["gpu-count"]["reason"] == "no NVIDIA driver on the host"
    assert rows["disk-free"]["status"] in ("ok", "warn")


class _HangingHost:
    """A host that answers pct and then stops answering (the transport's deadline fires)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: list[str], *, timeout: float | None = None, step: str = "") -> t.Any:
        from opsctl.errors import DeadlineExceeded
        from opsctl.remote.command import CommandResult

        self.calls.append(tuple(argv))
        assert timeout is not None and timeout <= 30, "every host step has a bounded deadline"
        if argv[:2] == ["pct", "status"]:
            return CommandResult(tuple(argv), "", 0, b"status: running\n", b"", 0.01)
        if argv[0] == "dpkg-query":
            return CommandResult(tuple(argv), "", 0, b"5.2.4", b"", 0.01)
        raise DeadlineExceeded(f"pve1: {step} did not answer within {timeout:g} s; connection "
                               "to it closed", argv=list(argv))


def test_a_host_that_stops_answering_mid_doctor_fails_the_deadline_row_and_skips_the_rest() -> None:
    from opsctl.config import inventory

    spec = inventory.Inventory(hosts={}, sources=(), torch_builds={}).resolve("root@127.0.0.1:2222")
    remote = _HangingHost()
    tgt = SimpleNamespace(remote=remote, ctid=120, host=spec, label="pve1 ct 120", agent=None)
    report = doctor_ops.doctor(t.cast(t.Any, tgt), deadline_s=60)
    rows = {r["name"]: r for r in report.rows}
    assert [r["name"] for r in report.failed] == ["deadline"]
    assert "did not answer within" in rows["deadline"]["reason"]
    assert rows["pct"]["status"] == "ok" and rows["pct"]["evidence"] == "pve-container 5.2.4"
    for name in ("host-driver", "gpu-count", "torch-matmul", "xid-events"):
        assert rows[name]["status"] == "skip" and "no answer in time" in rows[name]["reason"], name
    assert remote.calls[-1] == ("cat", "/proc/driver/nvidia/version")  # nothing after the hang


class _WedgedSmiHost(_HangingHost):
    """A host whose driver is loaded and whose nvidia-smi hangs (a GPU fell off the bus);
    everything else answers, its kernel log with the Xid that says why."""

    def run(self, argv: list[str], *, timeout: float | None = None, step: str = "") -> t.Any:
        from opsctl.remote.command import CommandResult

        def answer(out: bytes) -> CommandResult:
            return CommandResult(tuple(argv), "", 0, out, b"", 0.01)

        self.calls.append(tuple(argv))
        if argv[:2] == ["cat", "/proc/driver/nvidia/version"]:
            return answer(b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct 30\n")
        if "nvidia-smi" in argv:
            raise DeadlineExceeded(f"pve1: {step} ran past its {timeout:g} s deadline; its "
                                   "remote process group was killed", argv=list(argv))
        if "journalctl" in argv:
            return answer(time.strftime("%Y-%m-%dT%H:%M:%S.000000+0000 pve1 kernel: ").encode()
                          + b"NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.\n")
        return answer(b"")

    def pct_exec(self, ctid: int, argv: list[str], **_: t.Any) -> t.Any:
        from opsctl.remote.command import CommandResult

        self.calls.append(tuple(argv))  # the payload's manifest: none, so no agent rows
        return CommandResult(tuple(argv), "", 1, b"", b"cat: No such file or directory\n", 0.01)


def test_a_hung_host_nvidia_smi_fails_the_driver_row_and_the_other_checks_still_run() -> None:
    """nvidia-smi hanging is what a wedged driver or a GPU fallen off the bus does: the row
    says so, and the checks after it still run (the Xid row is what names the GPU), never
    every row skipped as if the host had stopped answering."""
    from opsctl.config import inventory

    spec = inventory.Inventory(hosts={}, sources=(), torch_builds={}).resolve("root@127.0.0.1:2222")
    spec = spec.model_copy(update={"enter": "direct", "root": "/srv/opsctl"})
    remote = _WedgedSmiHost()
    agent = SimpleNamespace(root="/srv/opsctl")
    tgt = SimpleNamespace(remote=remote, ctid=0, host=spec, label="gpu1", agent=agent)
    report = doctor_ops.doctor(t.cast(t.Any, tgt), deadline_s=120, torch=False)
    rows = {r["name"]: r for r in report.rows}
    assert rows["host-driver"]["status"] == "fail", rows["host-driver"]
    assert "nvidia-smi did not answer within" in rows["host-driver"]["evidence"]
    assert "xid-events" in rows["host-driver"]["fix"]
    assert rows["xid-events"]["status"] in ("fail", "warn") and "Xid 79" in rows["xid-events"]["reason"]
    assert any("journalctl" in call for call in remote.calls)


def test_the_whole_doctor_run_has_one_deadline() -> None:
    from opsctl.errors import DeadlineExceeded

    clock = doctor_ops._Clock(10)
    assert 1.0 <= clock.step() <= 9.0, "a step never outlives the run"
    assert clock.step(cap=2) == 2
    clock.end = time.monotonic() + 0.5  # the run's time is nearly spent
    with pytest.raises(DeadlineExceeded, match="deadline passed"):
        clock.step()


def _ct_target(gpus: int) -> t.Any:
    from opsctl.config import inventory

    spec = inventory.Inventory(hosts={}, sources=(), torch_builds={}).resolve("root@127.0.0.1:2222")
    spec = spec.model_copy(update={"containers": {120: inventory.ContainerSpec(gpus=gpus)}})
    return SimpleNamespace(ctid=120, host=spec)


HOST_NODES = {**{f"/dev/nvidia{i}": (195, i) for i in range(8)}, "/dev/nvidiactl": (195, 255),
              "/dev/nvidia-uvm": (238, 0), "/dev/nvidia-uvm-tools": (238, 1)}


def test_a_ct_config_without_the_uvm_major_names_the_missing_lines() -> None:
    conf = ("arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n" + "".join(
        f"lxc.mount.entry: /dev/nvidia{i} dev/nvidia{i} none bind,optional,create=file\n" for i in range(8))
        + "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file\n"
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file\n")
    row = doctor_ops._ct_config_row(_ct_target(8), HOST_NODES, conf, conf)
    assert row["status"] == "fail", row
    assert row["fix"] == ("lxc.cgroup2.devices.allow: c 238:* rwm | lxc.mount.entry: /dev/nvidia-uvm-tools "
                          "dev/nvidia-uvm-tools none bind,optional,create=file (then pct reboot 120)")
    fixed = conf + ("lxc.cgroup2.devices.allow: c 238:* rwm\nlxc.mount.entry: /dev/nvidia-uvm-tools "
                    "dev/nvidia-uvm-tools none bind,optional,create=file\n")
    assert doctor_ops._ct_config_row(_ct_target(8), HOST_NODES, fixed, fixed)["status"] == "ok"


def test_pve8_dev_entries_pass_the_nodes_through() -> None:
    conf = "".join(f"dev{i}: {p},mode=0666\n" for i, p in enumerate(
        ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]))
    assert doctor_ops._ct_config_row(_ct_target(1), HOST_NODES, conf, conf)["status"] == "ok"
    row = doctor_ops._ct_config_row(_ct_target(2), HOST_NODES, conf, conf)
    assert row["status"] == "fail" and "/dev/nvidia1" in row["fix"]


def test_a_container_the_inventory_gives_no_gpus_is_not_a_config_failure() -> None:
    row = doctor_ops._ct_config_row(_ct_target(0), HOST_NODES, "arch: amd64\n", "arch: amd64\n")
    assert row["status"] == "skip" and "gpus: 0" in row["reason"]


@pytest.mark.parametrize(("value", "shown"), [(0.123456789, "0.1"), (9.99, "9.9"), (10.0, "10"),
                                              (44.98237, "44"), (604800.0, "604800")])
def test_doctor_prints_durations_rounded_down(value, shown):
    from opsctl.ops import doctor as ops_doctor

    assert ops_doctor.seconds(value) == shown


def test_a_passed_deadline_names_it_rounded():
    from opsctl.errors import DeadlineExceeded
    from opsctl.ops import doctor as ops_doctor

    clock = ops_doctor._Clock(0.123456789)
    with pytest.raises(DeadlineExceeded, match=r"doctor's 0\.1 s deadline passed"):
        clock.step()


# --- the deadline holds end to end -------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from opsctl.errors import DeadlineExceeded  # noqa: E402
from opsctl.remote import hostfacts  # noqa: E402
from remote_payload.wire import doctor_row  # noqa: E402


class _FakeTime:
    """``time.monotonic`` of the doctor module, moved on by the fake remote steps only."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_764_500_000.0 + self.now


def _printed_plainly(timeout: float) -> bool:
    """At most one decimal, as ``seconds`` writes it (never ``13.8869``)."""
    return f"{timeout:g}" == doctor_ops.seconds(timeout) or f"{timeout:g}" == str(int(timeout))


@settings(max_examples=200, deadline=None)
@given(deadline=st.floats(min_value=0.5, max_value=600), spent=st.lists(
    st.floats(min_value=0, max_value=50), max_size=12), cap=st.floats(min_value=1, max_value=60))
def test_a_step_killed_at_its_timeout_still_ends_inside_the_deadline(deadline, spent, cap):
    fake = _FakeTime()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(doctor_ops, "time", fake)
        clock = doctor_ops._Clock(deadline)
        for s in spent:
            fake.now += s
            try:
                timeout = clock.step(cap)
            except DeadlineExceeded as exc:
                assert "deadline passed" in str(exc)
                assert clock.left() - doctor_ops.KILL_GRACE_S - doctor_ops.STEP_MARGIN_S < 1.0
                return
            assert 1.0 <= timeout <= cap
            worst = fake.now + timeout + doctor_ops.KILL_GRACE_S + doctor_ops.STEP_MARGIN_S
            assert worst <= clock.end + 1e-9
            assert _printed_plainly(timeout), timeout


@pytest.fixture
def monkeypatch_time():
    fake = _FakeTime()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(doctor_ops, "time", fake)
        yield fake


def _fake_target(fake: _FakeTime, agent_call: t.Callable[..., t.Any]) -> t.Any:
    host = SimpleNamespace(ssh_label=lambda: "root@pve1", known_hosts_path=lambda: Path("/kh"),
                           containers={200: SimpleNamespace(gpus=1)}, user="root",
                           enter="pct", direct=False,
                           target_spec=lambda ct: SimpleNamespace(gpus=1) if ct == 200 else None)
    agent = SimpleNamespace(ensure_payload=lambda: None, call=agent_call)
    return SimpleNamespace(label="pve1 ct 200", ctid=200, host=host, remote=object(), agent=agent,
                           flags=["--host", "pve1", "--ct", "200"])


@pytest.fixture
def quick_host(monkeypatch, monkeypatch_time):
    """Host facts that answer at once: a running container, a driver, no Xid."""

    def command_text(remote, argv, *, timeout, step):
        monkeypatch_time.now += 0.05
        if argv[:2] == ["pct", "status"]:
            return 0, "status: running"
        if argv[0] == "dpkg-query":
            return 0, "5.1.2"
        return 0, ""

    def kernel_events(remote, since, until, *, timeout):
        monkeypatch_time.now += 0.05
        return hostfacts.KernelLog([], "journalctl")

    monkeypatch.setattr(hostfacts, "command_text", command_text)
    monkeypatch.setattr(hostfacts, "gpus", lambda remote, timeout: hostfacts.HostGpus("580.1", "v"))
    monkeypatch.setattr(hostfacts, "device_nodes", lambda remote, timeout: ({}, ""))
    monkeypatch.setattr(hostfacts, "kernel_events", kernel_events)
    monkeypatch.setattr(doctor_ops, "_payload_current", lambda tgt, clock: True)
    return monkeypatch_time


def test_doctor_deadline_15_with_an_agent_that_hangs_until_killed_returns_within_15_s(quick_host):
    seen: list[float] = []

    def hangs(verb, *args, timeout):  # killed at its timeout, after SIGTERM's grace
        seen.append(timeout)
        quick_host.now += timeout + doctor_ops.KILL_GRACE_S + doctor_ops.STEP_MARGIN_S
        raise DeadlineExceeded(f"pve1: agent doctor ran past its {timeout:g} s deadline")

    start = quick_host.now
    report = doctor_ops.doctor(_fake_target(quick_host, hangs), deadline_s=15)
    assert quick_host.now - start <= 15
    assert report.elapsed_s <= 15
    (deadline_row,) = [r for r in report.rows if r["name"] == "deadline"]
    assert seen == [11.0] and "ran past its 11 s deadline" in deadline_row["reason"]
    assert "." not in deadline_row["reason"].split("deadline")[0].split()[-1]


def test_doctor_gives_the_agent_its_own_deadline_and_keeps_time_for_the_xid_row(quick_host):
    sent: dict[str, str] = {}

    def answers_at_its_deadline(verb, *args, timeout):
        sent.update(zip(args[::2], args[1::2], strict=False))
        quick_host.now += float(sent["--deadline"]) + doctor_ops.AGENT_MARGIN_S
        return {"rows": [doctor_row(n, "skip", "out of time") for n in doctor_ops.AGENT_ROWS]}

    start = quick_host.now
    report = doctor_ops.doctor(_fake_target(quick_host, answers_at_its_deadline), deadline_s=15)
    assert quick_host.now - start <= 15
    assert sent["--deadline"] == "6.5" and sent["--torch-timeout"] == "60"
    rows = {r["name"]: r["status"] for r in report.rows}
    assert rows["xid-events"] == "ok" and "deadline" not in rows


def test_a_payload_that_would_not_ship_in_time_is_not_shipped_and_the_rows_say_why(quick_host,
                                                                                   monkeypatch):
    shipped: list[bool] = []
    monkeypatch.setattr(doctor_ops, "_payload_current", lambda tgt, clock: False)
    tgt = _fake_target(quick_host, lambda *a, **k: pytest.fail("the agent ran without its payload"))
    tgt.agent.ensure_payload = lambda force=False: shipped.append(force)
    start = quick_host.now
    report = doctor_ops.doctor(tgt, deadline_s=15)
    assert quick_host.now - start <= 15 and shipped == []
    rows = {r["name"]: r for r in report.rows}
    assert all(rows[n]["status"] == "skip" and "does not fit" in rows[n]["reason"]
               for n in doctor_ops.AGENT_ROWS)
    assert rows["xid-events"]["status"] == "ok"


@pytest.mark.parametrize("deadline", [5, 8])
def test_a_deadline_that_leaves_no_time_for_the_container_is_a_failing_deadline_row(
        quick_host, deadline):
    """Never a false ok: a doctor whose deadline left no time for the container's checks is
    incomplete, and says so in a failing ``deadline`` row (exit 28), never "no failing check"."""
    def never_called(verb, *args, timeout):
        pytest.fail("the agent was called with no time for it")

    report = doctor_ops.doctor(_fake_target(quick_host, never_called), deadline_s=deadline)
    rows = {r["name"]: r for r in report.rows}
    assert "deadline" in {r["name"] for r in report.failed}
    assert all(rows[n]["status"] == "skip" for n in doctor_ops.AGENT_ROWS)
    for name in doctor_ops.AGENT_ROWS:
        assert name in rows["deadline"]["reason"]
    assert "--deadline" in rows["deadline"]["fix"]
    assert not report.to_dict()["ok"]


def test_checks_the_agent_skipped_for_its_deadline_fail_the_deadline_row(quick_host):
    def answers_with_skips(verb, *args, timeout):
        quick_host.now += 1.0
        rows = [doctor_row(n, "ok", "fine") for n in doctor_ops.AGENT_ROWS[:-2]]
        return {"rows": rows + [doctor_row(n, "skip", f"doctor's 6.5 s {wire.DEADLINE_SKIP} "
                                           "for this check", "", "a longer --deadline")
                                for n in doctor_ops.AGENT_ROWS[-2:]]}

    report = doctor_ops.doctor(_fake_target(quick_host, answers_with_skips), deadline_s=15)
    (row,) = [r for r in report.failed if r["name"] == "deadline"]
    assert "torch-matmul" in row["reason"] and "leftover-gpu-processes" in row["reason"]


def test_a_payload_that_cannot_ship_within_the_deadline_makes_doctor_incomplete(quick_host,
                                                                                monkeypatch):
    monkeypatch.setattr(doctor_ops, "_payload_current", lambda tgt, clock: False)
    tgt = _fake_target(quick_host, lambda *a, **k: pytest.fail("the agent ran without its payload"))
    report = doctor_ops.doctor(tgt, deadline_s=15)
    assert "deadline" in {r["name"] for r in report.failed}


def test_a_doctor_with_time_for_every_check_has_no_deadline_row(quick_host):
    def answers(verb, *args, timeout):
        quick_host.now += 1.0
        return {"rows": [doctor_row(n, "ok", "fine") for n in doctor_ops.AGENT_ROWS]}

    report = doctor_ops.doctor(_fake_target(quick_host, answers), deadline_s=60)
    assert "deadline" not in {r["name"] for r in report.rows}


def test_an_agent_that_cannot_run_fails_the_agent_row_never_a_clean_bill(quick_host):
    """No python3 on the target (exit 127), a payload that does not import: none of the
    container's checks ran, so doctor fails (exit 28) with a row that names why and what to
    run, instead of skipping them all and saying "no failing check"."""
    from opsctl import errors

    def cannot_run(verb, *args, timeout):
        raise errors.RemoteCommandFailed("pve1 ct 200: agent doctor exited 127: python3: not found")

    report = doctor_ops.doctor(_fake_target(quick_host, cannot_run), deadline_s=60)
    (row,) = [r for r in report.failed if r["name"] == "agent"]
    assert "could not run" in row["reason"] and "exited 127" in row["reason"]
    assert row["fix"].startswith("opsctl exec --host pve1 --ct 200 -- python3 --version")
    assert all(r["status"] == "skip" for r in report.rows if r["name"] in doctor_ops.AGENT_ROWS)
    assert not report.to_dict()["ok"]


def test_no_driver_on_a_host_the_inventory_gives_gpus_fails_the_driver_row(quick_host,
                                                                          monkeypatch):
    """Without a driver the GPU rows skip; on a target the inventory says has GPUs that is a
    driver that did not load, and the host-driver row fails (exit 28), never a clean bill."""
    monkeypatch.setattr(hostfacts, "gpus", lambda remote, timeout: hostfacts.HostGpus(None, ""))

    def answers(verb, *args, timeout):
        quick_host.now += 1.0
        return {"rows": [doctor_row(n, "skip", "no NVIDIA driver on the host")
                         for n in doctor_ops.AGENT_ROWS]}

    report = doctor_ops.doctor(_fake_target(quick_host, answers), deadline_s=60)
    (row,) = [r for r in report.failed if r["name"] == "host-driver"]
    assert "gives this target 1 GPU(s)" in row["reason"] and "modprobe nvidia" in row["fix"]
