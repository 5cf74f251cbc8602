"""Every diagnosis signature against a real captured log; a healthy log yields nothing."""

from __future__ import annotations

import pathlib
import re
import time
import typing as t

import pytest

from remote_payload import wire
from remote_payload.agent import diagnosis
from remote_payload.probes import stackdump
from tests.paths import FIXTURES

FIX = FIXTURES
H200 = FIX / "h200-torch-2.11.0-cu130"
DIAG = FIX / "diagnosis"
NOW = 1_800_000_000.0


def log(path: pathlib.Path) -> list[str]:
    """Fixture lines without the ``#!`` metadata (source citations)."""
    return [ln for ln in path.read_text().splitlines() if not ln.startswith("#!")]


def status(**kw: t.Any) -> dict[str, t.Any]:
    base: dict[str, t.Any] = {
        "state": "FAILED", "alive": False, "phase": "training", "exit_code": 1, "signal": None,
        "gpus": [], "last_step": None, "last_output_at": NOW - 5, "started_at": NOW - 600,
        "expect_tok_s": None,
    }
    base.update(kw)
    return base


def run(lines: list[str], st: dict[str, t.Any] | None = None,
        events: list[dict[str, t.Any]] | None = None) -> list[dict[str, t.Any]]:
    if events is None:
        events = [ev for ln in lines if (ev := wire.parse_event(ln))]
    return diagnosis.diagnose(output_tail=lines, events=events, status=st or status(), now=NOW)


def causes(found: list[dict[str, t.Any]]) -> list[str]:
    return [f["cause"] for f in found]


def by_cause(found: list[dict[str, t.Any]], cause: str) -> dict[str, t.Any]:
    hits = [f for f in found if f["cause"] == cause]
    assert hits, f"{cause} not in {causes(found)}"
    return hits[0]


def test_every_finding_has_the_contract_shape() -> None:
    found = run(log(H200 / "fx-race-error-backward.txt"))
    assert found, "expected findings"
    for f in found:
        assert set(f) == {"cause", "severity", "summary", "evidence", "hint"}, f
        assert f["severity"] in ("error", "warning", "info"), f
        assert isinstance(f["evidence"], list) and all(isinstance(e, str) for e in f["evidence"])


@pytest.mark.parametrize("name", ["fx-race-error-forward.txt", "fx-race-error-backward.txt"])
def test_fx_race_is_named_with_fixes_best_first(name: str) -> None:
    f = by_cause(run(log(H200 / name)), "fx_tracing_race")
    assert f["severity"] == "error"
    assert "Concurrent torch.compile in threads" in f["summary"]
    assert any("Detected that you are using FX" in e for e in f["evidence"]), f["evidence"]
    hint = f["hint"]
    assert hint.index("one process per GPU") < hint.index("torch >= 2.14") < hint.index("lock")


def test_fx_race_outranks_the_generic_exception_line() -> None:
    found = run(log(H200 / "fx-race-error-backward.txt"))
    assert "python_exception" not in causes(found), causes(found)


@pytest.mark.parametrize("name", ["compile-hang-3-threads-stacks.txt",
                                  "compile-hang-watchdog-stacks.txt"])
def test_watchdog_stacks_with_threads_in_compile_read_as_the_concurrent_compile_hang(
        name: str) -> None:
    found = run(log(H200 / name), status(state="COMPILING", alive=True, exit_code=None))
    f = by_cause(found, "compile_hang_stacks")
    assert f["severity"] == "error"
    assert "concurrent-compile hang" in f["summary"]
    assert any("fx Tracer.trace" in e for e in f["evidence"]), f["evidence"]


def test_probe_raw_output_from_the_h200_reads_as_the_compile_hang() -> None:
    raw = (FIX / "h200-probe" / "raw.log").read_text().splitlines()
    dump_start = next(i for i, ln in enumerate(raw) if ln.startswith("Timeout ("))
    found = run(raw[dump_start:dump_start + 200], status(state="COMPILING", alive=True,
                                                         exit_code=None))
    assert "compile_hang_stacks" in causes(found), causes(found)


def test_hang_when_alive_silent_past_the_threshold_and_gpus_idle() -> None:
    st = status(state="RUNNING", alive=True, exit_code=None, last_output_at=NOW - 900,
                gpus=[{"index": 0, "util_pct": 0.0}, {"index": 1, "util_pct": 1.0}],
                last_step={"event": "step", "step": 41, "tok_s": 19000.0, "_at": NOW - 905})
    f = by_cause(run(log(H200 / "compile-hang-3-threads-stacks.txt")[:0], st), "hang")
    assert f["severity"] == "error"
    assert "900 s" in f["summary"] and "GPUs idle" in f["summary"]
    assert "opsctl stacks" in f["hint"]


def test_a_job_quiet_for_90_s_with_idle_gpus_is_hung_by_default() -> None:
    idle = [{"index": 0, "util_pct": 0.0}]
    quiet = {"state": "RUNNING", "alive": True, "exit_code": None, "gpus": idle}
    assert "hang" not in causes(run([], status(last_output_at=NOW - 89, **quiet), events=[]))
    f = by_cause(run([], status(last_output_at=NOW - 91, **quiet), events=[]), "hang")
    assert f["severity"] == "error"
    assert "threshold 90 s: default" in f["evidence"][0]


@pytest.mark.parametrize(("fields", "threshold", "why"), [
    ({}, 90.0, "default"),
    ({"hang_after_s": 30}, 30.0, "playbook hang_after_s"),
    ({"phase": "compiling", "budget_s": 300}, 300.0, "announced by the job for phase compiling"),
    ({"budget_s": 20}, 90.0, "default"),  # an announced budget never makes the check stricter
    ({"phase": "compiling", "budget_s": 300, "phase_budgets_s": {"compiling": 40}}, 40.0,
     "playbook phase_budgets_s.compiling"),
    ({"state": "COMPILING"}, diagnosis.UNANNOUNCED_COMPILE_HANG_S, "compiling, no budget announced"),
])
def test_the_hang_threshold_comes_from_the_playbook_then_the_jobs_budget_then_90_s(
        fields: dict[str, t.Any], threshold: float, why: str) -> None:
    st = {"phase": "training", "state": "RUNNING", **fields}
    assert diagnosis.hang_threshold(st) == (threshold, why)


def test_a_compile_within_its_announced_budget_is_not_a_hang() -> None:
    st = status(state="COMPILING", phase="compiling", alive=True, exit_code=None,
                last_output_at=NOW - 200, budget_s=300.0, gpus=[])
    assert "hang" not in causes(run([], st, events=[]))
    f = by_cause(run([], {**st, "last_output_at": NOW - 301}, events=[]), "hang")
    assert f["severity"] == "warning", "GPU load unknown: a warning, not an error"


def test_the_hang_names_where_every_rank_waits_from_the_stacks_taken_at_the_hang() -> None:
    hang = {"quiet_since": NOW - 120, "summary": "all ranks in collectives: rank 1 in new_group "
            "(dist.py:86), rank 0 in broadcast_object_list (train.py:184)",
            "processes": [{"rank": 1, "collective": "new_group"},
                          {"rank": 0, "collective": "broadcast_object_list"}],
            "saved_to": "/opt/opsctl/jobs/j/stack-dumps/x-hang.txt"}
    st = status(state="SETTING_UP", phase="loading", alive=True, exit_code=None,
                last_output_at=NOW - 120, gpus=[{"index": 0, "util_pct": 100.0}], hang=hang)
    f = by_cause(run([], st, events=[]), "hang")
    assert f["severity"] == "error", "a rank stuck in a collective spins its GPU at 100 %"
    assert "rank 1 in new_group (dist.py:86), rank 0 in broadcast_object_list" in f["summary"]
    assert any("x-hang.txt" in e for e in f["evidence"])
    stale = {**hang, "quiet_since": NOW - 400}  # taken in an earlier quiet spell
    assert "new_group" not in by_cause(run([], {**st, "hang": stale}, events=[]), "hang")["summary"]


def test_a_job_that_printed_nothing_at_all_is_called_out() -> None:
    st = status(state="SETTING_UP", alive=True, exit_code=None, last_output_at=None,
                started_at=NOW - 1000, gpus=[{"index": 0, "util_pct": 0.0}])
    f = by_cause(run([], st, events=[]), "hang")
    assert "no output at all" in f["summary"]


def test_quiet_but_busy_gpus_is_a_warning_not_an_error() -> None:
    st = status(state="RUNNING", alive=True, exit_code=None, last_output_at=NOW - 900,
                gpus=[{"index": 0, "util_pct": 97.0}])
    assert by_cause(run([], st), "hang")["severity"] == "warning"


def test_the_first_rank_to_fail_is_named_not_the_ranks_it_took_down() -> None:
    errors = [
        {"event": "error", "type": "RuntimeError", "rank": 0, "gpu": "0", "_at": NOW - 3,
         "message": "[pair.cc:553] Connection closed by peer [127.0.0.1]:4487. This is typically "
                    "caused by a remote worker crashing."},
        {"event": "error", "type": "RuntimeError", "rank": 1, "gpu": "1", "_at": NOW - 4,
         "message": "CUDA error: an illegal memory access was encountered"},
    ]
    f = by_cause(run([], status(errors=errors), events=[]), "rank_failed")
    assert f["summary"].startswith("Rank 1 (GPU 1) failed: RuntimeError: CUDA error")
    assert "rank(s) 0 failed after it" in f["summary"]
    assert "python_exception" not in causes(run(["RuntimeError: x"], status(errors=errors)))


def test_one_process_failing_is_left_to_the_exception_finding() -> None:
    errors = [{"event": "error", "type": "ValueError", "rank": 0, "message": "bad"}]
    assert "rank_failed" not in causes(run([], status(errors=errors), events=[]))


def test_gpus_held_by_something_else_at_launch_are_named() -> None:
    pre = {"needed": None, "forced": True, "busy": [
        {"index": 3, "mem_used_mib": 61000.0, "processes": [], "why": "59.6 GiB used by processes "
         "this container cannot see (the host or another container)"}]}
    f = by_cause(run([], status(state="RUNNING", alive=True, preflight=pre), events=[]),
                 "gpus_busy_at_launch")
    assert "launched with --force" in f["summary"]
    assert f["evidence"] == ["GPU 3: 59.6 GiB used by processes this container cannot see "
                             "(the host or another container)"]


def test_cuda_oom_reports_the_numbers_from_the_message() -> None:
    f = by_cause(run(log(DIAG / "cuda-oom.txt")), "cuda_oom")
    assert f["summary"].startswith("CUDA out of memory on GPU 0: tried to allocate 22.00 MiB "
                                   "with 11.06 MiB free of 23.65 GiB"), f["summary"]
    assert "this process holds 23.60 GiB" in f["summary"]
    assert "expandable_segments" not in f["hint"], "194 MiB reserved is not fragmentation"


def test_cuda_oom_with_much_reserved_memory_suggests_expandable_segments() -> None:
    f = by_cause(run(log(DIAG / "cuda-oom-fragmented.txt")), "cuda_oom")
    assert "9.35 GiB reserved but unallocated" in f["summary"]
    assert "expandable_segments:True" in f["hint"]


def test_cuda_oom_old_message_format_is_parsed() -> None:
    f = by_cause(run(log(DIAG / "cuda-oom-old-format.txt")), "cuda_oom")
    assert "tried to allocate 2.26 GiB with 3.03 GiB free of 6.00 GiB" in f["summary"]


def test_nccl_watchdog_timeout_names_op_seq_duration_and_ranks() -> None:
    found = run(log(DIAG / "nccl-timeout.txt"))
    f = by_cause(found, "nccl_timeout")
    assert f["summary"] == "NCCL ALLREDUCE (SeqNum 808) timed out after 600 s on rank(s) [0, 1]"
    assert "nccl_error" not in causes(found)


def test_nccl_error_names_the_nccl_code() -> None:
    f = by_cause(run(log(DIAG / "nccl-error.txt")), "nccl_error")
    assert f["summary"] == "NCCL unhandled cuda error (ncclUnhandledCudaError)"
    assert "NCCL_DEBUG=INFO" in f["hint"]


def test_uncompiled_flex_attention_is_the_slow_path() -> None:
    f = by_cause(run(log(DIAG / "flex-uncompiled.txt"), status(state="RUNNING", alive=True,
                                                               exit_code=None)),
                 "flex_attention_uncompiled")
    assert f["severity"] == "warning"
    assert "4.6 Ktok/s" in f["summary"]


@pytest.mark.parametrize("name,fn", [("recompile-limit.txt", "'f'"),
                                     ("recompile-limit-fullgraph.txt",
                                      "'dion2_post_orthogonalize'")])
def test_recompile_limit_names_the_function(name: str, fn: str) -> None:
    f = by_cause(run(log(DIAG / name)), "recompile_limit")
    assert fn in f["summary"] and "uncompiled" in f["summary"]


@pytest.mark.parametrize("name,words", [
    ("cuda-driver-too-old.txt", "needs a newer NVIDIA driver than the host has (driver supports "
                                "CUDA 11.0)"),
    ("cuda-driver-insufficient.txt", "CUDA runtime is newer than the host driver supports"),
    ("cuda-no-kernel-image.txt", "no kernels for this GPU architecture"),
])
def test_cuda_driver_or_build_mismatch(name: str, words: str) -> None:
    f = by_cause(run(log(DIAG / name)), "cuda_driver_mismatch")
    assert words in f["summary"], f["summary"]
    assert "580" in f["hint"]


def test_missing_module_names_the_module() -> None:
    found = run(log(DIAG / "missing-module.txt"))
    f = by_cause(found, "missing_module")
    assert f["summary"] == "Import failed: no module 'dflash_missing_mod'"
    assert "python_exception" not in causes(found)


def test_missing_torch_points_at_the_env() -> None:
    lines = ["ModuleNotFoundError: No module named 'torch'"]
    assert "torch is not installed" in by_cause(run(lines), "missing_module")["hint"]


def test_sigkill_points_at_the_oom_killer_and_dmesg() -> None:
    found = run(log(DIAG / "killed-sigkill.txt"), status(exit_code=137, signal=None))
    f = by_cause(found, "killed_by_signal")
    assert "OOM killer" in f["summary"] and "dmesg" in f["hint"]
    assert any("Killed" in e for e in f["evidence"]), f["evidence"]


def test_signal_from_the_status_document_is_used() -> None:
    f = by_cause(run([], status(exit_code=None, signal="SIGSEGV")), "killed_by_signal")
    assert "segmentation fault" in f["summary"]


def test_a_cancelled_job_is_not_reported_as_killed() -> None:
    assert run([], status(state="CANCELLED", exit_code=None, signal="SIGTERM")) == []


def test_throughput_far_below_expectation_warns_and_names_the_slow_path() -> None:
    steps = [{"event": "step", "step": s, "tok_s": 4600.0, "_at": NOW - 10 + s} for s in (5, 6, 7)]
    st = status(state="RUNNING", alive=True, exit_code=None, expect_tok_s=20000.0,
                last_step=steps[-1])
    found = run(log(DIAG / "flex-uncompiled.txt"), st, events=steps)
    f = by_cause(found, "throughput_regression")
    assert f["severity"] == "warning"
    assert f["summary"].startswith("Throughput 4.6 Ktok/s is 23% of the expected 20.0 Ktok/s")
    assert "likely cause: flex_attention_uncompiled" in f["summary"]


def test_throughput_near_expectation_is_fine() -> None:
    st = status(state="RUNNING", alive=True, exit_code=None, expect_tok_s=20000.0,
                last_step={"event": "step", "step": 9, "tok_s": 12800.0})
    assert "throughput_regression" not in causes(run([], st))


def test_unknown_failure_still_names_the_last_exception() -> None:
    f = by_cause(run(log(DIAG / "python-exception.txt")), "python_exception")
    assert f["summary"].startswith("The job failed with json.decoder.JSONDecodeError: Expecting")


def test_errors_come_before_warnings() -> None:
    lines = log(DIAG / "flex-uncompiled.txt") + log(H200 / "fx-race-error-forward.txt")
    sev = [f["severity"] for f in run(lines)]
    assert sev == sorted(sev, key=diagnosis.SEVERITY_ORDER.__getitem__), sev


def test_a_healthy_log_yields_no_findings() -> None:
    lines = log(DIAG / "healthy-training.txt")
    events = [ev | {"_at": NOW - 30 + i} for i, ln in enumerate(lines)
              if (ev := wire.parse_event(ln))]
    st = status(state="RUNNING", alive=True, exit_code=None, expect_tok_s=20000.0,
                last_step=events[-2], gpus=[{"index": 0, "util_pct": 96.0}])
    assert run(lines, st, events) == []


def test_diagnosis_is_fast_on_a_full_tail() -> None:
    lines = (log(H200 / "compile-hang-3-threads-stacks.txt") + log(DIAG / "nccl-timeout.txt")
             + log(DIAG / "healthy-training.txt")) * 2
    st = status(state="RUNNING", alive=True, exit_code=None, last_output_at=NOW - 900)
    t0 = time.perf_counter()
    for _ in range(20):
        run(lines[-200:], st)
    per_call = (time.perf_counter() - t0) / 20
    assert per_call < 0.02, f"diagnose took {per_call * 1000:.1f} ms"


def test_a_stack_dump_followed_by_training_steps_is_not_a_hang() -> None:
    step = '{"event":"step","step":1,"loss":7.9,"tok_s":19000.0}'
    lines = [*log(H200 / "compile-hang-3-threads-stacks.txt"), step]
    found = run(lines, status(state="RUNNING", alive=True, exit_code=None))
    assert "compile_hang_stacks" not in causes(found), causes(found)


def test_drafters_idle_more_than_half_the_time_get_a_layout_recommendation() -> None:
    step = {"event": "step", "step": 30, "tok_s": 40000.0, "feature_wait_pct": 63.0}
    st = status(state="RUNNING", alive=True, exit_code=None, last_step=step)
    f = by_cause(run([], st, events=[]), "drafters_waiting_for_features")
    assert f["severity"] == "info"
    assert "63% of their time waiting" in f["summary"] and "colocated" in f["hint"]
    busy = {**step, "feature_wait_pct": 42.0}
    found = run([], status(state="RUNNING", alive=True, exit_code=None, last_step=busy), events=[])
    assert "drafters_waiting_for_features" not in causes(found)


def test_diagnosis_loads_the_dump_parser_only_for_text_both_dump_headers_contain():
    for rx in (stackdump._THREAD_RE, stackdump._STACK_RE):
        assert re.escape(diagnosis._DUMP_HEADER).replace("\\ ", " ") in rx.pattern, rx.pattern
