"""The dashboard's ``/metrics``: one fleet snapshot in Prometheus' text format.

The page and ``/metrics`` render the same :class:`~opsctl.cli.dashboard.Snapshot` (one fetch,
two renderings): a scrape shares the dashboard's refresh, its one call per container at a
time and its deadline, so Prometheus scraping every second opens no more SSH connections
than a browser tab does.

prometheus-client writes the text format (its escaping of label values: quotes, backslashes,
newlines; its spelling of NaN and infinities). Each scrape builds a fresh
:class:`~prometheus_client.CollectorRegistry` holding one collector bound to that snapshot,
so nothing is kept between scrapes (no global registry, no series left over from a job or a
host that is gone).

What a series means when a host does not answer: ``opsctl_host_up`` 0 and none of the
host's other series (an absent series, not the last value seen: a stale number would look
alive to an alert). The same holds for one container (``opsctl_container_up`` 0).

Numbers come from JSON, which holds integers of any size: one beyond a float's range is
served as ±Inf (a step of 10**400 is no reason to fail the whole scrape), and a time stamp
beyond it gives no age. Label values are remote text; a lone surrogate (a ``\\udcff`` the
agent's JSON may carry) cannot be written as UTF-8 and is served as its backslash escape.

Ages (``*_age_seconds``) compare the container's clock (the agent's ``_at`` stamps) with
this machine's at the snapshot; a host whose clock is off shifts them by that much.
"""

from __future__ import annotations

import math
import typing as t

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from remote_payload.wire import NONFINITE_KEY, JobState

if t.TYPE_CHECKING:
    from remote_payload.wire_shapes import StatusDoc


# The dashboard's snapshot as this module reads it (structural: the dashboard imports this
# module, so naming its classes here would be an import circle).
class ContainerView(t.Protocol):
    @property
    def ctid(self) -> int: ...
    @property
    def status(self) -> StatusDoc | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def stale_s(self) -> float | None: ...
    @property
    def unreachable(self) -> bool: ...
    @property
    def queued(self) -> int | None: ...
    @property
    def doctor(self) -> t.Sequence[t.Mapping[str, str]] | None: ...
    @property
    def doctor_at(self) -> float | None: ...


class HostView(t.Protocol):
    @property
    def name(self) -> str: ...
    @property
    def containers(self) -> t.Sequence[ContainerView]: ...


class Snapshot(t.Protocol):
    @property
    def hosts(self) -> t.Sequence[HostView]: ...
    @property
    def taken_at(self) -> float: ...

CONTENT_TYPE = CONTENT_TYPE_LATEST
MIB = 1024 * 1024
CT = ["host", "container"]
JOB = ["host", "container", "job_id"]  # not "job": Prometheus sets that label to the scrape job
GPU = ["host", "container", "gpu"]
RUN = ["host", "container", "run_id"]  # a run: the attempts and re-deploys of one training


def fresh(cv: ContainerView) -> bool:
    """The container answered this refresh (its data is current, not a stale copy)."""
    return cv.stale_s is None and not cv.unreachable


def host_up(views: t.Sequence[ContainerView]) -> bool:
    """A host is up when one of its containers answered this refresh over its connection (a
    container's own error, e.g. a stopped container, still proves the host answered)."""
    return any(fresh(cv) for cv in views)


def _float(value: int | float) -> float:
    """``value`` as a float; an integer beyond a float's range is ±Inf (not OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _finite(value: t.Any) -> float | None:
    """A finite number from JSON (a time stamp), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = _float(value)
    return number if math.isfinite(number) else None


def label(text: object) -> str:
    """A label value prometheus-client can write as UTF-8: lone surrogates backslash-escaped."""
    value = str(text)
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _number(step: t.Mapping[str, t.Any], key: str) -> float | None:
    """A step metric; NaN where the trainer sent a non-finite value (the wire carries it as
    ``null`` and names it under ``nonfinite``), None where it sent none."""
    value = step.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return _float(value)
    nonfinite = step.get(NONFINITE_KEY)
    if isinstance(nonfinite, list) and key in nonfinite:
        return math.nan
    return None


def _age(now: float, at: t.Any) -> float | None:
    stamp = _finite(at)
    return None if stamp is None else max(0.0, now - stamp)


def last_event_at(st: StatusDoc) -> float | None:
    """When the job last said anything: its newest event, step or output line."""
    times: list[float] = []
    for doc in [st["last_step"] or {}, *st["events_tail"]]:
        at = _finite(doc.get("_at"))
        if at is not None:
            times.append(at)
    output_at = _finite(st["last_output_at"])
    if output_at is not None:
        times.append(output_at)
    return max(times) if times else None


class SnapshotCollector(Collector):
    """The metric families of one snapshot (prometheus-client's custom collector)."""

    def __init__(self, snap: Snapshot):
        self.snap = snap

    def collect(self) -> t.Iterator[GaugeMetricFamily]:
        g = {name: GaugeMetricFamily(name, doc, labels=labels) for name, doc, labels in FAMILIES}
        now = self.snap.taken_at
        for hv in self.snap.hosts:
            if not hv.containers:
                continue  # nothing asked of it: neither up nor down
            g["opsctl_host_up"].add_metric([label(hv.name)], 1.0 if host_up(hv.containers) else 0.0)
            for cv in hv.containers:
                ct = [label(hv.name), str(cv.ctid)]
                up = fresh(cv) and cv.error is None
                g["opsctl_container_up"].add_metric(ct, 1.0 if up else 0.0)
                if up and cv.queued is not None:
                    g["opsctl_queue_length"].add_metric(ct, float(cv.queued))
                if up and cv.doctor is not None:
                    _doctor(g, ct, cv.doctor, cv.doctor_at, now)
                if up and cv.status is not None:
                    _job(g, ct, cv.status, now)
        yield from g.values()


def _doctor(g: dict[str, GaugeMetricFamily], ct: list[str], rows: t.Sequence[t.Mapping[str, str]],
            at: float | None, now: float) -> None:
    """The last ``doctor`` run (dashboard ``--doctor-every``): each check 1 when it failed."""
    failing = 0
    for row in rows:
        failed = row.get("status") == "fail"
        failing += failed
        g["opsctl_doctor_check_failing"].add_metric([*ct, label(row.get("name", "?"))],
                                                    1.0 if failed else 0.0)
    g["opsctl_doctor_failing_checks"].add_metric(ct, float(failing))
    age = _age(now, at)
    if age is not None:
        g["opsctl_doctor_age_seconds"].add_metric(ct, age)


def _job(g: dict[str, GaugeMetricFamily], ct: list[str], st: StatusDoc, now: float) -> None:
    job = [*ct, label(st["job_id"])]
    for state in JobState:
        g["opsctl_job_state"].add_metric([*job, state.value], 1.0 if st["state"] == state.value else 0.0)
    step = st["last_step"] or {}
    for key, name in (("step", "opsctl_job_step"), ("loss", "opsctl_job_loss"),
                      ("tok_s", "opsctl_job_tokens_per_second")):
        value = _number(step, key)
        if value is not None:
            g[name].add_metric(job, value)
    for name, at in (("opsctl_job_last_step_age_seconds", step.get("_at")),
                     ("opsctl_job_last_event_age_seconds", last_event_at(st))):
        age = _age(now, at)
        if age is not None:
            g[name].add_metric(job, age)
    g["opsctl_job_restarts"].add_metric(job, float(len(st["restarts"])))
    _run(g, ct, st.get("goodput"))
    for gpu in st["gpus"]:
        lab = [*ct, str(gpu["index"])]
        g["opsctl_gpu_info"].add_metric([*lab, label(gpu["name"])], 1.0)
        for name, value, scale in (("opsctl_gpu_utilization_ratio", gpu["util_pct"], 0.01),
                                   ("opsctl_gpu_memory_used_bytes", gpu["mem_used_mib"], MIB),
                                   ("opsctl_gpu_memory_total_bytes", gpu["mem_total_mib"], MIB),
                                   ("opsctl_gpu_temperature_celsius", gpu["temp_c"], 1.0),
                                   ("opsctl_gpu_power_watts", gpu["power_w"], 1.0)):
            if value is not None:
                g[name].add_metric(lab, value * scale)


def _run(g: dict[str, GaugeMetricFamily], ct: list[str],
         brief: t.Mapping[str, t.Any] | None) -> None:
    """The job's run's ledger (``status``' ``goodput``): the ratio and every cause but
    ``productive`` as badput seconds."""
    if not brief or brief.get("goodput") is None:
        return
    run = [*ct, label(brief.get("run_id") or "?")]
    g["opsctl_run_goodput_ratio"].add_metric(run, _float(brief["goodput"]))
    for cause, secs in sorted((brief.get("causes") or {}).items()):
        if cause != "productive" and _finite(secs) is not None:
            g["opsctl_run_badput_seconds"].add_metric([*run, label(cause)], _float(secs))
    rate = _finite(brief.get("effective_tok_s"))
    if rate is not None:
        g["opsctl_run_effective_tokens_per_second"].add_metric(run, rate)


#: Every family: name, help text, labels. docs/guide/prometheus.md lists them (generated).
FAMILIES: tuple[tuple[str, str, list[str]], ...] = (
    ("opsctl_host_up", "1 when one of the host's containers answered this refresh, else 0",
     ["host"]),
    ("opsctl_container_up", "1 when the container's agent answered this refresh without an "
                            "error, else 0", CT),
    ("opsctl_queue_length", "jobs waiting in the container's queue (asked every 30 s)", CT),
    ("opsctl_doctor_failing_checks", "failing checks of the container's last doctor run "
                                     "(dashboard --doctor-every)", CT),
    ("opsctl_doctor_check_failing", "1 when the check failed in the last doctor run, else 0",
     [*CT, "check"]),
    ("opsctl_doctor_age_seconds", "seconds since the container's last doctor run ended", CT),
    ("opsctl_job_state", "1 for the job's current state, 0 for the others", [*JOB, "state"]),
    ("opsctl_job_step", "the job's last optimizer step", JOB),
    ("opsctl_job_loss", "the loss of the job's last step (NaN when non-finite)", JOB),
    ("opsctl_job_tokens_per_second", "training throughput of the job's last step", JOB),
    ("opsctl_job_last_step_age_seconds", "seconds since the job's last step event", JOB),
    ("opsctl_job_last_event_age_seconds", "seconds since the job's last event or output line",
     JOB),
    ("opsctl_job_restarts", "how many times the restart policy relaunched the job", JOB),
    ("opsctl_run_goodput_ratio", "productive time over wall time of the current job's run "
                                 "(its attempts and re-deploys), 0 to 1", RUN),
    ("opsctl_run_badput_seconds", "the run's wall time lost, by cause (docs/guide/goodput.md)",
     [*RUN, "cause"]),
    ("opsctl_run_effective_tokens_per_second", "the run's surviving tokens over its wall time",
     RUN),
    ("opsctl_gpu_info", "1 for each GPU of a container with a job, labelled with its name",
     [*GPU, "name"]),
    ("opsctl_gpu_utilization_ratio", "GPU utilisation, 0 to 1", GPU),
    ("opsctl_gpu_memory_used_bytes", "GPU memory in use", GPU),
    ("opsctl_gpu_memory_total_bytes", "GPU memory in all", GPU),
    ("opsctl_gpu_temperature_celsius", "GPU temperature", GPU),
    ("opsctl_gpu_power_watts", "GPU power draw", GPU),
)


def render(snap: Snapshot) -> bytes:
    """The text format of one snapshot (a fresh registry: nothing kept between scrapes)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snap))
    return generate_latest(registry)
