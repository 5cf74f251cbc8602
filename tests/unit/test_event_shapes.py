"""The trainer's events carry sane numbers: a step is an integer >= 0 and present where the
event is about a step; counts are integers >= 0, durations and rates numbers >= 0. One
definition (remote_payload/wire_shapes.py) gives both the check and ``opsctl schema event``."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.cli import schemas
from remote_payload import wire
from remote_payload.wire_shapes import EVENT_SHAPES, event_problem

VALIDATOR = jsonschema.Draft202012Validator(schemas.event_schema())


def _schema_accepts(doc: dict[str, object]) -> bool:
    return bool(VALIDATOR.is_valid(doc))


@pytest.mark.parametrize("doc", [
    {"event": "step"}, {"event": "step", "step": -5}, {"event": "step", "step": 1.5},
    {"event": "step", "step": "3"}, {"event": "step", "step": None},
    {"event": "checkpoint", "path": "x"}, {"event": "done", "reason": "finished"},
    {"event": "resume", "step": -1, "path": "x"}, {"event": "step", "step": 1, "tok_s": -3.0},
    {"event": "restart", "attempt": -1, "reason": "x"}, {"event": "compile", "seconds": -1},
])
def test_a_step_event_without_a_step_or_with_a_negative_number_is_refused(doc):
    assert event_problem(doc) is not None
    assert not _schema_accepts(doc)


@pytest.mark.parametrize("doc", [
    {"event": "step", "step": 0}, {"event": "step", "step": 12, "loss": None, "tok_s": 1.5e3},
    {"event": "step", "step": 3, "loss": -0.5, "lr": 1e-4},  # a loss may be negative
    {"event": "done", "step": 0, "warmup_only": True}, {"event": "checkpoint", "step": 7},
    {"event": "my_own", "step": -5}, {"event": "phase", "phase": "loading"},
])
def test_well_formed_and_foreign_events_pass(doc):
    assert event_problem(doc) is None
    assert _schema_accepts(doc)


def test_true_is_not_a_step():
    assert event_problem({"event": "step", "step": True}) == "step event: step True is not an integer"


@settings(max_examples=150, deadline=None)
@given(step=st.integers(min_value=-(2**40), max_value=2**40))
def test_a_step_is_valid_exactly_when_it_is_not_negative(step):
    doc = {"event": "step", "step": step}
    assert (event_problem(doc) is None) == (step >= 0)
    assert _schema_accepts(doc) == (step >= 0)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=10), lambda c: st.lists(c, max_size=3)
                    | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(EVENT_SHAPES)), fields=st.dictionaries(
    st.sampled_from(["step", "tok_s", "seconds", "attempt", "path", "loss", "reason", "records"]),
    JSON, max_size=4))
def test_the_check_and_the_schema_agree_and_never_raise_on_any_event_line(name, fields):
    doc = wire.parse_event(json.dumps({**fields, "event": name}))
    assert doc is not None
    problem = event_problem(doc)
    if problem is None:
        assert _schema_accepts(doc), doc
    assert problem is None or problem.startswith(name)


@pytest.mark.parametrize("name", [["step"], {"a": 1}, 3, None])
def test_an_event_name_that_is_not_a_string_passes_as_an_open_event_never_a_type_error(name):
    assert event_problem({"event": name, "step": -1}) is None


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=3)
                     | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from([*EVENT_SHAPES, "other"]) | _JSON,
       fields=st.dictionaries(st.sampled_from(["step", "seconds", "tokens", "loss", "path", "x"]),
                              _JSON, max_size=4))
def test_any_event_doc_is_a_problem_or_none_never_an_exception(name, fields):
    got = event_problem({**fields, "event": name})
    assert got is None or isinstance(got, str)


def test_a_nan_amount_is_below_its_bound():
    assert event_problem({"event": "step", "step": 1, "acc": float("nan")}) == \
        "step event: acc nan is below 0 and nan is not null"
