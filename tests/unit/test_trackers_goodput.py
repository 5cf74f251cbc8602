"""The goodput summary file as the trainer's trackers read it: untrusted bytes in the job
dir, where anything in the container may write. Any damage is "no scalar this time", never
an exception and never a number out of its range."""

from __future__ import annotations

import json
import math
import typing as t

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_payload.agent import goodput
from remote_payload.trainer import trackers
from remote_payload.wire_shapes import GoodputCause


def test_the_trackers_know_exactly_the_ledgers_causes() -> None:
    assert trackers.GOODPUT_CAUSES == goodput.CAUSES
    assert set(t.get_args(GoodputCause)) == set(goodput.CAUSES)


def _doc(**summary: t.Any) -> bytes:
    base: dict[str, t.Any] = {"goodput": 0.9, "effective_tok_s": 1200.0, "wall_s": 100.0,
                              "causes": dict.fromkeys(goodput.CAUSES, 1.0)}
    base.update(summary)
    return json.dumps({"at": 1_790_000_000.0, "summary": base}).encode()


def test_a_summary_gives_the_ratio_the_rate_and_badput_by_cause() -> None:
    got = trackers.goodput_metrics(_doc())
    assert got is not None
    at, scalars = got
    assert at == 1_790_000_000.0
    assert scalars == {"goodput/ratio": 0.9, "goodput/effective_tok_s": 1200.0,
                       "goodput/wall_s": 100.0,
                       **{f"goodput/badput_s/{c}": 1.0 for c in goodput.CAUSES
                          if c != "productive"}}


def test_a_figure_the_ledger_has_not_got_yet_is_left_out() -> None:
    got = trackers.goodput_metrics(_doc(goodput=None, effective_tok_s=None))
    assert got is not None and "goodput/ratio" not in got[1]


@pytest.mark.parametrize("bad", [
    {"goodput": 1.5}, {"goodput": -0.1}, {"goodput": True}, {"goodput": "0.9"},
    {"effective_tok_s": float("inf")}, {"wall_s": -1}, {"causes": {"made_up": 1.0}},
    {"causes": {"stall": -3.0}}, {"causes": {"stall": 10**400}}, {"causes": [1, 2]},
])
def test_a_damaged_figure_is_no_scalar_this_time(bad: dict[str, t.Any]) -> None:
    assert trackers.goodput_metrics(_doc(**bad).replace(b"Infinity", b"1e999")) is None


@pytest.mark.parametrize("data", [b"", b"null", b"[]", b"\xff\xfe", b"{" * 100_000,
                                  b'{"at": NaN, "summary": {}}', b'{"at": 1, "summary": []}',
                                  b'{"summary": {"goodput": 0.5}}'])
def test_text_that_is_no_summary_is_no_scalar(data: bytes) -> None:
    assert trackers.goodput_metrics(data) is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["at", "summary", "goodput", "effective_tok_s", "wall_s", "causes",
                         *goodput.CAUSES, "x"]), inner, max_size=6), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 _json.map(lambda v: json.dumps(v, allow_nan=True).encode())))
def test_any_bytes_give_scalars_in_range_or_none_never_an_exception(data: bytes) -> None:
    got = trackers.goodput_metrics(data)
    if got is None:
        return
    at, scalars = got
    assert math.isfinite(at) and scalars
    for name, value in scalars.items():
        assert math.isfinite(value) and value >= 0, (name, value)
        assert name in {"goodput/ratio", "goodput/effective_tok_s", "goodput/wall_s"} or (
            name.removeprefix("goodput/badput_s/") in goodput.CAUSES), name
    assert scalars.get("goodput/ratio", 0.0) <= 1.0


def test_the_file_is_read_at_most_every_ten_seconds_and_given_once_per_refresh(tmp_path) -> None:
    path = tmp_path / "goodput-summary.json"
    path.write_bytes(_doc())
    now = [100.0]
    reader = trackers.GoodputFile(str(path), clock=lambda: now[0])
    assert reader.poll() is not None
    now[0] += 30.0
    assert reader.poll() is None  # the same refresh: already given
    path.write_bytes(_doc().replace(b"1790000000.0", b"1790000060.0"))
    now[0] += 1.0
    assert reader.poll() is None  # read 1 s ago: not read again yet
    now[0] += trackers.GOODPUT_READ_EVERY_S
    got = reader.poll()
    assert got is not None and got["goodput/ratio"] == 0.9
