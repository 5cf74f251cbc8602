"""One contract: the shapes in ``remote_payload/wire_shapes.py`` are the only definition of
what the agent answers and what the trainer prints; nothing on the CLI's side repeats them.

- The CLI validates every reply against its shape (``opsctl/remote/shapes.py``): a valid reply
  comes back unchanged, keys a newer agent adds are dropped, and a reply that is not the shape
  is one named error (``ReplyShapeError``, exit 25), never a traceback.
- No pydantic model in ``opsctl/`` mirrors a reply: the modules that read replies import the
  shapes, not a second copy.
- The agent's builders are annotated with these shapes (mypy --strict checks them), and the
  shapes stay importable on the container's Python 3.10 without ``NotRequired``.
- Every event the trainer documents in ``wire`` has a shape, and real events validate.
"""

from __future__ import annotations

import ast
import typing as t
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl import errors
from opsctl.remote import shapes
from remote_payload import wire, wire_shapes
from tests.replies import status_doc

OPSCTL = Path(shapes.__file__).resolve().parents[1]


@pytest.mark.parametrize("verb", sorted(wire_shapes.REPLY_SHAPES))
def test_every_reply_shape_builds_one_validator_that_is_kept(verb):
    shape = wire_shapes.REPLY_SHAPES[verb]
    assert shapes.adapter(shape) is shapes.adapter(shape)
    assert shapes.json_schema(shape)["type"] == "object"


def test_a_valid_reply_comes_back_unchanged_and_unknown_keys_are_dropped():
    doc = dict(status_doc())
    assert shapes.validate(wire_shapes.StatusDoc, doc, where="h ct 1: status") == doc
    newer = {**doc, "from_a_newer_agent": [1, 2]}
    assert "from_a_newer_agent" not in shapes.validate(wire_shapes.StatusDoc, newer, where="x")


@pytest.mark.parametrize(("change", "where"), [
    ({"state": "DANCING"}, "state"), ({"gpus": [{"index": "zero"}]}, "gpus.0"),
    ({"job_id": None}, "job_id"), ({"tmux": []}, "tmux")])
def test_a_reply_that_is_not_its_shape_is_one_named_line_with_exit_25(change, where):
    bad = {**status_doc(), **change}
    with pytest.raises(errors.ReplyShapeError) as exc:
        shapes.validate(wire_shapes.StatusDoc, bad, where="pve1 ct 200: status")
    assert exc.value.exit_code == errors.REMOTE_FAILED == 25
    assert exc.value.message.startswith(f"pve1 ct 200: status: the reply is not a StatusDoc: {where}")
    assert "\n" not in exc.value.message and "opsctl deploy" in (exc.value.hint or "")


def test_a_missing_key_is_named():
    doc = dict(status_doc())
    del doc["now"]
    with pytest.raises(errors.ReplyShapeError, match=r"now: Field required"):
        shapes.validate(wire_shapes.StatusDoc, doc, where="x")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8),
                                                                              kids, max_size=3),
                     max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(verb=st.sampled_from(sorted(wire_shapes.REPLY_SHAPES)), data=_json,
       hostile_key=st.text(max_size=20))
def test_any_json_is_a_reply_of_its_shape_or_one_line_naming_why(verb, data, hostile_key):
    """The agent's output is untrusted: whatever JSON comes back (a hostile key included,
    newlines and all), validation returns the shape or raises the one named error."""
    if isinstance(data, dict):
        data = {**data, hostile_key: data}
    try:
        shapes.validate(wire_shapes.REPLY_SHAPES[verb], data, where=f"h ct 1: {verb}")
    except errors.ReplyShapeError as exc:
        assert "\n" not in exc.message and len(exc.message) < 400


def test_no_module_of_opsctl_defines_a_pydantic_model_of_a_reply():
    """A reply is read through its wire shape: no second copy by hand (a model whose fields
    are a shape's, or a class named after one)."""
    reply_fields = {frozenset(t.get_type_hints(s)) for s in wire_shapes.REPLY_SHAPES.values()}
    for path in OPSCTL.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b) for b in node.bases}
            if not bases & {"BaseModel", "pydantic.BaseModel"}:
                continue
            fields = frozenset(n.target.id for n in node.body
                               if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
            assert fields not in reply_fields, f"{path}: {node.name} repeats a wire shape"


def test_the_shapes_need_no_python_3_11_typing():
    from pathlib import Path

    source = Path(wire_shapes.__file__).read_text(encoding="utf-8")
    assert "NotRequired" not in source.replace("``NotRequired``", "")
    assert "Required[" not in source


def test_every_event_wire_names_has_a_shape_and_every_shape_a_name():
    named = {value for name, value in vars(wire).items()
             if name.startswith("EVENT_") and isinstance(value, str)}
    undocumented = set(wire_shapes.EVENT_SHAPES) - named
    assert undocumented == set()
    # events only the probes and the trainer's tools print may stay open-ended
    assert {"phase", "step", "compile", "checkpoint", "error", "done", "resume", "restart",
            "time_limit", "acceptance"} <= set(wire_shapes.EVENT_SHAPES)


def test_the_agent_never_imports_the_shapes_at_run_time():
    """Defining them costs ~10 ms of every status poll: the agent imports them for mypy only."""
    import ast
    from pathlib import Path

    root = Path(wire.__file__).parent
    for path in (root / "agent").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # top-level imports run at import time
            if isinstance(node, ast.ImportFrom) and node.module == "remote_payload.wire_shapes":
                pytest.fail(f"{path} imports wire_shapes at run time")


@pytest.mark.parametrize("reply", [
    {"root": "/opt/opsctl", "caches": "not a list"},
    {"root": "/opt/opsctl", "current_fingerprint": None, "current_build": None,
     "caches": [{"fingerprint": "a\nb\x1b[2J", "size_bytes": -1}], "outside": [], "warnings": []},
    ["a", "list"], None, "text"])
def test_a_command_given_a_reply_that_is_not_its_shape_exits_25_with_one_json_error(reply, monkeypatch):
    import contextlib
    import json
    import types

    from click.testing import CliRunner

    from opsctl.cli import cli
    from opsctl.ops import jobs
    from tests.replies import envelope, scripted_agent

    @contextlib.contextmanager
    def target(*_: t.Any, **__: t.Any) -> t.Iterator[t.Any]:
        yield types.SimpleNamespace(label="pve1 ct 200",
                                    agent=scripted_agent(lambda verb, args: envelope(verb, reply)))

    monkeypatch.setattr(jobs, "open_target", target)
    res = CliRunner().invoke(cli, ["cache", "info", "--host", "pve1", "--ct", "200", "--json"])
    assert res.exit_code == errors.REMOTE_FAILED, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    (line,) = [ln for ln in res.stdout.splitlines() if '"type"' in ln]
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "ReplyShapeError"
    assert doc["error"]["message"].startswith("pve1 ct 200: cache-info: the reply is not a CacheInfoDoc")
    assert "\n" not in doc["error"]["message"] and "\x1b" not in line
