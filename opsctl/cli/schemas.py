"""The JSON Schema (draft 2020-12) of every ``--json`` document, of the trainer's events and
of the playbook and inventory files.

Nothing here is written by hand a second time: each document's schema is built by pydantic
from the type that produces the document (the agent's shapes in
``remote_payload/wire_shapes.py``, which the CLI validates every reply against; the use
cases' report dataclasses and TypedDicts), then wrapped in the envelope
``opsctl/cli/jsonout.py`` writes: ``"ok": true`` plus the document, or ``"ok": false`` with an
``error`` (and, for some commands, what they got before failing). Objects whose keys opsctl
decides are closed (``additionalProperties: false``); free-form maps (a step event, an
error's fields) stay open. Commands that print the same document share its one entry
(:data:`DOCUMENTS` maps each command to it). ``tests/unit/test_schema.py`` fails on a command
with ``--json`` and no entry; ``tests/sandbox/test_schema_sandbox.py`` validates real outputs.
"""

from __future__ import annotations

import copy
import typing as t

import typing_extensions as te
from pydantic import TypeAdapter

from opsctl.remote import shapes
from remote_payload import wire

DRAFT = "https://json-schema.org/draft/2020-12/schema"
#: A number that was NaN or infinite is ``null`` and its path is listed here
#: (``remote_payload.wire.finite_doc``): strict JSON everywhere it leaves opsctl.
_NONFINITE = {"type": "array", "items": {"type": "string"},
              "description": "paths of numbers that were NaN or infinite and are null here"}


def _wire() -> t.Any:
    from remote_payload import wire_shapes

    return wire_shapes


def _reply(name: str) -> t.Callable[[], t.Any]:
    """An agent reply printed as the CLI validated it: its wire shape."""
    return lambda: shapes.pydantic_view(getattr(_wire(), name))


def _object(name: str, **fields: t.Any) -> t.Any:
    """A document of a few keys around the shapes it holds (all required)."""
    return te.TypedDict(name, {k: shapes.pydantic_type(v) for k, v in fields.items()})  # type: ignore[operator]


def _with(name: str, base: t.Any, **extra: t.Any) -> t.Any:
    """``base``'s keys (a TypedDict or a dataclass, printed flat) plus ``extra``'s, as one
    TypedDict: a document that adds a key or two to a shape it prints."""
    view = shapes.pydantic_view(base)
    required = view.__required_keys__
    fields = {k: (v if k in required else te.NotRequired[v])
              for k, v in t.get_type_hints(view).items()}
    fields.update(extra)
    return _object(name, **fields)


def _status() -> t.Any:
    return _reply("StatusDoc")()


def _jobs() -> t.Any:
    return _with("JobsDocument", _reply("JobListDoc")(), target=str)


def _queue() -> t.Any:
    return _with("QueueDocument", _reply("QueueDoc")(), target=str)


def _queue_rm() -> t.Any:
    return _with("QueueRmDocument", _reply("QueueRmDoc")(), target=str)


def _deploy() -> t.Any:
    from opsctl.ops.deploy import DeployReport

    return shapes.pydantic_view(DeployReport)


def _queue_add() -> t.Any:
    from opsctl.ops.queue import QueueAddReport

    return shapes.pydantic_view(QueueAddReport)


def _hosts() -> t.Any:
    from opsctl.ops.hosts import HostRow

    return _object("HostsDocument", hosts=list[HostRow])


def _fleet() -> t.Any:
    from opsctl.ops.fleet import FleetRow

    return _object("FleetDocument", hosts=list[str], took_s=float, deadline_s=float, errors=int,
                   rows=list[FleetRow])


def _doctor() -> t.Any:
    row = _reply("DoctorRowDoc")()
    return _object("DoctorDocument", target=str, elapsed_s=float, rows=list[row])  # type: ignore[valid-type]


def _run() -> t.Any:
    from opsctl.ops.multinode import RunReport

    return _with("RunDocument", RunReport, state=str, complete=bool)


def _transfer() -> t.Any:
    from opsctl.ops.files import TransferPlan, TransferReport

    many = _object("TransfersDocument", transfers=list[TransferReport])
    return shapes.pydantic_type(TransferReport | TransferPlan) | many


def _swap() -> t.Any:
    from opsctl.ops.torch import SwapReport

    return shapes.pydantic_view(SwapReport)


def _playbooks() -> t.Any:
    from opsctl.config.paths import SearchDir
    from opsctl.config.playbook import Found

    return _object("PlaybooksDocument", playbooks=list[Found], search_path=list[SearchDir])


def _muxes() -> t.Any:
    from opsctl.remote.mux_client import MuxRow

    row = shapes.pydantic_view(MuxRow)
    return _object("MuxesDocument", muxes=list[row])  # type: ignore[valid-type]


def _sandbox_up() -> t.Any:
    from opsctl.sandbox.host import SandboxInfo

    return _with("SandboxUpDocument", SandboxInfo, elapsed_s=float)


def _exit_codes() -> t.Any:
    from opsctl.cli.help import ExitCodesDocument

    return shapes.pydantic_view(ExitCodesDocument)


def _sandbox_status() -> t.Any:
    from opsctl.sandbox.host import SandboxInfo

    absent = _object("SandboxAbsent", set_up=t.Literal[False])
    present = _with("SandboxStatusDocument", SandboxInfo, set_up=t.Literal[True],
                    sshd_running=bool, container_states=dict[int, str],
                    wanted_running=list[int], healthy=bool)
    return absent | present


#: ``opsctl schema`` names -> (what the document is, the type that produces it). Commands
#: that print the same document share its producer.
DOCUMENTS: dict[str, tuple[str, t.Callable[[], t.Any]]] = {
    "status": ("one job's status (`status --json`, `status --follow --json`)", _status),
    "jobs": ("the container's jobs, newest first (`jobs --json`)", _jobs),
    "deploy": ("what deploy did and the job's status (`deploy --json`)", _deploy),
    "stop": ("the signals sent and what survived (`stop --json`)", _reply("StopDoc")),
    "queue": ("the container's queue, first to start first, and who holds which GPU slots "
              "(`queue --json`)", _queue),
    "queue add": ("the jobs queued, those started at once, and the queue (`queue add --json`, "
                  "`deploy --json` of a pipeline)", _queue_add),
    "queue rm": ("the removed job, its dependants cancelled with it, and the queue "
                 "(`queue rm --json`)", _queue_rm),
    "queue move": ("the queue after the move (`queue move --json`; the same document as "
                   "`queue --json`)", _queue),
    "push": ("what was sent, or with --dry-run what would be (`push --json`; several targets: "
             "`transfers`)", _transfer),
    "pull": ("what was fetched, or with --dry-run what would be (`pull --json`)", _transfer),
    "plot": ("a job's full bounded history (`plot --json`)", _reply("HistoryReplyDoc")),
    "goodput": ("a run's wall time by cause, per attempt, and its timeline (`goodput --json`)",
                _reply("GoodputDoc")),
    "stacks": ("every thread's stack of every process of the job (`stacks --json`)",
               _reply("StacksDoc")),
    "probe compile-race": ("the compile-race probe's report (`probe compile-race --json`)",
                           _reply("ProbeReportDoc")),
    "doctor": ("the GPU chain's checks, a row each (`doctor --json`)", _doctor),
    "swap-torch": ("what the swap did, or with --dry-run would do (`swap-torch --json`)", _swap),
    "envs": ("the container's torch builds (`envs --json`)", _reply("EnvsDoc")),
    "cache info": ("the compile caches, per fingerprint (`cache info --json`)",
                   _reply("CacheInfoDoc")),
    "cache clear": ("the caches removed and the bytes freed (`cache clear --json`)",
                    _reply("CacheClearDoc")),
    "cache seed": ("the seeded artifact and the proof of its reuse (`cache seed --json`)",
                   _reply("CacheSeedDoc")),
    "hosts": ("the inventory's hosts, reachability with --check (`hosts --json`)", _hosts),
    "status --all": ("one row per container of the fleet (`status --all --json`)", _fleet),
    "status --nodes": ("a multi-node run, one row per node (`status --nodes --json`)", _run),
    "deploy --nodes": ("what deploy did on every node of a multi-node run (`deploy --nodes --json`)",
                       _run),
    "playbooks": ("the playbooks by name and where each was found (`playbooks --json`)",
                  _playbooks),
    "mux status": ("the live connection multiplexers (`mux status --json`)", _muxes),
    "sandbox up": ("how to reach the sandbox host (`sandbox up --json`)", _sandbox_up),
    "help exit-codes": ("every exit status and its meaning (`help exit-codes --json`)",
                        _exit_codes),
    "sandbox status": ("whether the sandbox's sshd and containers run (`sandbox status --json`)",
                       _sandbox_status),
}
EVENT = "event"
#: File formats: the schema of the YAML file itself (no envelope), for editors and checks.
FILES: dict[str, str] = {
    "playbook": "a playbook file (playbooks/*.yaml): one job, or a pipeline (`steps:`)",
    "inventory": "an inventory file (inventory/*.yaml)",
}


def names() -> list[str]:
    return [*DOCUMENTS, EVENT, *FILES]


def what(name: str) -> str:
    """One line on what ``name``'s schema describes."""
    if name in DOCUMENTS:
        return DOCUMENTS[name][0]
    if name == EVENT:
        return "one trainer event (a JSON object per line of the job's output)"
    return FILES[name]


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


def _success(body: dict[str, t.Any], defs: dict[str, t.Any]) -> dict[str, t.Any]:
    """``body`` (an object, or a union of objects) with ``"ok": true`` added to each."""
    if "$ref" in body:
        body = copy.deepcopy(defs[body["$ref"].rsplit("/", 1)[1]])
    for key in ("anyOf", "oneOf"):
        if key in body:
            return {"anyOf": [_success(b, defs) for b in body[key]]}
    body["properties"] = {"ok": {"const": True}, **body.get("properties", {}),
                          wire.NONFINITE_KEY: _NONFINITE}
    body["required"] = ["ok", *body.get("required", [])]
    return body


def document_schema(name: str) -> dict[str, t.Any]:
    """The schema of ``opsctl NAME --json``'s one document (or of the file ``NAME``).

    Raises:
        KeyError: ``name`` is not one of :func:`names` (the CLI says which are).
    """
    if name == EVENT:
        return event_schema()
    if name in FILES:
        return file_schema(name)
    description, producer = DOCUMENTS[name]
    body = copy.deepcopy(TypeAdapter(producer()).json_schema())
    defs = body.pop("$defs", {})
    _close(body)
    _close(defs)
    failure = {"type": "object", "properties": {"ok": {"const": False}, "error": {"$ref": "#/$defs/Error"}},
               "required": ["ok", "error"],
               "description": "a failure: the error, and what the command got before it"}
    return {"$schema": DRAFT, "title": f"opsctl {name} --json", "description": description,
            "oneOf": [_success(body, defs), failure], "$defs": {**defs, "Error": _error_object()}}


def file_schema(name: str) -> dict[str, t.Any]:
    """The JSON Schema of a playbook or inventory file, from its pydantic model (the one
    definition ``opsctl`` loads the file with).

    Raises:
        KeyError: ``name`` is not one of :data:`FILES`.
    """
    if name == "playbook":  # one job, or a pipeline of them (a file with ``steps:``)
        from opsctl.config.pipeline import Pipeline
        from opsctl.config.playbook import Playbook

        body = TypeAdapter(Playbook | Pipeline).json_schema()
    elif name == "inventory":
        from opsctl.config.inventory import InventoryFile

        body = InventoryFile.model_json_schema()
    else:
        raise KeyError(name)
    return {"$schema": DRAFT, "title": f"opsctl {name} file", "description": FILES[name], **body}


def event_schema() -> dict[str, t.Any]:
    """One trainer event: any JSON object with a string ``event``; the ones opsctl writes have
    the keys their shapes list (and may carry more: events are open)."""
    known = _wire().EVENT_SHAPES
    branches = []
    defs: dict[str, t.Any] = {}
    for name, shape in known.items():
        schema = copy.deepcopy(shapes.json_schema(shape))
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
