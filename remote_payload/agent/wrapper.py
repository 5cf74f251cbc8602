"""The job wrapper: ``python3 -m remote_payload.agent.wrapper <job_dir>``, the process in the tmux pane.

It owns the job's lifetime record. It starts the job command in its own
process group with stdout+stderr merged into one pipe, copies every byte to
``output.log`` (so nothing is lost to scrollback) and to the pane, picks out
event lines (``events.jsonl``), moves the state forward (``status.json``,
write-then-rename) and writes ``exit_code`` when the child ends. If the tmux
server goes away (SIGHUP) it takes the job's process group down with it and
records LOST, so a dead tmux server never leaves orphans behind.

It also watches for hangs (:class:`HangWatch`): when the job has been silent longer than
its budget (:func:`remote_payload.agent.diagnosis.hang_threshold`), it takes every process's
stacks at once and records where each rank waits in ``hang.json``, so ``status`` can say
it without anyone running ``opsctl stacks``.

Being the one process that lives as long as the job, it also applies the playbook's
babysitting with no client connected: the restart policy (:mod:`restart`; an attempt that
ended, or hung, is run again in the same job dir: ``output.log`` continues after a separator
line, a ``restart`` event is recorded), the wall-clock limit (``max_duration_s``: the stop
escalation, ending CANCELLED with reason ``time limit``), webhook notifications
(:mod:`notify`) and the job's secrets (:mod:`jobsecrets`: in the environment, masked in the output).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import typing as t

from remote_payload import boundedread, wire
from remote_payload.agent import diagnosis, gpus, jobsecrets, notify, outindex, spawn
from remote_payload.agent import history as history_mod
from remote_payload.agent import jobstore as jobs
from remote_payload.agent import restart as restart_mod
from remote_payload.agent import stacks as stacks_mod
from remote_payload.agent.common import read_json, write_json_atomic
from remote_payload.agent.verbs import goodput as goodput_verb

JobState = wire.JobState

STATUS_THROTTLE_S = 0.5  # status.json is rewritten at most this often for mere output
DRAIN_AFTER_EXIT_S = 0.5  # read what grandchildren still hold open, then stop
MAX_LINE = 1 << 20  # a "line" longer than this is judged as it is (progress bars, binary)
HANG_CHECK_INTERVAL_S = 2.0
HANG_STACKS_TIMEOUT_S = 10.0
MAX_ERROR_EVENTS = 16  # status.json keeps the first ones: the first failing rank is the cause
# healthy_when.regex is matched against at most this much of a line, for at most this long per
# line and in total; past either it is switched off with evidence (a catastrophic
# regex must never wedge the wrapper, which also records the exit and acts on stop)
REGEX_MAX_CHARS = 8192
REGEX_LINE_BUDGET_S = 0.05
REGEX_TOTAL_BUDGET_S = 10.0
# kept free in the job dir so that pid / exit_code / hangup can still be written on a full disk
RESERVE = ".disk-reserve"
RESERVE_BYTES = 256 * 1024


class _RegexTimeout(Exception):
    """Raised by the SIGALRM handler inside a match that ran past its budget."""


def _regex_alarm(_signum: int, _frame: t.Any) -> None:
    raise _RegexTimeout


# a hung attempt that the restart policy runs again: SIGINT, then SIGTERM, then SIGKILL
# (shorter than stop's: a hung job reaches no step boundary to checkpoint at)
HANG_RESTART_PLAN = jobs.stop_plan(10.0, 5.0)
DIAGNOSIS_BYTES = 256 * 1024  # of the attempt's own output, for the restart decision


class Wrapper:
    """One job run: spawn, pump output, track state, record the end."""

    def __init__(self, path: str):
        self.path = path
        self.spec: dict[str, t.Any] = read_json(self._f(jobs.SPEC))
        self.launch: dict[str, t.Any] = read_json(self._f(jobs.LAUNCH), {}) or {}
        old = read_json(self._f(jobs.STATUS), {}) or {}
        now = time.time()
        self.status: dict[str, t.Any] = {
            "job_id": self.spec["job_id"], "name": self.spec.get("name"),
            "state": JobState.PENDING.value, "phase": None, "healthy": False,
            "created_at": old.get("created_at", now), "started_at": None, "ended_at": None,
            "last_output_at": None, "output_size": 0, "last_step": None, "events_count": 0,
            "exit_code": None, "signal": None, "evidence": [], "budget_s": None, "errors": [],
            "transitions": old.get("transitions") or [[JobState.PENDING.value, now, "launched"]],
            "attempt": 1, "attempt_started_at": None, "restarting": False,
            "max_restarts": (self.spec.get("restart") or {}).get("max_restarts"),
            "restarts": [], "end_reason": None,
        }
        self.state = JobState.PENDING
        hw = self.spec.get("healthy_when") or jobs.HEALTHY_DEFAULT
        self.healthy_when: dict[str, t.Any] = hw
        self.regex = re.compile(hw["regex"]) if "regex" in hw else None
        self.regex_spent = 0.0
        self.log_fd = os.open(self._f(jobs.OUTPUT), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.events = open(self._f(jobs.EVENTS), "a", encoding="utf-8")  # noqa: SIM115
        self.disk_errors: set[str] = set()  # files whose writes failed (disk full): said once
        self._reserve()
        self.partial = b""
        self.pane_ok = True
        self.log_error: str | None = None
        self.last_write = 0.0
        self.dirty = False
        self.pending_signals: list[int] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.child_ticks: int | None = None
        self.cgroup: str | None = None  # the job's cgroup, where cgroup2 is writable
        self.history = history_mod.Recorder(path)  # bounded plot data for status
        self.out_index = outindex.Writer(path)  # time -> offset, for `logs --since`
        self.policy: dict[str, t.Any] | None = self.spec.get("restart")
        self.attempt = 1
        self.attempt_offset = 0  # where this attempt's output starts in output.log
        self.hang_decision: restart_mod.Decision | None = None  # set by the hang watch
        self.event_lock = threading.Lock()
        self.notifier = notify.Notifier(self.spec.get("notify") or [], path)
        self.secrets = jobsecrets.load(path)
        self.redactor = jobsecrets.Redactor(self.secrets.values())
        self.last_byte = b"\n"
        self.last_rc = 0  # Popen's returncode of the last attempt (negative: a signal)

    def _f(self, name: str) -> str:
        return os.path.join(self.path, name)

    # --- state ---------------------------------------------------------------

    def advance(self, new: JobState, why: str, write: bool = True) -> None:
        """Move forward if the transition table allows it; anything else is ignored (forward-only)."""
        if new == self.state or not wire.can_transition(self.state, new):
            return
        self.state = new
        self.status["state"] = new.value
        self.status["transitions"].append([new.value, time.time(), why])
        if new == JobState.RUNNING or new == JobState.SUCCEEDED:
            if new == JobState.RUNNING and not self.status["healthy"]:
                self.notify(notify.EVENT_HEALTHY)
            self.status["healthy"] = True
        if new.is_terminal():
            self.history.mark(history_mod.MARK_END, f"{new.value}: {why}")
            # written before the terminal status, whatever FLUSH_S says: a reader that sees
            # the job ended (`status --follow`, then `plot`) finds its last buckets
            self.history.flush(force=True)
        if write:
            self.write_status()

    def write_status(self, force: bool = True) -> None:
        now = time.time()
        if not force and now - self.last_write < STATUS_THROTTLE_S:
            self.dirty = True
            return
        self.status["updated_at"] = now
        self.last_write = now
        if self.write_record(jobs.STATUS, self.status):
            self.dirty = False
        else:
            self.dirty = True  # retried at the next throttle tick

    # --- a full disk: the job lives on; what could not be written is said --------

    def _reserve(self) -> None:
        """Hold some space in the job dir: given back when a record cannot be written."""
        with contextlib.suppress(OSError):
            fd = os.open(self._f(RESERVE), os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)

    def disk_error(self, what: str, exc: OSError) -> None:
        """Record (in memory, in status.json when it can be written) that ``what`` failed."""
        if what in self.disk_errors:
            return
        self.disk_errors.add(what)
        full = jobs.is_disk_full(exc)
        why = (f"{what} write failed: {'disk full: ' if full else ''}{exc.strerror or exc}; "
               "the job keeps running")
        self.status["evidence"] = [*self.status["evidence"], why]
        self.to_pane(f"\r\n[opsctl] {why}\r\n".encode())

    def write_record(self, name: str, obj: t.Any, critical: bool = False) -> bool:
        """``write_json_atomic`` that never raises; False when it failed (said in the evidence).

        A ``critical`` record (pid, exit, hangup) on a full disk gives up the reserve once
        and retries, so the job's end is still recorded.
        """
        path = self._f(name)
        for attempt in range(2):
            try:
                write_json_atomic(path, obj)
                return True
            except OSError as exc:
                if (critical and attempt == 0 and jobs.is_disk_full(exc)
                        and os.path.exists(self._f(RESERVE))):
                    with contextlib.suppress(OSError):
                        os.unlink(self._f(RESERVE))
                    continue
                self.disk_error(name, exc)
        return False

    # --- output --------------------------------------------------------------

    def to_pane(self, data: bytes) -> None:
        """The pane is for humans: never block on it, never fail the job over it."""
        if not self.pane_ok:
            return
        try:
            os.write(1, data)
        except BlockingIOError:
            pass  # pane not drained (tmux stopped?): drop, output.log has it
        except OSError:
            self.pane_ok = False  # EIO: the pty is gone

    def on_output(self, chunk: bytes) -> None:
        """The job's bytes, secrets masked, to output.log, the pane, events and state."""
        if self.redactor:
            chunk = self.redactor.feed(chunk)
            if not chunk:
                return
        self.record_output(chunk)

    def record_output(self, chunk: bytes) -> None:
        self.out_index.note(time.time(), self.log_fd)
        self.last_byte = chunk[-1:]
        view = memoryview(chunk)
        try:
            while view:
                n = os.write(self.log_fd, view)
                view = view[n:]
        except OSError as exc:  # disk full: keep the job alive, say what was lost
            if not self.log_error:
                self.log_error = f"output.log write failed ({exc}); later output is incomplete"
                self.disk_error(jobs.OUTPUT, exc)
        self.to_pane(chunk)
        self.status["output_size"] += len(chunk)
        self.status["last_output_at"] = time.time()
        self.partial += chunk
        lines = self.partial.split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE:
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            self.on_line(line)
        self.write_status(force=False)

    def on_line(self, line: bytes) -> None:
        if self.regex is not None and not self.status["healthy"]:
            text = line[:REGEX_MAX_CHARS].decode("utf-8", "replace").rstrip("\r")
            if self.healthy_match(text):
                self.advance(JobState.RUNNING, f"healthy_when regex matched: {text[:200]}")
        if not line.lstrip().startswith(b"{"):
            return
        ev = wire.parse_event(line)
        if ev is not None:
            self.on_event(ev)

    def healthy_match(self, text: str) -> bool:
        """``healthy_when.regex`` on one line, bounded in time.

        ``re`` checks for signals while it backtracks, so a SIGALRM raised after
        :data:`REGEX_LINE_BUDGET_S` ends a runaway match; the regex is then switched
        off with evidence (a deploy waiting for health then ends at its timeout, saying why).
        """
        regex = self.regex
        if regex is None:
            return False
        t0 = time.monotonic()
        previous = signal.signal(signal.SIGALRM, _regex_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, REGEX_LINE_BUDGET_S)
            try:
                return regex.search(text) is not None
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _RegexTimeout:
            self.give_up_regex(f"one line took over {REGEX_LINE_BUDGET_S * 1000:.0f} ms")
            return False
        finally:
            signal.signal(signal.SIGALRM, previous)
            self.regex_spent += time.monotonic() - t0
            if self.regex is not None and self.regex_spent > REGEX_TOTAL_BUDGET_S:
                self.give_up_regex(f"matching took {self.regex_spent:.1f} s in total")

    def give_up_regex(self, why: str) -> None:
        self.regex = None
        self.status["evidence"] = [
            *self.status["evidence"],
            f"healthy_when regex switched off: {why} (catastrophic backtracking?); "
            "the job runs on but cannot become healthy by regex"]
        self.write_status()

    def on_event(self, ev: dict[str, t.Any]) -> None:
        ev = {**ev, "_at": time.time()}
        self.write_event(ev)
        self.status["events_count"] += 1
        self.history.on_event(ev, ev["_at"])
        kind = ev["event"]
        budget = ev.get(wire.FIELD_BUDGET)
        if isinstance(budget, int | float) and not isinstance(budget, bool) and budget > 0:
            self.status["budget_s"] = float(budget)
        if kind == wire.EVENT_ERROR and len(self.status["errors"]) < MAX_ERROR_EVENTS:
            self.status["errors"].append({k: (v[:500] if isinstance(v, str) else v)
                                          for k, v in ev.items()})
            self.write_status()
        if kind == wire.EVENT_PHASE:
            phase = ev.get("phase")
            self.status["phase"] = phase
            target = wire.PHASE_TO_STATE.get(str(phase))
            # RUNNING means healthy, which only healthy_when decides
            if target is not None and target != JobState.RUNNING:
                self.advance(target, f"phase {phase}")
            self.write_status()
        elif kind == wire.EVENT_STEP:
            first = self.status["last_step"] is None
            self.status["last_step"] = ev
            if first:
                self.write_status()
        want = self.healthy_when
        if "event" in want and all(ev.get(k) == v for k, v in want.items()):
            self.advance(JobState.RUNNING, f"healthy_when event {kind}")

    def write_event(self, ev: dict[str, t.Any]) -> None:
        """One line of events.jsonl (the job's events, and the wrapper's restart/time_limit)."""
        ev = {**ev, "_at": ev.get("_at") or time.time()}
        try:
            with self.event_lock:
                self.events.write(wire.dumps_strict(ev, separators=(",", ":")) + "\n")
                self.events.flush()
        except OSError as exc:  # disk full: the event still moves the state
            self.disk_error(jobs.EVENTS, exc)

    def notify(self, event: str, headline: str | None = None) -> None:
        """Queue a webhook notification (never blocks, never fails the job)."""
        self.notifier.send(notify.body(event, spec=self.spec, status=self.status,
                                       diagnosis=headline))

    # --- lifecycle -------------------------------------------------------------

    def child_env(self) -> dict[str, str]:
        env = dict(self.launch.get("base_env") or os.environ)
        env.update(self.spec.get("env") or {})
        payload = self.launch.get("payload_dir") or os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        hook = os.path.join(payload, "remote_payload", "sitehook")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (hook, payload, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"
        env["OPSCTL_JOB_ID"] = self.spec["job_id"]
        env["OPSCTL_JOB_DIR"] = self.path
        env[wire.ENV_GOODPUT_FILE] = self._f(goodput_verb.SUMMARY_CACHE)
        env[wire.ENV_ATTEMPT] = str(self.attempt)
        env.update(self.secrets)
        return env

    def record_pid(self, pid: int | None, started_at: float | None) -> None:
        me = os.getpid()
        self.write_record(jobs.PID, critical=True, obj={
            "wrapper_pid": me, "wrapper_start_ticks": jobs.start_ticks(me),
            "pid": pid, "pgid": pid, "start_ticks": self.child_ticks, "started_at": started_at,
            "argv": self.launch.get("argv") or self.spec["command"], "cgroup": self.cgroup,
            "attempt": self.attempt,
        })

    def finish(self, exit_code: int | None, sig: str | None, why: str,
               error: str | None = None) -> None:
        now = time.time()
        rec = {"exit_code": exit_code, "signal": sig, "ended_at": now, "error": error}
        self.write_record(jobs.EXIT_CODE, rec, critical=True)
        cancelled = os.path.exists(self._f(jobs.CANCEL))
        self.status.update(exit_code=exit_code, signal=sig, ended_at=now, restarting=False)
        self.status["evidence"] = [*self.status["evidence"], why]
        final = jobs.final_state(rec, cancelled)
        if final == JobState.CANCELLED:
            self.status["end_reason"] = jobs.cancel_reason(self.path) or "cancelled"
        self.advance(final, why + (" after cancel was requested" if cancelled else ""))
        self.write_status()
        self.history.flush(force=True)
        self.to_pane(f"\r\n[opsctl] job {self.spec['job_id']} {final.value}: {why}\r\n".encode())
        headline = None
        if final == JobState.FAILED:
            found = self.diagnose(exit_code, sig)
            headline = found[0]["summary"] if found else why
        self.notify(notify.EVENT_FAILED if final == JobState.FAILED else notify.EVENT_FINISHED,
                    headline)

    def handle_signals(self) -> bool:
        """Act on signals the wrapper received; True when it must hang up."""
        sigs, self.pending_signals = self.pending_signals, []
        hangup = False
        for sig in sigs:
            if sig == signal.SIGHUP:
                hangup = True
            elif self.proc is not None:  # Ctrl-C / TERM in the pane: pass it on
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, sig)
        return hangup

    def hang_up(self) -> None:
        """tmux is gone: end the job's process group and record LOST (no exit_code)."""
        proc = self.proc
        sent: list[str] = []
        if proc is not None:  # the job's group and its detached children alike
            sent, _left = jobs.escalate(self.spec["job_id"], proc.pid, self.child_ticks,
                                        self.cgroup, jobs.LEFTOVERS_PLAN)
        why = "wrapper got SIGHUP: the tmux server or pane went away"
        self.write_record(jobs.HANGUP, {"at": time.time(), "why": why, "signals": sent}, critical=True)
        self.status["evidence"] = [*self.status["evidence"], why,
                                   f"job process group ended with {', '.join(sent) or 'no signal'}"]
        self.status["ended_at"] = time.time()
        self.status["end_reason"] = "tmux went away"
        self.status["restarting"] = False
        self.advance(JobState.LOST, why)
        self.write_status()
        self.history.flush(force=True)
        self.notify(notify.EVENT_LOST, why)

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda s, _f: self.pending_signals.append(s))
        with contextlib.suppress(OSError):
            fl = fcntl.fcntl(1, fcntl.F_GETFL)
            fcntl.fcntl(1, fcntl.F_SETFL, fl | os.O_NONBLOCK)

        stop_all = threading.Event()  # the job's end: samplers, history, time limit
        try:
            return self.attempts(wake_r, stop_all)
        finally:
            stop_all.set()
            jobsecrets.remove(self.path)
            self.notifier.drain()

    def attempts(self, wake_r: int, stop_all: threading.Event) -> int:
        """Run the job, and again while the restart policy says so; the wrapper's exit code."""
        if os.path.exists(self._f(jobs.CANCEL)):
            self.record_pid(None, None)
            self.finish(None, None, "cancelled before it started")
            return 0
        argv = self.launch.get("argv") or jobs.job_argv(self.spec)
        while True:
            proc = self.start_attempt(argv)
            if proc is None:
                return 127
            if self.attempt == 1:
                # started after the fork above: preexec_fn is only safe without other threads
                self.start_threads(stop_all)
            stop_watch = threading.Event()
            threading.Thread(target=HangWatch(self).run, name="hang-watch", daemon=True,
                             args=(stop_watch,)).start()
            try:
                ended = self.pump(proc, wake_r)
            finally:
                stop_watch.set()
            if ended is None:
                self.hang_up()
                return 129
            rc, sig = ended
            decision = self.decide(rc, sig)
            if decision is not None and decision.restart:
                outcome = self.between_attempts(decision, wake_r)
                if outcome == "restart":
                    continue
                if outcome == "hangup":
                    self.hang_up()
                    return 129
            elif decision is not None:
                self.record_decision(decision)
                if not decision.restart and "limit" in decision.why:
                    self.status["end_reason"] = "restart limit reached"
            if sig is not None:
                self.finish(None, sig, f"killed by {sig}")
                return 128 - self.last_rc
            self.finish(rc, None, f"exited with code {rc}")
            return self.last_rc

    def start_attempt(self, argv: list[str]) -> subprocess.Popen[bytes] | None:
        """Start this attempt's process (None: the first one could not start; recorded)."""
        self.cgroup = cgroup = jobs.job_cgroup_create(self.spec["job_id"])
        try:
            if self.attempt == 1:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    cwd=self.spec.get("workdir") or None, env=self.child_env(),
                    preexec_fn=lambda: spawn.child_setup(cgroup))
            else:  # threads run now: the exec helper sets the process up (spawn's docstring)
                proc = subprocess.Popen(
                    [sys.executable, "-S", "-m", "remote_payload.agent.spawn", cgroup or "-", *argv],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    cwd=self.spec.get("workdir") or None, env=self.child_env())
        except OSError as exc:
            self.on_output(spawn.cannot_start(argv[0], exc).encode())
            self.record_pid(None, None)
            self.finish(127, None, f"could not start: {exc}", error=str(exc))
            return None
        self.proc = proc
        started = time.time()
        self.child_ticks = jobs.start_ticks(proc.pid)
        self.record_pid(proc.pid, started)
        self.status["started_at"] = self.status["started_at"] or started
        self.status.update(attempt=self.attempt, attempt_started_at=started, restarting=False)
        self.attempt_offset = self.status["output_size"]
        # one write for both steps: launch returns the first non-PENDING status it sees
        self.advance(JobState.SETTING_UP, f"pid {proc.pid} started", write=False)
        if self.healthy_when.get("started"):
            self.advance(JobState.RUNNING, "healthy_when started", write=False)
        self.write_status()
        return proc

    def start_threads(self, stop: threading.Event) -> None:
        """The job-long helpers: GPU sampler, history writer, the run's goodput summary, and
        the wall-clock limit."""
        threading.Thread(target=gpus.sample_forever, name="gpu-sampler", daemon=True,
                         args=(self._f(gpus.SAMPLE_FILE), stop),
                         kwargs={"on_sample": self.history.on_gpus}).start()
        threading.Thread(target=self.history.run, name="history", daemon=True,
                         args=(stop,)).start()
        threading.Thread(target=GoodputRefresher(self).run, name="goodput", daemon=True,
                         args=(stop,)).start()
        if self.spec.get("max_duration_s"):
            threading.Thread(target=self.time_limit, name="time-limit", daemon=True,
                             args=(float(self.spec["max_duration_s"]), stop)).start()

    def time_limit(self, limit_s: float, stop: threading.Event) -> None:
        """``max_duration_s``: past it, cancel with reason ``time limit`` and escalate like
        ``stop`` (SIGINT first, so the trainer checkpoints); the end is then CANCELLED."""
        if stop.wait(limit_s):
            return
        jobs.mark_cancelled(self.path, jobs.TIME_LIMIT_REASON)
        self.write_event({"event": wire.EVENT_TIME_LIMIT, "max_duration_s": limit_s,
                          "attempt": self.attempt})
        self.to_pane(f"\r\n[opsctl] time limit: {limit_s:g} s (max_duration_s) reached; "
                     "stopping the job\r\n".encode())
        proc = self.proc
        if proc is not None:
            jobs.escalate(self.spec["job_id"], proc.pid, self.child_ticks, self.cgroup,
                          jobs.stop_plan(jobs.STOP_GRACE_S, jobs.STOP_KILL_AFTER_S))

    # --- restarts ------------------------------------------------------------------

    def attempt_output(self) -> list[str]:
        """The last lines this attempt printed (not an earlier attempt's)."""
        path = self._f(jobs.OUTPUT)
        try:
            with boundedread.open_binary(path) as f:
                size = f.seek(0, os.SEEK_END)
                start = max(self.attempt_offset, size - DIAGNOSIS_BYTES)
                f.seek(start)
                data = f.read(size - start)
        except OSError:
            return []
        lines = data.decode("utf-8", "replace").split("\n")
        if start > self.attempt_offset:
            lines = lines[1:]  # cut
        return [ln.rstrip("\r").rsplit("\r", 1)[-1] for ln in lines if ln]

    def diagnose(self, exit_code: int | None, sig: str | None) -> list[dict[str, t.Any]]:
        """Diagnosis of the attempt that just ended (its output, events, exit)."""
        failed = exit_code != 0 or sig is not None
        view = {**self.status, "state": JobState.FAILED.value if failed else JobState.SUCCEEDED.value,
                "alive": False, "exit_code": exit_code, "signal": sig,
                "hang_after_s": self.spec.get("hang_after_s"),
                "expect_tok_s": self.spec.get("expect_tok_s")}
        try:
            events = jobs.tail_events(self._f(jobs.EVENTS), 5)
            return diagnosis.diagnose(output_tail=self.attempt_output(), events=events,
                                      status=view, now=time.time())
        except Exception:  # a diagnosis bug: decide on the exit code alone
            return []

    def decide(self, exit_code: int | None, sig: str | None) -> restart_mod.Decision | None:
        """The restart policy's decision for the attempt that just ended (None: no policy/success)."""
        cancelled = os.path.exists(self._f(jobs.CANCEL))
        if self.hang_decision is not None and not cancelled:
            decision, self.hang_decision = self.hang_decision, None
            return decision
        if self.policy is None or (exit_code == 0 and sig is None):
            return None
        ids = [str(f.get("cause")) for f in self.diagnose(exit_code, sig)]
        return restart_mod.should_restart(ids, exit_code, sig, self.policy, self.attempt, cancelled)

    def record_decision(self, decision: restart_mod.Decision) -> None:
        self.status["restarts"].append({"attempt": self.attempt, "at": time.time(),
                                        "reason": decision.reason, "decision": decision.decision,
                                        "why": decision.why})
        self.status["evidence"] = [*self.status["evidence"],
                                   f"attempt {self.attempt} ended ({decision.reason}): "
                                   f"{decision.decision}: {decision.why}"]

    def between_attempts(self, decision: restart_mod.Decision, wake_r: int) -> str:
        """Record the restart, pause (backoff), then ``restart`` | ``cancelled`` | ``hangup``."""
        self.record_decision(decision)
        ended = self.attempt
        self.attempt += 1
        self.status.update(restarting=True, phase=None, budget_s=None)
        self.write_event({"event": wire.EVENT_RESTART, "attempt": self.attempt,
                          "reason": decision.reason})
        self.history.mark(history_mod.MARK_RESTART, f"attempt {self.attempt}: {decision.reason}")
        self.write_status()
        self.notify(notify.EVENT_RESTART, decision.why)
        pause = restart_mod.backoff_s(ended)
        limit = self.policy.get("max_restarts") if self.policy else None
        sep = "" if self.last_byte == b"\n" else "\n"
        self.record_output(f"{sep}[opsctl] ===== attempt {self.attempt} of {(limit or 0) + 1} "
                           f"({decision.why}; starting in {pause:g} s) =====\n".encode())
        deadline = time.monotonic() + pause
        while True:
            if os.path.exists(self._f(jobs.CANCEL)):
                self.attempt = ended
                self.status["attempt"] = ended
                return "cancelled"
            left = deadline - time.monotonic()
            if left <= 0:
                return "restart"
            ready, _, _ = select.select([wake_r], [], [], min(left, 0.1))
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                if self.handle_signals():
                    return "hangup"

    def on_hang(self, record: dict[str, t.Any]) -> None:
        """The hang watch found the attempt quiet past its budget: notify; restart if the policy says."""
        self.notify(notify.EVENT_HANG, f"no output for {record.get('idle_s')} s: {record.get('summary')}")
        cancelled = os.path.exists(self._f(jobs.CANCEL))
        decision = restart_mod.should_restart([restart_mod.ON_HANG], None, None, self.policy,
                                              self.attempt, cancelled)
        proc = self.proc
        if decision is None or not decision.restart or proc is None:
            return  # the job stays as it is, for `opsctl stacks` / `opsctl stop`
        self.hang_decision = decision
        jobs.escalate(self.spec["job_id"], proc.pid, self.child_ticks, self.cgroup, HANG_RESTART_PLAN)

    def pump(self, proc: subprocess.Popen[bytes], wake_r: int) -> tuple[int | None, str | None] | None:
        """Copy the attempt's output until it ends: ``(exit code, signal name)``; None on SIGHUP."""
        out = proc.stdout
        if out is None:  # unreachable: stdout=PIPE
            raise RuntimeError("child has no stdout pipe")
        rfd = out.fileno()
        exited_at: float | None = None
        while True:
            timeout = STATUS_THROTTLE_S if exited_at is None else DRAIN_AFTER_EXIT_S / 5
            ready, _, _ = select.select([rfd, wake_r], [], [], timeout)
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                if self.handle_signals():
                    return None
            if rfd in ready:
                try:
                    chunk = os.read(rfd, 65536)
                except OSError as exc:
                    if exc.errno != errno.EINTR:
                        raise
                    continue
                if not chunk:
                    break
                self.on_output(chunk)
            if self.dirty:
                self.write_status(force=False)
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at > DRAIN_AFTER_EXIT_S:
                break
        rc = proc.wait()
        out.close()
        if self.redactor:
            held = self.redactor.flush()
            if held:
                self.record_output(held)
        if self.partial:
            self.on_line(self.partial)
            self.partial = b""
        left = self.reap_leftovers(proc.pid)
        if left:
            self.status["evidence"].append(f"killed {len(left)} leftover process(es) of the "
                                           f"job's group: {left}")
        self.last_rc = rc
        if rc < 0:
            return None, jobs.signal_name(-rc)
        return rc, None

    def reap_leftovers(self, pgid: int) -> list[int]:
        """Processes the job left behind after it exited: TERM, then KILL (no orphans).

        Its process group, its cgroup, and the detached ones (``setsid``, double fork)
        that still carry its ``OPSCTL_JOB_ID`` marker (:func:`jobs.marked_processes`).
        """
        job_id, ticks, cgroup = self.spec["job_id"], self.child_ticks, self.cgroup
        left = jobs.job_processes(job_id, pgid, ticks, cgroup)
        if left:
            jobs.escalate(job_id, pgid, ticks, cgroup, jobs.LEFTOVERS_PLAN)
        jobs.cgroup_remove(cgroup)
        return left


class GoodputRefresher:
    """Keeps the run's goodput summary in the job dir fresh for the job itself: the
    trainer's ``--report-to`` trackers log it as scalars (``wire.ENV_GOODPUT_FILE`` names the
    file), since a trainer cannot see its run's earlier attempts and re-deploys.

    The summary is the one ``status`` carries (:func:`remote_payload.agent.verbs.goodput.
    refresh_summary`: one definition of the ledger, one file). It is computed at most every
    ``every_s`` and never with more than ``share`` of one core: the pause after a refresh
    grows with the CPU time that refresh took (:func:`~remote_payload.agent.verbs.goodput.
    refresh_pause`). A failure (a full disk, a bug) costs the scalars, never the job; the
    first one is said in the evidence."""

    def __init__(self, wrapper: Wrapper, *, first_s: float | None = None,
                 every_s: float | None = None, share: float | None = None):
        self.w = wrapper
        self.verb = goodput_verb
        self.first_s = goodput_verb.REFRESH_FIRST_S if first_s is None else first_s
        self.every_s = goodput_verb.REFRESH_EVERY_S if every_s is None else every_s
        self.share = goodput_verb.REFRESH_MAX_SHARE if share is None else share
        self.refreshes = 0
        self.spent_s = 0.0  # CPU seconds of every refresh so far
        self.failed = False

    def run(self, stop: threading.Event) -> None:
        pause = self.first_s
        while not stop.wait(pause):
            pause = self.refresh()

    def refresh(self) -> float:
        """One refresh; returns the pause before the next."""
        w = self.w
        root = os.path.dirname(os.path.dirname(w.path))
        began = time.thread_time()
        try:
            self.verb.refresh_summary(root, w.spec["job_id"], (w.state.value, w.attempt))
            self.refreshes += 1
        except Exception as exc:
            if not self.failed:
                self.failed = True
                with contextlib.suppress(Exception):
                    w.status["evidence"] = [
                        *w.status["evidence"],
                        f"goodput summary not written ({type(exc).__name__}: {exc}); the "
                        "trainer's trackers get no goodput scalars"]
        spent = time.thread_time() - began
        self.spent_s += spent
        return self.verb.refresh_pause(spent, self.every_s, self.share)


class HangWatch:
    """Takes every process's stacks once per quiet spell that outlasts the job's budget."""

    def __init__(self, wrapper: Wrapper):
        self.w = wrapper
        self.taken_for: float | None = None  # the quiet spell (its start) already reported

    def quiet_since(self) -> float | None:
        st = self.w.status
        return st.get("last_output_at") or st.get("started_at")

    def run(self, stop: threading.Event) -> None:
        failed = False
        while not stop.wait(HANG_CHECK_INTERVAL_S):
            try:
                self.check()
            except Exception as exc:  # a watch bug must never take the job down
                if not failed:
                    failed = True
                    with contextlib.suppress(Exception):
                        self.w.status["evidence"] = [
                            *self.w.status["evidence"],
                            f"hang watch failed: {type(exc).__name__}: {exc}"]

    def check(self, now: float | None = None) -> dict[str, t.Any] | None:
        """Take and record the stacks if the job is quiet past its threshold; else None."""
        w = self.w
        since = self.quiet_since()
        if since is None or since == self.taken_for or w.state.is_terminal():
            return None
        now = time.time() if now is None else now
        # the pump thread owns w.status; these reads are single loads of immutable values
        view = {"phase": w.status.get("phase"), "state": w.state.value,
                "budget_s": w.status.get("budget_s"), "hang_after_s": w.spec.get("hang_after_s"),
                "phase_budgets_s": w.spec.get("phase_budgets_s")}
        threshold, why = diagnosis.hang_threshold(view)
        if now - since < threshold or w.proc is None:
            return None
        self.taken_for = since
        armed, unarmed = stacks_mod.armed_pythons(w.proc.pid, w.child_ticks)
        procs = stacks_mod.capture(w.path, armed, timeout=HANG_STACKS_TIMEOUT_S) if armed else []
        saved = (stacks_mod.save(w.path, procs, time.strftime("%Y%m%d-%H%M%S") + "-hang")
                 if procs else None)
        record = {
            "at": now, "quiet_since": since, "idle_s": round(now - since, 1),
            "threshold_s": threshold, "threshold_why": why, "phase": w.status.get("phase"),
            "summary": stacks_mod.summary(procs) if procs else
            f"no stacks: {len(armed)} armed, {len(unarmed)} unarmed python processes",
            "processes": [{k: v for k, v in p.to_dict().items() if k != "dump"} for p in procs],
            "saved_to": saved,
        }
        write_json_atomic(w._f(jobs.HANG), record)
        w.history.mark(history_mod.MARK_HANG, str(record["summary"]), at=now)
        w.on_hang(record)
        return record


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python3 -m remote_payload.agent.wrapper JOB_DIR\n")
        return 2
    path = os.path.abspath(args[0])
    refused = not_startable(path)
    if refused is not None:  # never a second run of a job, never touching its records
        sys.stderr.write(refused + "\n")
        return 2
    try:
        rc = Wrapper(path).run()
    except Exception:
        # a wrapper bug: leave the traceback where status finds it (LOST evidence)
        import traceback

        text = traceback.format_exc()
        sys.stderr.write(text)
        with contextlib.suppress(OSError), open(os.path.join(path, jobs.WRAPPER_ERROR), "w",
                                                encoding="utf-8") as f:
            f.write(text)
        return 70
    advance_queue(path)
    return rc


def not_startable(path: str) -> str | None:
    """Why the job in ``path`` must not run (None: it may). A wrapper runs a job once, from
    PENDING (what ``launch`` and a start from the queue write just before they start it): a
    job that runs, ended, or waits in the queue is never started by a stray wrapper."""
    from remote_payload.agent import jobrecord

    try:
        status = jobrecord.read_status(path, {}) or {}
    except jobrecord.DamagedRecord as exc:
        return f"not started: {exc}"
    state = status.get("state", JobState.PENDING.value)
    if state != JobState.PENDING.value:
        return f"not started: job dir {path} is {state}, not PENDING (a wrapper runs a job once)"
    return None


def advance_queue(path: str) -> None:
    """The job has ended (its restart policy is done): start what waited for it or for its
    GPUs, and cancel its dependants if it failed, with no client connected. A
    failure here is recorded in ``queue_error.txt``; the next agent call advances again."""
    root = os.path.dirname(os.path.dirname(path))
    try:
        from remote_payload.agent import launching

        socket = (read_json(os.path.join(path, jobs.LAUNCH), {}) or {}).get("tmux_socket")
        launching.advance_queue(root, socket or wire.DEFAULT_TMUX_SOCKET)
    except Exception:
        import traceback

        with contextlib.suppress(OSError), open(os.path.join(path, "queue_error.txt"), "w",
                                                encoding="utf-8") as f:
            f.write(traceback.format_exc())


if __name__ == "__main__":
    sys.exit(main())
