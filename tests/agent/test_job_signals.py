"""A job's processes are signalled one by one, each held by a pidfd while it is checked to
still be the job's (``jobstore.signal_job`` through ``procgroup.signal_if``): a number that
names another process by the time the signal goes (a reused pid, a reused group number) is
never signalled. Real processes, marked by ``PGTEST=<token>``."""

from __future__ import annotations

import os
import signal
import typing as t
import uuid

import pytest

from remote_payload import procgroup
from remote_payload.agent import jobstore
from tests import live_processes
from tests.waiting import wait_for


@pytest.fixture
def token(monkeypatch) -> str:
    tok = uuid.uuid4().hex
    monkeypatch.setenv("PGTEST", tok)
    yield tok
    for pid in live_processes.with_env(f"PGTEST={tok}"):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    return jobstore.proc_alive(pid, None)


def test_a_process_that_is_no_longer_the_one_meant_is_never_signalled(token):
    group = procgroup.Group(["sleep", "300"])
    try:
        assert not procgroup.signal_if(group.pid, signal.SIGKILL, lambda pid: False)
        assert _alive(group.pid)
        assert procgroup.signal_if(group.pid, signal.SIGKILL, lambda pid: True)
        assert wait_for(lambda: group.poll() is not None, 5.0)
    finally:
        group.end(grace=0)


def test_an_exited_unreaped_process_is_never_signalled_its_number_may_be_reused(token):
    group = procgroup.Group(["true"])
    try:
        assert wait_for(lambda: group.exited(), 5.0)  # a zombie now: its number is held
        assert not procgroup.signal_if(group.pid, signal.SIGTERM, lambda pid: True)
    finally:
        group.end(grace=0)


def test_the_jobs_group_number_never_reaches_a_process_older_than_the_job(token):
    """The group's leader predates the job (its number was reused for the job's group, as a
    recycled pgid would be); only the job's own member of that group is signalled."""
    old = procgroup.Group(["sh", "-c", 'sleep 0.6; sleep 300 & echo "$!"; exec sleep 301'])
    try:
        leader_ticks = jobstore.start_ticks(old.pid)
        assert leader_ticks is not None
        member = int(wait_for(lambda: os.read(t.cast(int, old.out), 64), 10.0).split()[0])
        ticks = jobstore.start_ticks(member)
        assert ticks is not None and ticks > leader_ticks
        sent = jobstore.signal_job(f"nojob-{token}", old.pid, ticks, signal.SIGTERM)
        assert sent == [member]
        assert wait_for(lambda: not _alive(member), 5.0)
        assert _alive(old.pid), "the older process in the group was signalled by number"
    finally:
        old.end(grace=0)


def test_a_marked_job_process_outside_the_group_is_signalled_and_an_unmarked_one_is_not(
        token, monkeypatch):
    job = f"job-{token[:8]}"
    monkeypatch.setenv(jobstore.JOB_ENV_MARKER, job)
    marked = procgroup.Group(["sleep", "300"])
    monkeypatch.delenv(jobstore.JOB_ENV_MARKER)
    other = procgroup.Group(["sleep", "301"])
    try:
        assert jobstore.signal_job(job, None, None, signal.SIGTERM) == [marked.pid]
        assert wait_for(lambda: marked.poll() is not None, 5.0)
        assert _alive(other.pid)
    finally:
        marked.end(grace=0)
        other.end(grace=0)
