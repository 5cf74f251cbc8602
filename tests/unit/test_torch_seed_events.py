"""Reading compile seconds and cache hit counters from warm-up events (pure logic)."""

from __future__ import annotations

from remote_payload.agent.torchenv.seed import summarize_events, with_python


def test_counters_come_from_trainer_compile_and_cache_events() -> None:
    events = [
        {"event": "phase", "phase": "compiling"},
        {"event": "compile", "name": "a", "seconds": 3.0,
         "cache": {"inductor.fxgraph_cache_miss": 1, "graphs": 1}},
        {"event": "compile", "name": "b", "seconds": 1.5,
         "cache": {"inductor.fxgraph_cache_miss": 2, "graphs": 2}},
        {"event": "cache", "inductor.fxgraph_cache_miss": 2, "aot_autograd.autograd_cache_hit": 0},
    ]
    s = summarize_events(events)
    assert s["compile_seconds"] == 4.5
    assert s["counters"] == {"inductor.fxgraph_cache_miss": 2, "aot_autograd.autograd_cache_hit": 0}
    assert s["hits"] == 0


def test_no_compile_events_means_unknown_compile_seconds() -> None:
    assert summarize_events([{"event": "step", "step": 1}]) == {
        "compile_seconds": None, "counters": {}, "hits": 0}


def test_leading_python_is_replaced_by_the_build_python() -> None:
    assert with_python(["python3", "-m", "x"], "/e/bin/python") == ["/e/bin/python", "-m", "x"]
    assert with_python(["torchrun", "-m", "x"], "/e/bin/python") == ["torchrun", "-m", "x"]
