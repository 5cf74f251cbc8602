"""Whatever bytes ``jobs/current`` holds, the agent reads a job id, no job, or a damaged
record whose reason does not repeat the bytes: never another exception."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload.agent import jobrecord
from remote_payload.agent import jobstore as jobs


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=6000))
def test_any_content_is_a_job_id_none_or_a_damaged_record_that_does_not_show_it(data):
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "jobs").mkdir()
        (Path(root) / "jobs" / "current").write_bytes(data)
        try:
            got = jobs.current_job_id(root)
        except jobrecord.DamagedRecord as exc:
            text = data.decode("utf-8", "replace").strip()
            assert len(text) < 8 or text not in exc.reason
        else:
            assert got is None or jobs.JOB_ID_RE.fullmatch(got)
