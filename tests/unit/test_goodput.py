"""The goodput ledger's arithmetic (``remote_payload/agent/goodput.py``): the causes partition
the wall time, none is negative, overlaps count once, and damaged input is unknown, never a
crash or a wrong number."""

from __future__ import annotations

import itertools
import json
import math
import typing as t

from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload.agent import goodput
from remote_payload.agent.goodput import Interval
from remote_payload.wire_shapes import GoodputCause

T0 = 1_790_000_000.0

causes = st.sampled_from(goodput.PRIORITY)
offsets = st.floats(min_value=-50.0, max_value=1050.0, allow_nan=False)
intervals = st.lists(st.builds(lambda c, a, b: Interval(c, T0 + a, T0 + b), causes, offsets,
                               offsets), max_size=40)


def _brute(start: float, end: float, ivs: list[Interval], step: float) -> dict[str, float]:
    """Sample the window: each sample point goes to the highest-priority cover."""
    out: dict[str, float] = dict.fromkeys(goodput.CAUSES, 0.0)
    n = round((end - start) / step)
    for k in range(n):
        x = start + (k + 0.5) * step
        cover = [iv.cause for iv in ivs if iv.start <= x < iv.end]
        cause = min(cover, key=goodput.PRIORITY.index) if cover else goodput.UNKNOWN
        out[cause] += step
    return out


@given(intervals, st.floats(min_value=1.0, max_value=1000.0))
def test_the_causes_sum_to_the_wall_time_and_none_is_negative(ivs, length):
    segs = goodput.spans(T0, T0 + length, ivs)
    total = goodput.totals(segs)
    assert set(total) == set(goodput.CAUSES)
    assert all(v >= 0 for v in total.values())
    assert math.isclose(sum(total.values()), length, rel_tol=1e-9, abs_tol=1e-6)
    assert all(a.end == b.start for a, b in itertools.pairwise(segs))  # no gap, no overlap
    assert all(a.cause != b.cause for a, b in itertools.pairwise(segs))  # merged


@given(intervals)
def test_overlapping_intervals_are_counted_once_by_priority(ivs):
    # integer-second edges only: then a 1 s sampling is exact
    ivs = [Interval(iv.cause, T0 + round(iv.start - T0), T0 + round(iv.end - T0)) for iv in ivs]
    got = goodput.totals(goodput.spans(T0, T0 + 1000.0, ivs))
    want = _brute(T0, T0 + 1000.0, ivs, 1.0)
    for cause in goodput.CAUSES:
        assert math.isclose(got[cause], want[cause], abs_tol=1e-6), cause


def test_an_interval_counted_twice_is_still_its_length_once():
    ivs = [Interval("productive", T0, T0 + 10), Interval("productive", T0 + 5, T0 + 15)]
    assert goodput.totals(goodput.spans(T0, T0 + 20, ivs))["productive"] == 15


def test_a_higher_cause_takes_the_time_it_shares_with_a_lower_one():
    ivs = [Interval("productive", T0, T0 + 100), Interval("checkpoint", T0 + 10, T0 + 12)]
    total = goodput.totals(goodput.spans(T0, T0 + 100, ivs))
    assert (total["productive"], total["checkpoint"]) == (98, 2)


def test_a_bucketed_timeline_keeps_each_columns_main_cause():
    segs = goodput.spans(T0, T0 + 10, [Interval("startup", T0, T0 + 2),
                                       Interval("productive", T0 + 2, T0 + 10)])
    assert goodput.bucketed(segs, T0, T0 + 10, 5) == ["startup"] + ["productive"] * 4
    assert len(goodput.bounded(segs * 3000, T0, T0 + 10, limit=16)) <= 16


# --- hostile and damaged event lines ------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12)


@given(st.binary(max_size=300))
def test_any_bytes_parse_as_an_event_or_as_damaged_never_an_error(data):
    ev = goodput.parse_line(data)
    assert ev is None or (isinstance(ev["event"], str) and
                          goodput.TIME_RANGE[0] <= ev["_at"] <= goodput.TIME_RANGE[1])


def test_a_line_past_the_limit_is_damaged_unparsed():
    line = json.dumps({"event": "step", "step": 1, "_at": T0, "pad": "x" * goodput.MAX_LINE_CHARS})
    assert goodput.parse_line(line) is None
    assert goodput.parse_line("[" * 100_000 + "]" * 100_000) is None  # deeper than the parser


kinds = st.sampled_from([*sorted(goodput.KINDS), "error", "warning"])
field_names = st.sampled_from(["step", "seconds", "blocked_s", "ckpt_s", "first_step_at",
                               "pg_ready_at", "resumed_at", "tok_s", "steps", "reason", "x"])
events = st.lists(st.builds(
    lambda kind, at, fields: {"event": kind, "_at": T0 + at, **fields}, kinds,
    st.floats(min_value=-100, max_value=2000, allow_nan=False),
    st.dictionaries(field_names, json_values, max_size=5)), max_size=30)
states = st.sampled_from(["RUNNING", "FAILED", "SUCCEEDED", "CANCELLED", "LOST", "QUEUED"])
maybe_time = st.none() | st.floats(min_value=-100, max_value=2000, allow_nan=False).map(
    lambda x: T0 + x)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(events, states, maybe_time, maybe_time, maybe_time), min_size=1,
                max_size=3), st.none() | st.floats(min_value=0, max_value=1e6))
def test_a_ledger_of_hostile_events_still_partitions_the_wall_time(jobs, expect):
    facts = []
    for i, (evs, state, created, started, ended) in enumerate(jobs):
        evs = [e for e in (goodput.parse_line(json.dumps(e, allow_nan=True)) for e in evs) if e]
        facts.append(goodput.JobFacts(f"j{i}", created, started, ended, state, evs, 0))
    doc = goodput.ledger(facts, now=T0 + 2500.0, expect_tok_s=expect)
    assert doc["wall_s"] >= 0
    assert all(v >= 0 for v in doc["causes"].values())
    assert math.isclose(sum(doc["causes"].values()), doc["wall_s"], abs_tol=0.01)
    assert doc["goodput"] is None or 0 <= doc["goodput"] <= 1
    assert all(a["lost_steps"] >= 0 and a["surviving_steps"] >= 0 for a in doc["attempts"])
    assert all(v >= 0 for a in doc["attempts"] for v in a["causes"].values())
    assert doc["slow_s"] >= 0 and doc["slow_shortfall_s"] >= 0
    assert doc["effective_tok_s"] is None or doc["effective_tok_s"] >= 0
    json.dumps(doc, allow_nan=False)  # strict JSON: nothing infinite or NaN


def test_no_jobs_is_an_empty_ledger():
    doc = goodput.ledger([], now=T0)
    assert doc["wall_s"] == 0 and doc["goodput"] is None


def _job(evs: list[dict[str, t.Any]], state: str = "SUCCEEDED", ended: float | None = None,
         created: float = T0) -> goodput.JobFacts:
    return goodput.JobFacts("j", created, None, ended, state, evs)


def test_a_run_without_a_startup_event_says_its_start_up_is_not_split():
    evs = [{"event": "step", "step": 10, "_at": T0 + 30}, {"event": "step", "step": 20, "_at": T0 + 40},
           {"event": "done", "step": 20, "_at": T0 + 41}]
    doc = goodput.ledger([_job(evs, ended=T0 + 41)], now=T0 + 100)
    assert doc["causes"]["unknown"] == 30  # no recorded start: before the first event
    assert any("no startup event" in u for u in doc["unknown"])


def test_a_checkpoint_without_a_duration_is_said_not_guessed():
    evs = [{"event": "startup", "first_step_at": 5.0, "_at": T0 + 5},
           {"event": "checkpoint", "step": 10, "_at": T0 + 15},
           {"event": "step", "step": 20, "_at": T0 + 25}, {"event": "done", "step": 20, "_at": T0 + 25}]
    doc = goodput.ledger([_job(evs, ended=T0 + 25)], now=T0 + 100)
    assert doc["causes"]["checkpoint"] == 0
    assert any("no duration" in u for u in doc["unknown"])


def test_a_live_attempt_counts_its_steps_in_flight_as_productive_and_its_start_up_to_now():
    evs = [{"event": "startup", "first_step_at": 10.0, "_at": T0 + 10},
           {"event": "step", "step": 10, "_at": T0 + 20}]
    doc = goodput.ledger([goodput.JobFacts("j", T0, T0, None, "RUNNING", evs)], now=T0 + 50)
    assert doc["ended_at"] is None and doc["wall_s"] == 50
    assert (doc["causes"]["startup"], doc["causes"]["productive"]) == (10, 40)
    starting = goodput.JobFacts("j", T0, T0, None, "SETTING_UP",
                                [{"event": "phase", "phase": "loading", "_at": T0 + 1}])
    assert goodput.ledger([starting], now=T0 + 30)["causes"]["startup"] == 30


# --- records a job's code or a hand could have written --------------------------------------

#: times an events.jsonl line can carry that parse (``TIME_RANGE``): 1970, the year ~5000,
#: a year ahead, before the run, within it
wild_times = st.sampled_from([0.0, 1.0, goodput.TIME_RANGE[1], T0 + 365 * 86400.0, T0 - 3600.0]) \
    | st.floats(min_value=T0 - 10, max_value=T0 + 200, allow_nan=False)
wild_events = st.lists(st.builds(
    lambda kind, at, fields: {"event": kind, "_at": at, **fields}, kinds, wild_times,
    st.dictionaries(field_names | st.just("attempt"), json_values | st.integers(0, 10**6)
                    | st.just(7 * 86400.0), max_size=5)), max_size=30)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(wild_events, st.sampled_from(["FAILED", "SUCCEEDED", "CANCELLED"]),
                          st.floats(min_value=0, max_value=50), st.floats(min_value=60, max_value=150)),
                min_size=1, max_size=3))
def test_no_event_moves_the_wall_time_past_the_jobs_own_life(jobs):
    """Whatever a finished run's files say, its wall time is within its jobs' creation and
    end (``status.json``): a stray time is damaged, never hours or centuries of some cause."""
    facts = []
    for i, (evs, state, created, ended) in enumerate(jobs):
        evs = [e for e in (goodput.parse_line(json.dumps(e)) for e in evs) if e]
        facts.append(goodput.JobFacts(f"j{i}", T0 + created, T0 + created, T0 + ended, state,
                                      evs, 0))
    doc = goodput.ledger(facts, now=T0 + 10_000.0)
    span = max(j.ended_at for j in facts) - min(j.created_at for j in facts)
    assert doc["wall_s"] <= span + 2 * goodput.CLOCK_SLACK_S + goodput.BACKOFF_MAX_S
    assert math.isclose(sum(doc["causes"].values()), doc["wall_s"], abs_tol=0.01)
    assert doc["started_at"] >= min(j.created_at for j in facts) - goodput.CLOCK_SLACK_S


def _attempts(n: int) -> list[dict[str, t.Any]]:
    evs: list[dict[str, t.Any]] = [{"event": "startup", "first_step_at": 1.0, "_at": T0 + 1}]
    for k in range(2, n + 1):
        evs.append({"event": "restart", "attempt": k, "reason": "exit 1", "_at": T0 + k * 0.01})
    return evs


def test_thousands_of_restart_events_are_a_ledger_with_bounded_rows_not_a_crash():
    # 2.0 ** 1024 overflowed the backoff of attempt 1026
    doc = goodput.ledger([goodput.JobFacts("j", T0, T0, T0 + 100, "FAILED", _attempts(3000))],
                         now=T0 + 200)
    assert doc["restarts"] == 2999 and len(doc["attempts"]) == goodput.MAX_ATTEMPT_ROWS
    assert doc["attempts"][-1]["attempt"] == 3000
    assert any("only the newest 1024 of the run's 3000 attempts" in u for u in doc["unknown"])
    assert math.isclose(sum(doc["causes"].values()), doc["wall_s"], abs_tol=0.01)


def test_a_restart_event_that_starts_no_new_attempt_is_skipped_and_said():
    """A job that prints ``{"event": "restart"}`` itself, or a line copied twice: the
    wrapper's own restart events number the attempts upwards."""
    evs = [{"event": "startup", "first_step_at": 2.0, "_at": T0 + 2},
           {"event": "step", "step": 10, "_at": T0 + 10},
           {"event": "restart", "_at": T0 + 11},  # the job's own line: no attempt number
           {"event": "step", "step": 20, "_at": T0 + 20},
           {"event": "restart", "attempt": 2, "reason": "exit 1", "_at": T0 + 30},
           {"event": "restart", "attempt": 2, "reason": "exit 1", "_at": T0 + 30},  # a copy
           {"event": "startup", "first_step_at": 2.0, "_at": T0 + 34},
           {"event": "done", "step": 20, "_at": T0 + 40}]
    doc = goodput.ledger([goodput.JobFacts("j", T0, T0, T0 + 40, "SUCCEEDED", evs)], now=T0 + 50)
    assert doc["restarts"] == 1 and doc["crashes"] == 1 and len(doc["attempts"]) == 2
    assert any("2 restart event(s) that start no new attempt" in u for u in doc["unknown"])


def test_events_stamped_outside_their_jobs_life_are_damaged_never_counted():
    evs = [{"event": "startup", "first_step_at": 2.0, "_at": T0 + 2},
           {"event": "step", "step": 10, "_at": T0 + 50},
           {"event": "restart", "attempt": 2, "_at": 9.9e10},  # the year ~5100
           {"event": "restart", "attempt": 3, "_at": 0.0},  # 1970
           {"event": "done", "step": 10, "_at": T0 + 60}]
    doc = goodput.ledger([goodput.JobFacts("j", T0, T0, T0 + 60, "SUCCEEDED", evs)], now=T0 + 99)
    assert doc["wall_s"] == 60 and doc["restarts"] == 0 and doc["damaged_lines"] == 2
    assert any("outside the job's life" in u for u in doc["unknown"])
    live = goodput.JobFacts("j", T0, T0, None, "RUNNING",
                            [*evs[:2], {"event": "step", "step": 99, "_at": T0 + 3600}])
    doc = goodput.ledger([live], now=T0 + 100)  # a step an hour ahead of now
    assert doc["last_step"] == 10 and doc["damaged_lines"] == 1


def test_a_file_whose_times_go_backwards_is_damaged_not_counted_again():
    evs = [{"event": "startup", "first_step_at": 2.0, "_at": T0 + 2},
           {"event": "step", "step": 10, "_at": T0 + 20},
           {"event": "restart", "attempt": 2, "reason": "exit 1", "_at": T0 + 25},
           {"event": "startup", "first_step_at": 2.0, "_at": T0 + 28},
           {"event": "step", "step": 20, "_at": T0 + 40},
           {"event": "done", "step": 20, "_at": T0 + 41}]
    once = goodput.ledger([goodput.JobFacts("j", T0, T0, T0 + 41, "SUCCEEDED", evs)], now=T0 + 50)
    twice = goodput.ledger([goodput.JobFacts("j", T0, T0, T0 + 41, "SUCCEEDED", evs + evs)],
                           now=T0 + 50)  # the file appended to itself
    assert twice["causes"] == once["causes"] and twice["restarts"] == once["restarts"] == 1
    assert twice["damaged_lines"] > 0
    assert any("behind an earlier line" in u for u in twice["unknown"])


def test_a_young_runs_brief_rounded_to_the_millisecond_still_adds_up():
    """Productive 100.49 ms of 249.51 ms is goodput 0.4028; rounded to the millisecond on the
    wire they read 0.100 of 0.250 (0.4): the rounding, not a lie, so the brief is kept."""
    from opsctl.remote.agent_client import goodput_problem

    exact_p, exact_w = 0.10049, 0.24951
    causes = {c: 0.0 for c in t.get_args(GoodputCause)}
    causes.update(productive=round(exact_p, 3), startup=round(exact_w - exact_p, 3))
    brief = {"wall_s": round(exact_w, 3), "causes": causes, "goodput": round(exact_p / exact_w, 4)}
    assert goodput_problem(brief, whole=False) is None
    assert goodput_problem({**brief, "goodput": 0.9}, whole=False) is not None
