"""One contract: the shapes in ``remote_payload/wire_shapes.py`` are the only definition of
what the agent answers and what the trainer prints; everything else is checked against them.

- Every field the CLI's pydantic models read (``opsctl/remote/models.py``) is a field of the
  agent's shape, and the model accepts every value the shape allows (a model that rejected
  ``None`` where the agent may send it would turn a valid reply into a crash).
- The agent's builders are annotated with these shapes (mypy --strict checks them), and the
  shapes stay importable on the container's Python 3.10 without ``NotRequired``.
- Every event the trainer documents in ``wire`` has a shape, and real events validate.
"""

from __future__ import annotations

import typing as t

import pytest
from pydantic import BaseModel

from opsctl.remote import models, shapes
from remote_payload import wire, wire_shapes

#: CLI model -> the agent shape it reads.
MODEL_SHAPES: list[tuple[type[BaseModel], type]] = [
    (models.JobStatus, wire_shapes.StatusDoc),
    (models.JobList, wire_shapes.JobListDoc),
    (models.QueueList, wire_shapes.QueueDoc),
    (models.QueueRow, wire_shapes.QueueRowDoc),
    (models.QueueHolder, wire_shapes.QueueHolderDoc),
    (models.QueueAdd, wire_shapes.QueueAddDoc),
    (models.JobRow, wire_shapes.JobRowDoc),
    (models.StopResult, wire_shapes.StopDoc),
    (models.LogsChunk, wire_shapes.LogsChunkDoc),
    (models.GpuRow, wire_shapes.GpuRowDoc),
    (models.DiagnosisItem, wire_shapes.DiagnosisDoc),
    (models.HangReport, wire_shapes.HangDoc),
    (models.Preflight, wire_shapes.PreflightDoc),
    (models.History, wire_shapes.HistoryDoc),
    (models.RestartRecord, wire_shapes.RestartRecordDoc),
    (models.RunMembership, wire_shapes.RunDoc),
    (models.TmuxRef, wire_shapes.TmuxDoc),
]


def _resolve(schema: dict[str, t.Any], defs: dict[str, t.Any]) -> dict[str, t.Any]:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _branches(schema: dict[str, t.Any], defs: dict[str, t.Any]) -> list[dict[str, t.Any]]:
    schema = _resolve(schema, defs)
    if "anyOf" in schema:
        return [b for s in schema["anyOf"] for b in _branches(s, defs)]
    return [schema]


def _kind(schema: dict[str, t.Any]) -> str:
    if "enum" in schema or "const" in schema:
        return "string"
    return str(schema.get("type", "any"))


def _accepts(model: dict[str, t.Any], mdefs: dict[str, t.Any], shape: dict[str, t.Any],
             sdefs: dict[str, t.Any], where: str) -> list[str]:
    """Where the model would reject a value the shape allows (empty: it accepts them all)."""
    problems: list[str] = []
    model_branches = _branches(model, mdefs)
    if any(_kind(b) == "any" for b in model_branches):
        return problems
    for sb in _branches(shape, sdefs):
        kind = _kind(sb)
        fits = [mb for mb in model_branches
                if _kind(mb) == kind or (_kind(mb) == "number" and kind == "integer")]
        if kind == "any":
            problems.append(f"{where}: the shape allows anything, the model does not")
        elif not fits:
            problems.append(f"{where}: the shape allows {kind}, the model only "
                            f"{sorted({_kind(b) for b in model_branches})}")
        elif kind == "object" and "properties" in fits[0]:
            problems += _fields_within(fits[0], mdefs, sb, sdefs, where)
        elif kind == "array" and "items" in fits[0] and "items" in sb:
            problems += _accepts(fits[0]["items"], mdefs, sb["items"], sdefs, f"{where}[]")
    return problems


def _fields_within(model: dict[str, t.Any], mdefs: dict[str, t.Any], shape: dict[str, t.Any],
                   sdefs: dict[str, t.Any], where: str) -> list[str]:
    props = shape.get("properties")
    if props is None:  # dict[str, Any] on the agent's side: nothing more to check
        return []
    problems = [f"{where}.{name}: read by the CLI, not in the agent's shape"
                for name in model["properties"] if name not in props]
    for name, sub in model["properties"].items():
        if name in props:
            problems += _accepts(sub, mdefs, props[name], sdefs, f"{where}.{name}")
    return problems


@pytest.mark.parametrize(("model", "shape"), MODEL_SHAPES, ids=lambda x: x.__name__)
def test_every_field_the_cli_reads_is_in_the_agents_shape_with_a_type_it_accepts(model, shape):
    m = model.model_json_schema()
    s = shapes.json_schema(shape)
    assert _fields_within(m, m.get("$defs", {}), s, s.get("$defs", {}), model.__name__) == []


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
