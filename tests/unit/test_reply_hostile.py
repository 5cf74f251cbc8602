"""A hostile or broken agent's reply: a typed value of another JSON type, NaN or Infinity,
a key carrying terminal escapes, an endless reply. Each is one named error (exit 25), in
bounded time and memory, never a converted value, never a traceback."""

from __future__ import annotations

import typing as t

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl import errors
from opsctl.remote import shapes
from opsctl.remote.agent_client import parse_reply
from opsctl.remote.command import CommandResult, Kept
from remote_payload.wire_shapes import StatusDoc
from tests.replies import _STATUS


def _status(**fields: t.Any) -> StatusDoc:
    return shapes.validate(StatusDoc, {**_STATUS, **fields}, where="h ct 1: status")


@pytest.mark.parametrize(("field", "value"), [
    ("pid", True), ("pid", "1"), ("pid", 1.0), ("exit_code", True), ("attempt", False),
    ("healthy", 1), ("healthy", "yes"), ("gpu_slots", [True]), ("output_size", "0"),
])
def test_a_value_of_another_json_type_is_a_reply_shape_error_never_converted(
        field: str, value: t.Any) -> None:
    with pytest.raises(errors.ReplyShapeError, match=field) as exc:
        _status(**{field: value})
    assert exc.value.exit_code == 25


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("field", ["elapsed_s", "now", "created_at"])
def test_a_nan_or_infinite_number_is_a_reply_shape_error(field: str, value: float) -> None:
    with pytest.raises(errors.ReplyShapeError, match=f"{field}: Input should be a finite number"):
        _status(**{field: value})


def test_a_nan_literal_in_the_reply_text_is_refused_where_a_number_is_due() -> None:
    raw = b'{"ok": true, "verb": "status", "data": {"elapsed_s": NaN}}'
    reply = parse_reply("h", 1, "status", CommandResult(("x",), "x", 0, raw, b"", 0.1))
    with pytest.raises(errors.ReplyShapeError, match="elapsed_s"):
        _status(**reply["data"])


@settings(max_examples=60, deadline=None)
@given(key=st.text(alphabet=st.characters(codec="utf-8", categories=["Cc", "Cf", "L"]),
                   min_size=1, max_size=20))
def test_a_key_of_the_reply_never_reaches_the_error_line_as_a_control_character(key: str) -> None:
    with pytest.raises(errors.ReplyShapeError) as exc:
        _status(phase_budgets_s={key: "not a number"})
    line = exc.value.message
    assert "\n" not in line and "\x1b" not in line and "\x00" not in line and "\x9b" not in line
    assert not any(0x202a <= ord(c) <= 0x202e or 0x2066 <= ord(c) <= 0x2069 for c in line)


def test_an_escape_sequence_in_a_key_is_shown_as_its_code() -> None:
    with pytest.raises(errors.ReplyShapeError, match=r"phase_budgets_s\.\\x1b\]0;pwn\\x07") as exc:
        _status(phase_budgets_s={"\x1b]0;pwn\x07": "x"})
    assert "\x1b" not in exc.value.message


def test_a_reply_over_the_cap_is_an_error_naming_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_REPLY_BYTES", "1000")
    kept = Kept(1000)
    kept.add(b'{"ok": true, "verb": "status", "data": [' + b"0, " * 100_000 + b"0]}\n")
    result = CommandResult(("x",), "x", 0, kept.value(), b"", 0.1)
    with pytest.raises(errors.RemoteCommandFailed, match="over the 1000 bytes a reply may have") as exc:
        parse_reply("h", 1, "status", result)
    assert exc.value.exit_code == 25


def test_a_reply_nested_a_hundred_thousand_deep_is_refused_quickly() -> None:
    raw = b'{"ok": true, "verb": "status", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(errors.RemoteCommandFailed, match=r"the reply is not JSON .*recursion limit"):
        parse_reply("h", 1, "status", CommandResult(("x",), "x", 0, raw, b"", 0.1))
