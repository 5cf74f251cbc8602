"""The goodput ledger against a scripted run whose schedule is known to the second.

A :class:`Script` writes the job dirs a real run leaves (``spec.json``, ``status.json``,
``events.jsonl`` with the wrapper's ``_at`` stamps) while it advances its own clock, and
adds every second it spends to the cause the schedule says it is. The run: a job that
crashes, restarts by policy and resumes from an older checkpoint, hangs (a stall) and is
restarted for it, is stopped (final checkpoint), then is re-deployed under a new job id that
resumes, crashes a second time, resumes from an older checkpoint again and finishes. The
agent's ``goodput`` verb (a real agent process) must give each cause within 2 s.
"""

from __future__ import annotations

import json
import typing as t
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload.agent import goodput
from tests.agent_helper import run_agent

T0 = 1_790_000_000.0
TOLERANCE_S = 2.0
JOB_A, JOB_B, JOB_C = "train-20261203-100000-aaaa", "train-20261203-120000-bbbb", \
    "other-20261203-110000-cccc"


class Script:
    """A run's schedule: a clock, the events it writes, and the seconds per cause."""

    def __init__(self, root: Path, out_dir: str = "runs/x"):
        self.root, self.out_dir = root, out_dir  # as the trainer names a resume's checkpoint
        self.t = T0
        self.expect: Counter[str] = Counter()
        self.events: list[dict[str, t.Any]] = []
        # (attempt key, step, seconds) of every productive step, for the lost-progress rule
        self.productive: list[tuple[int, int, float]] = []
        self.attempt_key = 0
        self.last_event_step: dict[int, int] = {}

    def wait(self, cause: str, seconds: float) -> None:
        self.t += seconds
        self.expect[cause] += seconds

    def event(self, kind: str, **fields: t.Any) -> None:
        self.events.append({"event": kind, **fields, "_at": round(self.t, 6)})

    def start_attempt(self, startup_s: float, resume_step: int | None) -> int:
        """Process start to the first optimizer step (the first step is start-up's last)."""
        self.attempt_key += 1
        marks = {"pg_ready_at": 1.0, "target_built_at": 4.0, "drafter_built_at": 6.0}
        self.event("phase", phase="loading")
        if resume_step is not None:  # stamped when written: after the phase line
            self.t += 7.0
            self.event("resume", step=resume_step, path=f"{self.out_dir}/ckpt-{resume_step:07d}",
                       from_run="r1")
            self.t -= 7.0
            marks["resumed_at"] = 7.0
            self.lose_after(resume_step)
        self.wait("startup", startup_s)
        self.event("startup", **marks, first_step_at=startup_s, drafter_compile_s=3.0)
        return (resume_step or 0) + 1

    def lose_after(self, step: int) -> None:
        """A resume from ``step``: earlier attempts' reported progress past it is lost."""
        for i, (key, s, secs) in enumerate(self.productive):
            if s > step and s <= self.last_event_step.get(key, -1):
                self.expect["productive"] -= secs
                self.expect["lost"] += secs
                self.productive[i] = (key, -1, secs)  # counted once

    def train(self, first: int, last: int, *, compile_after: dict[int, float] | None = None,
              ckpt_every: int = 50, ckpt_s: float = 2.0, tok_s: float = 1000.0) -> None:
        """Steps ``first + 1 .. last`` at 1 s each (``first`` ended with start-up); a step
        event every 10 steps, a periodic checkpoint (blocked ``ckpt_s``) every 50."""
        self.event("phase", phase="training", step=first, steps=300)
        for step in range(first + 1, last + 1):
            self.wait("productive", 1.0)
            self.productive.append((self.attempt_key, step, 1.0))
            if step % 10 == 0:
                self.event("step", step=step, loss=1.0, tok_s=tok_s)
                self.last_event_step[self.attempt_key] = step
            if compile_after and step in compile_after:
                self.wait("compile", compile_after[step])
                self.event("compile", name="drafter_step", seconds=compile_after[step])
            if step % ckpt_every == 0:
                self.wait("checkpoint", ckpt_s)
                self.event("checkpoint", step=step, path=f"ckpt-{step}", blocked_s=ckpt_s)

    def restart(self, attempt: int, reason: str) -> dict[str, t.Any]:
        self.event("restart", attempt=attempt, reason=reason)
        return {"attempt": attempt - 1, "at": self.t, "reason": reason, "decision": "restart",
                "why": f"restart {attempt - 1} after {reason}"}

    def write_job(self, job_id: str, out_dir: str, created: float, started: float,
                  ended: float, state: str, restarts: list[dict[str, t.Any]]) -> None:
        path = self.root / "jobs" / job_id
        path.mkdir(parents=True)
        spec = {"job_id": job_id, "name": "train", "workdir": "/w", "expect_tok_s": 1200,
                "command": ["python3", "-m", "remote_payload.trainer", "--out-dir", out_dir,
                            "--resume", "auto", "--ckpt-every", "50"]}
        (path / "spec.json").write_text(json.dumps(spec))
        (path / "status.json").write_text(json.dumps({
            "job_id": job_id, "state": state, "created_at": created, "started_at": started,
            "ended_at": ended, "restarts": restarts, "attempt": len(restarts) + 1,
            "transitions": [["PENDING", created, "launched"]]}))
        with (path / "events.jsonl").open("w") as f:
            for ev in self.events:
                f.write(json.dumps(ev) + "\n")
        self.events = []


def scripted_run(root: Path) -> Script:
    s = Script(root)
    # job A: created, waits 3 s for its start
    a_created = s.t
    s.wait("queue_wait", 3.0)
    a_started = s.t
    restarts = []
    # attempt 1: trains 1..70, crashes 5.5 s after its last step event (crash 1)
    s.train(s.start_attempt(20.0, None), 70)
    s.wait("stall", 5.5)
    restarts.append(s.restart(2, "python_exception"))
    s.wait("restart_gap", 1.0)  # the policy's backoff
    # attempt 2: resumes from ckpt-50 (steps 51..70 are lost), recompiles once, then hangs
    s.train(s.start_attempt(15.0, 50), 160, compile_after={80: 4.0})
    s.wait("stall", 40.0)  # silent until the hang watch names it
    restarts.append(s.restart(3, "hang"))
    s.wait("restart_gap", 2.0)
    # attempt 3: resumes from ckpt-150 (151..160 lost), is stopped after step 230
    s.train(s.start_attempt(15.0, 150), 230)
    s.wait("checkpoint", 3.0)
    s.event("checkpoint", step=230, path="ckpt-230", seconds=3.0)
    s.wait("shutdown", 1.0)
    s.event("done", step=230, reason="SIGINT", ckpt_s=3.0, shutdown_s=4.0)
    s.wait("shutdown", 0.5)
    s.write_job(JOB_A, "runs/x", a_created, a_started, s.t, "CANCELLED", restarts)
    # a job of another run, in between: never part of this ledger
    other = Script(root)
    other.t = s.t + 1.0
    other.train(other.start_attempt(5.0, None), 40)
    other.write_job(JOB_C, "/elsewhere", s.t + 1.0, s.t + 1.0, other.t, "SUCCEEDED", [])
    # the re-deploy: job B, 10 s later, 2 s to start; resumes from ckpt-230
    s.wait("restart_gap", 10.0)
    b_created = s.t
    s.wait("queue_wait", 2.0)
    b_started = s.t
    restarts = []
    s.train(s.start_attempt(12.0, 230), 270)  # crash 2, 2 s after step 270
    s.wait("stall", 2.0)
    restarts.append(s.restart(2, "exit 1"))
    s.wait("restart_gap", 1.0)
    s.train(s.start_attempt(12.0, 250), 300)  # 251..270 lost; finishes
    s.wait("checkpoint", 3.0)
    s.event("checkpoint", step=300, path="ckpt-300", seconds=3.0)
    s.wait("shutdown", 0.3)
    s.event("done", step=300, reason="finished", ckpt_s=3.0, shutdown_s=3.3)
    s.wait("shutdown", 0.2)
    s.write_job(JOB_B, "/w/runs/x", b_created, b_started, s.t, "SUCCEEDED", restarts)
    return s


@pytest.fixture
def run_root(tmp_path: Path) -> tuple[Path, Script]:
    return tmp_path, scripted_run(tmp_path)


def test_each_cause_matches_the_scripted_schedule_within_two_seconds(run_root):
    root, script = run_root
    doc = run_agent(root, "goodput", "--job", JOB_B).data
    assert doc["jobs"] == [JOB_A, JOB_B]
    assert doc["out_dir"] == "/w/runs/x"
    wall = script.t - T0
    assert doc["wall_s"] == pytest.approx(wall, abs=0.01)
    for cause in goodput.CAUSES:
        assert doc["causes"][cause] == pytest.approx(script.expect[cause], abs=TOLERANCE_S), \
            (cause, doc["causes"], dict(script.expect))
    assert sum(doc["causes"].values()) == pytest.approx(wall, abs=0.01)
    assert doc["goodput"] == pytest.approx(script.expect["productive"] / wall, abs=0.01)


def test_the_ledger_counts_crashes_restarts_and_redeploys(run_root):
    root, _ = run_root
    doc = run_agent(root, "goodput", "--run", JOB_A).data
    assert (doc["crashes"], doc["hangs"], doc["restarts"], doc["redeploys"]) == (2, 1, 3, 1)
    assert [a["lost_steps"] for a in doc["attempts"]] == [20, 10, 0, 20, 0]
    assert doc["attempts"][0]["startup"][0] == {"phase": "pg_ready", "seconds": 1.0}
    assert doc["surviving_steps"] == 300
    assert doc["ended_at"] is not None and doc["eta_s"] == 0
    assert sum(sum(a["causes"].values()) for a in doc["attempts"]) == pytest.approx(
        doc["wall_s"], abs=0.01)


def test_the_effective_rate_counts_surviving_tokens_over_the_wall_time(run_root):
    root, script = run_root
    doc = run_agent(root, "goodput", "--job", JOB_A).data
    # every step window reports 1000 tok/s against an expected 1200: all productive time
    # is slow, and the surviving tokens are its productive seconds at 1000 tok/s
    assert doc["effective_tok_s"] == pytest.approx(
        1000 * script.expect["productive"] / doc["wall_s"], rel=0.05)
    assert doc["slow_s"] == pytest.approx(script.expect["productive"], abs=TOLERANCE_S * 5)


def test_another_out_dir_is_another_run(run_root):
    root, _ = run_root
    doc = run_agent(root, "goodput", "--job", JOB_C).data
    assert doc["jobs"] == [JOB_C]
    assert doc["crashes"] == 0


def test_a_job_that_trains_from_step_zero_in_the_same_out_dir_starts_a_new_run(run_root):
    root, _ = run_root
    s = Script(root)
    s.t = T0 + 10_000
    s.train(s.start_attempt(5.0, None), 20)
    s.event("done", step=20, reason="finished")
    s.write_job("train-20261203-180000-dddd", "/w/runs/x", T0 + 10_000, T0 + 10_000, s.t,
                "SUCCEEDED", [])
    doc = run_agent(root, "goodput", "--job", "train-20261203-180000-dddd").data
    assert doc["jobs"] == ["train-20261203-180000-dddd"]


def test_damaged_event_lines_are_counted_and_never_break_the_ledger(run_root):
    root, _ = run_root
    with (root / "jobs" / JOB_A / "events.jsonl").open("ab") as f:
        f.write(b'{"event": "step", "step": 1e999, "_at": "soon"}\n\xff\xfe\n[1,2]\n{"event":')
    doc = run_agent(root, "goodput", "--job", JOB_A).data
    assert doc["damaged_lines"] == 4
    assert any("damaged" in u for u in doc["unknown"])
    assert sum(doc["causes"].values()) == pytest.approx(doc["wall_s"], abs=0.01)


def test_missing_events_leave_the_time_unknown_never_guessed(run_root):
    root, _ = run_root
    (root / "jobs" / JOB_A / "events.jsonl").unlink()
    doc = run_agent(root, "goodput", "--job", JOB_B).data
    assert doc["causes"]["unknown"] > 100
    assert doc["unknown"]
    assert sum(doc["causes"].values()) == pytest.approx(doc["wall_s"], abs=0.01)


def test_status_carries_the_runs_ledger_in_brief_and_jobs_a_column(run_root):
    root, script = run_root
    status = run_agent(root, "status", "--job", JOB_B).data
    brief = status["goodput"]
    assert brief["run_id"] == JOB_A
    assert brief["goodput"] == pytest.approx(script.expect["productive"] / (script.t - T0),
                                             abs=0.01)
    rows = {r["job_id"]: r for r in run_agent(root, "jobs").data["jobs"]}
    assert 0 < rows[JOB_B]["goodput"] <= 1


def test_an_unknown_run_is_a_typed_error(run_root):
    root, _ = run_root
    reply = run_agent(root, "goodput", "--run", "no-such-run").reply
    assert reply["ok"] is False and reply["error"]["type"] == "NoSuchJob"


def test_an_events_file_that_is_a_link_a_fifo_or_an_overlong_line_is_damaged_not_read(
        run_root, tmp_path):
    import os

    root, _ = run_root
    events = root / "jobs" / JOB_A / "events.jsonl"
    secret = tmp_path / "secret.jsonl"
    secret.write_text(events.read_text())
    events.unlink()
    events.symlink_to(secret)  # someone else's file: never followed
    doc = run_agent(root, "goodput", "--job", JOB_A).data
    assert doc["damaged_lines"] == 1 and doc["attempts"][0]["last_step"] == 0
    events.unlink()
    os.mkfifo(events)  # would block a plain open forever
    assert run_agent(root, "goodput", "--job", JOB_A, timeout=30).data["damaged_lines"] == 1
    events.unlink()
    with events.open("wb") as f:
        f.write(b'{"event": "step", "pad": "' + b"x" * (goodput.MAX_LINE_CHARS * 3) + b'"}\n')
        f.write(secret.read_bytes())
    doc = run_agent(root, "goodput", "--job", JOB_A).data
    assert doc["damaged_lines"] == 1 and doc["crashes"] == 2


def test_a_link_or_fifo_planted_as_the_status_cache_is_no_cache_and_never_blocks(run_root,
                                                                                  tmp_path):
    import os

    root, _ = run_root
    cache = root / "jobs" / JOB_B / "goodput-summary.json"
    fake = tmp_path / "fake.json"
    fake.write_text(json.dumps({"at": 9e99, "moment": [], "summary": {"goodput": 1.0}}))
    cache.symlink_to(fake)
    assert run_agent(root, "status", "--job", JOB_B).data["goodput"]["goodput"] < 1.0
    cache.unlink()
    os.mkfifo(cache)
    assert run_agent(root, "status", "--job", JOB_B, timeout=30).data["goodput"]["run_id"] == JOB_A


def _finished_job(root: Path, job_id: str, out_dir: str, at: float, steps: int,
                  resume: int | None = None) -> None:
    s = Script(root, out_dir)
    s.t = at
    s.train(s.start_attempt(5.0, resume), steps)
    s.event("done", step=steps, reason="finished")
    s.write_job(job_id, out_dir, at, at, s.t, "SUCCEEDED", [])


def test_a_job_created_while_the_runs_last_job_still_ran_is_a_run_of_its_own(tmp_path):
    """Two trainers on one out-dir at once (the second resumed from the first's checkpoint
    while the first still trained): two runs, never one ledger that overlaps them."""
    first, second = "train-20261203-100000-aaaa", "train-20261203-100200-bbbb"
    _finished_job(tmp_path, first, "/o", T0, 300)
    _finished_job(tmp_path, second, "/o", T0 + 100, 200, resume=50)
    doc = run_agent(tmp_path, "goodput", "--job", second).data
    assert doc["jobs"] == [second] and doc["surviving_steps"] == 150
    assert doc["unknown"][0] == (f"job {second} shares the out-dir of run {first} but it was "
                                 f"created while job {first} still ran (two trainers at once): "
                                 "a run of its own")
    assert run_agent(tmp_path, "goodput", "--job", first).data["jobs"] == [first]


def test_a_job_that_resumed_from_another_runs_checkpoint_is_a_run_of_its_own(tmp_path):
    first, second = "train-20261203-100000-aaaa", "train-20261203-120000-bbbb"
    _finished_job(tmp_path, first, "/p", T0, 100)
    s = Script(tmp_path, "/elsewhere")  # --resume /elsewhere/ckpt-0005000 into /p
    s.t = T0 + 10_000
    s.train(s.start_attempt(5.0, 5000), 5100)
    s.event("done", step=5100, reason="finished")
    s.write_job(second, "/p", T0 + 10_000, T0 + 10_000, s.t, "SUCCEEDED", [])
    doc = run_agent(tmp_path, "goodput", "--job", second).data
    assert doc["jobs"] == [second] and doc["surviving_steps"] == 100
    assert doc["causes"]["restart_gap"] == 0
    assert doc["unknown"][0] == (f"job {second} shares the out-dir of run {first} but it "
                                 "resumed from '/elsewhere/ckpt-0005000', outside that out-dir: "
                                 "a run of its own")


@settings(max_examples=200, deadline=None)
@given(path=st.one_of(st.text(max_size=300), st.integers(), st.none()),
       workdir=st.one_of(st.text(max_size=40), st.none()))
def test_whatever_a_resume_event_names_as_its_path_the_grouping_never_raises(path, workdir):
    from remote_payload.agent.verbs import goodput as verb

    prev = verb.Run("a", None, "/o", ["a"], [{}], [{"state": "SUCCEEDED", "ended_at": T0}])
    why = verb._apart("/nonexistent", prev, {"workdir": workdir}, "/o", T0 + 10,
                      {"event": "resume", "path": path, "_at": T0 + 11})
    assert isinstance(why, str) and "\n" not in why.replace(str(path), "")


def test_a_runs_step_events_are_held_in_a_few_hundred_bytes_each(tmp_path):
    """A ledger holds every step event of the run at once (the job's wrapper computes it, in
    its own long-lived process): only the fields it reads are kept, ~320 bytes an event,
    where the whole lines took ~1,000 (1.2 GB for 10**6 step events)."""
    import tracemalloc

    from remote_payload.agent.verbs import goodput as verb

    path = tmp_path / "events.jsonl"
    with path.open("w") as f:
        for i in range(1, 20_001):
            f.write(json.dumps({"event": "step", "step": i, "loss": 1.0, "acc": 0.5,
                                "tok_s": 1000.0, "eta_s": 1.0, "lr": 5e-4, "budget_s": 30.0,
                                "_at": T0 + i}) + "\n")
    tracemalloc.start()
    try:
        events, damaged = verb.read_events(str(path))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(events) == 20_000 and damaged == 0
    assert events[-1] == {"event": "step", "_at": T0 + 20_000, "step": 20_000, "tok_s": 1000.0}
    assert held / len(events) < 500, held
