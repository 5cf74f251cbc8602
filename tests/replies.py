"""Agent replies for tests of the code that reads them.

Complete replies: the wire shapes (``remote_payload/wire_shapes.py``) require every key the
agent always sends, so a test gives only the keys it is about and gets the rest here, checked
against the shape. And the hostile-agent harness: a container whose agent answers whatever a
test says, for every verb (:class:`ScriptedContainer`), with replies built from the shapes and
the known attacks (:func:`valid`, :func:`hostile`)."""

from __future__ import annotations

import json
import shlex
import types
import typing as t
from pathlib import Path

from hypothesis import strategies as st

from opsctl.remote import shapes
from opsctl.remote.agent_client import Agent
from opsctl.remote.command import CommandResult, Kept
from opsctl.remote.transport import Remote
from remote_payload.wire_shapes import DiagnosisDoc, StatusDoc

_STATUS: dict[str, t.Any] = {
    "job_id": "j", "name": "job", "state": "RUNNING", "healthy": False, "phase": None,
    "created_at": 1000.0, "started_at": None, "ended_at": None, "elapsed_s": 0.0, "pid": None,
    "pgid": None, "alive": False, "exit_code": None, "signal": None, "pane_tail": [],
    "output_tail": [], "output_log": "/opt/opsctl/jobs/j/output.log", "output_size": 0,
    "last_output_at": None, "last_step": None, "events_tail": [], "gpus": [], "gpu_error": None,
    "gpus_at": 1000.0, "diagnosis": [], "evidence": [],
    "tmux": {"socket": None, "session": None, "error": None}, "healthy_when": None,
    "timeout_s": None, "expect_tok_s": None, "hang_after_s": None, "phase_budgets_s": {},
    "budget_s": None, "hang_threshold_s": None, "hang": None, "errors": [], "preflight": None,
    "transitions": [], "now": 1000.0, "attempt": 1, "max_restarts": None, "restarts": [],
    "end_reason": None, "max_duration_s": None, "run": None,
}


def status_doc(**fields: t.Any) -> StatusDoc:
    """A ``status`` reply with ``fields`` over the defaults, as the CLI validates it."""
    return shapes.validate(StatusDoc, {**_STATUS, **fields}, where="test")


def diagnosis(cause: str, summary: str, severity: str = "error") -> DiagnosisDoc:
    return {"cause": cause, "severity": t.cast(t.Any, severity), "summary": summary,
            "evidence": [], "hint": ""}


# --- a container whose agent answers what a test says ---------------------------------------
#
# The hostile-agent harness: every agent verb opsctl sends is answered at the CommandResult
# boundary (``Remote.pct_exec``), so the real Agent client, its parser and validator, and the
# real CLI commands above it read the reply. Nothing is connected: the inventory host is never
# contacted.

Answer = t.Callable[[str, list[str]], "bytes | CommandResult"]


def envelope(verb: str, data: t.Any) -> bytes:
    """An ``ok`` reply of ``verb`` carrying ``data`` (any JSON, NaN and Infinity as their
    literals: the attacks the agent never writes)."""
    return json.dumps({"ok": True, "verb": verb, "data": data, "agent_version": 1}).encode()


def verb_of(argv: t.Sequence[str]) -> str | None:
    """The agent verb of a container command (``agent_argv``'s layout), or None."""
    words = list(argv)
    if "remote_payload.agent" not in words:
        return None
    rest = words[words.index("remote_payload.agent") + 1:]
    while rest and rest[0] == "--root":
        rest = rest[2:]
    return rest[0] if rest else None


class ScriptedContainer:
    """Stands in for ``Remote.pct_exec``: an agent verb gets ``answer(verb, args)`` as its
    stdout (bytes, kept to ``keep_bytes`` as the transport does) or as a whole
    :class:`CommandResult`; the payload manifest is this checkout's (nothing is shipped)."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.verbs: list[str] = []

    def pct_exec(self, _remote: t.Any, ctid: int, argv: t.Sequence[str], *,
                 keep_bytes: int | None = None, **_: t.Any) -> CommandResult:
        words = tuple(argv)
        verb = verb_of(words)
        if verb is None:
            if words[:1] == ("cat",) and words[-1].endswith("MANIFEST.json"):
                from opsctl.remote import payload

                out = json.dumps({"digest": payload.build_manifest().digest}).encode()
                return CommandResult(words, shlex.join(words), 0, out, b"", 0.01)
            return CommandResult(words, shlex.join(words), 0, b"", b"", 0.01)
        self.verbs.append(verb)
        rest = words[words.index(verb) + 1:]
        got = self.answer(verb, [w for w in rest if w != "--json"])
        if isinstance(got, CommandResult):
            return got
        kept = Kept(keep_bytes)
        kept.add(got)
        return CommandResult(words, shlex.join(words), 0, kept.value(), b"", 0.01)

    def install(self, monkeypatch: t.Any) -> ScriptedContainer:
        from opsctl.remote.transport import Remote

        container = self

        def pct_exec(remote: t.Any, ctid: int, argv: t.Sequence[str], **kw: t.Any) -> CommandResult:
            return container.pct_exec(remote, ctid, argv, **kw)

        monkeypatch.setattr(Remote, "pct_exec", pct_exec)
        return self


def scripted_agent(answer: Answer, ctid: int = 200) -> Agent:
    """A real :class:`Agent` of ``pve1 ct <ctid>`` whose container answers ``answer``
    (no connection: the scripted ``pct_exec`` is the agent's remote's only call)."""
    from opsctl.config.inventory import HostSpec

    remote = Remote(HostSpec(name="pve1", address="127.0.0.1", containers={ctid: {}}))
    container = ScriptedContainer(answer)
    remote.pct_exec = lambda ctid, argv, **kw: container.pct_exec(remote, ctid, argv, **kw)  # type: ignore[method-assign]
    return Agent(remote, ctid)


def write_inventory(home: Path, ctid: int = 200) -> None:
    """The inventory of the harness: host ``pve1`` on 127.0.0.1 (never contacted) with ``ctid``."""
    inv = home / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yaml").write_text(json.dumps({"hosts": {"pve1": {
        "address": "127.0.0.1", "user": "root", "containers": {str(ctid): {"gpus": 1}}}}}))


# --- replies built from the shapes, and the known attacks ------------------------------------

#: strings a hostile container puts where a name or an id is due
HOSTILE_TEXT = ["../../../.ssh", "/etc/passwd", "..", ".", "a/b", "-rf", "x" * 70_000,
                "\x1b]0;pwn\x07", "a\nb", "\x00", "\u202e"]
#: numbers the agent never writes (``NaN`` / ``Infinity`` are their JSON literals here)
HOSTILE_NUMBERS = [float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 2**64, 10**30, -1]


def valid(tp: t.Any) -> st.SearchStrategy[t.Any]:
    """Values of a wire shape's type ``tp`` that a well-behaved agent could send (the
    bounds and patterns of ``wire_shapes`` held)."""
    from opsctl.remote import shapes as sh

    if sh._is_typeddict(tp):
        hints = t.get_type_hints(tp, include_extras=True)
        required = tp.__required_keys__
        return st.fixed_dictionaries(
            {k: valid(v) for k, v in hints.items() if k in required},
            optional={k: valid(v) for k, v in hints.items() if k not in required})
    origin, args = t.get_origin(tp), t.get_args(tp)
    if origin is t.Annotated:
        marks = {type(m).__name__: m.value for m in args[1:]}
        base = args[0]
        if base is str:
            if "Matches" in marks:
                return st.from_regex(marks["Matches"], fullmatch=True).filter(
                    lambda s: len(s) <= marks.get("MaxLen", 1 << 30))
            return st.text(max_size=min(marks.get("MaxLen", 40), 40))
        if base in (int, float):
            low, high = marks.get("AtLeast", -1000), marks.get("AtMost", 10**9)
            ints = st.integers(max(int(low), -(10**9)), min(int(high), 10**9))
            return ints if base is int else st.floats(max(low, -1e9), min(high, 1e9))
        return valid(base)
    if origin is t.Literal:
        return st.sampled_from(args)
    if origin in (t.Union, types.UnionType):
        return st.one_of(*(valid(a) for a in args))
    if origin is list:
        return st.lists(valid(args[0]), max_size=3)
    if origin is dict:  # keys as the shape types them (a Literal: the names it allows)
        return st.dictionaries(valid(args[0]), valid(args[1]), max_size=3)
    if tp is type(None):
        return st.none()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(-(10**6), 10**6)
    if tp is float:
        return st.floats(-1e6, 1e6)
    if tp is str:
        return st.text(max_size=20)
    if tp is t.Any:  # a value the shape leaves open: any JSON scalar
        return st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6),
                         st.text(max_size=8))
    return st.none()


def hostile(tp: t.Any) -> st.SearchStrategy[t.Any]:
    """Values of ``tp``'s shape in which hypothesis may swap any value for an attack: a
    traversal id, a huge or control-laden string, NaN, Infinity, 1e308, a value of another
    JSON type."""
    attack = st.sampled_from([*HOSTILE_TEXT, *HOSTILE_NUMBERS, None, True, [], {}, "1"])
    from opsctl.remote import shapes as sh

    if sh._is_typeddict(tp):
        hints = t.get_type_hints(tp, include_extras=True)
        required = tp.__required_keys__
        doc = st.fixed_dictionaries(
            {k: hostile(v) for k, v in hints.items() if k in required},
            optional={k: hostile(v) for k, v in hints.items() if k not in required})
        return st.one_of(doc, doc, doc, attack)
    return st.one_of(valid(tp), valid(tp), valid(tp), attack)


def minimal(tp: t.Any) -> t.Any:
    """The simplest value of a wire shape's type ``tp`` that its bounds allow: every required
    key, an id where an id is due (deterministic, unlike a drawn one)."""
    from opsctl.remote import shapes as sh
    from remote_payload import wire

    if sh._is_typeddict(tp):
        hints = t.get_type_hints(tp, include_extras=True)
        return {k: minimal(v) for k, v in hints.items() if k in tp.__required_keys__}
    origin, args = t.get_origin(tp), t.get_args(tp)
    if origin is t.Annotated:
        marks = {type(m).__name__: m.value for m in args[1:]}
        pattern = marks.get("Matches")
        if pattern is not None:
            return {wire.JOB_ID_PATTERN: "j", wire.BUILD_NAME_PATTERN: "torch-2.11.0-cpu",
                    wire.FINGERPRINT_PATTERN: "fp", wire.IPV4_PATTERN: "10.0.0.1"}[pattern]
        if args[0] in (int, float):
            return args[0](max(marks.get("AtLeast", 0), 0))
        return minimal(args[0])
    if origin is t.Literal:
        return args[0]
    if origin in (t.Union, types.UnionType):
        return None if type(None) in args else minimal(args[0])
    if origin is list:
        return []
    if origin is dict:
        return {}
    return {bool: False, int: 0, float: 0.0, str: "x"}.get(tp)


def scalar_key(shape: type, *kinds: type) -> str:
    """The first key of ``shape`` whose value is one of ``kinds`` (``int``, ``float``; under
    its bounds and ``| None``)."""
    for key, tp in t.get_type_hints(shape, include_extras=True).items():
        while t.get_origin(tp) in (t.Annotated, t.Union, types.UnionType):
            tp = next(a for a in t.get_args(tp) if a is not type(None))
        if tp in kinds:
            return key
    raise LookupError(f"{shape.__name__} has no {kinds} key")
