"""GPU table parsing and the nvidia-smi fallbacks of the container agent."""

from __future__ import annotations

import json
import os
import stat
import textwrap
import threading
import time
from pathlib import Path

import pytest

from remote_payload.agent import gpus
from tests.waiting import wait_for

# real `nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total,
# temperature.gpu,power.draw --format=csv,noheader,nounits` lines (H200 idle and busy)
H200_IDLE = "0, NVIDIA H200, 0, 0, 143771, 27, 73.52"
H200_BUSY = "7, NVIDIA H200, 100, 131072, 143771, 61, 688.17"


def test_an_H200_line_parses_into_numbers() -> None:
    assert gpus.parse_smi_csv(H200_IDLE + "\n") == [{
        "index": 0, "name": "NVIDIA H200", "util_pct": 0.0, "mem_used_mib": 0.0,
        "mem_total_mib": 143771.0, "temp_c": 27.0, "power_w": 73.52}]


def test_several_gpus_keep_their_order_and_indices() -> None:
    table = gpus.parse_smi_csv(f"{H200_IDLE}\n{H200_BUSY}\n")
    assert [g["index"] for g in table] == [0, 7]
    assert table[1]["util_pct"] == 100.0
    assert table[1]["power_w"] == 688.17


@pytest.mark.parametrize("missing", ["[N/A]", "[Not Supported]", "N/A", ""])
def test_unavailable_fields_become_null(missing: str) -> None:
    (gpu,) = gpus.parse_smi_csv(f"0, NVIDIA H200, {missing}, 0, 143771, {missing}, {missing}")
    assert gpu["util_pct"] is None
    assert gpu["temp_c"] is None
    assert gpu["power_w"] is None
    assert gpu["mem_total_mib"] == 143771.0


def test_a_line_with_the_wrong_field_count_is_refused() -> None:
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        gpus.parse_smi_csv("0, NVIDIA H200, 0")


def _fake_smi(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """No driver library reachable through pynvml either (whatever is installed here)."""
    monkeypatch.setattr(gpus, "_nvml_query", lambda: None)


def test_without_nvidia_smi_NVML_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = gpus.parse_smi_csv(H200_IDLE)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(gpus, "_nvml_query", lambda: table)
    assert gpus.query() == (table, None)


@pytest.mark.usefixtures("no_nvml")
def test_no_nvidia_smi_and_no_NVML_means_no_gpus_and_no_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.query() == ([], None)


@pytest.mark.usefixtures("no_nvml")
def test_a_working_nvidia_smi_is_parsed(tmp_path: Path) -> None:
    smi = _fake_smi(tmp_path, f"""\
        case "$*" in *--query-gpu=index,name,utilization.gpu*noheader,nounits*) ;;
          *) echo "bad args: $*" >&2; exit 2;; esac
        echo '{H200_IDLE}'
        echo '{H200_BUSY}'
        """)
    table, err = gpus.GpuQuery(smi=str(smi)).result()
    assert err is None
    assert [g["index"] for g in table] == [0, 7]


@pytest.mark.usefixtures("no_nvml")
def test_a_failing_nvidia_smi_gives_no_gpus_and_says_why(tmp_path: Path) -> None:
    smi = _fake_smi(tmp_path, """\
        echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        exit 9
        """)
    table, err = gpus.GpuQuery(smi=str(smi)).result()
    assert table == []
    assert err is not None
    assert err.startswith("nvidia-smi exited 9: NVIDIA-SMI has failed")


@pytest.mark.usefixtures("no_nvml")
def test_a_hanging_nvidia_smi_is_cut_off_at_the_timeout(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "SMI_TIMEOUT_S", 0.2)
    smi = _fake_smi(tmp_path, "exec sleep 30\n")
    query = gpus.GpuQuery(smi=str(smi))
    table, err = query.result()
    assert table == []
    assert err == "nvidia-smi timed out after 0.2s"
    proc = query._proc
    assert proc is not None
    assert proc.returncode is not None  # killed and reaped, not left behind
    assert not os.path.exists(f"/proc/{proc.pid}/stat") or proc.returncode < 0


@pytest.mark.usefixtures("no_nvml")
def test_the_sampler_writes_fresh_tables_that_status_reuses(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_smi(tmp_path, f"echo '{H200_IDLE}'\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    sample_path = tmp_path / "gpus.json"
    stop = threading.Event()
    sampler = threading.Thread(target=gpus.sample_forever, args=(str(sample_path), stop, 0.05))
    sampler.start()
    try:
        wait_for(sample_path.exists, 10, interval=0.01)
        sample = gpus.read_sample(str(sample_path), time.time())
    finally:
        stop.set()
        sampler.join(10)
    assert sample is not None
    table, err, _at = sample
    assert err is None
    assert table == gpus.parse_smi_csv(H200_IDLE)
    stale = time.time() + gpus.SAMPLE_MAX_AGE_S + 1
    assert gpus.read_sample(str(sample_path), stale) is None  # the sampler died: query live


@pytest.mark.usefixtures("no_nvml")
def test_a_machine_without_gpus_is_sampled_once_and_stays_valid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    sample_path = tmp_path / "gpus.json"
    gpus.sample_forever(str(sample_path), threading.Event(), 0.05)  # returns: nothing to watch
    assert gpus.read_sample(str(sample_path), time.time() + 3600) == ([], None, pytest.approx(
        json.loads(sample_path.read_text())["at"]))


# --- launch preflight: the answers of the real nvidia-smi queries (H200, 2026-11-30) --------

GPU_IDS = ("0, GPU-092891bf-a09d-eb57-af5a-2052dd5d03ad, 60761\n"
           "1, GPU-93c19784-9a89-60fe-0a12-f2f7720f62a2, 0\n")
APPS = "GPU-092891bf-a09d-eb57-af5a-2052dd5d03ad, 2444, 60752, /opt/torch/.venv/bin/python3\n"


def _preflight_smi(tmp_path: Path, ids: str, apps: str) -> Path:
    return _fake_smi(tmp_path, f"""\
        case "$1" in
          --query-gpu=index,uuid,memory.used) printf '{ids}';;
          --query-compute-apps=*) printf '{apps}';;
          *) echo "bad args: $*" >&2; exit 2;;
        esac
        """)


def test_a_leftover_process_on_a_needed_gpu_is_named(tmp_path: Path) -> None:
    smi = _preflight_smi(tmp_path, GPU_IDS, APPS)
    check = gpus.preflight(None, smi=str(smi))
    (busy,) = check["busy"]
    assert busy["index"] == 0
    assert busy["why"] == "1 process(es) from outside this job: pid 2444 /opt/torch/.venv/bin/python3"
    assert gpus.preflight([1], smi=str(smi))["busy"] == [], "GPU 0 is not needed"


def test_the_job_being_replaced_is_not_a_stranger(tmp_path: Path) -> None:
    smi = _preflight_smi(tmp_path, GPU_IDS, APPS)
    assert gpus.preflight(None, own_pids=[2444], smi=str(smi))["busy"] == []


def test_memory_held_by_processes_this_container_cannot_see_counts(tmp_path: Path) -> None:
    smi = _preflight_smi(tmp_path, GPU_IDS, "")
    (busy,) = gpus.preflight(None, smi=str(smi), settle_s=0.6)["busy"]
    assert busy["why"].startswith("59.3 GiB used by processes this container cannot see")
    assert gpus.preflight(None, smi=str(smi), memory=False)["busy"] == []


def test_no_nvidia_smi_is_no_gpu_not_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.preflight(None) == {"needed": None, "busy": [], "error": None}


@pytest.mark.parametrize(("spec", "needed"), [
    ({"gpus": [2, 3]}, [2, 3]),
    ({"gpus": 4, "gpu_slots": [4, 5, 6, 7]}, [4, 5, 6, 7]),  # the slots the queue gave it
    ({"gpus": 4}, None),  # a count not yet given slots: not a list of GPUs
    ({"env": {"CUDA_VISIBLE_DEVICES": "4,5"}}, [4, 5]),
    ({"env": {"CUDA_VISIBLE_DEVICES": "GPU-0928"}}, None),
    ({}, None),
])
def test_the_gpus_a_job_needs(spec: dict, needed: list[int] | None) -> None:
    assert gpus.needed_gpus(spec) == needed
