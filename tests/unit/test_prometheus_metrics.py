"""The dashboard's ``/metrics`` text, rendered from snapshots built here (pure logic): every
series read back through prometheus-client's own parser of the text format."""

from __future__ import annotations

import math
import typing as t

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from opsctl.cli import prometheus_metrics
from opsctl.cli.dashboard import ContainerView, HostView, Snapshot
from remote_payload import wire
from remote_payload.wire import JobState, finite_doc
from remote_payload.wire_shapes import StatusDoc
from tests.replies import status_doc

NOW = 1_800_000_000.0


def status(**fields: t.Any) -> StatusDoc:
    doc: dict[str, t.Any] = {"job_id": "j-1", "state": "RUNNING",
                             "last_step": {"event": "step", "step": 42, "loss": 1.5,
                                           "tok_s": 12800.0, "_at": NOW - 30},
                             "gpus": [{"index": 0, "name": "NVIDIA H200", "util_pct": 97.0,
                                       "mem_used_mib": 1024.0, "mem_total_mib": 2048.0,
                                       "temp_c": 61.0, "power_w": 650.0}]}
    doc.update(fields)
    return status_doc(**doc)


def gpu(**fields: t.Any) -> dict[str, t.Any]:
    """A whole GPU row (every key the shape requires), with ``fields`` over the defaults."""
    return {"index": 0, "name": "NVIDIA H200", "util_pct": None, "mem_used_mib": None,
            "mem_total_mib": None, "temp_c": None, "power_w": None, **fields}


def snap(*hosts: HostView) -> Snapshot:
    return Snapshot(list(hosts), NOW, 0.1)


def series(snapshot: Snapshot) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] as Prometheus' text parser reads the rendering."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    text = prometheus_metrics.render(snapshot).decode("utf-8")
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def one(found: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    values = found.get(name, [])
    assert len(values) == 1, (name, values)
    return values[0][1]


def test_a_running_job_is_labelled_by_host_container_and_job_with_units_as_suffixes():
    found = series(snap(HostView("pve1", "root@10.1.2.6", [ContainerView("pve1", 200, status=status())])))
    job = {"host": "pve1", "container": "200", "job_id": "j-1"}
    assert found["opsctl_host_up"] == [({"host": "pve1"}, 1.0)]
    assert found["opsctl_container_up"] == [({"host": "pve1", "container": "200"}, 1.0)]
    assert found["opsctl_job_step"] == [(job, 42.0)]
    assert found["opsctl_job_loss"] == [(job, 1.5)]
    assert found["opsctl_job_tokens_per_second"] == [(job, 12800.0)]
    assert found["opsctl_job_last_step_age_seconds"] == [(job, 30.0)]
    assert found["opsctl_job_restarts"] == [(job, 0.0)]
    gpu = {"host": "pve1", "container": "200", "gpu": "0"}
    assert found["opsctl_gpu_utilization_ratio"] == [(gpu, 0.97)]
    assert found["opsctl_gpu_memory_used_bytes"] == [(gpu, 1024.0 * 1024 * 1024)]
    assert found["opsctl_gpu_memory_total_bytes"] == [(gpu, 2048.0 * 1024 * 1024)]
    assert found["opsctl_gpu_temperature_celsius"] == [(gpu, 61.0)]
    assert found["opsctl_gpu_info"] == [({**gpu, "name": "NVIDIA H200"}, 1.0)]


def test_the_job_state_is_one_series_per_state_with_exactly_the_current_one_at_1():
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, status=status(state="FAILED"))])))
    states = {labels["state"]: value for labels, value in found["opsctl_job_state"]}
    assert states == {s.value: (1.0 if s is JobState.FAILED else 0.0) for s in JobState}


def test_a_non_finite_loss_is_NaN_and_an_absent_one_is_no_series():
    # the wire turns NaN/inf into null and names the field under "nonfinite"
    step = finite_doc({"event": "step", "step": 7, "loss": math.nan, "tok_s": math.inf, "_at": NOW})
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, status=status(last_step=step))])))
    assert math.isnan(one(found, "opsctl_job_loss"))
    assert math.isnan(one(found, "opsctl_job_tokens_per_second"))
    assert one(found, "opsctl_job_step") == 7.0
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, status=status(last_step={
        "event": "step", "step": 1}))])))
    assert "opsctl_job_loss" not in found and "opsctl_job_last_step_age_seconds" not in found


def test_an_unreachable_host_is_host_up_0_and_none_of_its_other_series():
    down = HostView("down", "root@10.9.9.9", [ContainerView("down", 200, error="connection refused",
                                                             unreachable=True)])
    up = HostView("up", "up", [ContainerView("up", 200, status=status())])
    found = series(snap(down, up))
    assert sorted(found["opsctl_host_up"], key=lambda x: x[0]["host"]) == [
        ({"host": "down"}, 0.0), ({"host": "up"}, 1.0)]
    for name, rows in found.items():
        if name != "opsctl_host_up":
            assert all(labels["host"] == "up" or value == 0.0 for labels, value in rows), name
            assert not [1 for labels, _ in rows if labels["host"] == "down"
                        and name != "opsctl_container_up"], name


def test_a_stale_container_exports_no_values_only_that_it_is_down():
    """The dashboard shows a late container's last data marked stale; /metrics must not,
    or an alert on "no step for 10 minutes" would see a number that still looks alive."""
    stale = ContainerView("h", 200, status=status(), stale_s=120.0, stale_note="stale")
    found = series(snap(HostView("h", "h", [stale])))
    assert one(found, "opsctl_host_up") == 0.0
    assert one(found, "opsctl_container_up") == 0.0
    assert not [n for n in found if n.startswith(("opsctl_job_", "opsctl_gpu_"))]


def test_a_container_with_its_own_error_leaves_its_host_up():
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, error="container stopped"),
                                            ContainerView("h", 201, note="no job launched here yet")])))
    assert one(found, "opsctl_host_up") == 1.0
    assert sorted((labels["container"], v) for labels, v in found["opsctl_container_up"]) == [
        ("200", 0.0), ("201", 1.0)]


def test_a_host_without_containers_and_an_empty_inventory_export_nothing():
    assert series(snap(HostView("bare", "bare"))) == {}
    text = prometheus_metrics.render(snap()).decode()
    assert [ln for ln in text.splitlines() if not ln.startswith("#")] == []


def test_each_scrape_starts_from_a_fresh_registry():
    first = series(snap(HostView("gone", "g", [ContainerView("gone", 200, status=status())])))
    second = series(snap(HostView("new", "n", [ContainerView("new", 300, note="no job")])))
    assert "opsctl_job_step" in first
    assert "opsctl_job_step" not in second
    assert {labels["host"] for labels, _ in second["opsctl_host_up"]} == {"new"}


def test_the_queue_length_is_served_when_known_and_absent_when_not():
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, status=status(), queued=3),
                                            ContainerView("h", 201, status=status())])))
    assert found["opsctl_queue_length"] == [({"host": "h", "container": "200"}, 3.0)]
    stale = ContainerView("h", 200, status=status(), queued=3, stale_s=60.0)
    assert "opsctl_queue_length" not in series(snap(HostView("h", "h", [stale])))


def test_the_last_doctor_run_is_one_series_per_check_and_a_count_of_the_failing():
    rows = [{"name": "ssh", "status": "ok"}, {"name": "host-driver", "status": "fail"},
            {"name": "dev-shm", "status": "warn"}, {"name": "xid-events", "status": "skip"}]
    view = ContainerView("h", 200, note="no job", doctor=rows, doctor_at=NOW - 42)
    found = series(snap(HostView("h", "h", [view])))
    ct = {"host": "h", "container": "200"}
    assert found["opsctl_doctor_failing_checks"] == [(ct, 1.0)]
    assert found["opsctl_doctor_age_seconds"] == [(ct, 42.0)]
    assert sorted((labels["check"], v) for labels, v in found["opsctl_doctor_check_failing"]) == [
        ("dev-shm", 0.0), ("host-driver", 1.0), ("ssh", 0.0), ("xid-events", 0.0)]
    assert "opsctl_doctor_failing_checks" not in series(snap(HostView("h", "h", [
        ContainerView("h", 200, note="no job")])))  # no run yet (or --doctor-every 0): absent


def test_restarts_and_last_event_age_come_from_the_status():
    st = status(restarts=[{"attempt": 1, "at": NOW - 100, "reason": "exit 1"},
                          {"attempt": 2, "at": NOW - 50, "reason": "exit 1"}],
                events_tail=[{"event": "phase", "_at": NOW - 5}], last_output_at=NOW - 9)
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, status=st)])))
    assert one(found, "opsctl_job_restarts") == 2.0
    assert one(found, "opsctl_job_last_event_age_seconds") == 5.0


def test_the_runs_goodput_and_badput_by_cause_come_from_the_status_ledger():
    brief = {"run_id": "r-1", "wall_s": 1000.0, "goodput": 0.9,
             "causes": {"productive": 870.0, "checkpoint": 40.0, "lost": 60.0, "unknown": 30.0},
             "crashes": 1, "hangs": 0, "restarts": 1, "redeploys": 0,
             "effective_tok_s": 800.0, "eta_s": None}
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, status=status(goodput=brief))])))
    run = {"host": "h", "container": "200", "run_id": "r-1"}
    assert found["opsctl_run_goodput_ratio"] == [(run, 0.9)]
    # time no record explains is badput of its own cause, never left out of the sum
    assert sorted((lab["cause"], v) for lab, v in found["opsctl_run_badput_seconds"]) == [
        ("checkpoint", 40.0), ("lost", 60.0), ("unknown", 30.0)]
    assert found["opsctl_run_effective_tokens_per_second"] == [(run, 800.0)]
    assert "opsctl_run_goodput_ratio" not in series(snap(HostView("h", "h", [
        ContainerView("h", 200, status=status(goodput=None))])))  # no ledger: absent


HOSTILE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(gpu_name=HOSTILE, job_id=st.from_regex(wire.JOB_ID_PATTERN, fullmatch=True), host=HOSTILE)
def test_any_remote_text_in_a_label_reads_back_exactly(gpu_name, job_id, host):
    """Quotes, backslashes, newlines, unicode: prometheus-client escapes them, and its parser
    (the text format's reference) reads the very same label values back."""
    st_ = status(job_id=job_id, gpus=[gpu(index=3, name=gpu_name, util_pct=1.0)])
    found = series(snap(HostView(host, host, [ContainerView(host, 200, status=st_)])))
    assert found["opsctl_gpu_info"] == [({"host": host, "container": "200", "gpu": "3",
                                          "name": gpu_name}, 1.0)]
    assert one(found, "opsctl_job_step") == 42.0
    assert found["opsctl_job_step"][0][0]["job_id"] == job_id


def test_a_label_with_a_quote_and_a_newline_is_escaped_in_the_text():
    st_ = status(gpus=[gpu(name='H200"}\nopsctl_host_up{host="x"} 1', util_pct=5.0)])
    text = prometheus_metrics.render(snap(HostView("h", "h", [ContainerView("h", 200, status=st_)])))
    assert b'name="H200\\"}\\nopsctl_host_up{host=\\"x\\"} 1"' in text
    assert not [ln for ln in text.decode().splitlines() if ln.startswith('opsctl_host_up{host="x"}')]


def test_the_families_are_named_by_prometheus_conventions():
    for name, help_text, labels in prometheus_metrics.FAMILIES:
        assert name.startswith("opsctl_") and name == name.lower(), name
        assert help_text and labels, name
        assert not name.endswith("_total"), name  # gauges only: a counter's suffix would lie


JSON_NUMBER = st.one_of(st.integers(min_value=-(10**400), max_value=10**400),
                        st.integers(min_value=-(2**64), max_value=2**64),
                        st.floats(allow_nan=False, allow_infinity=False), st.just(-0.0))


@settings(max_examples=150, deadline=None)
@given(step=JSON_NUMBER, loss=JSON_NUMBER, at=JSON_NUMBER, event_at=JSON_NUMBER)
def test_any_number_the_agent_s_json_can_hold_is_served_never_a_failed_scrape(step, loss, at,
                                                                               event_at):
    """JSON integers have no size limit: one past a float's range is ±Inf (a step) or no age
    (a time stamp); the scrape of the whole fleet never fails on one container's numbers."""
    st_ = status(last_step={"event": "step", "step": step, "loss": loss, "_at": at},
                 events_tail=[{"event": "phase", "_at": event_at}])
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, status=st_)])))
    served = one(found, "opsctl_job_step")
    try:
        expected = float(step)
    except OverflowError:  # an integer past a float's range
        expected = math.inf if step > 0 else -math.inf
    assert served == expected
    for name in ("opsctl_job_last_step_age_seconds", "opsctl_job_last_event_age_seconds"):
        assert all(math.isfinite(v) and v >= 0 for _, v in found.get(name, []))


def test_a_time_stamp_past_a_float_s_range_gives_no_age_and_the_rest_is_served():
    st_ = status(last_step={"event": "step", "step": 2**63, "loss": 1.0, "_at": 10**400},
                 events_tail=[{"event": "phase", "_at": -(10**400)}])
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, status=st_)])))
    assert one(found, "opsctl_job_step") == float(2**63)
    assert "opsctl_job_last_step_age_seconds" not in found
    assert "opsctl_job_last_event_age_seconds" not in found


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=20).map(lambda s: s + "\udcff"))
def test_a_label_with_a_lone_surrogate_is_served_backslash_escaped(text):
    """JSON's ``\\udcff`` escape decodes to a lone surrogate, which UTF-8 cannot hold: the label
    is served with it escaped, and the scrape (every other host's series) still works. (A reply
    cannot carry one: the agent client's JSON parser refuses it; the renderer holds anyway, so
    the document is built here past the boundary's checks.)"""
    st_ = t.cast(StatusDoc, {**status(), "job_id": text, "gpus": [gpu(name=text)]})
    rows = [{"name": text, "status": "fail"}]
    found = series(snap(HostView("h", "h", [ContainerView("h", 200, status=st_, doctor=rows)]),
                        HostView("other", "o", [ContainerView("other", 201)])))
    escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
    assert found["opsctl_job_step"][0][0]["job_id"] == escaped
    assert found["opsctl_gpu_info"][0][0]["name"] == escaped
    assert found["opsctl_doctor_check_failing"][0][0]["check"] == escaped
    assert ({"host": "other"}, 1.0) in found["opsctl_host_up"]
