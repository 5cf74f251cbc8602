"""``opsctl dashboard``: a read-only web page of the fleet, on 127.0.0.1.

Every inventory host's containers, each job's state, charts, diagnosis and pane tail;
``/metrics`` is the same snapshot in Prometheus' text format (:mod:`.prometheus_metrics`).
The status comes from the same operations as ``opsctl status``
(:func:`opsctl.jobs.open_target` + :func:`opsctl.watch.fetch_status`); nothing here
talks to the agent another way.

The stack is the standard library's ``http.server`` (threaded), HTML and SVG rendered on
the server, and one small inline script. The first response already holds the current
state (``curl`` and a browser without JavaScript see it); the script only fetches
``/fragment`` every few seconds and swaps it in, so the page updates without a reload.

Why no login: the server binds to 127.0.0.1 only (there is no option to bind elsewhere),
so only users of this machine can reach it, the same people who can run ``opsctl status``.
Requests whose ``Host`` header is not exactly ``127.0.0.1:PORT`` or ``localhost:PORT`` are
refused with 403 (a web page on another site cannot reach it through DNS rebinding), a request
with more than one ``Host`` header with 400 (whichever of them came first), the
page is read-only (GET only), and a Content-Security-Policy allows only its own inline
script and style. Every remote text is escaped (and its control characters shown as
``\\xNN``, :func:`opsctl.render.safe`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import threading
import time
import typing as t
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opsctl.cli import plots
from opsctl.cli.render import safe
from opsctl.config import inventory
from opsctl.errors import AgentError, OpsctlError, TransportError
from opsctl.ops import jobs, watch
from opsctl.ops import queue as queue_ops
from opsctl.remote.agent_client import NoPayload
from remote_payload.wire import dumps_strict, parse_event
from remote_payload.wire_shapes import StatusDoc

BIND = "127.0.0.1"  # loopback only: the reason the page needs no login (module docstring)
MAX_WORKERS = 8
#: How long one container's call may run before its connection is dropped (a fresh one at
#: the next refresh) and its row says it did not answer.
CONTAINER_DEADLINE_S = 30.0
#: How long one refresh waits for the containers; one that has not answered by then keeps
#: its call running in the background and its row shows the last data, marked stale with
#: its age. A container that was late once is not waited for again until it answers, so a
#: host that never answers costs no refresh any time (it once blocked each by ~10 s).
REFRESH_WAIT_S = 5.0
#: How often a container's queue is asked (one more agent call; a queue changes when a job is
#: added or starts, not every refresh). Its length is shown and served on /metrics.
QUEUE_EVERY_S = 30.0
#: ``--doctor-every S``: each container gets an ``opsctl doctor`` run every S seconds (off by
#: default: it runs host commands a page view should not start unasked), without the torch
#: matmul (it would take a training GPU's time), in a thread of its own on a connection of its
#: own, so a slow doctor never delays the page. Its failing rows are shown and on /metrics.
DOCTOR_DEADLINE_S = 60.0
#: Doctor runs at a time, from a pool of their own: doctors that hang (a wedged driver's
#: nvidia-smi on every host) never take the slots the page's status calls need.
DOCTOR_WORKERS = 2
#: how long the server keeps a connection that sends nothing (Prometheus scrapes at most every
#: few minutes in practice and reconnects when it must)
IDLE_CONNECTION_S = 120.0


@dataclass
class ContainerView:
    host: str
    ctid: int
    status: StatusDoc | None = None
    note: str | None = None  # no job / no payload: not an error
    error: str | None = None
    stale_s: float | None = None  # no answer this refresh: the data shown is this old
    stale_note: str | None = None
    unreachable: bool = False  # its connection failed or it never answered (/metrics: host down)
    queued: int | None = None  # jobs waiting in its queue (None: not known)
    doctor: list[dict[str, str]] | None = None  # the last doctor run's rows (None: none yet)
    doctor_at: float | None = None  # when that run ended (time.time())


@dataclass
class HostView:
    name: str
    label: str
    containers: list[ContainerView] = field(default_factory=list)
    error: str | None = None


@dataclass
class Snapshot:
    hosts: list[HostView]
    taken_at: float
    took_s: float
    error: str | None = None  # the inventory could not be read


class Fleet:
    """Keeps one :class:`~opsctl.jobs.Target` per container (connections are reused between
    refreshes) and takes snapshots of every inventory host's containers, in parallel."""

    def __init__(self, lines: int = 15, doctor_every_s: float = 0.0):
        self.lines = lines
        self.doctor_every_s = doctor_every_s  # 0: no doctor runs
        self.targets: dict[tuple[str, int], jobs.Target] = {}
        self.lock = threading.Lock()
        # the background calls (one per container at most) and what they last answered
        self.cond = threading.Condition()
        self.answers: dict[tuple[str, int], tuple[ContainerView, float]] = {}  # view, time()
        self.running: dict[tuple[str, int], float] = {}  # monotonic start of the call
        self.late: set[tuple[str, int]] = set()  # not waited for until they answer in time
        self.took: dict[tuple[str, int], float] = {}  # how long the last finished call took
        self.dropped: set[tuple[str, int]] = set()  # past CONTAINER_DEADLINE_S, closed once
        self.slots = threading.BoundedSemaphore(MAX_WORKERS)
        self.doctor_slots = threading.BoundedSemaphore(DOCTOR_WORKERS)
        self.queues: dict[tuple[str, int], tuple[float, int | None]] = {}  # monotonic, length
        self.doctors: dict[tuple[str, int], tuple[float, list[dict[str, str]]]] = {}  # time(), rows
        self.doctoring: set[tuple[str, int]] = set()  # a doctor run is in flight

    def _target(self, host: str, ctid: int) -> jobs.Target:
        with self.lock:
            tgt = self.targets.get((host, ctid))
            if tgt is None:
                tgt = self.targets[(host, ctid)] = jobs.open_target(host, ctid)
            return tgt

    def _drop(self, host: str, ctid: int) -> None:
        with self.lock:
            tgt = self.targets.pop((host, ctid), None)
        if tgt is not None:
            tgt.close()

    def container(self, host: str, ctid: int) -> ContainerView:
        view = ContainerView(host, ctid)
        try:
            tgt = self._target(host, ctid)
            view.status = watch.fetch_status(tgt.agent, None, self.lines)
            view.queued = self._queued(tgt, host, ctid)
        except NoPayload:
            view.note = "no opsctl payload in this container yet (deploy ships it)"
        except AgentError as exc:
            if exc.remote_type == "NoSuchJob":
                view.note = "no job launched here yet"
            else:
                view.error = exc.message
        except TransportError as exc:
            self._drop(host, ctid)  # reconnect at the next refresh
            view.error = exc.message
            view.unreachable = True
        except OpsctlError as exc:
            view.error = exc.message
        except Exception as exc:  # a bug: shown on the page, the other containers still render
            view.error = f"{type(exc).__name__}: {exc}"
        return view

    def _queued(self, tgt: jobs.Target, host: str, ctid: int) -> int | None:
        """The container's queue length, asked at most every :data:`QUEUE_EVERY_S`; None when
        the agent cannot say (its error is not the page's: the status row already shows)."""
        last = self.queues.get((host, ctid))
        if last is not None and time.monotonic() - last[0] < QUEUE_EVERY_S:
            return last[1]
        length: int | None
        try:
            length = len(queue_ops.listing(tgt)["jobs"])
        except OpsctlError:
            length = None  # not asked again before QUEUE_EVERY_S either (an agent without it)
        self.queues[(host, ctid)] = (time.monotonic(), length)
        return length

    def _doctor_due(self, key: tuple[str, int]) -> None:
        """Start a doctor run for ``key`` when its last one is older than ``--doctor-every``."""
        if self.doctor_every_s <= 0:
            return
        with self.cond:
            last = self.doctors.get(key)
            if key in self.doctoring or (last is not None
                                         and time.time() - last[0] < self.doctor_every_s):
                return
            self.doctoring.add(key)
        threading.Thread(target=self._doctor, args=(key,), daemon=True,
                         name=f"dashboard doctor {key[0]} ct {key[1]}").start()

    def _doctor(self, key: tuple[str, int]) -> None:
        from opsctl.ops import doctor

        rows: list[dict[str, str]] | None = None
        try:
            with self.doctor_slots, jobs.open_target(*key) as tgt:
                rows = doctor.doctor(tgt, deadline_s=DOCTOR_DEADLINE_S, torch=False).rows
        except OpsctlError:
            rows = None  # e.g. the inventory changed: no rows rather than a guess
        except Exception as exc:  # a bug: one line, the page goes on
            import sys

            sys.stderr.write(f"dashboard: doctor of {key[0]}{_ct_words(key[1])} failed: "
                             f"{type(exc).__name__}: {exc}\n")
        with self.cond:
            self.doctoring.discard(key)
            if rows is not None:
                self.doctors[key] = (time.time(), rows)

    def snapshot(self) -> Snapshot:
        start = time.monotonic()
        inv = inventory.load()
        hosts: list[HostView] = []
        work: list[tuple[HostView, int]] = []
        for name, spec in sorted(inv.hosts.items()):
            hv = HostView(name, spec.ssh_label())
            if not spec.targets():
                hv.error = "no containers listed in the inventory"
            hosts.append(hv)
            work.extend((hv, ctid) for ctid in sorted(spec.targets()))
        by_key = {(hv.name, ctid): hv for hv, ctid in work}
        for key, view in self._gather(list(by_key), start).items():
            self._doctor_due(key)
            with self.cond:
                done = self.doctors.get(key)
            if done is not None:
                view = dataclasses.replace(view, doctor=done[1], doctor_at=done[0])
            by_key[key].containers.append(view)
        return Snapshot(hosts, time.time(), time.monotonic() - start)

    def _call(self, key: tuple[str, int]) -> None:
        """One container's refresh, in a daemon thread; its answer is kept for the next
        snapshot that looks (a late one included)."""
        try:
            with self.slots:
                view = self.container(*key)
        except BaseException as exc:  # container() catches the rest: a bug, shown on the page
            view = ContainerView(*key, error=f"{type(exc).__name__}: {exc}")
        with self.cond:
            self.answers[key] = (view, time.time())
            self.took[key] = time.monotonic() - self.running.pop(key, time.monotonic())
            self.dropped.discard(key)
            self.cond.notify_all()

    def _gather(self, keys: list[tuple[str, int]], start: float) -> dict[tuple[str, int], ContainerView]:
        """Each container's view within :data:`REFRESH_WAIT_S` (the refresh's deadline): a
        fresh answer, or the last one marked stale, or a row saying it did not answer."""
        wait_s = min(REFRESH_WAIT_S, CONTAINER_DEADLINE_S)
        with self.cond:
            for key in keys:  # a late one whose last call answered in time is waited for again
                if key in self.late and key not in self.running and self.took.get(key, wait_s) < wait_s:
                    self.late.discard(key)
            for key in keys:
                if key not in self.running:  # one call per container at a time
                    self.running[key] = time.monotonic()
                    threading.Thread(target=self._call, args=(key,), daemon=True,
                                     name=f"dashboard {key[0]} ct {key[1]}").start()
            awaited = [k for k in keys if k not in self.late]
            while any(k in self.running for k in awaited):
                left = start + wait_s - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            now = time.monotonic()
            views: dict[tuple[str, int], ContainerView] = {}
            hung: list[tuple[str, int]] = []
            for key in keys:
                if key not in self.running:
                    self.late.discard(key)
                    views[key] = self.answers[key][0]
                    continue
                self.late.add(key)
                waited = now - self.running[key]
                if waited >= CONTAINER_DEADLINE_S and key not in self.dropped:
                    self.dropped.add(key)
                    hung.append(key)
                last = self.answers.get(key)
                if last is None:
                    views[key] = ContainerView(*key, error=f"{key[0]}{_ct_words(key[1])}: no answer "
                                                           f"within {wait_s:g} s", unreachable=True)
                else:
                    age = time.time() - last[1]
                    views[key] = dataclasses.replace(
                        last[0], stale_s=age, stale_note=f"stale: no answer for {waited:.0f} s; "
                                                         f"showing data from {age:.0f} s ago")
        for key in hung:  # its connection may be what hangs: a fresh one next time
            self._drop(*key)
        return views

    def close(self) -> None:
        with self.lock:
            targets, self.targets = list(self.targets.values()), {}
        for tgt in targets:
            tgt.close()


class App:
    """The latest snapshot (refreshed at most every ``refresh_s``) and its rendering."""

    def __init__(self, fleet: Fleet, refresh_s: float = 3.0):
        self.fleet = fleet
        self.refresh_s = refresh_s
        self.lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._snap_done = 0.0  # time.monotonic() when it was taken
        self.metrics_lock = threading.Lock()
        self._metrics: tuple[Snapshot, bytes] | None = None

    def metrics(self) -> bytes:
        """``/metrics`` of the current snapshot, rendered once per snapshot: scrapes that share
        a refresh share its text too (a big fleet's text takes a while to write)."""
        from opsctl.cli import prometheus_metrics

        snap = self.snapshot()
        with self.metrics_lock:
            if self._metrics is None or self._metrics[0] is not snap:
                self._metrics = (snap, prometheus_metrics.render(snap))
            return self._metrics[1]

    def snapshot(self) -> Snapshot:
        asked = time.monotonic()  # (not the wall clock: a clock set back would freeze the page)
        with self.lock:  # one refresh at a time; concurrent requests share it
            snap = self._snap
            # a snapshot taken while this request waited for the lock is fresh enough for it:
            # a burst of scrapes shares one refresh instead of queueing a refresh each
            if snap is None or (self._snap_done < asked
                                and time.monotonic() - self._snap_done >= self.refresh_s * 0.8):
                try:
                    snap = self.fleet.snapshot()
                except OpsctlError as exc:  # e.g. a broken inventory file: say it on the page
                    snap = Snapshot([], time.time(), 0.0, error=exc.message)
                self._snap, self._snap_done = snap, time.monotonic()
            return snap

    def close(self) -> None:
        self.fleet.close()


# --- HTML ---------------------------------------------------------------------------------


def esc(text: object) -> str:
    """Remote text for HTML: control characters shown as ``\\xNN``, then escaped."""
    return html.escape(safe(text))


STYLE = """
body{font-family:system-ui,sans-serif;margin:1em;color:#222;background:#fafafa}
h1{font-size:1.2em;margin:0 0 .3em}.meta{color:#777;font-size:.85em}
.host{margin:1em 0;padding:.5em 1em;background:#fff;border:1px solid #ddd;border-radius:6px}
.ct{border-top:1px solid #eee;padding:.6em 0}.ct:first-of-type{border-top:none}
.state{font-weight:bold;padding:0 .4em;border-radius:3px}
.QUEUED{color:#36c}.PENDING{color:#777}.SETTING_UP{color:#0aa}.COMPILING{color:#a0a}.RUNNING{color:#080}
.SUCCEEDED{color:#fff;background:#080}.FAILED,.LOST{color:#fff;background:#c00}
.CANCELLED{color:#a60}.err{color:#c00}.note{color:#777}
.diag{margin:.3em 0;padding:.3em .6em;border-left:3px solid #c00;background:#fff5f5}
.diag.warning{border-color:#e90;background:#fffaf0}.diag.info{border-color:#09c;background:#f5fbff}
pre{background:#111;color:#ddd;padding:.5em;max-height:16em;overflow:auto;font-size:.8em}
.charts svg{background:#fff;border:1px solid #eee;margin-right:.5em}
table.gpus td,table.gpus th{padding:0 .6em;font-size:.85em;text-align:right}
"""

SCRIPT_TEMPLATE = """
(function(){
  var ms = REFRESH_MS, fails = 0;
  function tick(){
    fetch('/fragment', {cache: 'no-store'}).then(function(r){
      if (!r.ok) throw new Error('HTTP ' + r.status);
      return r.text();
    }).then(function(text){
      document.getElementById('fleet').innerHTML = text; fails = 0;
      document.getElementById('live').textContent = 'live';
    }).catch(function(e){
      fails += 1;
      document.getElementById('live').textContent = 'refresh failed (' + e.message + '), retrying';
    }).finally(function(){ setTimeout(tick, ms * Math.min(1 + fails, 5)); });
  }
  setTimeout(tick, ms);
})();
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def script(refresh_s: float) -> str:
    return SCRIPT_TEMPLATE.replace("REFRESH_MS", str(int(refresh_s * 1000)))


def csp(refresh_s: float) -> str:
    return (f"default-src 'none'; script-src {_csp_hash(script(refresh_s))}; "
            f"style-src {_csp_hash(STYLE)}; connect-src 'self'; img-src 'self' data:; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def render_page(snap: Snapshot, refresh_s: float) -> str:
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>opsctl dashboard</title>"
            f"<style>{STYLE}</style></head><body>"
            "<h1>opsctl dashboard</h1>"
            f"<div class=\"meta\">read-only · 127.0.0.1 only · refreshes every {refresh_s:g} s · "
            "<span id=\"live\">server-rendered</span></div>"
            f"<main id=\"fleet\">{render_fragment(snap)}</main>"
            f"<script>{script(refresh_s)}</script></body></html>")


def render_fragment(snap: Snapshot) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.taken_at))
    parts = [f"<div class=\"meta\" id=\"taken\">state at {stamp} (took {snap.took_s:.2f} s)</div>"]
    if snap.error:
        parts.append(f"<p class=\"err\">{esc(snap.error)}</p>")
    elif not snap.hosts:
        parts.append("<p class=\"note\">no hosts in the inventory</p>")
    for hv in snap.hosts:
        parts.append(f"<section class=\"host\" data-host=\"{esc(hv.name)}\">"
                     f"<h2>{esc(hv.name)} <span class=\"meta\">{esc(hv.label)}</span></h2>")
        if hv.error:
            parts.append(f"<p class=\"note\">{esc(hv.error)}</p>")
        parts.extend(_container(cv) for cv in hv.containers)
        parts.append("</section>")
    return "".join(parts)


def _container(cv: ContainerView) -> str:
    name = "the host itself" if cv.ctid == inventory.DIRECT_CTID else f"ct {cv.ctid}"
    head = f"<div class=\"ct\" data-ct=\"{cv.ctid}\"><h3>{name}"
    if cv.stale_note:
        head = head.replace("<h3>", f"<p class=\"err stale\">{esc(cv.stale_note)}</p><h3>", 1)
    st = cv.status
    if st is None:
        body = (f"<p class=\"err\">{esc(cv.error)}</p>" if cv.error
                else f"<p class=\"note\">{esc(cv.note or '')}</p>")
        return head + "</h3>" + body + _doctor_line(cv) + "</div>"
    state = esc(st["state"])
    parts = [head, f" · job <span class=\"job\">{esc(st['job_id'])}</span> "
             f"<span class=\"state {state}\" data-state=\"{state}\">{state}</span>"]
    if st["phase"]:
        parts.append(f" <span class=\"meta\">phase {esc(st['phase'])}</span>")
    parts.append("</h3>")
    from opsctl.cli.render import duration, goodput_line, metrics_line

    facts = [f"elapsed {duration(st['elapsed_s'])}"]
    if st["exit_code"] is not None:
        facts.append(f"exit code {st['exit_code']}")
    if st["signal"]:
        facts.append(f"killed by {esc(st['signal'])}")
    if cv.queued:
        facts.append(f"{cv.queued} queued")
    parts.append(f"<div class=\"meta\">{' · '.join(facts)}</div>")
    parts.append(_doctor_line(cv))
    parts.append(f"<div>{esc(metrics_line(st['last_step']).plain)}</div>")
    ledger = goodput_line(st.get("goodput"))
    if ledger is not None:
        parts.append(f"<div class=\"goodput\">{esc(ledger.plain)}</div>")
    history = st.get("history")
    if history is not None:
        charts = [plots.svg_chart(s, history.get("marks", []), escape=esc)
                  for s in plots.series(history, plots.STATUS_METRICS,
                                        latest=plots.status_latest(st))]
        if charts:
            parts.append("<div class=\"charts\">" + "".join(charts) + "</div>")
    for d in st["diagnosis"]:
        sev = esc(d["severity"])
        parts.append(f"<div class=\"diag {sev}\"><b>[{sev}] {esc(d['cause'])}</b>: "
                     f"{esc(d['summary'])}" + "".join(f"<br><small>evidence: {esc(e)}</small>"
                                                     for e in d["evidence"][:4])
                     + (f"<br>next: {esc(d['hint'])}" if d["hint"] else "") + "</div>")
    for e in st["evidence"]:
        parts.append(f"<div class=\"meta\">evidence: {esc(e)}</div>")
    tail = [x for x in (st["pane_tail"] or st["output_tail"]) if parse_event(x) is None]
    if tail:
        parts.append("<pre class=\"pane\">" + html.escape(safe("\n".join(tail), newlines=True))
                     + "</pre>")
    if st["gpus"]:
        rows = "".join(f"<tr><td>{g['index']}</td><td>{esc(g['name'])}</td><td>{_n(g['util_pct'])}</td>"
                       f"<td>{_n(g['mem_used_mib'])}/{_n(g['mem_total_mib'])}</td></tr>"
                       for g in st["gpus"])
        parts.append("<table class=\"gpus\"><tr><th>#</th><th>GPU</th><th>util %</th>"
                     f"<th>mem MiB</th></tr>{rows}</table>")
    parts.append("</div>")
    return "".join(parts)


def _doctor_line(cv: ContainerView) -> str:
    """The failing checks of the container's last doctor run (``--doctor-every``)."""
    failing = [r.get("name", "?") for r in cv.doctor or [] if r.get("status") == "fail"]
    if not failing:
        return ""
    return (f"<p class=\"err doctor\">doctor: {esc(', '.join(failing))} failing "
            f"(<code>opsctl doctor --host {esc(cv.host)}{_ct_flag(cv.ctid)}</code>)</p>")


def _ct_words(ctid: int) -> str:
    """`` ct N`` after a host's name, or nothing for a direct host's one target."""
    return "" if ctid == inventory.DIRECT_CTID else f" ct {ctid}"


def _ct_flag(ctid: int) -> str:
    """`` --ct N``, or nothing for a direct host's one target (which takes no ``--ct``)."""
    return "" if ctid == inventory.DIRECT_CTID else f" --ct {ctid}"


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


# --- HTTP ---------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    #: seconds a connection may sit without sending a request (a kept-alive one between
    #: scrapes included): each holds a thread, so a client that opens hundreds and says
    #: nothing (or a tab left open) frees them, instead of holding them for ever
    timeout = IDLE_CONNECTION_S

    def log_message(self, format: str, *args: t.Any) -> None:
        pass  # the terminal stays quiet; errors show on the page

    def _send(self, code: int, body: str | bytes, ctype: str = "text/html; charset=utf-8") -> None:
        data = body.encode("utf-8") if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", csp(self.server.app.refresh_s))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _host_ok(self) -> bool:
        """Only ``127.0.0.1:PORT`` and ``localhost:PORT`` (this server's port): a page on
        another site that rebinds its name to 127.0.0.1 sends its own name, and is refused
        (DNS rebinding). ``[::1]`` cannot reach a server bound to 127.0.0.1 at all."""
        return (self.headers.get("Host") or "").strip().lower() in allowed_hosts(self.server)

    def do_GET(self) -> None:
        if len(self.headers.get_all("Host") or []) > 1:
            # RFC 9112 3.2: a request with more than one Host is answered 400. Which of them a
            # proxy or a browser would have used is not known, so none is trusted.
            self._send(400, "bad request: more than one Host header", "text/plain")
            return
        if not self._host_ok():
            self._send(403, f"forbidden: open this page as {url(self.server)}", "text/plain")
            return
        path = self.path.split("?", 1)[0]
        app = self.server.app
        if path == "/":
            self._send(200, render_page(app.snapshot(), app.refresh_s))
        elif path == "/fragment":
            self._send(200, render_fragment(app.snapshot()))
        elif path == "/status.json":
            snap = app.snapshot()
            doc = {"taken_at": snap.taken_at, "hosts": [
                {"name": h.name, "error": h.error, "containers": [
                    {"ctid": c.ctid, "note": c.note, "error": c.error, "stale_s": c.stale_s,
                     "status": c.status}
                    for c in h.containers]} for h in snap.hosts]}
            self._send(200, dumps_strict(doc), "application/json")
        elif path == "/metrics":
            from opsctl.cli import prometheus_metrics

            self._send(200, app.metrics(), prometheus_metrics.CONTENT_TYPE)
        else:
            self._send(404, "not found", "text/plain")

    do_HEAD = do_GET

    def _refuse(self) -> None:
        self._send(405, "read-only: GET only", "text/plain")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse


def allowed_hosts(server: Server) -> frozenset[str]:
    """The ``Host`` headers the dashboard answers (README, "Input limits")."""
    port = server.server_address[1]
    return frozenset({f"{BIND}:{port}", f"localhost:{port}"})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    #: connections the kernel holds before they are accepted (the standard library's 5 resets
    #: a burst of scrapes or browser tabs)
    request_queue_size = 256

    def __init__(self, port: int, app: App):
        self.app = app
        super().__init__((BIND, port), Handler)

    def handle_error(self, request: t.Any, client_address: t.Any) -> None:
        """A client that went away mid-request (a closed tab, ``curl`` interrupted) is no
        problem: nothing printed. Anything else: one line, never the traceback the standard
        library prints (a page's errors show on the page)."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):  # BrokenPipe, ConnectionReset…
            return
        sys.stderr.write(f"dashboard: request from {client_address[0]} failed: "
                         f"{type(exc).__name__}: {exc}\n")


def serve(*, port: int = 8765, refresh_s: float = 3.0, lines: int = 15,
          doctor_every_s: float = 0.0) -> Server:
    """Bind the dashboard to 127.0.0.1:``port`` (0: any free port); call ``serve_forever``.

    Raises:
        OSError: the port is taken.
    """
    return Server(port, App(Fleet(lines, doctor_every_s), refresh_s))


def url(server: Server) -> str:
    return f"http://{BIND}:{server.server_address[1]}/"
