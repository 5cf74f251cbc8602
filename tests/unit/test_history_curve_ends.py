"""Where a job's curves end, and the history's step table.

A sparkline ends at the value the text beside it prints, with the precision it prints it
(the metrics line's loss, the GPU table's utilisation); a chart ends at the job's newest
sample, never at the mean of its last bucket; a short job is drawn from its step events;
any job can be drawn by step. The history that feeds them stays bounded whatever the
trainer logs. Pure logic: the agent's history module and the CLI's drawing, no remote.
"""

from __future__ import annotations

import io
import json
import math
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from opsctl.cli import dashboard, plots, render
from opsctl.errors import ConfigError, ReplyShapeError
from opsctl.remote import shapes
from remote_payload import wire_shapes
from remote_payload.agent import history as agent_history
from remote_payload.wire_shapes import HistoryDoc
from tests.cli_runner import run_cli
from tests.replies import status_doc

T0 = 1_764_500_000.0
#: the bundled CPU smoke job's shape: 40 steps, a step event every 5, within a few seconds
SMOKE_LOSSES = [6.9412, 6.5203, 6.2281, 6.0105, 5.8370, 5.6622, 5.5159, 5.4057]


def smoke_history() -> agent_history.History:
    """The smoke job as the wrapper records it: 8 step events 0.3 s apart (two 2 s buckets)."""
    h = agent_history.History()
    agent_history.feed_event(h, {"event": "phase", "phase": "training"}, T0)
    for i, loss in enumerate(SMOKE_LOSSES):
        agent_history.feed_event(h, {"event": "step", "step": 5 * (i + 1), "loss": loss,
                                     "tok_s": 1800.0 + i}, T0 + 0.3 * i)
    return h


def status_history(h: agent_history.History) -> HistoryDoc:
    """``h`` as a status reply carries it, through the CLI's validation."""
    doc = agent_history.reduce(h.columns(), agent_history.STATUS_POINTS, agent_history.STATUS_FIELDS)
    return shapes.validate(HistoryDoc, doc, where="test")


def printed(fn: object, *args: object) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=200, color_system=None)
    fn(con, *args)  # type: ignore[operator]
    return buf.getvalue()


class TestSparklinesEndAtTheText:
    def test_the_loss_sparkline_ends_at_the_metrics_lines_loss_with_its_digits(self):
        h = agent_history.History()
        for i, loss in enumerate([13.52, 13.50, 13.4709, 13.4091]):  # one 2 s bucket: mean 13.48
            h.add(T0 + 0.2 * i, {"loss": loss, "tok_s": 1000.0})
        hist = status_history(h)
        assert hist["loss"][-1] != 13.4091  # the bucket holds their mean
        last = {"event": "step", "step": 4, "loss": 13.4091, "tok_s": 1000.0, "_at": T0 + 0.6}
        st_doc = status_doc(history=hist, last_step=last)
        text = printed(render.status, "pve1/200", st_doc)
        metrics = next(x for x in text.splitlines() if x.startswith("metrics:"))
        spark = next(x for x in text.splitlines() if x.strip().startswith("loss"))
        assert "loss 13.4091" in metrics
        assert re.search(r" 13\.4091 ", spark), spark

    def test_a_status_newer_than_the_history_file_ends_the_line_at_the_status_values(self):
        h = agent_history.History()
        for i in range(30):
            h.add(T0 + 2 * i, {"loss": 3.0 - 0.01 * i})
            h.add(T0 + 2 * i, {"gpu_util": 0.0 if i > 25 else 90.0})
        hist = status_history(h)  # the file is a few seconds old: the GPU rows end at 0 %
        gpus = [{"index": 0, "name": "NVIDIA H200", "util_pct": 100.0, "mem_used_mib": 80_000.0,
                 "mem_total_mib": 143_771.0, "temp_c": 60.0, "power_w": 650.0}]
        last = {"event": "step", "step": 31, "loss": 2.6543, "_at": T0 + 62}
        st_doc = status_doc(history=hist, last_step=last, gpus=gpus, alive=True, now=T0 + 63)
        rows = {r.label: r for r in plots.sparkline_rows(hist, 48, latest=plots.status_latest(st_doc))}
        assert rows["GPU util %"].last == "100" and rows["GPU util %"].spark[-1] == "█"
        assert rows["loss"].last == "2.6543" and rows["loss"].spark[-1] == "▁"
        text = printed(render.sparklines, st_doc)
        gpu_line = next(x for x in text.splitlines() if "GPU util" in x)
        assert re.search(r"█ 100  \(", gpu_line), gpu_line

    def test_a_finished_jobs_gpu_line_ends_with_its_history_not_the_gpus_now(self):
        h = agent_history.History()
        h.add(T0, {"gpu_util": 90.0})
        h.add(T0 + 2, {"gpu_util": 80.0})
        gpus = [{"index": 0, "name": "g", "util_pct": 0.0, "mem_used_mib": 0.0,
                 "mem_total_mib": 1.0, "temp_c": None, "power_w": None}]
        st_doc = status_doc(history=status_history(h), gpus=gpus, alive=False, state="SUCCEEDED")
        (row,) = plots.sparkline_rows(st_doc["history"], 48, latest=plots.status_latest(st_doc))
        assert row.last == "80"

    @pytest.mark.parametrize("width", [1, 2, 7, 40, 48])
    def test_the_last_cell_is_the_last_value_not_a_mean_with_the_ones_before(self, width):
        values = [10.0] * 299 + [0.0]
        line = plots.sparkline(values, width)
        assert len(line) == width and line[-1] == plots.BLOCKS[0]
        assert set(line[:-1]) <= {plots.BLOCKS[-1]}

    def test_a_sparkline_of_few_values_has_a_cell_each(self):
        assert plots.sparkline([1.0, 2.0, 3.0], 48) == "▁▅█"

    def test_the_mark_line_is_as_wide_as_the_sparkline_above_it(self):
        h = smoke_history()
        h.mark(T0 + 3, "end", "SUCCEEDED")
        hist = status_history(h)
        text = printed(render.sparklines, status_doc(history=hist))
        lines = text.splitlines()
        spark = next(x for x in lines if x.strip().startswith("loss"))
        marks = next(x for x in lines if x.strip() == "X")
        assert marks.rstrip().endswith("X")
        assert len(marks.rstrip()) <= len(spark.split(" 5.4057")[0])


class TestChartsEndAtTheNewestSample:
    def test_a_short_job_is_drawn_from_its_step_events_and_ends_at_its_final_loss(self):
        hist = status_history(smoke_history())
        assert len(hist["t"]) <= 2  # the time buckets hold means of several events
        (loss,) = plots.series(hist, ("loss",))
        assert loss.values == SMOKE_LOSSES  # the events themselves, each at its time
        assert loss.t == [pytest.approx(T0 + 0.3 * i) for i in range(8)]
        (row,) = plots.sparkline_rows(hist, metrics=("loss",))
        assert row.last == "5.4057" and row.high == "6.9412"

    def test_by_step_the_x_axis_is_the_step(self):
        hist = status_history(smoke_history())
        (loss,) = plots.series(hist, ("loss",), by="step")
        assert loss.t == [5.0 * (i + 1) for i in range(8)] and loss.values[-1] == 5.4057
        chart = plots.terminal_charts(hist, ("loss", "tok_s"), by="step", color=False, width=80)
        assert "step" in chart and "minutes since start" not in chart

    def test_by_step_the_marks_sit_at_the_step_the_job_was_at(self):
        h = smoke_history()
        h.mark(T0 + 1.0, "compile", "recompile")  # after the 4th event (0.9 s), step 20
        h.mark(T0 - 5.0, "restart", "first")  # before any step: at the first one
        hist = status_history(h)
        assert [x for _, x in plots.mark_steps(hist)] == [20.0, 5.0]

    def test_a_long_job_ends_at_its_newest_sample_not_its_last_buckets_mean(self):
        h = agent_history.History()
        for i in range(5000):
            h.add(T0 + i, {"loss": 10.0 - i * 0.001, "gpu_util": 50.0})
        h.add(T0 + 5000, {"loss": 1.23456789})
        hist = status_history(h)
        (loss,) = plots.series(hist, ("loss",))
        assert loss.values[-1] == 1.23456789 and loss.t[-1] == T0 + 5000
        svg = plots.svg_chart(loss, [])
        assert "loss 1.2346 " in svg

    def test_the_dashboard_chart_ends_at_the_metrics_lines_loss(self):
        h = agent_history.History()
        for i, loss in enumerate([13.52, 13.50, 13.4709]):
            h.add(T0 + 0.2 * i, {"loss": loss})
        st_doc = status_doc(history=status_history(h), last_step={
            "event": "step", "step": 4, "loss": 13.4091, "_at": T0 + 0.8})
        snap = dashboard.Snapshot([dashboard.HostView("pve1", "root@pve1", [
            dashboard.ContainerView("pve1", 120, st_doc)])], time.time(), 0.1)
        page = dashboard.render_page(snap, 3.0)
        assert "loss 13.4091 (min 13.4091" in page

    def test_gpu_utilisation_cannot_be_plotted_by_step(self):
        with pytest.raises(ConfigError, match="no step"):
            plots.check_axis("step", ("gpu_util",))
        plots.check_axis("step", ("loss", "gpu_util"))  # loss is drawn, gpu_util left out
        with pytest.raises(ConfigError, match="no data to plot yet for these metrics by step"):
            plots.terminal_charts({"t": [T0], "gpu_util": [50.0]}, ("gpu_util", "loss"), by="step")

    def test_plot_refuses_gpu_util_by_step_before_connecting(self):
        res = run_cli("plot", "--host", "127.0.0.1:1", "--ct", "200", "--by", "step",
                      "--metric", "gpu_util")  # port 1: nothing is contacted
        assert res.exit_code == ConfigError.exit_code
        assert "gpu_util has no step" in res.output and "--by time" in res.output


class TestStepTable:
    def test_the_history_keeps_every_step_event_of_a_short_job_and_its_last_sample(self):
        cols = smoke_history().columns()
        assert cols["steps"]["step"] == [5, 10, 15, 20, 25, 30, 35, 40]
        assert cols["steps"]["loss"] == SMOKE_LOSSES and cols["steps"]["width"] == 1
        assert cols["last"]["loss"] == {"t": T0 + 0.3 * 7, "v": 5.4057, "step": 40}

    def test_a_restart_from_an_earlier_step_lands_in_that_steps_row(self):
        h = agent_history.History()
        for n, step in enumerate([1, 2, 3, 4, 2, 3, 4, 5]):
            agent_history.feed_event(h, {"event": "step", "step": step, "loss": float(n)}, T0 + n)
        steps = h.columns()["steps"]
        assert steps["step"] == [1, 2, 3, 4, 5]
        assert steps["loss"] == [0.0, 2.5, 3.5, 4.5, 7.0]  # the two runs' mean at 2, 3, 4
        assert h.columns()["last"]["loss"]["step"] == 5

    @pytest.mark.parametrize("step", [-1, 2**53 + 1, 1.5, 3.0, True, "7", None, float("nan"),
                                      10**400])
    def test_a_step_that_is_no_step_counts_by_time_only(self, step):
        h = agent_history.History()
        agent_history.feed_event(h, {"event": "step", "step": step, "loss": 2.0}, T0)
        cols = h.columns()
        assert cols["loss"] == [2.0] and "steps" not in cols
        assert "step" not in cols["last"]["loss"]

    def test_the_row_cap_is_the_wire_shapes_bound(self):
        assert agent_history.CAP == wire_shapes.HISTORY_ROWS_MAX
        assert agent_history.STEP_MAX == 2**53

    def test_a_reply_with_more_step_rows_than_the_bound_is_refused(self):
        rows = wire_shapes.HISTORY_ROWS_MAX + 1
        doc = {"t": [T0], "steps": {"width": 1, "step": list(range(rows)), "t": [T0] * rows}}
        with pytest.raises(ReplyShapeError, match=r"(?i)at most 512"):
            shapes.validate(HistoryDoc, doc, where="test")

    def test_since_keeps_the_step_rows_of_the_last_seconds(self):
        cols = smoke_history().columns()
        out = agent_history.reduce(cols, 512, since=T0 + 1.0)  # step 25 came at T0 + 1.2
        assert out["steps"]["step"] == [25, 30, 35, 40]
        assert out["last"]["loss"]["v"] == 5.4057


# --- any stream of step events a trainer may log -------------------------------------------

_STEP = st.one_of(st.integers(min_value=-10, max_value=60), st.integers(min_value=2**53 - 2,
                                                                          max_value=2**53 + 2),
                  st.just(10**400), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                  st.none(), st.text(max_size=3))
_LOSS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                  st.sampled_from([1e308, -1e308, 5e-324, 0.0]), st.integers(-10**30, 10**30),
                  st.none(), st.just("0.5"))
_EVENTS = st.lists(st.tuples(st.floats(min_value=0, max_value=1e6), _STEP, _LOSS), max_size=80)


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_EVENTS, cap=st.integers(min_value=2, max_value=9), ordered=st.booleans())
def test_any_step_stream_keeps_its_newest_loss_and_bounded_rows(events, cap, ordered):
    h = agent_history.History(cap=cap)
    if ordered:
        events = sorted(events, key=lambda e: e[0])
    newest: tuple[float, float, int | None] | None = None
    for at, step, loss in events:
        agent_history.feed_event(h, {"event": "step", "step": step, "loss": loss}, T0 + at)
        try:
            value = float(loss) if _finite(loss) else None  # type: ignore[arg-type]
        except OverflowError:
            value = None
        if value is not None and math.isfinite(value) and (newest is None or T0 + at >= newest[0]):
            newest = (T0 + at, value, agent_history.step_of({"step": step}))
    cols = h.columns()
    assert len(cols["t"]) <= cap and len(h.step_starts) <= cap
    assert h.step_starts == sorted(set(h.step_starts))
    if newest is None:
        assert "loss" not in cols["last"]
    else:
        point = cols["last"]["loss"]
        assert (point["t"], point["v"], point.get("step")) == newest
    json.dumps(cols, allow_nan=False)  # the file and the reply are strict JSON
    for points in (agent_history.STATUS_POINTS, 3):
        hist = shapes.validate(HistoryDoc, agent_history.reduce(cols, points), where="test")
        for s in plots.series(hist, ("loss",), by="time") + plots.series(hist, ("loss",), by="step"):
            assert len(s.t) == len(s.v) <= min(points, cap) + 1
        if newest is not None:
            (by_time,) = plots.series(hist, ("loss",))
            assert by_time.values[-1] == plots.limits.clamp(newest[1], 0.0, 1e9)


_LINE = st.one_of(
    st.builds(lambda step, loss, at: json.dumps({"event": "step", "step": step, "loss": loss,
                                                 "_at": at}),
              _STEP.filter(lambda s: not (isinstance(s, int) and abs(s) > 2**64)),
              st.floats(allow_nan=True, allow_infinity=True),
              st.one_of(st.floats(min_value=0, max_value=2e9), st.just(float("nan")))),
    st.sampled_from(['{"event": "step", "step": 1e400, "loss": 1, "_at": 1.0}',
                     '{"event": "step", "step": -5, "loss": NaN, "_at": 2.0}',
                     '{"event": "step", "step": 99999999999999999999999999, "loss": 1, "_at": 3}',
                     '{"event": "step", "step": 3, "loss": Infinity, "_at": 1e400}',
                     '{"event": "step", "step": [1], "loss": {"a": 1}, "_at": "now"}',
                     "not json", "", "\x00\xff", '{"event": "step"']),
    st.text(max_size=40),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_LINE, max_size=40), long_line=st.booleans())
def test_any_events_file_replays_into_a_bounded_valid_history(tmp_path, lines, long_line):
    path = tmp_path / "events.jsonl"
    body = "\n".join(lines)
    if long_line:  # past the replay's line bound: cut, so it does not parse
        body += "\n" + json.dumps({"event": "step", "step": 1, "loss": 1.0, "_at": 5.0,
                                   "pad": "x" * agent_history.MAX_EVENT_LINE_BYTES})
    path.write_text(body, encoding="utf-8", errors="surrogateescape")
    h = agent_history.from_events(str(path), cap=8)
    cols = h.columns()
    assert len(cols["t"]) <= 8 and len(h.step_starts) <= 8
    assert all(0 <= s <= agent_history.STEP_MAX for s in h.step_starts)
    json.dumps(cols, allow_nan=False)
    hist = agent_history.reduce(cols, 120)
    if all(abs(x) <= wire_shapes.SECONDS_MAX for x in hist["t"]):  # an absurd _at is the
        shapes.validate(HistoryDoc, hist, where="test")  # reply's damage, refused by its shape
