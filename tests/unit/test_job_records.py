"""The job dirs are the one record of job state: their parsers, the queue derived from them,
the migration of an older agent's ``queue.json``, and job ids that are unique by construction.

Pure logic and files in a temporary root (no tmux, no process is started).
"""

from __future__ import annotations

import json
import os
import re
import typing as t
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl.config.playbook import Playbook
from opsctl.ops import queue as queue_ops
from remote_payload import wire
from remote_payload.agent import jobqueue as q
from remote_payload.agent import jobrecord

json_st = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20)
#: a status.json-like object: the known keys with any JSON value, plus noise
status_st = st.dictionaries(
    st.sampled_from(["state", "created_at", "queue_rank", "transitions", "evidence", "x"]),
    json_st | st.sampled_from([s.value for s in wire.JobState]), max_size=6)
spec_st = st.dictionaries(
    st.sampled_from(["gpus", "gpu_slots", "after", "job_id", "torch_build", "command", "x"]),
    json_st, max_size=6)
PARSERS = [jobrecord.parse_status, jobrecord.parse_spec]
ANY_FILE = settings(max_examples=150, deadline=None,  # file system work: no time bound
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


# --- the parsers --------------------------------------------------------------------------


@pytest.mark.parametrize("parse", PARSERS)
@given(data=st.binary(max_size=200))
@settings(max_examples=200)
def test_any_bytes_are_a_record_or_a_ValueError(parse: t.Callable[[t.Any], t.Any],
                                                data: bytes) -> None:
    try:
        doc = parse(jobrecord.decode(data))
    except ValueError:
        return
    assert isinstance(doc, dict)


@given(status_st)
@settings(max_examples=300)
def test_a_status_that_parses_has_a_state_and_numbers_where_readers_compute(raw: t.Any) -> None:
    try:
        doc = jobrecord.parse_status(raw)
    except ValueError:
        return
    wire.JobState(doc["state"])
    for key in ("created_at", "queue_rank"):
        if doc.get(key) is not None:
            float(doc[key])  # what the queue and the jobs list do with it


@given(spec_st)
@settings(max_examples=300)
def test_a_spec_that_parses_has_a_gpu_request_and_job_ids(raw: t.Any) -> None:
    try:
        doc = jobrecord.parse_spec(raw)
    except ValueError:
        return
    wire.validate_gpu_request(doc.get("gpus"))
    for key in ("after", "job_id"):
        assert doc.get(key) is None or re.fullmatch(wire.JOB_ID_PATTERN, doc[key])


@pytest.mark.parametrize(("raw", "why"), [
    ({"state": "QUEUED", "created_at": "yesterday"}, "created_at 'yesterday' is not a number"),
    ({"state": "QUEUED", "created_at": True}, "created_at True is not a number"),
    ({"state": "DONE"}, "state 'DONE' is not a job state"),
    ({"created_at": 1.0}, "state is missing"),
    ([], "not a JSON object"),
    ({"state": "QUEUED", "transitions": "x"}, "transitions is not a list"),
])
def test_a_status_that_does_not_parse_names_its_field(raw: t.Any, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        jobrecord.parse_status(raw)


@given(data=st.binary(max_size=300))
@ANY_FILE
def test_any_file_is_read_as_a_record_or_a_damaged_record_naming_it(tmp_path: Path,
                                                                    data: bytes) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(data)
    try:
        jobrecord.read(str(path), jobrecord.parse_status)
    except jobrecord.DamagedRecord as exc:
        assert exc.path == str(path) and exc.reason and "\n" not in exc.reason
    assert path.read_bytes() == data  # never rewritten


def test_a_directory_where_the_record_belongs_is_damaged(tmp_path: Path) -> None:
    (tmp_path / "status.json").mkdir()
    with pytest.raises(jobrecord.DamagedRecord, match="a directory, not a file"):
        jobrecord.read_status(str(tmp_path))


def test_a_missing_status_is_a_launch_still_writing_not_damage(tmp_path: Path) -> None:
    assert jobrecord.read_status(str(tmp_path), {}) == {}


# --- the queue, derived from the job dirs ---------------------------------------------------


def _job(root: Path, job_id: str, state: str = "QUEUED", rank: float | None = None,
         created: float = 1.0, **spec: t.Any) -> Path:
    path = root / "jobs" / job_id
    path.mkdir(parents=True)
    status: dict[str, t.Any] = {"job_id": job_id, "state": state, "created_at": created}
    if rank is not None:
        status[q.RANK] = rank
    (path / "status.json").write_text(json.dumps(status))
    (path / "spec.json").write_text(json.dumps({"job_id": job_id, "name": job_id, "workdir": "/",
                                                "command": ["true"], **spec}))
    return path


def test_the_queue_is_the_queued_job_dirs_in_rank_order_and_nothing_else(tmp_path: Path) -> None:
    _job(tmp_path, "b", rank=2.0)
    _job(tmp_path, "a", rank=1.0)
    _job(tmp_path, "old", created=0.5)  # an older agent's: no rank, after the ranked ones
    _job(tmp_path, "done", state="SUCCEEDED", rank=0.5)
    _job(tmp_path, "gone", state="CANCELLED")
    snap = q.scan(str(tmp_path), reconcile=False)
    assert snap.order == ["a", "b", "old"]
    assert snap.holders == {} and snap.damaged == []


def test_a_damaged_job_dir_is_neither_queued_nor_a_holder_and_is_named(tmp_path: Path) -> None:
    _job(tmp_path, "ok", rank=1.0)
    bad = _job(tmp_path, "bad", rank=2.0)
    (bad / "status.json").write_text('{"state": "QUEUED", "created_at": "soon"}')
    snap = q.scan(str(tmp_path), reconcile=False)
    assert snap.order == ["ok"]
    assert snap.damaged == [{"path": str(bad / "status.json"),
                             "reason": "created_at 'soon' is not a number"}]


def test_a_live_job_holds_its_slots_and_one_without_holds_the_whole_container(
        tmp_path: Path) -> None:
    _job(tmp_path, "two", state="RUNNING", gpu_slots=[0, 1])
    _job(tmp_path, "all", state="SETTING_UP")
    snap = q.scan(str(tmp_path), reconcile=False)
    assert snap.holders == {"two": [0, 1], "all": None}


@given(moves=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.booleans()),
                      max_size=40))
@ANY_FILE
def test_moves_keep_every_queued_job_once_in_the_order_asked(tmp_path: Path,
                                                              moves: list[t.Any]) -> None:
    root = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
    ids = [f"j{i}" for i in range(6)]
    for i, j in enumerate(ids):
        _job(root, j, rank=float(i + 1))
    want = list(ids)
    for a, b, before in moves:
        if a == b:
            continue
        snap = q.scan(str(root), reconcile=False)
        assert snap.order == want
        want = q.moved(snap.order, ids[a], ids[b], before, {})
        q.reorder(str(root), snap, want, ids[a])
    assert q.scan(str(root), reconcile=False).order == want


def test_ranks_squeezed_to_no_room_are_renumbered(tmp_path: Path) -> None:
    _job(tmp_path, "a", rank=1.0)
    _job(tmp_path, "b", rank=1.0 + 2e-16)
    _job(tmp_path, "c", rank=3.0)
    snap = q.scan(str(tmp_path), reconcile=False)
    order = q.moved(snap.order, "c", "b", True, {})
    q.reorder(str(tmp_path), snap, order, "c")
    assert q.scan(str(tmp_path), reconcile=False).order == ["a", "c", "b"]


# --- an older agent's queue.json -----------------------------------------------------------


def test_a_legacy_order_ranks_only_the_jobs_still_queued_and_is_kept_aside(tmp_path: Path) -> None:
    _job(tmp_path, "done", state="SUCCEEDED")
    _job(tmp_path, "run", state="RUNNING")
    _job(tmp_path, "x")
    _job(tmp_path, "y")
    legacy = tmp_path / "jobs" / "queue.json"
    legacy.write_text(json.dumps({"version": 1, "order": ["done", "run", "y", "x"], "slots": 4,
                                  "holders": {"run": None}}))
    kept = q.migrate_legacy(str(tmp_path))
    assert kept is not None and ".migrated-" in kept and not legacy.exists()
    snap = q.scan(str(tmp_path), reconcile=False)
    assert snap.order == ["y", "x"]
    assert q.read_slots(str(tmp_path)) == 4
    for job, state in (("done", "SUCCEEDED"), ("run", "RUNNING")):
        status = json.loads((tmp_path / "jobs" / job / "status.json").read_text())
        assert status["state"] == state and q.RANK not in status
    assert q.migrate_legacy(str(tmp_path)) is None  # read once


@given(data=st.binary(max_size=200))
@ANY_FILE
def test_any_legacy_file_is_migrated_or_set_aside_and_never_starts_anything(
        tmp_path: Path, data: bytes) -> None:
    root = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
    _job(root, "done", state="SUCCEEDED")
    (root / "jobs" / "queue.json").write_bytes(data)
    kept = q.migrate_legacy(str(root))
    assert kept is not None and Path(kept).read_bytes() == data
    assert q.scan(str(root), reconcile=False).order == []


@given(data=st.binary(max_size=100) | json_st.map(lambda v: json.dumps({"slots": v}).encode()))
@ANY_FILE
def test_any_gpu_count_file_is_a_count_or_unknown(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "jobs").mkdir(exist_ok=True)
    (tmp_path / "jobs" / q.SLOTS_FILE).write_bytes(data)
    slots = q.read_slots(str(tmp_path))
    assert slots is None or (isinstance(slots, int) and 0 < slots <= wire.MAX_GPU_SLOTS)


# --- job ids --------------------------------------------------------------------------------


def test_ids_of_a_batch_are_distinct_even_when_the_random_part_repeats(
        monkeypatch: pytest.MonkeyPatch) -> None:
    draws = iter(["aaaaaaaa"] * 3 + [f"{i:08x}" for i in range(1000)])
    monkeypatch.setattr("secrets.token_hex", lambda n: next(draws))
    books = [Playbook(name="step", command=["true"])] * 64
    ids = queue_ops.batch_ids(books)
    assert len(set(ids)) == 64


def test_ids_over_a_large_batch_are_distinct_and_carry_8_hex_digits() -> None:
    book = Playbook(name="step", command=["true"])
    ids = queue_ops.batch_ids([book] * 5000)
    assert len(set(ids)) == 5000
    assert all(re.fullmatch(r"step-\d{8}-\d{6}-[0-9a-f]{8}", j) for j in ids)
    from remote_payload.agent import jobstore

    agent_ids = {jobstore.new_job_id("step") for _ in range(5000)}
    assert len(agent_ids) == 5000


def test_a_staging_dir_is_never_taken_for_a_job(tmp_path: Path) -> None:
    from remote_payload.agent import jobqueue, jobstore

    (tmp_path / "jobs" / jobqueue.STAGING / "1-1" / "x").mkdir(parents=True)
    assert jobstore.list_job_ids(str(tmp_path)) == []
    assert os.path.isdir(tmp_path / "jobs" / jobqueue.STAGING)


# --- records that are not opsctl's -----------------------------------------------------------


@pytest.mark.parametrize("field", ["created_at", "queue_rank", "started_at"])
def test_an_integer_too_large_for_a_float_is_no_number(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} .* is not a number"):
        jobrecord.parse_status({"state": "QUEUED", field: 10**400})
    assert jobrecord.parse_status({"state": "QUEUED", field: 2**64})[field] == 2**64


def test_a_record_that_is_a_link_is_damaged_and_never_read_through(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text('{"state": "QUEUED", "created_at": 1.0}')
    job = _job(tmp_path, "linked", rank=1.0)
    (job / "status.json").unlink()
    (job / "status.json").symlink_to(secret)
    with pytest.raises(jobrecord.DamagedRecord, match="symbolic link"):
        jobrecord.read_status(str(job))
    snap = q.scan(str(tmp_path), reconcile=False)
    assert snap.order == [] and [d["path"] for d in snap.damaged] == [str(job / "status.json")]
    assert (job / "status.json").is_symlink() and secret.exists()


def test_a_fifo_or_a_device_where_a_record_belongs_is_damaged_without_blocking(
        tmp_path: Path) -> None:
    job = _job(tmp_path, "fifo", rank=1.0)
    (job / "status.json").unlink()
    os.mkfifo(job / "status.json")  # nobody writes it: an open without O_NONBLOCK would hang
    with pytest.raises(jobrecord.DamagedRecord, match="not a regular file"):
        jobrecord.read_status(str(job))
    (tmp_path / "jobs" / q.SLOTS_FILE).symlink_to("/dev/zero")  # endless: never read
    assert q.read_slots(str(tmp_path)) is None
    from remote_payload.agent import common

    with pytest.raises(ValueError, match="not a regular file"):
        common.read_json("/dev/zero")


def test_a_job_dir_that_is_a_link_is_listed_damaged_and_never_queued(tmp_path: Path) -> None:
    from remote_payload.agent import jobstore

    elsewhere = _job(tmp_path / "elsewhere", "away", rank=1.0)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "away").symlink_to(elsewhere)
    snap = q.scan(str(tmp_path))
    assert snap.order == [] and snap.holders == {}
    assert snap.damaged == [{"path": str(tmp_path / "jobs" / "away"),
                             "reason": jobstore.LINKED_JOB_DIR}]
    assert jobstore.list_job_ids(str(tmp_path)) == []
    with pytest.raises(jobrecord.DamagedRecord):
        jobstore.resolve_job(str(tmp_path), "away")


@pytest.mark.parametrize("spec, why", [
    (None, "missing"),
    ({"job_id": "q", "name": "q", "workdir": "/"}, "command is missing"),
    ({"job_id": "other", "name": "q", "workdir": "/", "command": ["true"]}, "job dir's name"),
    ({"job_id": "q", "name": "q", "command": ["true"]}, "workdir is missing"),
    ({"job_id": "q", "name": "q", "workdir": "/", "command": ["true"], "env": {"A": 1}}, "env"),
])
def test_a_queued_job_whose_spec_its_start_could_not_use_is_damaged(
        tmp_path: Path, spec: t.Any, why: str) -> None:
    job = _job(tmp_path, "q", rank=1.0)
    if spec is None:
        (job / "spec.json").unlink()
    else:
        (job / "spec.json").write_text(json.dumps(spec))
    snap = q.scan(str(tmp_path), reconcile=False)
    assert snap.order == [] and why in snap.damaged[0]["reason"]


def test_a_whole_staged_batch_left_by_a_killed_add_is_moved_in_whole(tmp_path: Path) -> None:
    batch = tmp_path / "jobs" / q.STAGING / "4242"
    for name in ("s1", "s2"):
        _job(tmp_path / "x", name, rank=1.0).rename(batch / name if batch.exists()
                                                     else (batch.mkdir(parents=True), batch / name)[1])
    _job(tmp_path, "s1", rank=1.0)  # the first was moved in before the kill
    (batch / "s1").rename(tmp_path / "gone-s1")
    (batch / q.STAGED_WHOLE).touch()
    with q.locked(str(tmp_path)):
        assert q.scan(str(tmp_path)).order == ["s1", "s2"]
    assert not (tmp_path / "jobs" / q.STAGING).exists()


def test_a_half_staged_batch_left_by_a_killed_add_is_removed(tmp_path: Path) -> None:
    half = tmp_path / "jobs" / q.STAGING / "4242" / "h1"
    half.mkdir(parents=True)
    (half / "secrets.json").write_text('{"TOKEN": "s3cr3t"}')
    with q.locked(str(tmp_path)):
        assert q.scan(str(tmp_path)).order == []
    assert not (tmp_path / "jobs" / q.STAGING).exists()


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_staging_path_that_is_not_opsctls_is_left_alone(tmp_path: Path, kind: str) -> None:
    staging = tmp_path / "jobs" / q.STAGING
    staging.parent.mkdir()
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep").write_text("x")
    if kind == "file":
        staging.write_text("mine")
    else:
        staging.symlink_to(target)
    with q.locked(str(tmp_path)):
        pass
    assert (staging.read_text() == "mine") if kind == "file" else (target / "keep").exists()


def test_a_directory_at_the_queued_hint_is_left_and_costs_only_a_scan(tmp_path: Path) -> None:
    hint = tmp_path / "jobs" / q.QUEUED_HINT
    hint.mkdir(parents=True)
    q.set_hint(str(tmp_path))
    q.clear_hint(str(tmp_path))
    assert hint.is_dir() and q.may_have_queued(str(tmp_path))


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=st.one_of(st.binary(max_size=200), _JSON.map(lambda v: json.dumps(v).encode()),
                        st.fixed_dictionaries({}, optional={
                            "pgid": _JSON, "start_ticks": _JSON, "cgroup": _JSON}).map(
                            lambda d: json.dumps(d).encode())))
def test_a_damaged_jobs_pid_record_gives_only_typed_facts_and_never_another_jobs_cgroup(
        tmp_path: Path, record: bytes) -> None:
    """What ``stop`` of a damaged job and the GPU holders read back from its ``pid`` record:
    a pgid only with the start time that makes it this job's, whole numbers only, and a
    cgroup that is this job's own (never one the record names for another job)."""
    from remote_payload.agent import jobstore

    job = tmp_path / "jobs" / "wreck-60"
    job.mkdir(parents=True, exist_ok=True)
    (job / "pid").write_bytes(record)
    pgid, ticks, cgroup = jobstore.damaged_pid_facts(str(tmp_path), "wreck-60")
    for value in (pgid, ticks):
        assert value is None or (type(value) is int and value > 1)
    assert pgid is None or ticks is not None
    assert cgroup is None or (os.path.basename(cgroup) == "wreck-60"
                              and os.path.basename(os.path.dirname(cgroup))
                              == jobstore.JOB_CGROUP_PARENT)
