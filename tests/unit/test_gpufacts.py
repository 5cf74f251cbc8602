"""The pure parsers of what a GPU machine shows, on what real H200 machines printed
(tests/fixtures/h200-gpu-facts/: a GPU VM, 2026-12-01; tests/fixtures/h200-host-2026-12-01/:
the device machine, recorded with this code's own commands), on NVIDIA's documented Xid line
formats, and on any text at all (hypothesis: a value or "unknown", never an exception)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from remote_payload.gpufacts import kernlog, nvidia, pctconf, shm
from tests.paths import FIXTURES

FIX = FIXTURES
VM = FIX / "h200-gpu-facts"
HOST = FIX / "h200-host-2026-12-01"


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# --- driver and library versions ------------------------------------------------------------


def test_the_driver_version_reads_the_same_from_proc_and_the_libraries() -> None:
    assert nvidia.driver_from_proc(read(VM / "proc_driver.txt")) == "580.159.04"
    assert nvidia.library_version_sets(read(VM / "libs.txt")) == {
        "libnvidia-ml": ["580.159.04"], "libcuda": ["580.159.04"]}
    assert nvidia.driver_from_proc(read(HOST / "proc_version.txt")) == "580.159.04"


def test_a_container_with_two_library_versions_lists_both() -> None:
    listing = ("/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15\n"
               "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04")
    assert nvidia.library_version_sets(listing) == {"libcuda": ["570.86.15", "580.159.04"]}


def test_pci_addresses_of_nvidia_smi_and_of_the_kernel_compare_equal() -> None:
    assert nvidia.pci_key("00000000:00:06.0") == nvidia.pci_key("PCI:0000:00:06") == "0000:00:06"
    assert nvidia.pci_key("0000:41:00") == "0000:41:00"
    assert nvidia.pci_key("not a bus") == "unknown"


# --- device nodes ------------------------------------------------------------------------------


H200_NODES = {"/dev/nvidia0": (195, 0), "/dev/nvidiactl": (195, 255), "/dev/nvidia-uvm": (238, 0),
              "/dev/nvidia-uvm-tools": (238, 1), "/dev/nvidia-caps/nvidia-cap1": (241, 1),
              "/dev/nvidia-caps/nvidia-cap2": (241, 2)}


def test_device_nodes_from_a_glob_listing_and_from_a_directory_listing_agree() -> None:
    assert nvidia.device_nodes(read(VM / "dev_nodes.txt")) == H200_NODES
    assert nvidia.device_nodes(read(HOST / "ls_nvidia.txt")) == H200_NODES
    # what doctor runs on the host: ls -l /dev /dev/nvidia-caps (every other node ignored)
    assert nvidia.device_nodes(read(HOST / "ls_dev.txt")) == H200_NODES


# --- /dev/shm -----------------------------------------------------------------------------------


def test_nccl_wants_more_dev_shm_with_more_gpus_and_none_without() -> None:
    assert shm.needed_bytes(0) == 0
    assert shm.needed_bytes(1) == shm.GIB
    assert shm.needed_bytes(8) == 4 * shm.GIB
    assert shm.human(64 * shm.MIB) == "64 MiB"


# --- pct config ---------------------------------------------------------------------------------

PCT_CONFIG = """arch: amd64
cores: 32
dev0: /dev/nvidia0,mode=0666
hostname: gpu-ct
memory: 262144
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
"""


def test_pct_config_passes_dev_entries_and_allow_plus_bind_pairs() -> None:
    entries = pctconf.parse(PCT_CONFIG)
    assert pctconf.missing_lines(entries, "/dev/nvidia0", 195, 0) == []  # dev0:
    assert pctconf.missing_lines(entries, "/dev/nvidiactl", 195, 255) == []
    # uvm: bound, but its major (238) is not allowed
    assert pctconf.missing_lines(entries, "/dev/nvidia-uvm", 238, 0) == [
        "lxc.cgroup2.devices.allow: c 238:* rwm"]
    assert pctconf.missing_lines(entries, "/dev/nvidia-uvm-tools", 238, 1) == [
        "lxc.cgroup2.devices.allow: c 238:* rwm",
        "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file"]


# --- kernel log: Xid and OOM ------------------------------------------------------------------

# NVIDIA's documented formats (Xid catalog; the driver's own lines as posted in NVIDIA's issues)
XID_79 = "NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
XID_48_JOURNAL = ("2026-12-01T16:11:09.262206+00:00 pve kernel: NVRM: Xid (PCI:0000:2b:00): 48, "
                  "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been "
                  "detected")
XID_OLD = "[ 5107.644336] NVRM: Xid (0000:01:00): 13, Graphics Exception: ESR 0x405840=0x0"
XID_119 = ("2026-12-01T16:11:10,000000+00:00 NVRM: Xid (PCI:0000:65:00): 119, pid='N/A', "
           "Timeout waiting for RPC from GSP")


def test_xid_lines_in_every_documented_format_parse() -> None:
    (e79,) = kernlog.parse(XID_79)
    assert (e79.xid, e79.pci, e79.pid, e79.process, e79.at) == (79, "0000:41:00", 1234, "python3", None)
    (e48,) = kernlog.parse(XID_48_JOURNAL)
    assert (e48.xid, e48.pci, e48.at) == (48, "0000:2b:00", 1796141469.262206)
    assert e48.line.startswith("NVRM: Xid")  # the timestamp and "host kernel:" are stripped
    (e13,) = kernlog.parse(XID_OLD)
    assert (e13.xid, e13.pci) == (13, "0000:01:00")
    (e119,) = kernlog.parse(XID_119)
    assert e119.xid == 119 and e119.at is not None


def test_the_recorded_nvrm_lines_of_a_healthy_h200_are_no_events() -> None:
    assert kernlog.parse(read(VM / "dmesg_xid.txt")) == []
    assert kernlog.parse(read(HOST / "dmesg_nvrm.txt")) == []


def test_xid_79_and_48_say_what_to_do() -> None:
    meaning, action = kernlog.xid_meaning(79)
    assert "fallen off the bus" in meaning and "drain" in action and "reset" in action
    meaning, action = kernlog.xid_meaning(48)
    assert "double-bit ECC" in meaning and "replace the card" in action
    for code in (13, 31, 94, 95, 119, 120):
        assert kernlog.xid_meaning(code) != kernlog.UNKNOWN_XID
    assert "catalog" in kernlog.xid_meaning(9999)[1]


def test_an_oom_kill_is_one_event_and_belongs_to_its_container() -> None:
    text = ("2026-12-01T16:11:09.1+00:00 pve kernel: oom-kill:constraint=CONSTRAINT_MEMCG,"
            "nodemask=(null),cpuset=ns,mems_allowed=0,oom_memcg=/lxc/120,task_memcg=/lxc/120/ns/"
            "user.slice,task=python3,pid=4242,uid=0\n"
            "2026-12-01T16:11:09.2+00:00 pve kernel: Memory cgroup out of memory: Killed process "
            "4242 (python3) total-vm:1kB, anon-rss:1kB")
    (ev,) = kernlog.parse(text)
    assert (ev.kind, ev.pid, ev.process) == ("oom", 4242, "python3")
    assert kernlog.of_container(ev, 120) and not kernlog.of_container(ev, 12)


def test_events_outside_the_window_and_without_wall_time_are_left_out() -> None:
    events = kernlog.parse(f"{XID_48_JOURNAL}\n{XID_79}")
    at = 1796141469.262206
    assert [e.xid for e in kernlog.in_window(events, at - 1, at + 1)] == [48]
    assert kernlog.in_window(events, at + 100, at + 200) == []


# --- any text ----------------------------------------------------------------------------------

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400) | st.sampled_from(
    [XID_79, XID_48_JOURNAL, XID_OLD, PCT_CONFIG, "NVRM: Xid (PCI:ffffffffff:zz:00): 99999999999",
     "oom-kill:task_memcg=,task=,pid=1", "[ 1.0] NVRM: Xid (0:00:00): 0",
     "GPU 0:00:00.0\n  Persistence Mode : "])


@given(TEXT)
def test_every_parser_answers_any_text_without_raising(text: str) -> None:
    assert nvidia.driver_from_proc(text) == "unknown" or "." in nvidia.driver_from_proc(text)
    assert isinstance(nvidia.library_version_sets(text), dict)
    assert isinstance(nvidia.device_nodes(text), dict)
    assert isinstance(nvidia.pci_key(text), str)
    entries = pctconf.parse(text)
    assert isinstance(pctconf.missing_lines(entries, "/dev/nvidia0", 195, 0), list)
    for ev in kernlog.parse(text):
        assert ev.kind in ("xid", "oom")
        assert isinstance(kernlog.xid_meaning(ev.xid or 0), tuple)


@given(st.lists(TEXT, max_size=5))
def test_kernel_log_of_many_lines_never_raises(lines: list[str]) -> None:
    events = kernlog.parse("\n".join(lines))
    timed = [e for e in events if e.at is not None and -5 <= e.at <= 2e9 + 5]
    assert kernlog.in_window(events, 0, 2e9) == timed
