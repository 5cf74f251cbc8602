"""A job's history as pictures: the agent's bounded history, sparklines, charts.

Pure logic on a recorded ``events.jsonl`` (tests/fixtures/history: a shortened 2×H200 split-layout
run with the 20 → 4.6 Ktok/s drop, an NCCL timeout, a resume and its recompile) and on
synthetic week-long streams; no remote, no mocks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from opsctl.cli import dashboard, plots
from opsctl.errors import ConfigError
from opsctl.ops.watch import parse_status
from opsctl.remote import shapes
from remote_payload.agent import history as agent_history
from remote_payload.wire_shapes import HistoryDoc, StatusDoc
from tests.paths import FIXTURES, REPO
from tests.replies import status_doc
from tests.waiting import wait_for_value

FIXTURE = FIXTURES / "history" / "events.jsonl"
WEEK_S = 7 * 86400


@pytest.fixture(scope="module")
def recorded() -> HistoryDoc:
    """The fixture's history as a status reply carries it."""
    cols = agent_history.from_events(str(FIXTURE)).columns()
    return shapes.validate(HistoryDoc, agent_history.reduce(cols, agent_history.STATUS_POINTS),
                           where="test")


class TestRecordedRun:
    def test_every_step_event_becomes_one_row_with_its_metrics(self):
        h = agent_history.from_events(str(FIXTURE))
        cols = h.columns()
        steps = [json.loads(x) for x in FIXTURE.read_text().splitlines()
                 if json.loads(x)["event"] == "step"]
        assert len(cols["t"]) == len(steps) == 40
        assert cols["loss"][0] == pytest.approx(steps[0]["loss"], rel=1e-3)
        assert cols["tok_s"][-1] == pytest.approx(steps[-1]["tok_s"], rel=1e-3)
        for key in ("mfu", "mem_gib", "feature_wait_pct"):
            assert len(cols[key]) == 40

    def test_recompiles_restart_and_error_are_marked_on_the_time_axis(self, recorded):
        kinds = [m["kind"] for m in recorded["marks"]]
        assert kinds.count("compile") == 5  # phase compiling + 2 buckets, then again after the resume
        assert "restart" in kinds and "error" in kinds
        restart = next(m for m in recorded["marks"] if m["kind"] == "restart")
        assert restart["label"] == "resumed at step 600"
        error = next(m for m in recorded["marks"] if m["kind"] == "error")
        assert error["label"].startswith("NCCLTimeout:")
        assert kinds.index("error") < kinds.index("restart")

    def test_sparklines_show_the_loss_falling_and_the_throughput_drop(self, recorded):
        rows = {r.label: r for r in plots.sparkline_rows(recorded, width=40)}
        assert set(rows) == {"loss", "Ktok/s"}  # no GPU samples were recorded in this file
        loss = rows["loss"].spark
        assert len(loss) == 40 and loss[0] == "█" and loss[-1] == "▁"
        tok = rows["Ktok/s"].spark
        assert tok[:20] == "█" * 20 and tok[-10:] == "▁" * 10  # 20 → 4.6 Ktok/s
        assert rows["Ktok/s"].high.startswith("20.") and rows["Ktok/s"].last.startswith("4.")

    def test_the_mark_line_puts_the_error_before_the_recompile(self, recorded):
        line = plots.mark_line(recorded, 40)
        assert len(line) == 40
        assert line.index("E") < line.rindex("C")
        assert line[0] == "C"  # the first compile happened before the first step

    def test_terminal_chart_has_a_panel_per_metric_and_no_colour_off_a_terminal(self, recorded):
        out = plots.terminal_charts(recorded, ["loss", "tok_s"], width=80, color=False)
        assert "loss" in out and "Ktok/s" in out and "minutes since start" in out
        assert "\x1b" not in out
        assert max(len(line) for line in out.splitlines()) <= 80

    def test_png_has_the_same_charts(self, recorded, tmp_path):
        pytest.importorskip("matplotlib")
        out = tmp_path / "run.png"
        plots.write_png(recorded, ["loss", "tok_s", "mfu"], str(out), title="job x")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert out.stat().st_size > 10_000

    def test_nothing_to_draw_is_an_error_that_says_so(self):
        empty: HistoryDoc = {"t": [1.0], "gpu_util": [50.0]}
        with pytest.raises(ConfigError, match="no data"):
            plots.terminal_charts(empty, ["loss"])


class TestBound:
    def test_a_week_of_samples_stays_a_few_hundred_uniform_rows(self):
        h = agent_history.History()
        t0 = 1_764_500_000.0
        for i in range(WEEK_S // 2):  # the wrapper's 2 s GPU samples
            h.add(t0 + 2 * i, {"gpu_util": 90.0, "gpu_mem_gib": 120.0})
            if i % 5 == 0:  # and a step event every 10 s
                h.add(t0 + 2 * i, {"loss": 2.0, "tok_s": 20000.0})
        assert len(h.starts) <= agent_history.CAP
        assert len(h.starts) >= agent_history.CAP // 2  # the resolution is used, not thrown away
        gaps = {round(b - a) for a, b in zip(h.starts, h.starts[1:], strict=False)}
        assert gaps == {h.bucket_s}  # uniform resolution, old and new alike
        doc = json.dumps(h.columns(), separators=(",", ":"))
        assert len(doc) < 64_000
        status = agent_history.reduce(h.columns(), agent_history.STATUS_POINTS,
                                      agent_history.STATUS_FIELDS)
        assert len(status["t"]) <= agent_history.STATUS_POINTS
        assert len(json.dumps(status)) < 8_000

    def test_merged_rows_keep_the_mean(self):
        h = agent_history.History(cap=4, bucket_s=1.0)
        for i in range(8):
            h.add(float(i), {"loss": float(i)})
        cols = h.columns()
        assert len(cols["t"]) <= 4
        assert sum(cols["loss"]) / len(cols["loss"]) == pytest.approx(3.5)

    def test_marks_are_bounded_and_keep_the_first_ones(self):
        h = agent_history.History()
        for i in range(500):
            h.mark(1000.0 + 10 * i, "compile" if i % 2 else "error", f"m{i}")
        assert len(h.marks) == agent_history.MAX_MARKS
        assert h.marks[0]["label"] == "m0" and h.marks[-1]["label"] == "m499"

    def test_non_numbers_from_the_job_are_ignored(self):
        h = agent_history.History()
        h.add(1.0, {"loss": "nan-ish", "tok_s": True, "mfu": float("inf"), "mem_gib": 10**400})
        h.add(1.0, {"loss": 2.5})
        assert h.columns()["loss"] == [2.5] and "tok_s" not in h.columns()

    def test_since_keeps_only_the_recent_rows_and_marks(self):
        cols = agent_history.from_events(str(FIXTURE)).columns()
        cut = cols["t"][-10]
        out = agent_history.reduce(cols, 500, since=cut)
        assert out["t"][0] >= cut and len(out["t"]) == 10
        assert all(m["t"] >= cut for m in out["marks"])


class TestRecorder:
    def test_wrapper_side_writes_a_file_that_status_reads(self, tmp_path):
        rec = agent_history.Recorder(str(tmp_path))
        now = time.time()
        rec.on_event({"event": "phase", "phase": "compiling"}, now - 30)
        for i in range(5):
            rec.on_event({"event": "step", "step": i, "loss": 3.0 - i * 0.1, "tok_s": 1000.0},
                         now - 20 + 2 * i)
            rec.on_gpus([{"util_pct": 80.0, "mem_used_mib": 2048.0},
                         {"util_pct": 60.0, "mem_used_mib": 1024.0}], now - 20 + 2 * i)
        assert rec.flush(force=True)
        assert not rec.flush()  # nothing changed since
        doc = agent_history.for_status(
            str(tmp_path), [{"severity": "error", "cause": "cuda_oom"}], now)
        assert doc is not None
        hist = shapes.validate(HistoryDoc, doc, where="test")
        assert hist["gpu_util"][0] == pytest.approx(70.0)
        assert [m["kind"] for m in hist["marks"]] == ["compile", "diagnosis"]
        assert not list(tmp_path.glob("*.tmp.*"))

    def test_status_without_a_history_file_has_none(self, tmp_path):
        assert agent_history.for_status(str(tmp_path)) is None

    @pytest.mark.parametrize("content", ["{", '{"t": 3}', '{"t": [1, "x"], "loss": [1, 2]}',
                                         '{"t": [1, 2], "loss": 5, "marks": [1]}'])
    def test_a_damaged_history_file_never_breaks_status(self, tmp_path, content):
        (tmp_path / agent_history.FILE).write_text(content)
        doc = agent_history.for_status(str(tmp_path))
        assert doc is None or isinstance(doc["t"], list)
        st = parse_status({**status_doc(), "history": doc}, where="test")
        assert st.get("history") is None or st["history"]["t"] == [1.0, 2.0]

    def test_the_client_drops_history_it_cannot_parse_and_keeps_the_status(self):
        st = parse_status({**status_doc(), "history": {"t": ["x"], "marks": "no"}}, where="test")
        assert st["state"] == "RUNNING" and st["history"] is None


class TestParsing:
    @pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("30m", 1800.0), ("6h", 21600.0),
                                                   ("1.5d", 129600.0)])
    def test_since_takes_a_duration(self, text, seconds):
        assert plots.parse_since(text) == seconds

    @pytest.mark.parametrize("text", ["", "0h", "-1h", "6 hours", "h"])
    def test_since_refuses_what_is_not_a_duration(self, text):
        with pytest.raises(ConfigError):
            plots.parse_since(text)

    def test_plot_refuses_an_unknown_metric_before_connecting(self):
        from click.testing import CliRunner

        from opsctl.cli import cli

        res = CliRunner().invoke(cli, ["plot", "--host", "127.0.0.1:1", "--ct", "200",
                                       "--metric", "speed"])  # port 1: nothing is contacted
        assert res.exit_code == ConfigError.exit_code
        assert "unknown metric 'speed'" in res.output and "tok_s" in res.output

    def test_an_unknown_metric_names_the_known_ones(self):
        with pytest.raises(ConfigError) as exc:
            plots.parse_metrics("loss,throughput")
        assert "throughput" in exc.value.message and "tok_s" in (exc.value.hint or "")


EVIL = "<script>alert(1)</script>\x1b]52;c;aGk=\x07"


def _status(**kw: object) -> StatusDoc:
    doc = {"job_id": "job-1", "state": "RUNNING", "pane_tail": [EVIL, "step 3 ok"],
           "diagnosis": [{"cause": EVIL, "summary": EVIL, "severity": "error", "evidence": [EVIL],
                          "hint": ""}],
           "history": {"bucket_s": 2, "t": [1.0, 3.0], "loss": [2.0, 1.0],
                       "marks": [{"t": 2.0, "kind": "error", "label": EVIL}]}, **kw}
    return status_doc(**doc)


class TestDashboardHtml:
    def test_remote_text_is_escaped_everywhere(self):
        snap = dashboard.Snapshot([dashboard.HostView("pve1", "root@pve1", [
            dashboard.ContainerView("pve1", 120, _status()),
            dashboard.ContainerView("pve1", 121, error=EVIL)])], time.time(), 0.1)
        page = dashboard.render_page(snap, 3.0)
        assert "<script>alert" not in page and "\x1b" not in page and "\x07" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b]52" in page
        assert page.count("<script>") == 1  # our own refresh script only
        assert "<svg" in page and 'data-state="RUNNING"' in page

    def test_a_broken_inventory_is_said_on_the_page(self, isolated_env):
        inv = isolated_env / "inventory"
        inv.mkdir(parents=True, exist_ok=True)
        (inv / "bad.yaml").write_text("hosts: {pve1: {address: 10.1.2.6, colour: red}}\n")
        app = dashboard.App(dashboard.Fleet(), refresh_s=1.0)
        snap = app.snapshot()  # nothing is contacted: the file is refused before any host
        assert snap.error and not snap.hosts
        assert 'class="err"' in dashboard.render_fragment(snap)

    def test_a_container_that_never_answers_gets_a_row_saying_so_and_the_page_still_renders(
            self, isolated_env, monkeypatch):
        inv = isolated_env / "inventory"
        inv.mkdir(parents=True, exist_ok=True)
        (inv / "h.yaml").write_text("hosts: {pve1: {address: 127.0.0.1, containers: {120: {}, 121: {}}}}\n")
        release = threading.Event()

        def container(_fleet, host, ctid):  # pure logic: the fan-out, not the transport
            if ctid == 121:
                release.wait(30)  # a stuck pct exec
            return dashboard.ContainerView(host, ctid, note="no job launched here yet")

        monkeypatch.setattr(dashboard.Fleet, "container", container)
        monkeypatch.setattr(dashboard, "CONTAINER_DEADLINE_S", 0.5)
        try:
            start = time.monotonic()
            snap = dashboard.Fleet().snapshot()
            assert time.monotonic() - start < 5
        finally:
            release.set()
        views = {v.ctid: v for v in snap.hosts[0].containers}
        assert views[120].note == "no job launched here yet" and views[120].error is None
        assert views[121].error == "pve1 ct 121: no answer within 0.5 s"
        assert "no answer within 0.5 s" in dashboard.render_fragment(snap)

    def test_the_page_is_read_only_and_answers_only_loopback_names(self):
        server = dashboard.serve(port=0, refresh_s=1.0)  # the test's inventory has no hosts
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            host, port = server.server_address[:2]
            assert host == "127.0.0.1"
            base = dashboard.url(server)
            with urllib.request.urlopen(base, timeout=10) as r:
                body = r.read().decode()
                assert "no hosts in the inventory" in body
                assert "script-src 'sha256-" in r.headers["Content-Security-Policy"]
            post = urllib.request.Request(base, data=b"x", method="POST")
            with pytest.raises(urllib.error.HTTPError) as exc:
                urllib.request.urlopen(post, timeout=10)
            assert exc.value.code == 405
            rebound = urllib.request.Request(base, headers={"Host": f"evil.example:{port}"})
            with pytest.raises(urllib.error.HTTPError) as exc:
                urllib.request.urlopen(rebound, timeout=10)
            assert exc.value.code == 403
        finally:
            server.shutdown()
            server.server_close()


# two real `nvidia-smi --query-gpu=...` lines: an idle and a busy H200
SMI = "0, NVIDIA H200, 0, 0, 143771, 27, 73.52\n7, NVIDIA H200, 100, 131072, 143771, 61, 688.17\n"


@pytest.mark.skipif(not shutil.which("tmux"), reason="needs tmux")
def test_the_wrapper_records_steps_gpu_samples_and_the_end_in_history_json(tmp_path):
    """The real agent + wrapper in tmux, with an nvidia-smi that prints two H200 rows."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncat <<'EOF'\n" + SMI + "EOF\n")
    smi.chmod(0o755)
    root = tmp_path / "root"
    socket = f"opsctl-test-history-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPSCTL_TMUX_SOCKET": socket,
           "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("TMUX", None)
    script = ("import json, time\n"
              "print(json.dumps({'event': 'phase', 'phase': 'compiling'}), flush=True)\n"
              "for s in range(1, 13):\n"
              "    print(json.dumps({'event': 'step', 'step': s, 'loss': 3.0 / s, 'tok_s': 1e4}),"
              " flush=True)\n"
              "    time.sleep(0.5)\n")
    spec = {"job_id": "hist-20261130-000000-abcd", "name": "hist", "workdir": str(tmp_path),
            "command": [sys.executable, "-c", script], "env": {}, "healthy_when": {"started": True},
            "timeout_s": 60}

    def agent(*args: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "remote_payload.agent", "--root", str(root),
                               *args], capture_output=True, text=True, env=env, timeout=60)
        return json.loads(proc.stdout)

    try:
        assert agent("launch", "--spec-json", json.dumps(spec))["ok"]
        st = wait_for_value(lambda: agent("status")["data"], lambda st: st["state"] == "SUCCEEDED",
                            60, interval=0.3)
        assert st["state"] == "SUCCEEDED"
        hist = st["history"]
        loss = [x for x in hist["loss"] if x is not None]  # a row may hold GPU samples only
        assert loss[0] > loss[-1]
        assert set(hist["gpu_util"]) - {None} == {50.0}  # the mean of 0 % and 100 %
        assert [m["kind"] for m in hist["marks"]] == ["compile", "end"]
        assert hist["last"]["loss"]["v"] == 3.0 / 12  # written before the end was: the last step
        full = agent("history")["data"]
        assert full["source"] == "history.json"
        assert full["history"]["steps"]["step"] == list(range(1, 13))
        assert set(full["history"]["gpu_mem_gib"]) - {None} == {128.0}  # 0 + 131072 MiB
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def test_plot_needs_no_extra_plotext_is_a_dependency_and_matplotlib_only_for_png():
    """``opsctl plot`` works after a plain ``pip install``; only ``--png`` needs the extra."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml")
                            .read_text(encoding="utf-8"))["project"]
    assert any(dep.startswith("plotext") for dep in project["dependencies"])
    assert not any(dep.startswith("matplotlib") for dep in project["dependencies"])
    assert any(dep.startswith("matplotlib") for dep in project["optional-dependencies"]["plots"])


# --- any number a trainer may log --------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_ANY_FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none(),
                       st.sampled_from([1e308, -1e308, float("inf"), float("-inf"),
                                        float("nan"), -1.0, 0.0]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_ANY_FLOAT, min_size=1, max_size=30),
       times=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=30))
def test_every_chart_draws_any_float_a_trainer_logs(values, times):
    n = min(len(values), len(times))
    hist = dict(t=times[:n], loss=values[:n], tok_s=values[:n], gpu_util=values[:n],
                   gpu_mem_gib=values[:n], marks=[{"t": times[0], "kind": "compile",
                                                        "label": "drafter_step"}])
    rows = plots.sparkline_rows(hist, metrics=("loss", "tok_s", "gpu_util"))
    for row in rows:
        for shown in (row.last, row.low, row.high):
            assert "inf" not in shown and "nan" not in shown and len(shown) < 20, row
    plots.mark_line(hist, 40)
    found = plots.series(hist, ("loss", "gpu_util"))
    for s in found:
        assert all(v is None or s.metric.low * s.metric.scale <= v <= s.metric.high * s.metric.scale
                   for v in s.v)
        plots.svg_chart(s, hist["marks"])
    try:
        plots.terminal_charts(hist, ("loss", "tok_s"), color=False)
    except ConfigError as exc:  # every value was nan or every time absurd: nothing to draw
        assert "no data to plot" in str(exc)


@pytest.mark.parametrize("loss", [1e308, float("inf"), -1e308, float("nan")])
def test_an_absurd_loss_is_drawn_clamped_not_a_traceback(loss):
    hist = dict(t=[1_700_000_000.0, 1_700_000_060.0, 1_700_000_120.0], loss=[2.5, loss, 2.0])
    chart = plots.terminal_charts(hist, ("loss",), color=False)
    assert "loss" in chart
    (row,) = plots.sparkline_rows(hist, metrics=("loss",))
    assert row.last == "2.0000" and float(row.high) <= plots.METRICS["loss"].high


# --- extreme finite values: the buckets keep a finite mean ---------------------------------

_FINITE = st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([1e308, -1e308, 1.7976931348623157e308, -1.7976931348623157e308,
                                     5e-324, 0.0]))


@settings(max_examples=200, deadline=None)
@given(samples=st.lists(st.tuples(st.floats(min_value=0, max_value=1e5), _FINITE),
                        min_size=1, max_size=60),
       cap=st.integers(min_value=2, max_value=8))
def test_every_bucket_of_finite_losses_has_a_finite_mean_within_their_range(samples, cap):
    h = agent_history.History(cap=cap, bucket_s=1.0)
    for at, loss in sorted(samples):
        h.add(1_700_000_000.0 + at, {"loss": loss})
    low, high = min(v for _, v in samples), max(v for _, v in samples)
    cols = h.columns()
    reduced = agent_history.reduce(cols, 3)
    for col in (cols["loss"], reduced["loss"]):
        assert all(v is not None for v in col)
        assert all(low - abs(low) * 1e-3 <= v <= high + abs(high) * 1e-3 for v in col), (low, high, col)
    json.dumps(cols, allow_nan=False)  # the file and the reply are strict JSON
    shapes.validate(HistoryDoc, reduced, where="test")


def test_steps_at_loss_1e308_are_plotted_not_reported_as_no_steps():
    rec = agent_history.History(bucket_s=60.0)
    for i in range(4):  # one bucket holds all four steps: their sum overflows, their mean does not
        rec.add(1_700_000_000.0 + i, {"loss": 1e308, "tok_s": 1000.0})
    hist = shapes.validate(HistoryDoc, agent_history.reduce(rec.columns(), 120), where="test")
    assert hist["loss"] == [pytest.approx(1e308, rel=1e-3)]
    chart = plots.terminal_charts(hist, ("loss", "tok_s"), color=False)
    assert "loss" in chart and "Ktok/s" in chart
