"""``opsctl queue``'s text: states by name, and one line a job when stdout is no terminal
(a table squeezed into 80 columns wrapped its last column one character a line)."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from opsctl.cli import render
from opsctl.remote import shapes
from remote_payload.wire_shapes import QueueDoc

LONG = {"jobs": [{"job_id": "j-" + "a" * 70, "name": "n" * 40, "position": 1, "after": "b" * 50,
                  "gpus": [0, 1], "created_at": None,
                  "waiting_for": "job bbb to end, and GPU slots 0,1 held by j-x"}],
        "slots": 2, "holders": [{"job_id": "j-x", "gpu_slots": [0, 1], "state": "RUNNING"}], "damaged": []}


def _text(q: QueueDoc, terminal: bool) -> str:
    buf = io.StringIO()
    render.queue_table(Console(file=buf, width=80, force_terminal=terminal), "sandbox:200", q)
    return buf.getvalue()


def test_a_piped_queue_is_one_line_a_job_with_every_field_whole():
    lines = _text(shapes.validate(QueueDoc, LONG, where="test"), terminal=False).splitlines()
    assert lines[1] == "  ".join(("#", "JOB", "PLAYBOOK", "AFTER", "GPUS", "WAITING FOR"))
    assert lines[2] == "  ".join(["1", "j-" + "a" * 70, "n" * 40, "b" * 50, "slots 0,1",
                                  "job bbb to end, and GPU slots 0,1 held by j-x"])


def test_a_holders_state_is_shown_by_its_name():
    text = _text(shapes.validate(QueueDoc, LONG, where="test"), terminal=False)
    assert "running: j-x (RUNNING) holds GPU slots 0,1" in text
    assert "JobState" not in text


@settings(max_examples=30, deadline=None)
@given(waiting=st.text(max_size=300), name=st.text(max_size=100))
def test_no_line_of_a_piped_queue_is_a_single_wrapped_character(waiting, name):
    doc = {**LONG, "jobs": [{**LONG["jobs"][0], "waiting_for": waiting, "name": name}]}
    lines = _text(shapes.validate(QueueDoc, doc, where="test"), terminal=False).splitlines()
    assert lines[2].startswith("1  j-" + "a" * 70 + "  ")
