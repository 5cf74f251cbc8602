"""The goodput ledger of the real trainer in the sandbox against the schedule the test itself
measured: real CPU torch in container 200, through the real CLI.

One run, in one out-dir: ``opsctl deploy`` starts a job whose restart policy (``failed``
and ``hang``) runs it four times, each attempt with its own fault
(``--debug-fault-plan``): attempt 1 crashes at step 30 (its checkpoint at step 20), attempt 2
resumes from step 20 and crashes at step 28, attempt 3 resumes from step 20 and hangs at
step 25 until the hang watch names it (``phase_budgets_s.training``) and the policy restarts
it, attempt 4 resumes from step 20 and trains until ``opsctl stop`` (its final checkpoint).
A re-deploy of the same command (``--resume auto``), under a new job id, resumes from that
checkpoint and finishes.

While it runs, a watcher reads the job dirs through the container's root file system every
50 ms with the test's own clock: when each job dir appears, when each attempt's process is
recorded, when each step line reaches the output, when each attempt ends (the restart
banner, the exit record). From those instants alone the test derives the seconds each cause
should hold, and ``opsctl goodput --json`` must match every one within 2 s.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from remote_payload import wire
from remote_payload.agent import goodput
from tests.cli_runner import run_cli as run
from tests.paths import REPO
from tests.sandbox_plugin import sandbox_home
from tests.shared_torch import real_cpu_build_in_default_root
from tests.waiting import wait_for
from tests.xdist_plugin import REAL_TORCH_GROUP

pytestmark = [pytest.mark.sandbox, pytest.mark.slow, pytest.mark.xdist_group(REAL_TORCH_GROUP)]

TOLERANCE_S = 2.0
SMOKE = REPO / "opsctl" / "bundled" / "playbooks" / "dflash-cpu-smoke.yaml"
OUT_DIR = "/tmp/opsctl-goodput-trainer"
STEPS = 300
TRAINER = ["python3", "-m", "remote_payload.trainer", "--preset", "tiny", "--device", "cpu",
           "--attn", "sdpa", "--compile", "off", "--steps", str(STEPS), "--warmup-steps", "1",
           "--token-budget", "768", "--seq-buckets", "48,96", "--log-every", "1",
           "--ckpt-every", "20", "--resume", "auto", "--out-dir", OUT_DIR]
#: the first job's attempts: attempt k's fault; the resume step each one starts from
PLAN = "raise@30,raise@28,hang@25,-"
HANG_BUDGET_S = 4.0  # the hang watch names a training phase silent this long
STOP_AFTER_STEP = 35  # attempt 4 is stopped once it has logged this step


@pytest.fixture(scope="module")
def real_build(sandbox, tmp_path_factory: pytest.TempPathFactory) -> None:
    real_cpu_build_in_default_root(sandbox, tmp_path_factory.mktemp("real-build-home"))


def book(tmp_path: Path, name: str, *extra: str, **fields: object) -> Path:
    smoke = yaml.safe_load(SMOKE.read_text())
    doc = {"name": name, "command": [*TRAINER, *extra], "env": {"OMP_NUM_THREADS": "1"},
           "healthy_when": {"event": "step"}, "timeout_s": 300, "torch": smoke["torch"],
           "requirements": smoke["requirements"], **fields}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(doc))
    return path


def jobs_dir() -> Path:
    """The agent's job dirs, seen from this machine (the sandbox's LXC root file system)."""
    return sandbox_home() / "sandbox" / "lxc" / "200" / "rootfs" / "opt" / "opsctl" / "jobs"


class Attempt:
    """What the watcher saw of one attempt, each instant by the test's clock."""

    def __init__(self) -> None:
        self.start: float | None = None  # its process recorded (``pid``)
        self.steps: dict[int, float] = {}  # step -> when its line reached the output
        self.end: float | None = None  # the restart banner, or the job's exit record

    @property
    def first(self) -> float:
        return self.steps[min(self.steps)]

    @property
    def last(self) -> float:
        return self.steps[max(self.steps)]


class Job:
    def __init__(self) -> None:
        self.created: float | None = None
        self.attempts: list[Attempt] = [Attempt()]
        self.offset = 0
        self.partial = b""


class Watcher:
    """Reads the job dirs every :data:`POLL_S` and stamps what changed with the test's clock."""

    POLL_S = 0.05

    def __init__(self, root: Path):
        self.root = root
        self.jobs: dict[str, Job] = {}
        self.before = {p.name for p in root.iterdir()} if root.is_dir() else set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self) -> Watcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)

    def run(self) -> None:
        while not self.stop.wait(self.POLL_S):
            now = time.time()
            for path in self.root.iterdir():
                if (path.name in self.before or path.name.startswith(".") or path.is_symlink()
                        or not path.is_dir()):
                    continue
                job = self.jobs.setdefault(path.name, Job())
                if job.created is None:
                    job.created = now
                self.look(path, job, now)

    def look(self, path: Path, job: Job, now: float) -> None:
        try:
            with (path / "output.log").open("rb") as f:
                f.seek(job.offset)
                data = f.read()
        except OSError:
            data = b""
        job.offset += len(data)
        lines = (job.partial + data).split(b"\n")
        job.partial = lines.pop()
        for line in lines:
            if line.startswith(b"[opsctl] ===== attempt "):
                job.attempts[-1].end = now
                job.attempts.append(Attempt())
                continue
            ev = wire.parse_event(line)
            if ev is not None and ev["event"] == "step" and isinstance(ev.get("step"), int):
                job.attempts[-1].steps.setdefault(ev["step"], now)
        try:
            pid = json.loads((path / "pid").read_text())
        except (OSError, ValueError):
            pid = {}
        if pid.get("pid") and pid.get("attempt") == len(job.attempts):
            current = job.attempts[-1]
            if current.start is None:
                current.start = now
        if (path / "exit_code").exists() and job.attempts[-1].end is None:
            job.attempts[-1].end = now


def schedule(jobs: list[Job], resumes: list[list[int]]) -> dict[str, float]:
    """Seconds per cause, from the watcher's instants alone. ``resumes``: the step each
    attempt resumed from (0: from the start), per job."""
    want = dict.fromkeys(goodput.CAUSES, 0.0)
    flat = [(a, r) for job, rs in zip(jobs, resumes, strict=True)
            for a, r in zip(job.attempts, rs, strict=True)]
    prev_end: float | None = None
    for job in jobs:
        assert job.created is not None
        first = job.attempts[0]
        assert first.start is not None
        want["queue_wait"] += first.start - job.created
        if prev_end is not None:
            want["restart_gap"] += job.created - prev_end
        for i, a in enumerate(job.attempts):
            assert a.start is not None and a.end is not None and a.steps
            if i:
                want["restart_gap"] += a.start - job.attempts[i - 1].end  # type: ignore[operator]
            want["startup"] += a.first - a.start
            want["productive"] += a.last - a.first
        prev_end = job.attempts[-1].end
    for k, (a, _) in enumerate(flat):
        later = [r for _, r in flat[k + 1:]]
        frontier = min(later) if later else None
        if frontier is not None and frontier < max(a.steps):
            # from when it reached the later resume's step (an attempt that resumed there
            # itself: its first step) to its last: computed again later
            lost = a.last - a.steps.get(frontier, a.first)
            want["lost"] += lost
            want["productive"] -= lost
    return want


def test_a_run_with_two_crashes_a_hang_and_a_stop_has_the_ledger_the_test_measured(
        real_build, stopping_target, tmp_path):
    run("exec", "--host", "sandbox", "--ct", "200", "--", "rm", "-rf", OUT_DIR)
    with Watcher(jobs_dir()) as seen:
        res = run("deploy", "--host", "sandbox", "--ct", "200", "--json", "--playbook", str(book(
            tmp_path, "gp-faults", "--debug-fault-plan", PLAN,
            restart={"max_restarts": 3, "on": ["failed", "hang"]},
            phase_budgets_s={"training": HANG_BUDGET_S})))
        assert res.exit_code in (0, 40), res.output  # 40: deploy saw attempt 1 fail
        first = json.loads(res.stdout)["job_id"]
        job = wait_for(lambda: seen.jobs.get(first), what="the first job's dir")
        wait_for(lambda: len(job.attempts) == 4 and STOP_AFTER_STEP in job.attempts[3].steps,
                 timeout=120, what="attempt 4 training past its resume")
        res = run("stop", "--host", "sandbox", "--ct", "200", "--job", first, "-y")
        assert res.exit_code == 0, res.output
        wait_for(lambda: job.attempts[3].end, timeout=60, what="the stopped job's end")
        res = run("deploy", "--host", "sandbox", "--ct", "200", "--json", "--playbook",
                  str(book(tmp_path, "gp-redeploy")))
        assert res.exit_code == 0, res.output
        second = json.loads(res.stdout)["job_id"]
        run("status", "--host", "sandbox", "--ct", "200", "--job", second, "--follow", "--json")
        redeploy = wait_for(lambda: seen.jobs[second].attempts[0].end and seen.jobs[second],
                            timeout=60, what="the re-deploy's end")
    res = run("goodput", second, "--host", "sandbox", "--ct", "200", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["jobs"] == [first, second]
    stopped_at = max(job.attempts[3].steps)
    assert [(a["job_id"], a["start_step"], a["last_step"], a["lost_steps"])
            for a in doc["attempts"]] == [
        (first, 0, 30, 10), (first, 20, 28, 8), (first, 20, 25, 5),
        (first, 20, stopped_at, 0), (second, stopped_at, STEPS, 0)]
    ended = [a["ended"] for a in doc["attempts"]]
    assert ended[2] == "restarted: hang" and ended[4] == "done: finished", ended
    assert ended[3].startswith("done: SIG"), ended  # stopped: its final checkpoint, then done
    assert (doc["crashes"], doc["hangs"], doc["restarts"], doc["redeploys"]) == (2, 1, 3, 1)
    assert doc["surviving_steps"] == STEPS

    want = schedule([job, redeploy], [[0, 20, 20, 20], [stopped_at]])
    # the stalls: each crash's and the hang's last step to the attempt's end
    for a in job.attempts[:3]:
        want["stall"] += a.end - a.last
    # the clean ends: the stopped attempt's and the finished one's last step to their end,
    # which the ledger splits into the final checkpoint and the wind-down
    wind_down = sum(a.end - a.last for a in (job.attempts[3], redeploy.attempts[0]))
    got = doc["causes"]
    print("measured", {k: round(v, 2) for k, v in want.items()}, "wind-down", round(wind_down, 2))
    print("ledger  ", got)
    assert got["shutdown"] + got["checkpoint"] == pytest.approx(wind_down, abs=TOLERANCE_S)
    assert got["checkpoint"] < TOLERANCE_S  # the tiny preset's checkpoints: milliseconds
    for cause in ("productive", "startup", "stall", "lost", "restart_gap", "queue_wait"):
        assert got[cause] == pytest.approx(want[cause], abs=TOLERANCE_S), (cause, got, want)
    assert got["compile"] == 0 and got["unknown"] == 0, doc["unknown"]
    assert doc["wall_s"] == pytest.approx(redeploy.attempts[0].end - job.created,
                                          abs=TOLERANCE_S)
    assert sum(got.values()) == pytest.approx(doc["wall_s"], abs=0.01)
    # the hang's stall is the hang watch's budget and the restart plan's escalation, at least
    assert got["stall"] > HANG_BUDGET_S
    res = run("status", "--host", "sandbox", "--ct", "200", "--job", second)
    line = next(x for x in res.output.splitlines() if x.startswith("goodput "))
    assert "(2 crashes, 1 hang)" in line, line
