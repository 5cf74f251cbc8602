"""``opsctl doctor`` and the host kernel's events in a job's diagnosis, on the real sandbox
(sshd on 127.0.0.1, the pct stand-in, LXC containers; this machine is the "host", which has no
NVIDIA driver, and its kernel log is real: a test writes an Xid line into /dev/kmsg)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from opsctl import errors
from tests.cli_runner import run_cli as run
from tests.fake_agent import plant_agent
from tests.sandbox_plugin import use_private_root

pytestmark = pytest.mark.sandbox

T = ["--host", "sandbox", "--ct", "200"]
ROOT = "/opt/opsctl-test-doctor"
GPU_ROWS = ("host-device-nodes", "ct-config-devices", "container-libraries", "container-device-nodes",
            "gpu-count", "persistence-mode", "torch-matmul", "leftover-gpu-processes", "xid-events")


@pytest.fixture
def target(sandbox, isolated_env: Path) -> Path:
    use_private_root(sandbox, isolated_env, ROOT)
    return isolated_env


def test_doctor_on_the_sandbox_skips_gpu_checks_without_crashing(target: Path) -> None:
    res = run("doctor", *T, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = {r["name"]: r for r in doc["rows"]}
    assert doc["ok"] is True
    assert rows["ssh"]["status"] == "ok" and rows["container-running"]["status"] == "ok"
    assert rows["host-driver"]["status"] == "skip"
    for name in GPU_ROWS:
        assert (rows[name]["status"], rows[name]["reason"]) == ("skip", "no NVIDIA driver on the host"), name
    assert rows["disk-free"]["status"] in ("ok", "warn") and ROOT in rows["disk-free"]["evidence"]
    assert set(rows) >= {"pct", "dev-shm"}


def test_doctor_with_a_short_deadline_holds_it_end_to_end(sandbox, isolated_env: Path) -> None:
    # a root of its own, new each run: the module's ROOT has a payload once any test ran
    root = f"{ROOT}-deadline-{os.getpid()}-{time.time_ns()}"
    use_private_root(sandbox, isolated_env, root)

    def doctor_15(exit_code: int) -> dict[str, dict[str, str]]:
        t0 = time.monotonic()
        res = run("doctor", *T, "--deadline", "15", "--json")
        took = time.monotonic() - t0
        assert took < 15, f"doctor took {took:.1f} s of its 15 s"
        assert res.exit_code == exit_code, res.output
        return {r["name"]: r for r in json.loads(res.stdout)["rows"]}

    # a fresh root has no payload, and shipping one may take longer than 15 s: not shipped,
    # and a doctor that could not run its container checks is never a clean bill
    rows = doctor_15(errors.DOCTOR_FAILED)
    assert rows["disk-free"]["status"] == "skip" and "does not fit" in rows["disk-free"]["reason"]
    assert rows["deadline"]["status"] == "fail" and "disk-free" in rows["deadline"]["reason"]
    assert run("doctor", *T, "--json").exit_code == 0  # the default deadline ships it
    rows = doctor_15(0)
    assert rows["disk-free"]["status"] in ("ok", "warn"), rows["disk-free"]
    assert root in rows["disk-free"]["evidence"] and "deadline" not in rows
    assert run("exec", *T, "--", "rm", "-rf", "--one-file-system", root).exit_code == 0


def test_doctor_prints_one_row_per_check(target: Path) -> None:
    res = run("doctor", *T)
    assert res.exit_code == 0, res.output
    assert "no NVIDIA driver on the host" in res.output and "no failing check" in res.output


def test_doctor_on_a_stopped_container_fails_that_row_and_skips_the_inside(target: Path,
                                                                       stopped_ct: int) -> None:
    res = run("doctor", "--host", "sandbox", "--ct", str(stopped_ct), "--json")
    assert res.exit_code == errors.DOCTOR_FAILED, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)["rows"]}
    assert rows["container-running"]["status"] == "fail"
    assert rows["container-running"]["fix"] == f"pct start {stopped_ct}"
    assert rows["disk-free"]["reason"] == f"container {stopped_ct} is not running"


def test_pct_config_of_the_stand_in_prints_sorted_keys_then_raw_lxc_entries(target: Path) -> None:
    """Like pct.pm's cmddef `config`: keys sorted (digest left out), then lxc.* in file order;
    doctor then names the missing passthrough lines of a container whose config has them."""
    from opsctl.ops import jobs
    from opsctl.sandbox import host as sandbox_mod
    from tests.sandbox_plugin import sandbox_home

    conf = sandbox_mod._Layout.of(sandbox_home()).lxc_path / "200" / "pve.conf"
    conf.write_text("memory: 4096\ndigest: 0123\narch: amd64\n"
                    "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
                    "lxc.cgroup2.devices.allow: c 195:* rwm\n")
    try:
        with jobs.open_target("sandbox", 200) as tgt:
            res = tgt.remote.run(["pct", "config", "200"], timeout=30)
    finally:
        conf.unlink()
    assert res.rc == 0, res
    assert res.stdout.decode().splitlines() == [
        "arch: amd64", "memory: 4096",
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "lxc.cgroup2.devices.allow: c 195:* rwm"]


def _silent_listener() -> tuple[socket.socket, int]:
    """A TCP port that accepts connections and never says a word (no SSH banner)."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(lst.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return lst, int(lst.getsockname()[1])


def test_a_host_that_never_answers_ends_doctor_within_its_deadline(isolated_env: Path) -> None:
    lst, port = _silent_listener()
    try:
        inv = isolated_env / "inventory"
        inv.mkdir(parents=True, exist_ok=True)
        (inv / "silent.yaml").write_text(
            f"hosts:\n  silent:\n    address: 127.0.0.1\n    port: {port}\n    user: root\n"
            "    connect_timeout_s: 2\n    containers:\n      200: {gpus: 1}\n")
        t0 = time.monotonic()
        res = run("doctor", "--host", "silent", "--ct", "200", "--deadline", "20", "--json")
        took = time.monotonic() - t0
    finally:
        lst.close()
    assert took < 20, f"doctor took {took:.1f} s"
    assert res.exit_code == errors.DOCTOR_FAILED, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)["rows"]}
    assert rows["ssh"]["status"] == "fail"
    assert rows["gpu-count"]["status"] == "skip" and "connection failed" in rows["gpu-count"]["reason"]


XID = "NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def test_kernel_xid_during_a_failed_job_is_in_its_diagnosis(target: Path, tmp_path: Path) -> None:
    """The job sleeps, the "host" kernel logs an Xid 79 (/dev/kmsg, as root), the job dies:
    its diagnosis names the Xid, the GPU and the action; status --host-log shows it too."""
    if os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK):
        pytest.skip("writing /dev/kmsg needs root")
    book = tmp_path / "xid.json"
    script = "import time\nprint('training', flush=True)\ntime.sleep(4)\nraise SystemExit(1)\n"
    book.write_text(json.dumps({"name": "xid", "command": ["python3", "-u", "-c", script],
                                "timeout_s": 60}))
    res = run("deploy", *T, "--playbook", str(book), "--replace", "-d", "--json")
    assert res.exit_code == 0, res.output
    job = json.loads(res.stdout)["job_id"]
    time.sleep(1.0)  # scenario: the Xid is logged while the job runs, after its start
    with open("/dev/kmsg", "w") as kmsg:  # <3>: KERN_ERR, as the driver logs it
        kmsg.write(f"<3>{XID}\n")
    res = run("status", *T, job, "--follow", "--poll", "0.3", "--json")
    assert res.exit_code == errors.JOB_FAILED, res.output
    st = json.loads(res.stdout)
    (xid,) = [d for d in st["diagnosis"] if d["cause"] == "host-xid"]
    assert xid["severity"] == "error"
    assert "Xid 79 on GPU at 0000:41:00" in xid["summary"] and "fallen off the bus" in xid["summary"]
    assert "drain it" in xid["hint"]
    assert any(XID in e for e in xid["evidence"])
    res = run("status", *T, job, "--host-log", "--json")
    assert any(d["cause"] == "host-xid" for d in json.loads(res.stdout)["diagnosis"])


def test_an_xid_before_the_job_started_is_not_in_its_diagnosis(target: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK):
        pytest.skip("writing /dev/kmsg needs root")
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write("<3>NVRM: Xid (PCI:0000:42:00): 48, pid=1, name=x, old double bit error\n")
    time.sleep(7)  # scenario: the Xid is older than the window's slack when the job starts
    book = tmp_path / "quick.json"
    book.write_text(json.dumps({"name": "q", "command": ["python3", "-c", "raise SystemExit(2)"],
                                "timeout_s": 60}))
    res = run("deploy", *T, "--playbook", str(book), "--replace", "-d", "--json")
    job = json.loads(res.stdout)["job_id"]
    res = run("status", *T, job, "--follow", "--poll", "0.3", "--json")
    st = json.loads(res.stdout)
    assert not any("0000:42:00" in d["summary"] for d in st["diagnosis"]), st["diagnosis"]


FULL_ROOT = "/opt/opsctl-test-doctor-full"


def test_deploy_refuses_on_a_failing_doctor_check_unless_forced(sandbox, isolated_env: Path,
                                                                 tmp_path: Path) -> None:
    """The opsctl root in the container on a 64 MiB tmpfs: deploy's launch answers doctor's
    own disk-free row (exit 25), nothing is launched; --force launches anyway."""
    use_private_root(sandbox, isolated_env, FULL_ROOT)
    mounted = run("exec", *T, "--", "sh", "-c", f"mkdir -p {FULL_ROOT} && "
                  f"mount -t tmpfs -o size=64m tmpfs {FULL_ROOT}")
    if mounted.exit_code != 0:
        pytest.skip(f"cannot mount a tmpfs in the container: {mounted.output}")
    try:
        book = tmp_path / "small.json"
        book.write_text(json.dumps({"name": "small", "command": ["sleep", "30"], "timeout_s": 60}))
        res = run("deploy", *T, "--playbook", str(book), "-d", "--json")
        assert res.exit_code == errors.REMOTE_FAILED, res.output
        err = json.loads(res.stdout)["error"]
        assert "doctor check disk-free failed: less than 2.0 GiB free" in err["message"]
        assert f"[{FULL_ROOT}: " in err["message"] and "fix: free space in the container" in err["message"]
        assert "--force" in err["hint"]
        assert json.loads(run("jobs", *T, "--json").stdout)["jobs"] == []
        res = run("deploy", *T, "--playbook", str(book), "-d", "--force", "--json")
        assert res.exit_code == 0, res.output
        job = json.loads(res.stdout)["job_id"]
        run("stop", *T, job, "--grace", "1")
    finally:
        run("exec", *T, "--", "umount", "-l", FULL_ROOT)




def test_a_deadline_that_leaves_no_time_for_the_container_is_never_a_clean_bill(target: Path):
    """An agent that never answers, and a deadline of 8 s: what is left after the host's
    checks cannot hold the agent's, so doctor says so in a failing ``deadline`` row and exits
    28 (never "no failing check", exit 0), within its deadline."""
    from opsctl.remote import payload

    plant_agent(ROOT, "import time\ntime.sleep(100000)\n",
                {"payload/MANIFEST.json": json.dumps({"digest": payload.build_manifest().digest})})
    start = time.monotonic()
    res = run("doctor", *T, "--deadline", "8", "--json")
    took = time.monotonic() - start
    assert res.exit_code == errors.DOCTOR_FAILED, res.output
    doc = json.loads(res.stdout)
    rows = {r["name"]: r for r in doc["rows"]}
    assert doc["ok"] is False and rows["deadline"]["status"] == "fail"
    assert "container-libraries" in rows["deadline"]["reason"]
    assert took < 8 + 1.5, took
