"""The JSON Schema (draft 2020-12) of every ``--json`` document and of the trainer's events.

Nothing here is written by hand a second time: each document's schema is built by pydantic
from the type that produces the document (the agent's shapes in
``remote_payload/wire_shapes.py``, the CLI's reply models, the use cases' report
dataclasses), then wrapped in the envelope ``opsctl/cli/jsonout.py`` writes: ``"ok": true``
plus the document, or ``"ok": false`` with an ``error`` (and, for some commands, what they
got before failing). Objects whose keys opsctl decides are closed
(``additionalProperties: false``); free-form maps (a step event, an error's fields) stay open.
``tests/sandbox/test_schema_sandbox.py`` validates real outputs of each command against these.
"""

from __future__ import annotations

import copy
import typing as t

import typing_extensions as te
from pydantic import TypeAdapter

from opsctl.ops.deploy import DeployReport
from opsctl.ops.fleet import FleetRow
from opsctl.ops.hosts import HostRow
from opsctl.remote import models, shapes
from remote_payload import wire

DRAFT = "https://json-schema.org/draft/2020-12/schema"
#: A number that was NaN or infinite is ``null`` and its path is listed here
#: (``remote_payload.wire.finite_doc``): strict JSON everywhere it leaves opsctl.
_NONFINITE = {"type": "array", "items": {"type": "string"},
              "description": "paths of numbers that were NaN or infinite and are null here"}


class _JobsDocument(models.JobList):
    target: str  # "host/ct"


class _QueueDocument(models.QueueList):
    target: str  # "host/ct"


class _HostsDocument(te.TypedDict):
    hosts: list[HostRow]


class _FleetDocument(te.TypedDict):
    hosts: list[str]
    took_s: float
    deadline_s: float
    errors: int
    rows: list[FleetRow]


#: ``opsctl schema`` names -> (what the document is, the type that produces it).
DOCUMENTS: dict[str, tuple[str, t.Callable[[], t.Any]]] = {
    "status": ("one job's status (`status --json`, `status --follow --json`)",
               lambda: models.JobStatus),
    "jobs": ("the container's jobs, newest first (`jobs --json`)", lambda: _JobsDocument),
    "deploy": ("what deploy did and the job's status (`deploy --json`)", lambda: DeployReport),
    "stop": ("the signals sent and what survived (`stop --json`)", lambda: models.StopResult),
    "queue": ("the container's queue, first to start first, and who holds which GPU slots "
              "(`queue --json`, `queue move --json`)", lambda: _QueueDocument),
    "queue add": ("the jobs queued, those started at once, and the queue (`queue add --json`, "
                  "`deploy --json` of a pipeline)", lambda: _queue_add_report()),
    "envs": ("the container's torch builds (`envs --json`)",
             lambda: shapes.pydantic_view(_wire_shapes().EnvsDoc)),
    "hosts": ("the inventory's hosts, reachability with --check (`hosts --json`)",
              lambda: _HostsDocument),
    "status --all": ("one row per container of the fleet (`status --all --json`)",
                     lambda: _FleetDocument),
    "doctor": ("the GPU chain's checks, a row each (`doctor --json`)", lambda: _doctor_document()),
}
EVENT = "event"


def _queue_add_report() -> t.Any:
    from opsctl.ops.queue import QueueAddReport

    return QueueAddReport


def _doctor_document() -> t.Any:
    row = shapes.pydantic_view(_wire_shapes().DoctorRowDoc)
    fields = {"target": str, "elapsed_s": float, "rows": list[row]}  # type: ignore[valid-type]
    return te.TypedDict("DoctorDocument", fields)  # type: ignore[operator]  # built at run time


def _wire_shapes() -> t.Any:
    from remote_payload import wire_shapes

    return wire_shapes


def names() -> list[str]:
    return [*DOCUMENTS, EVENT]


def _close(node: t.Any) -> None:
    """``additionalProperties: false`` on every object whose properties opsctl decides."""
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _close(value)
    elif isinstance(node, list):
        for value in node:
            _close(value)


def _error_object() -> dict[str, t.Any]:
    return {"type": "object", "description": "opsctl's error (opsctl/errors.py, to_dict)",
            "properties": {"type": {"type": "string"}, "message": {"type": "string"},
                           "exit_code": {"type": "integer"},
                           "hint": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                           "log_path": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
            "required": ["type", "message", "exit_code"],
            "additionalProperties": True}  # some errors carry fields of their own


def document_schema(name: str) -> dict[str, t.Any]:
    """The schema of ``opsctl NAME --json``'s one document.

    Raises:
        KeyError: ``name`` is not one of :func:`names` (the CLI says which are).
    """
    if name == EVENT:
        return event_schema()
    what, producer = DOCUMENTS[name]
    body = copy.deepcopy(TypeAdapter(producer()).json_schema())
    defs = body.pop("$defs", {})
    _close(body)
    _close(defs)
    body["properties"] = {"ok": {"const": True}, **body.get("properties", {}),
                          wire.NONFINITE_KEY: _NONFINITE}
    body["required"] = ["ok", *body.get("required", [])]
    failure = {"type": "object", "properties": {"ok": {"const": False}, "error": {"$ref": "#/$defs/Error"}},
               "required": ["ok", "error"],
               "description": "a failure: the error, and what the command got before it"}
    return {"$schema": DRAFT, "title": f"opsctl {name} --json", "description": what,
            "oneOf": [body, failure], "$defs": {**defs, "Error": _error_object()}}


def event_schema() -> dict[str, t.Any]:
    """One trainer event: any JSON object with a string ``event``; the ones opsctl writes have
    the keys their shapes list (and may carry more: events are open)."""
    known = _wire_shapes().EVENT_SHAPES
    branches = []
    defs: dict[str, t.Any] = {}
    for name, shape in known.items():
        schema = shapes.json_schema(shape)
        schema["properties"][wire.NONFINITE_KEY] = _NONFINITE
        defs.update(schema.pop("$defs", {}))
        schema["properties"]["event"] = {"const": name}
        schema["required"] = sorted({"event", *schema.get("required", [])})
        defs[shape.__name__] = schema
        branches.append({"if": {"properties": {"event": {"const": name}}, "required": ["event"]},
                         "then": {"$ref": f"#/$defs/{shape.__name__}"}})
    return {"$schema": DRAFT, "title": "a trainer event (one JSON object per line of output)",
            "type": "object", "properties": {"event": {"type": "string"}}, "required": ["event"],
            "allOf": branches, "$defs": defs}
