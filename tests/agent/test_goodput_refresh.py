"""The job's wrapper keeps its run's goodput summary fresh in the job dir, for the trainer's
``--report-to`` scalars: the same summary ``status`` carries (one ledger, one file), written
at a bounded rate and with a bounded share of one core, and a failure to write it costs the
scalars, never the job."""

from __future__ import annotations

import json
import os
import threading
import time
import types
from pathlib import Path

import pytest

from remote_payload.agent import goodput
from remote_payload.agent import jobstore as jobs
from remote_payload.agent.verbs import goodput as goodput_verb
from remote_payload.agent.wrapper import GoodputRefresher
from remote_payload.wire import JobState
from tests.agent.test_goodput_ledger import JOB_B, scripted_run


def fake_wrapper(root: Path, job_id: str) -> types.SimpleNamespace:
    """What the refresher reads of its wrapper: the job dir, the job id, state and attempt,
    and the status it adds evidence to."""
    return types.SimpleNamespace(path=str(root / "jobs" / job_id), spec={"job_id": job_id},
                                 state=JobState.SUCCEEDED, attempt=2,
                                 status={"evidence": []})


def summary_file(root: Path, job_id: str) -> dict:
    return json.loads((root / "jobs" / job_id / goodput_verb.SUMMARY_CACHE).read_text())


def test_a_refresh_writes_the_summary_status_carries(tmp_path: Path) -> None:
    scripted_run(tmp_path)
    refresher = GoodputRefresher(fake_wrapper(tmp_path, JOB_B))  # type: ignore[arg-type]
    pause = refresher.refresh()
    assert pause == goodput_verb.REFRESH_EVERY_S
    doc = summary_file(tmp_path, JOB_B)
    run = next(r for r in goodput_verb.group_runs(str(tmp_path)) if JOB_B in r.job_ids)
    whole = goodput_verb.document(str(tmp_path), run, doc["at"])
    assert doc["summary"] == {"run_id": whole["run_id"], **goodput.summary(whole)}
    assert doc["moment"] == ["SUCCEEDED", 2]
    # status reuses that very file (its moment and records unchanged)
    assert goodput_verb.status_summary(str(tmp_path), JOB_B, ("SUCCEEDED", 2)) == doc["summary"]
    assert refresher.refreshes == 1 and refresher.w.status["evidence"] == []


def test_a_later_refresh_shows_what_the_run_did_since(tmp_path: Path) -> None:
    script = scripted_run(tmp_path)
    refresher = GoodputRefresher(fake_wrapper(tmp_path, JOB_B))  # type: ignore[arg-type]
    refresher.refresh()
    before = summary_file(tmp_path, JOB_B)
    # a checkpoint that blocked training for 5 s, in the file after the first refresh (in its
    # place by time: the wrapper stamps each line as it writes it)
    events = tmp_path / "jobs" / JOB_B / jobs.EVENTS
    lines = events.read_text().splitlines()
    at = script.t - 12.0
    place = next(i for i, ln in enumerate(lines) if json.loads(ln)["_at"] > at)
    lines.insert(place, json.dumps({"event": "checkpoint", "step": 280, "blocked_s": 5.0,
                                    "_at": at}))
    events.write_text("\n".join(lines) + "\n")
    refresher.refresh()
    after = summary_file(tmp_path, JOB_B)
    assert after["at"] > before["at"]
    assert after["summary"]["causes"]["checkpoint"] == pytest.approx(
        before["summary"]["causes"]["checkpoint"] + 5.0, abs=0.01)


@pytest.mark.parametrize("spent", [0.0, 0.1, 0.6, 2.0, 30.0])
def test_the_pause_after_a_refresh_keeps_it_within_its_share_of_a_core(spent: float) -> None:
    pause = goodput_verb.refresh_pause(spent)
    assert pause >= goodput_verb.REFRESH_EVERY_S
    assert spent / (spent + pause) <= goodput_verb.REFRESH_MAX_SHARE


def test_a_refresher_left_running_spends_at_most_its_share_of_a_core(tmp_path: Path) -> None:
    scripted_run(tmp_path)
    refresher = GoodputRefresher(fake_wrapper(tmp_path, JOB_B),  # type: ignore[arg-type]
                                 first_s=0.0, every_s=0.01, share=0.2)
    stop = threading.Event()
    began = time.monotonic()
    thread = threading.Thread(target=refresher.run, args=(stop,))
    thread.start()
    time.sleep(2.0)  # scenario: the refresher runs on its own for two seconds
    stop.set()
    thread.join(5)
    elapsed = time.monotonic() - began
    assert refresher.refreshes >= 2, refresher.refreshes
    # the last refresh may have begun just before the stop: one refresh of slack
    last = refresher.spent_s / refresher.refreshes
    assert refresher.spent_s - last <= 0.2 * elapsed, (refresher.spent_s, elapsed)


def test_a_summary_that_cannot_be_written_is_said_once_and_the_job_goes_on(tmp_path: Path) -> None:
    scripted_run(tmp_path)
    target = tmp_path / "elsewhere.json"
    target.write_text("mine")
    os.symlink(target, tmp_path / "jobs" / JOB_B / goodput_verb.SUMMARY_CACHE)  # planted
    wrapper = fake_wrapper(tmp_path, JOB_B)
    refresher = GoodputRefresher(wrapper)  # type: ignore[arg-type]
    assert refresher.refresh() == goodput_verb.REFRESH_EVERY_S
    assert refresher.refresh() == goodput_verb.REFRESH_EVERY_S
    assert target.read_text() == "mine"  # never written through the link
    (said,) = wrapper.status["evidence"]
    assert said.startswith("goodput summary not written") and "no goodput scalars" in said
    assert refresher.refreshes == 0


def test_status_never_reuses_a_summary_made_before_the_run_had_a_goodput(tmp_path: Path) -> None:
    """A status at a job's first instant finds no wall time yet (goodput None); the next one,
    within the cache's age and at the same moment, computes the ratio instead of reusing
    that (the dashboard's ``opsctl_run_goodput_ratio`` would be missing for 30 s)."""
    scripted_run(tmp_path)
    moment = ("SUCCEEDED", 2)
    doc = goodput_verb.status_summary(str(tmp_path), JOB_B, moment)
    assert doc is not None and doc["goodput"] is not None
    cache = tmp_path / "jobs" / JOB_B / goodput_verb.SUMMARY_CACHE
    young = json.loads(cache.read_text())
    young["summary"] = {**young["summary"], "goodput": None}
    cache.write_text(json.dumps(young))
    assert goodput_verb.status_summary(str(tmp_path), JOB_B, moment) == doc
