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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import typing as t

from remote_payload import wire
from remote_payload.agent import diagnosis, gpus, outindex
from remote_payload.agent import history as history_mod
from remote_payload.agent import jobstore as jobs
from remote_payload.agent import stacks as stacks_mod
from remote_payload.agent.common import read_json, write_json_atomic

JobState = wire.JobState

STATUS_THROTTLE_S = 0.5  # status.json is rewritten at most this often for mere output
DRAIN_AFTER_EXIT_S = 0.5  # read what grandchildren still hold open, then stop
MAX_LINE = 1 << 20  # a "line" longer than this is judged as it is (progress bars, binary)
PR_SET_PDEATHSIG = 1
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


def _die_with_parent() -> None:
    """In the child: own process group (``process_group=0`` needs 3.11; containers may have
    3.10), and SIGKILL if the wrapper dies (best effort, Linux only)."""
    os.setpgid(0, 0)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def _child_setup(cgroup: str | None) -> None:
    """In the child: :func:`_die_with_parent`, then join the job's cgroup (before exec, so
    every process the job ever starts is in it; best effort)."""
    _die_with_parent()
    if cgroup is not None:
        try:
            fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError:
            pass


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
            self.status["healthy"] = True
        if new.is_terminal():
            self.history.mark(history_mod.MARK_END, f"{new.value}: {why}")
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
                with contextlib.suppress(OSError):
                    os.unlink(f"{path}.tmp.{os.getpid()}")
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
        self.out_index.note(time.time(), self.log_fd)
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
        try:
            self.events.write(json.dumps(ev, separators=(",", ":")) + "\n")
            self.events.flush()
        except OSError as exc:  # disk full: the event still moves the state below
            self.disk_error(jobs.EVENTS, exc)
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
        return env

    def record_pid(self, pid: int | None, started_at: float | None) -> None:
        me = os.getpid()
        self.write_record(jobs.PID, critical=True, obj={
            "wrapper_pid": me, "wrapper_start_ticks": jobs.start_ticks(me),
            "pid": pid, "pgid": pid, "start_ticks": self.child_ticks, "started_at": started_at,
            "argv": self.launch.get("argv") or self.spec["command"], "cgroup": self.cgroup,
        })

    def finish(self, exit_code: int | None, sig: str | None, why: str,
               error: str | None = None) -> None:
        now = time.time()
        rec = {"exit_code": exit_code, "signal": sig, "ended_at": now, "error": error}
        self.write_record(jobs.EXIT_CODE, rec, critical=True)
        cancelled = os.path.exists(self._f(jobs.CANCEL))
        self.status.update(exit_code=exit_code, signal=sig, ended_at=now)
        self.status["evidence"] = [*self.status["evidence"], why]
        final = jobs.final_state(rec, cancelled)
        self.advance(final, why + (" after cancel was requested" if cancelled else ""))
        self.write_status()
        self.history.flush(force=True)
        self.to_pane(f"\r\n[opsctl] job {self.spec['job_id']} {final.value}: {why}\r\n".encode())

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
        self.advance(JobState.LOST, why)
        self.write_status()
        self.history.flush(force=True)

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda s, _f: self.pending_signals.append(s))
        with contextlib.suppress(OSError):
            fl = fcntl.fcntl(1, fcntl.F_GETFL)
            fcntl.fcntl(1, fcntl.F_SETFL, fl | os.O_NONBLOCK)

        if os.path.exists(self._f(jobs.CANCEL)):
            self.record_pid(None, None)
            self.finish(None, None, "cancelled before it started")
            return 0
        argv = self.launch.get("argv") or jobs.job_argv(self.spec)
        self.cgroup = cgroup = jobs.job_cgroup_create(self.spec["job_id"])
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                cwd=self.spec.get("workdir") or None, env=self.child_env(),
                preexec_fn=lambda: _child_setup(cgroup))
        except OSError as exc:
            msg = f"[opsctl] cannot start {argv[0]!r}: {exc}\n"
            self.on_output(msg.encode())
            self.record_pid(None, None)
            self.finish(127, None, f"could not start: {exc}", error=str(exc))
            return 127
        self.proc = proc
        started = time.time()
        self.child_ticks = jobs.start_ticks(proc.pid)
        self.record_pid(proc.pid, started)
        self.status["started_at"] = started
        # one write for both steps: launch returns the first non-PENDING status it sees
        self.advance(JobState.SETTING_UP, f"pid {proc.pid} started", write=False)
        if self.healthy_when.get("started"):
            self.advance(JobState.RUNNING, "healthy_when started", write=False)
        self.write_status()
        # started after the fork above: preexec_fn is only safe without other threads
        stop_sampling = threading.Event()
        threading.Thread(target=gpus.sample_forever, name="gpu-sampler", daemon=True,
                         args=(self._f(gpus.SAMPLE_FILE), stop_sampling),
                         kwargs={"on_sample": self.history.on_gpus}).start()
        threading.Thread(target=self.history.run, name="history", daemon=True,
                         args=(stop_sampling,)).start()
        threading.Thread(target=HangWatch(self).run, name="hang-watch", daemon=True,
                         args=(stop_sampling,)).start()
        try:
            return self.pump(proc, wake_r)
        finally:
            stop_sampling.set()

    def pump(self, proc: subprocess.Popen[bytes], wake_r: int) -> int:
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
                    self.hang_up()
                    return 129
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
        if self.partial:
            self.on_line(self.partial)
            self.partial = b""
        left = self.reap_leftovers(proc.pid)
        if left:
            self.status["evidence"].append(f"killed {len(left)} leftover process(es) of the "
                                           f"job's group: {left}")
        if rc < 0:
            name = jobs.signal_name(-rc)
            self.finish(None, name, f"killed by {name}")
            return 128 - rc
        self.finish(rc, None, f"exited with code {rc}")
        return rc

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
        return record


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python3 -m remote_payload.agent.wrapper JOB_DIR\n")
        return 2
    path = os.path.abspath(args[0])
    try:
        return Wrapper(path).run()
    except Exception:
        # a wrapper bug: leave the traceback where status finds it (LOST evidence)
        import traceback

        text = traceback.format_exc()
        sys.stderr.write(text)
        with contextlib.suppress(OSError), open(os.path.join(path, jobs.WRAPPER_ERROR), "w",
                                                encoding="utf-8") as f:
            f.write(text)
        return 70


if __name__ == "__main__":
    sys.exit(main())
