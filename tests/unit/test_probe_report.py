"""Stack-dump parsing and the probe's verdict, on real H200 captures and plain dicts."""

from __future__ import annotations

import json
import typing as t

from remote_payload.probes import race_report, stackdump
from tests.paths import FIXTURES

FIX = FIXTURES
H200 = FIX / "h200-torch-2.11.0-cu130"


def test_watchdog_dump_parses_into_threads_with_frames() -> None:
    dumps = stackdump.parse_dump((H200 / "compile-hang-3-threads-stacks.txt").read_text())
    assert len(dumps) == 1
    d = dumps[0]
    assert d.timeout_after == "0:01:15"
    assert len(d.threads) == 8
    assert d.threads[0].ident == "0x00007f3b3b4ff6c0"
    assert d.threads[0].frames[0].short() == "torch/_inductor/compile_worker/timer.py:43 check"


def test_the_tracing_thread_is_named_by_its_compile_stages() -> None:
    d = stackdump.parse_dump((H200 / "compile-hang-3-threads-stacks.txt").read_text())[0]
    deep = max(d.threads, key=lambda th: len(th.frames))
    assert deep.landmarks()[:3] == ["autograd backward", "fx Tracer.trace",
                                    "flex_attention joint trace"]
    assert deep.in_compile
    assert deep.where(prefer=("race_gpu",)) == ("torch/autograd/graph.py:869 _engine_run_backward "
                                                "(from /root/race_gpu.py:36 worker)")


def test_dump_with_blank_separated_threads_parses_the_same() -> None:
    d = stackdump.parse_dump((H200 / "compile-hang-watchdog-stacks.txt").read_text())[0]
    assert d.timeout_after == "0:01:40" and len(d.threads) == 6


def test_fatal_signal_dump_and_two_dumps_in_one_log() -> None:
    text = ("Fatal Python error: Segmentation fault\n\n"
            "Thread 0x00007f0000000001 (most recent call first):\n"
            '  File "/x/y.py", line 3 in worker\n\n'
            "Current thread 0x00007f0000000002 (most recent call first):\n"
            '  File "/x/y.py", line 9 in <module>\n'
            "some output\n"
            "Thread 0x00007f0000000001 (most recent call first):\n"
            '  File "/x/y.py", line 4 in worker\n')
    dumps = stackdump.parse_dump(text)
    assert [len(d.threads) for d in dumps] == [2, 1]
    assert dumps[0].threads[1].current is True
    assert dumps[1].threads[0].frames[0].line == 4


def test_summaries_carry_thread_names_when_known() -> None:
    d = stackdump.parse_dump((H200 / "compile-hang-3-threads-stacks.txt").read_text())[0]
    names = {stackdump.normalize_ident(0x00007f3f625dd6c0): "worker-1"}
    rows = stackdump.summarize(d, names=names)
    assert [r["name"] for r in rows].count("worker-1") == 1


def mode(status: str, **kw: t.Any) -> dict[str, t.Any]:
    return {"status": status, "elapsed_s": 16.0, "threads": [], "errors": [], "backward": True,
            "fx_flag_kind": "module_global", "hang_stacks": [], **kw}


ENV = {"torch": "2.11.0+cu130", "device_name": "NVIDIA H200", "device": "cuda"}


def test_unguarded_hang_with_guarded_pass_is_affected_and_names_the_fixes() -> None:
    rep = race_report.build(modes={"unguarded": mode("hang", elapsed_s=96.4),
                                   "guarded": mode("ok", elapsed_s=16.2)},
                            env=ENV, threads=3, backward_requested=True)
    assert rep["status"] == "affected" and rep["affected"] is True
    v = rep["verdict"]
    assert v.startswith("This build is affected (torch 2.11.0+cu130 on NVIDIA H200): unguarded, "
                        "3 threads making their first compiled flex_attention forward+backward "
                        "at once hung")
    assert "guarded, 3 threads" in v and "passed in 16 s" in v
    assert "one process per GPU" in v and "torch >= 2.14" in v and "serialized_compile" in v


def test_a_pass_on_a_process_global_flag_is_not_called_safe() -> None:
    rep = race_report.build(modes={"unguarded": mode("ok"), "guarded": mode("ok")}, env=ENV,
                            threads=3, backward_requested=True)
    assert rep["status"] == "ok" and rep["affected"] is False
    assert "a pass does not prove the build safe" in rep["verdict"]


def test_a_thread_local_flag_explains_why_it_cannot_fire() -> None:
    modes = {"unguarded": mode("ok", fx_flag_kind="thread_local"), "guarded": mode("ok")}
    rep = race_report.build(modes=modes, env={**ENV, "torch": "2.14.0+cu130"}, threads=3,
                            backward_requested=True)
    assert "cannot fire" in rep["verdict"]


def test_a_crash_during_unguarded_compile_counts_as_affected() -> None:
    modes = {"unguarded": mode("crashed", phase="compile", signal="SIGSEGV",
                               error="child died by SIGSEGV before reporting"),
             "guarded": mode("ok")}
    rep = race_report.build(modes=modes, env=ENV, threads=3, backward_requested=True)
    assert rep["status"] == "affected"
    assert "crashed the process (child died by SIGSEGV" in rep["verdict"]


def test_the_h200_report_reproduces_the_measured_facts() -> None:
    """Captured on the H200 (torch 2.11.0+cu130): unguarded hung, guarded ~16-18 s."""
    rep = json.loads((FIX / "h200-probe" / "report.json").read_text())
    assert rep["event"] == "probe_report" and rep["status"] == "affected"
    assert rep["env"]["torch"] == "2.11.0+cu130" and rep["env"]["device_name"] == "NVIDIA H200"
    ung, gua = rep["modes"]["unguarded"], rep["modes"]["guarded"]
    assert ung["status"] == "hang" and ung["backward"] is True
    assert ung["fx_tracing_flag"] is True, "the flag stayed stuck after the hang"
    assert {s["name"] for s in ung["hang_stacks"] if s["name"]} == {"worker-0", "worker-1",
                                                                     "worker-2"}
    assert gua["status"] == "ok" and 10 < gua["elapsed_s"] < 30
    raw = (FIX / "h200-probe" / "raw.log").read_text()
    assert "Timeout (0:01:48)!" in raw and "compile_fx_backward" in raw


def test_warm_modes_show_whether_the_lock_alone_protects_warm_callers() -> None:
    warm_err = {"role": "warm", "index": 0, "status": "error"}
    modes = {"unguarded": mode("hang"), "guarded": mode("ok"),
             "warm-lock-only": mode("error", threads=[warm_err],
                                    errors=[f"RuntimeError: {race_report.FX_MARKER} ..."]),
             "warm-gated": mode("ok", threads=[{"role": "warm", "index": 0, "status": "ok",
                                                "calls": 812}])}
    rep = race_report.build(modes=modes, env=ENV, threads=3, backward_requested=True)
    v = rep["verdict"]
    assert ("warm-lock-only, 1 thread making warm compiled calls (with only the compile lock) "
            "while 2 compile under the lock: the warm thread raised the FX tracing race error") in v
    assert "(812 warm calls)" in v
    assert "The lock alone did not protect a thread making warm compiled calls" in v


def test_the_h200_warm_report_shows_the_lock_alone_fails_the_warm_caller() -> None:
    rep = json.loads((FIX / "h200-probe" / "report-warm.json").read_text())
    lock_only, gated = rep["modes"]["warm-lock-only"], rep["modes"]["warm-gated"]
    warm = lock_only["threads"][0]
    assert (warm["role"], warm["status"]) == ("warm", "error")
    assert race_report.FX_MARKER in warm["error"]
    assert gated["status"] == "ok" and all(th["status"] == "ok" for th in gated["threads"])
    assert "The lock alone did not protect" in rep["verdict"]
