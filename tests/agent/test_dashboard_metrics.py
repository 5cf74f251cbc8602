"""The dashboard's ``/metrics`` over its real HTTP server: the same loopback rules as the
page, and scrapes that share the page's refresh instead of opening connections of their own.
The containers' answers are scripted (pure logic); the sandbox test scrapes a real fleet."""

from __future__ import annotations

import contextlib
import threading
import time
import types
import typing as t
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from opsctl.cli import dashboard
from tests.waiting import wait_for


def write_inventory(home: Path, hosts: dict[str, dict[str, t.Any]]) -> None:
    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "metrics.yaml").write_text(yaml.safe_dump({"hosts": hosts}))


@pytest.fixture
def server() -> t.Iterator[dashboard.Server]:
    srv = dashboard.serve(port=0, refresh_s=0.2)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        srv.app.close()


def get(srv: dashboard.Server, path: str, host: str | None = None) -> tuple[int, str, str]:
    port = srv.server_address[1]
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Host": host or f"127.0.0.1:{port}"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_metrics_is_served_on_loopback_in_the_text_format(server, isolated_env):
    assert server.server_address[0] == "127.0.0.1"  # serve() has no other address to bind
    code, ctype, text = get(server, "/metrics")
    assert code == 200 and ctype.startswith("text/plain; version=")
    assert "# TYPE opsctl_host_up gauge" in text


def test_metrics_refuses_a_foreign_host_header_as_the_page_does(server, isolated_env):
    port = server.server_address[1]
    for host in (f"evil.example:{port}", f"127.0.0.1:{port}.evil.example", f"[::1]:{port}"):
        code, _, body = get(server, "/metrics", host=host)
        assert code == 403 and "opsctl" not in body, host
    assert get(server, "/metrics", host=f"localhost:{port}")[0] == 200


def test_scrapes_while_a_fetch_is_in_flight_share_it_and_open_nothing_more(server, isolated_env,
                                                                           monkeypatch):
    """Twelve scrapes at once against a container that does not answer: one call to it in
    all, every scrape answered within the refresh's wait, the container down (not a stale or
    made-up value); once it answers, the next scrape has it."""
    write_inventory(isolated_env, {"pve1": {"address": "127.0.0.1", "containers": {120: {}}}})
    release = threading.Event()
    calls: list[tuple[str, int]] = []

    def container(_fleet: dashboard.Fleet, host: str, ctid: int) -> dashboard.ContainerView:
        calls.append((host, ctid))
        release.wait(30)
        return dashboard.ContainerView(host, ctid, note="no job launched here yet")

    monkeypatch.setattr(dashboard.Fleet, "container", container)
    monkeypatch.setattr(dashboard, "REFRESH_WAIT_S", 0.5)
    try:
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda _: get(server, "/metrics"), range(12)))
        assert {code for code, _, _ in answers} == {200}
        assert calls == [("pve1", 120)]
        for _, _, text in answers:
            found = samples(text)
            assert found["opsctl_host_up"] == [({"host": "pve1"}, 0.0)]
            assert found["opsctl_container_up"] == [({"host": "pve1", "container": "120"}, 0.0)]
    finally:
        release.set()
    assert wait_for(lambda: samples(get(server, "/metrics")[2]).get("opsctl_host_up")
                    == [({"host": "pve1"}, 1.0)], 10)
    assert len(calls) <= 3  # one call per refresh at most, never one per scrape


def test_a_slow_doctor_runs_once_per_period_and_never_delays_a_scrape(server, isolated_env,
                                                                      monkeypatch):
    """--doctor-every: the run is in a thread of its own. While it hangs, scrapes answer at
    once without doctor series; once it answers, its failing checks are served."""
    from opsctl.ops import doctor

    write_inventory(isolated_env, {"pve1": {"address": "127.0.0.1", "containers": {120: {}}}})
    release = threading.Event()
    runs: list[str] = []

    def slow_doctor(tgt: t.Any, **_: t.Any) -> doctor.DoctorReport:
        runs.append(tgt.label)
        release.wait(30)
        return doctor.DoctorReport(tgt.label, rows=[
            {"name": "ssh", "status": "ok"}, {"name": "dev-shm", "status": "fail"}])

    monkeypatch.setattr(doctor, "doctor", slow_doctor)
    monkeypatch.setattr(dashboard.Fleet, "container", lambda _f, host, ctid: dashboard.ContainerView(
        host, ctid, note="no job launched here yet"))
    server.app.fleet.doctor_every_s = 3600.0
    try:
        for _ in range(5):
            code, _, text = get(server, "/metrics")
            assert code == 200 and "opsctl_doctor_failing_checks{" not in text
        assert wait_for(lambda: len(runs) == 1, 10) and len(runs) == 1
    finally:
        release.set()
    found = wait_for(lambda: samples(get(server, "/metrics")[2]).get("opsctl_doctor_failing_checks"),
                     10, what="the doctor's answer on /metrics")
    assert found == [({"host": "pve1", "container": "120"}, 1.0)]
    assert "dev-shm failing" in get(server, "/fragment")[2]
    assert len(runs) == 1  # not again within --doctor-every


def test_a_burst_of_scrapes_is_answered_every_one_and_shares_one_refresh(server, isolated_env,
                                                                        monkeypatch):
    """300 scrapes at once (Prometheus replicas, a dashboard of dashboards): every connection
    is accepted (no reset from a short listen queue) and answered, and the requests that
    waited while a refresh ran take that refresh, and its text, instead of each queueing one
    of their own."""
    refreshes: list[float] = []

    def snapshot(_fleet: dashboard.Fleet) -> dashboard.Snapshot:
        refreshes.append(0.0)
        threading.Event().wait(0.4)  # a fleet that takes longer than the page's refresh
        return dashboard.Snapshot([], time.time(), 0.4)

    from opsctl.cli import prometheus_metrics

    rendered: list[int] = []
    render = prometheus_metrics.render
    monkeypatch.setattr(prometheus_metrics, "render",
                        lambda snap: rendered.append(0) or render(snap))
    monkeypatch.setattr(dashboard.Fleet, "snapshot", snapshot)
    together = threading.Barrier(300)

    def scrape(_: int) -> int:
        together.wait(30)
        return get(server, "/metrics")[0]

    with ThreadPoolExecutor(300) as pool:
        answers = list(pool.map(scrape, range(300)))
    assert answers == [200] * 300
    assert len(refreshes) <= 3, len(refreshes)
    assert len(rendered) == len(refreshes)  # the text too: once per refresh


def test_doctors_that_hang_on_every_container_never_starve_the_status_calls(server, isolated_env,
                                                                            monkeypatch):
    """A doctor stuck on each of more containers than the dashboard has workers: the status of
    every container is still fetched and served (doctors have a pool of their own)."""
    from opsctl.ops import doctor

    cts = list(range(120, 120 + dashboard.MAX_WORKERS + 4))
    write_inventory(isolated_env, {"pve1": {"address": "127.0.0.1",
                                            "containers": {ct: {} for ct in cts}}})
    release = threading.Event()

    def stuck_doctor(tgt: t.Any, **_: t.Any) -> doctor.DoctorReport:
        release.wait(60)
        return doctor.DoctorReport(tgt.label)

    @contextlib.contextmanager
    def connected(host: str, ctid: int) -> t.Iterator[t.Any]:
        yield types.SimpleNamespace(label=f"{host} ct {ctid}")

    monkeypatch.setattr(doctor, "doctor", stuck_doctor)
    monkeypatch.setattr(dashboard.jobs, "open_target", connected)
    monkeypatch.setattr(dashboard.Fleet, "container", lambda _f, host, ctid: dashboard.ContainerView(
        host, ctid, note="no job launched here yet"))
    monkeypatch.setattr(dashboard, "REFRESH_WAIT_S", 0.5)
    server.app.fleet.doctor_every_s = 3600.0
    server.app.refresh_s = 0.0  # every scrape a refresh of its own
    try:
        get(server, "/metrics")  # starts the doctors
        def up() -> int:
            found = samples(get(server, "/metrics")[2]).get("opsctl_container_up", [])
            return sum(v == 1.0 for _, v in found)

        assert wait_for(lambda: up() == len(cts), 10, what="every container up")
        for _ in range(3):  # later refreshes too, while every doctor still hangs
            found = samples(get(server, "/metrics")[2])["opsctl_container_up"]
            assert [v for _, v in found] == [1.0] * len(cts)
    finally:
        release.set()


def test_a_wall_clock_set_back_does_not_freeze_the_page_s_refresh(server, isolated_env,
                                                                 monkeypatch):
    """The refresh's age is measured on the monotonic clock: a snapshot stamped an hour in the
    future (the clock was set back since) is still refreshed after the page's period."""
    taken: list[float] = []

    def snapshot(_fleet: dashboard.Fleet) -> dashboard.Snapshot:
        taken.append(time.monotonic())
        return dashboard.Snapshot([], time.time() + 3600, 0.0)

    monkeypatch.setattr(dashboard.Fleet, "snapshot", snapshot)
    get(server, "/metrics")
    assert wait_for(lambda: get(server, "/metrics") and len(taken) >= 2, 10,
                    what="a second refresh")


def test_a_queue_the_agent_cannot_list_is_asked_again_only_after_the_queue_period(monkeypatch):
    """An agent that refuses the queue call costs one more call per QUEUE_EVERY_S, not one
    per refresh; its length is unknown (no series), not 0."""
    from opsctl.errors import AgentError
    from opsctl.ops import queue as queue_ops

    asked: list[int] = []

    def refusing(_tgt: t.Any) -> t.Any:
        asked.append(1)
        raise AgentError("unknown command 'queue'", remote_type="UsageError")

    monkeypatch.setattr(queue_ops, "listing", refusing)
    fleet = dashboard.Fleet()
    assert [fleet._queued(t.cast(t.Any, None), "pve1", 120) for _ in range(5)] == [None] * 5
    assert len(asked) == 1


def test_connections_that_send_nothing_are_closed_and_free_their_threads(isolated_env,
                                                                         monkeypatch):
    """Fifty connections opened and left silent (or kept alive after a scrape) are closed by
    the server after its idle limit; a scrape still works meanwhile."""
    import socket

    assert dashboard.Handler.timeout is not None and 0 < dashboard.Handler.timeout <= 600
    monkeypatch.setattr(dashboard.Handler, "timeout", 0.5)  # the same rule, sooner
    srv = dashboard.serve(port=0, refresh_s=0.2)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    silent = [socket.create_connection(srv.server_address, timeout=10) for _ in range(50)]
    try:
        assert get(srv, "/metrics")[0] == 200
        for conn in silent:  # the server closes each: recv sees the end of the stream
            assert conn.recv(1) == b""
    finally:
        for conn in silent:
            conn.close()
        srv.shutdown()
        srv.server_close()
        srv.app.close()


def test_a_port_already_taken_is_one_line_and_exit_2(isolated_env):
    """`opsctl dashboard` started twice on one port: one line naming the port, exit 2 (not
    the standard library's traceback)."""
    import socket

    from click.testing import CliRunner

    from opsctl import errors
    from opsctl.cli import cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = CliRunner().invoke(cli, ["dashboard", "--port", str(port)])
    assert res.exit_code == errors.USAGE, res.output
    assert f"cannot listen on 127.0.0.1:{port}" in res.output
    assert "Traceback" not in res.output
