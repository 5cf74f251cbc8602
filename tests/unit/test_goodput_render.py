"""How ``opsctl goodput`` and ``opsctl status`` show a run's ledger: the status line, the
terminal timeline and the PNG, from replies that may hold anything the shape allows."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.cli import plots, render
from opsctl.errors import ConfigError

T0 = 1_790_000_000.0


def brief(**fields: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "run_id": "r", "wall_s": 41 * 3600 + 12 * 60, "goodput": 0.931,
        "causes": {"productive": 0.931, "lost": 0.011 * 148320, "stall": 0.010 * 148320,
                   "checkpoint": 0.004 * 148320, "startup": 0.010 * 148320},
        "crashes": 2, "hangs": 0, "restarts": 2, "redeploys": 0, "effective_tok_s": 1.0,
        "eta_s": None}
    doc.update(fields)
    return doc


def test_the_status_line_says_goodput_lost_checkpoints_and_start_up_shares():
    line = render.goodput_line(brief())
    assert line is not None
    assert line.plain == ("goodput 93.1 % of 1d17h12m · lost 2.1 % (2 crashes) · "
                          "checkpoints 0.4 % · start-up 1.0 %")


def test_the_status_line_names_hangs_and_unknown_time_and_is_absent_without_a_ledger():
    line = render.goodput_line(brief(crashes=0, hangs=1, causes={"unknown": 1484.0}))
    assert line is not None and "(1 hang)" in line.plain and "unknown 1.0 %" in line.plain
    assert render.goodput_line(None) is None
    eta = render.goodput_line(brief(eta_s=7200.0))
    assert eta is not None and eta.plain.endswith("· ETA 2h00m00s at the effective rate")
    assert render.goodput_line(brief(wall_s=0)) is None


segment = st.lists(st.one_of(st.text(max_size=12), st.floats(), st.integers(), st.none()),
                   max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(segment, max_size=30), st.integers(min_value=1, max_value=200))
def test_a_hostile_timeline_draws_as_cells_of_known_causes_never_an_error(timeline, width):
    cells = render.goodput_cells(timeline, T0, T0 + 100.0, width)
    assert len(cells) == width
    text = render.goodput_timeline({"started_at": T0, "wall_s": 100.0, "timeline": timeline},
                                   width)
    assert len(text.plain) == width


def test_infinite_and_nan_segment_times_are_clipped_or_skipped():
    timeline = [["stall", -math.inf, math.inf], ["lost", math.nan, T0 + 5], ["x", "a", "b"]]
    assert render.goodput_cells(timeline, T0, T0 + 10, 2) == ["stall", "stall"]


def test_the_timeline_shows_each_slice_as_its_main_cause():
    timeline = [["startup", T0, T0 + 20], ["productive", T0 + 20, T0 + 100]]
    assert render.goodput_cells(timeline, T0, T0 + 100, 5) == ["startup", *["productive"] * 4]


def test_the_png_is_written_and_a_ledger_without_time_is_a_config_error(tmp_path):
    pytest.importorskip("matplotlib")
    doc = {"timeline": [["startup", T0, T0 + 20], ["productive", T0 + 20, T0 + 100],
                        ["lost", math.nan, T0], ["nonsense", T0, T0 + 1], ["stall", 1e300, 2e300]],
           "causes": {"productive": 80.0, "startup": 20.0, "lost": math.inf},
           "attempts": [{"start": T0}, {"start": "soon"}]}
    out = tmp_path / "g.png"
    plots.write_goodput_png(doc, str(out), title="run r")
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ConfigError):
        plots.write_goodput_png({"timeline": [["stall", math.nan, math.inf]]}, str(out))


def test_the_dashboard_shows_the_runs_goodput_line():
    from opsctl.cli import dashboard
    from tests.replies import status_doc

    st = status_doc(job_id="j-1", state="RUNNING", goodput=brief())
    snap = dashboard.Snapshot([dashboard.HostView("h", "h", [
        dashboard.ContainerView("h", 200, status=st)])], T0, 0.1)
    page = dashboard.render_page(snap, 3.0)
    assert '<div class="goodput">goodput 93.1 % of 1d17h12m · lost 2.1 % (2 crashes)' in page


def test_the_report_shows_causes_attempts_start_up_phases_and_notes():
    import io

    from rich.console import Console

    doc = {"run_id": "r-1", "jobs": ["j-1"], "out_dir": "/runs/x", "ended_at": T0 + 100,
           "started_at": T0, "wall_s": 100.0, "goodput": 0.8, "crashes": 1, "hangs": 0,
           "causes": {"productive": 80.0, "startup": 15.0, "stall": 5.0},
           "effective_tok_s": 900.0, "surviving_steps": 40, "target_steps": 50, "eta_s": 25.0,
           "expect_tok_s": None, "timeline": [["startup", T0, T0 + 15],
                                              ["productive", T0 + 15, T0 + 95],
                                              ["stall", T0 + 95, T0 + 100]],
           "attempts": [{"job_id": "j-1", "attempt": 1, "ended": "failed", "start_step": 0,
                         "last_step": 40, "lost_steps": 0,
                         "startup": [{"phase": "pg_ready", "seconds": 1.0},
                                     {"phase": "first_step", "seconds": 14.0}],
                         "causes": {"startup": 15.0, "productive": 80.0, "stall": 5.0}}],
           "unknown": ["job j-1: 2 damaged events.jsonl line(s) skipped\x1b[2J"]}
    out = io.StringIO()
    render.goodput_report(Console(file=out, width=120), "pve1 ct 200", doc, width=50)
    text = out.getvalue()
    assert "goodput 80.0 % of 1m40s · lost 5.0 % (1 crash)" in text
    assert "start-up of j-1 attempt 1: pg_ready 1.0s · first_step 14.0s" in text
    assert "s" * 7 + "█" * 40 in text and text.count("!") >= 2
    assert "\x1b[2J" not in text and "note: job j-1: 2 damaged" in text  # remote text inert
