"""``jobs/current`` is the agent's own file (a job id, renamed into place): whatever else is
put there is refused at once, as a damaged record, without being waited on, followed or
shown. Run as the real agent (``python3 -m remote_payload.agent``) under each test's own
``--root``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from remote_payload import wire
from tests.agent_helper import run_agent

SECRET = "TOKEN-5f1c-do-not-show"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root" / "jobs").mkdir(parents=True)
    return tmp_path / "root"


def refused(root: Path, verb: str = "status") -> dict:
    run = run_agent(root, verb, timeout=25)
    assert run.wall_s < 10, f"{verb} waited {run.wall_s:.1f} s on jobs/current"
    reply = run.reply
    assert reply["ok"] is False, reply
    assert reply["error"]["type"] == wire.ErrorType.DamagedRecord.value, reply
    assert reply["error"]["fields"]["path"].endswith("jobs/current")
    assert SECRET not in json.dumps(reply)
    return reply


def test_a_fifo_at_jobs_current_is_refused_at_once_not_waited_on(root: Path):
    os.mkfifo(root / "jobs" / "current")
    reply = refused(root)
    assert "not a regular file" in reply["error"]["message"]


def test_a_link_at_jobs_current_is_refused_and_its_target_never_shown(root: Path, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    (root / "jobs" / "current").symlink_to(secret)
    reply = refused(root)
    assert "symbolic link" in reply["error"]["message"]


def test_a_link_to_a_job_id_shaped_file_is_still_refused(root: Path, tmp_path):
    (tmp_path / "other").write_text("job-1\n")
    (root / "jobs" / "current").symlink_to(tmp_path / "other")
    refused(root)


def test_text_that_is_no_job_id_is_refused_without_being_shown(root: Path):
    (root / "jobs" / "current").write_text(f"root:x:0:0:{SECRET}:/root:/bin/bash\n")
    reply = refused(root)
    assert "does not hold a job id" in reply["error"]["message"]


def test_a_huge_jobs_current_is_refused_naming_the_cap(root: Path):
    (root / "jobs" / "current").write_bytes(b"j" * (1 << 20))
    reply = refused(root)
    assert "larger than" in reply["error"]["message"]


def test_a_device_at_jobs_current_is_refused(root: Path):
    (root / "jobs" / "current").symlink_to("/dev/zero")
    refused(root)
    (root / "jobs" / "current").unlink()


def test_no_jobs_current_is_no_current_job(root: Path):
    reply = run_agent(root, "status", timeout=25).reply
    assert reply["ok"] is False and reply["error"]["type"] == wire.ErrorType.NoSuchJob.value


def test_the_jobs_list_is_still_given_with_a_damaged_jobs_current_listed(root: Path, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    (root / "jobs" / "current").symlink_to(secret)
    run = run_agent(root, "jobs", timeout=25)
    data = run.data
    assert data["current"] is None
    assert [d["path"].endswith("jobs/current") for d in data["damaged"]] == [True]
    assert SECRET not in json.dumps(run.reply)


def test_env_still_answers_with_a_fifo_at_jobs_current(root: Path):
    os.mkfifo(root / "jobs" / "current")
    run = run_agent(root, "env", timeout=25)
    assert run.wall_s < 10 and run.data["current_job"] is None


@pytest.mark.parametrize("plant", ["link", "fifo", "dir", "text"])
def test_a_refused_jobs_current_says_left_as_it_is_once(root: Path, tmp_path, plant):
    current = root / "jobs" / "current"
    if plant == "link":
        current.symlink_to(tmp_path / "elsewhere")
    elif plant == "fifo":
        os.mkfifo(current)
    elif plant == "dir":
        current.mkdir()
    else:
        current.write_text("not a job id\n")
    message = refused(root)["error"]["message"]
    assert message.count("left as it is") == 1, message


def test_a_damaged_reason_never_says_left_as_it_is_itself():
    """The reason is carried by a message (``damaged job record …; left as it is``) or a
    ``jobs`` row rendered as ``damaged record (set aside, left as it is)``: the reason itself
    saying it too doubles the words."""
    from remote_payload.agent import jobrecord, jobstore

    for reason in (*jobrecord._REFUSALS.values(), jobstore.LINKED_JOB_DIR):
        assert "left as it is" not in reason, reason
