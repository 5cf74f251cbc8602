"""A hostile container's agent, for every verb: whatever it answers, opsctl answers with its
checked reply or one named error line with its documented exit code (25 for a reply that is
not its verb's shape), in bounded time, never a traceback, and it writes nothing outside its
own log folder.

The container is answered at the CommandResult boundary (``tests/replies.py``
:class:`ScriptedContainer`): the real agent client, its validator and the real CLI commands
read the reply. Replies come from the wire shapes (hypothesis) and from the known attacks.
``tests/sandbox/test_hostile_reply_sandbox.py`` drives a representative set through the real
transport and a real container.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import time
import typing as t
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from opsctl import errors
from opsctl.cli import cli
from opsctl.remote import shapes
from opsctl.remote.command import CommandResult
from remote_payload import wire_shapes as ws
from remote_payload.agent.__main__ import VERBS
from remote_payload.wire import JobState, JobStateName
from tests.replies import (
    _STATUS,
    HOSTILE_NUMBERS,
    HOSTILE_TEXT,
    ScriptedContainer,
    envelope,
    hostile,
    minimal,
    scalar_key,
    scripted_agent,
    valid,
    write_inventory,
)

#: every exit code the OpsctlError tree documents (``opsctl help exit-codes``), and 0
DOCUMENTED = {0} | {getattr(errors, n) for n in dir(errors) if n.isupper()
                    and isinstance(getattr(errors, n), int)}

_LOGS = {"job_id": "j", "offset": 0, "next_offset": 3, "data_b64": "YWJj", "eof": True, "size": 3,
         "state": "RUNNING", "terminal": False, "exit_code": None, "signal": None,
         "since_indexed": True}


# --- every verb has a shape, one definition of the job states -------------------------------


def test_every_verb_the_agent_dispatches_has_a_reply_shape_and_every_shape_a_verb() -> None:
    assert sorted(set(VERBS) - set(ws.REPLY_SHAPES)) == [], "a verb without a reply shape"
    assert sorted(set(ws.REPLY_SHAPES) - set(VERBS)) == [], "a shape of no verb"


def test_the_agent_client_refuses_a_verb_without_a_shape_before_sending_anything() -> None:
    sent: list[str] = []
    agent = scripted_agent(lambda verb, args: sent.append(verb) or b"")
    with pytest.raises(LookupError, match="no reply shape"):
        agent.call("no-such-verb")  # type: ignore[call-overload]
    assert sent == []


def test_the_job_state_names_are_the_job_state_enum_in_its_order() -> None:
    assert list(t.get_args(JobStateName)) == [s.value for s in JobState]
    assert ws.JobStateName is JobStateName


def _walk(schema: t.Any, defs: dict[str, t.Any], path: str, seen: set[str]) -> t.Iterator[str]:
    """Every unbounded string, array, object or integer of a JSON Schema (``path``s)."""
    if not isinstance(schema, dict):
        return
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name not in seen:
            yield from _walk(defs[name], defs, name, seen | {name})
        return
    kind = schema.get("type")
    if kind == "string" and "maxLength" not in schema and "enum" not in schema \
            and "const" not in schema:
        yield f"{path}: string without maxLength"
    if kind == "array" and "maxItems" not in schema:
        yield f"{path}: array without maxItems"
    if kind == "object" and "properties" not in schema and "maxProperties" not in schema:
        yield f"{path}: object without maxProperties"
    if kind == "integer" and not ("maximum" in schema and "minimum" in schema):
        yield f"{path}: integer without bounds"
    for key, sub in schema.get("properties", {}).items():
        yield from _walk(sub, defs, f"{path}.{key}", seen)
    for key in ("items", "additionalProperties", "propertyNames"):
        yield from _walk(schema.get(key), defs, f"{path}[]", seen)
    for sub in schema.get("anyOf", []):
        yield from _walk(sub, defs, path, seen)


@pytest.mark.parametrize("verb", sorted(ws.REPLY_SHAPES))
def test_every_string_list_object_and_integer_of_a_reply_is_bounded(verb: str) -> None:
    schema = shapes.json_schema(ws.REPLY_SHAPES[verb])
    assert list(_walk(schema, schema.get("$defs", {}), verb, set())) == []


@pytest.mark.parametrize(("verb", "field"), [
    ("status", "job_id"), ("status", "after"), ("jobs", "current"), ("stop", "job_id"),
    ("logs", "job_id"), ("queue-rm", "job_id"), ("stacks", "job_id"), ("history", "job_id"),
    ("abort", "job_id"), ("abort", "old_job"), ("env", "current_job")])
def test_a_job_id_field_carries_the_agents_job_id_pattern(verb: str, field: str) -> None:
    schema = shapes.json_schema(ws.REPLY_SHAPES[verb])
    prop = schema["properties"][field]
    patterns = [prop.get("pattern")] + [s.get("pattern") for s in prop.get("anyOf", [])]
    assert "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$" in patterns


# --- the agent client, verb by verb ----------------------------------------------------------


def _data_of(verb: str, data: t.Any) -> t.Any:
    return scripted_agent(lambda v, args: envelope(v, data)).call(verb)  # type: ignore[call-overload]


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
@pytest.mark.parametrize("verb", sorted(ws.REPLY_SHAPES))
def test_a_reply_the_shape_allows_reaches_the_caller_unchanged(verb: str, data: st.DataObject) -> None:
    """Unchanged when it also carries no more than was asked (``REQUEST_BOUNDS``, held by
    tests/unit/test_reply_bounds.py): a ``jobs`` reply whose ``limit`` is not the one asked,
    or a ``status`` with more output lines than the 20 asked, is refused though its shape is
    valid."""
    from opsctl.remote import agent_client

    doc = data.draw(valid(ws.REPLY_SHAPES[verb]))
    if verb == "jobs":  # what a plain ``jobs`` asks: no --limit, so the limit echoed is 0
        doc = {**doc, "limit": 0}
    checked = shapes.validate(ws.REPLY_SHAPES[verb], doc, where="test")
    bound = agent_client.REQUEST_BOUNDS.get(verb)
    assume(bound is None or bound([], checked) is None)
    if verb == "goodput" and agent_client.goodput_problem(checked, whole=True) is not None:
        with pytest.raises(errors.ReplyShapeError, match="the ledger does not add up"):
            _data_of(verb, doc)
        return
    assert _data_of(verb, doc) == _added_up(verb, checked)


def _added_up(verb: str, checked: dict[str, t.Any]) -> dict[str, t.Any]:
    """A checked ``status`` as the client gives it: a goodput brief that does not add up
    (causes summing to its wall time, goodput their productive share) dropped."""
    from opsctl.remote import agent_client

    brief = checked.get("goodput") if verb in ("status", "launch") else None
    if brief is not None and agent_client.goodput_problem(brief, whole=False) is not None:
        return {**checked, "goodput": None}
    return checked


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
@pytest.mark.parametrize("verb", sorted(ws.REPLY_SHAPES))
def test_any_reply_is_the_checked_document_or_one_reply_shape_error(verb: str, data: st.DataObject) -> None:
    doc = data.draw(hostile(ws.REPLY_SHAPES[verb]))
    try:
        got = _data_of(verb, doc)
    except errors.ReplyShapeError as exc:
        assert exc.exit_code == errors.REMOTE_FAILED
        assert "\n" not in exc.message and "\x1b" not in exc.message and len(exc.message) < 600
        assert exc.log_path and Path(exc.log_path).is_file()  # the whole reply, kept
        return
    assert got == _added_up(verb, shapes.validate(ws.REPLY_SHAPES[verb], doc, where="test"))


@pytest.mark.parametrize("job_id", ["../../../.ssh", "/root/.ssh", "..", "a/b", ".hidden",
                                    "-rf", "x" * 129, "j\n"])
@pytest.mark.parametrize("verb", ["status", "jobs", "logs", "stop", "stacks", "history", "abort"])
def test_a_traversal_or_malformed_job_id_never_passes_the_boundary(verb: str, job_id: str) -> None:
    doc = {**_valid_doc(verb), ("current" if verb == "jobs" else "job_id"): job_id}
    with pytest.raises(errors.ReplyShapeError, match=r"should match pattern|at most 128"):
        _data_of(verb, doc)


def _valid_doc(verb: str) -> dict[str, t.Any]:
    if verb in ("status", "launch"):
        return dict(_STATUS)
    if verb == "logs":
        return dict(_LOGS)
    if verb == "goodput":
        return _ledger()
    return t.cast(dict[str, t.Any], minimal(ws.REPLY_SHAPES[verb]))


@pytest.mark.parametrize("value", [1e308, -1e12, 1e11 + 1])
@pytest.mark.parametrize("field", ["elapsed_s", "created_at", "now", "timeout_s"])
def test_a_time_past_its_bound_is_refused_never_printed(field: str, value: float) -> None:
    with pytest.raises(errors.ReplyShapeError, match=f"{field}: Input should be"):
        _data_of("status", {**_STATUS, field: value})


def test_a_string_past_its_bound_is_refused() -> None:
    with pytest.raises(errors.ReplyShapeError, match="name: String should have at most 1024"):
        _data_of("status", {**_STATUS, "name": "n" * 1025})
    with pytest.raises(errors.ReplyShapeError, match="phase: String should have at most 1024"):
        _data_of("status", {**_STATUS, "phase": "p" * 5000})


@pytest.mark.parametrize(("verb", "field", "value"), [
    ("envs", "current", "../torch-x"), ("envs", "current", "torch-a/../../b"),
    ("cache-info", "current_fingerprint", "../x"), ("net", "address", "1.2.3.4; rm -rf /"),
    ("net", "free_port", 0), ("net", "free_port", 70000)])
def test_a_name_outside_the_agents_own_pattern_is_refused(verb: str, field: str, value: t.Any) -> None:
    with pytest.raises(errors.ReplyShapeError, match=field):
        _data_of(verb, {**_valid_doc(verb), field: value})


def test_a_reply_that_is_not_json_is_named_so_with_the_saved_output() -> None:
    agent = scripted_agent(lambda verb, args: b"Segmentation fault (core dumped)\n")
    with pytest.raises(errors.RemoteCommandFailed, match="the reply is not JSON") as exc:
        agent.call("status")
    assert "no output" not in exc.value.message and exc.value.exit_code == errors.REMOTE_FAILED
    assert "Segmentation fault" in exc.value.message
    assert exc.value.log_path and "Segmentation fault" in Path(exc.value.log_path).read_text()


def test_an_empty_reply_is_named_no_output() -> None:
    agent = scripted_agent(lambda verb, args: b"")
    with pytest.raises(errors.RemoteCommandFailed, match="no output"):
        agent.call("jobs")


def test_json_that_is_not_the_envelope_is_named_so() -> None:
    agent = scripted_agent(lambda verb, args: b'{"hello": 1}')
    with pytest.raises(errors.RemoteCommandFailed, match=r"is not an agent reply .*ok: Field required"):
        agent.call("jobs")


# --- the CLI over a hostile agent ------------------------------------------------------------

#: commands and the verb whose reply they read (the harness answers the others validly)
COMMANDS: list[tuple[list[str], str]] = [
    (["status"], "status"), (["jobs"], "jobs"), (["logs"], "logs"),
    (["stop", "--job", "j", "--grace", "0"], "stop"), (["queue"], "queue"),
    (["cache", "info"], "cache-info"), (["envs"], "envs"), (["plot"], "history"),
    (["stacks"], "stacks"), (["probe", "compile-race"], "probe"), (["goodput"], "goodput"),
]


@contextlib.contextmanager
def _within(seconds: float) -> t.Iterator[None]:
    """Fails the test (rather than hang the suite) when the block runs past ``seconds``."""
    def expired(*_: t.Any) -> None:
        raise TimeoutError(f"still running after {seconds} s: a loop or a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


class Harness:
    """The CLI against a container whose agent answers ``replies[verb]`` (raw bytes, or
    data put in an ``ok`` envelope); a fresh HOME holding OPSCTL_HOME."""

    def __init__(self, home: Path, monkeypatch: pytest.MonkeyPatch):
        self.home = home
        self.replies: dict[str, t.Any] = {}
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("OPSCTL_HOME", str(home / ".opsctl"))
        monkeypatch.setenv("OPSCTL_INVENTORY_DIRS", str(home / ".opsctl" / "inventory"))
        write_inventory(home / ".opsctl")
        self.container = ScriptedContainer(self.answer).install(monkeypatch)

    def answer(self, verb: str, args: list[str]) -> bytes | CommandResult:
        got = self.replies.get(verb, _valid_doc(verb) if verb in ("status", "logs") else None)
        if isinstance(got, (bytes, CommandResult)):
            return got
        if got is None:
            got = minimal(ws.REPLY_SHAPES[verb])
        return envelope(verb, got)

    def run(self, *args: str) -> t.Any:
        from click.testing import CliRunner

        before = _tree(self.home)
        start = time.monotonic()
        as_json = ["--json"] if args[0] not in NO_JSON else []
        with _within(20):
            res = CliRunner().invoke(cli, [*as_json, *args, "--host", "pve1", "--ct", "200"],
                                     catch_exceptions=False)
        assert time.monotonic() - start < 20
        assert res.exit_code in DOCUMENTED, res.output
        new = _tree(self.home) - before
        assert all(p.startswith(os.path.join(".opsctl", "logs")) or p.startswith(".opsctl/state")
                   or p == ".opsctl/logs" for p in new), f"written outside its logs: {sorted(new)}"
        assert not (self.home / ".ssh").exists()
        return res


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Harness:
    h = Harness(tmp_path / "home", monkeypatch)
    h.home.mkdir(exist_ok=True)
    return h


#: commands without ``--json`` (their output is the log's bytes)
NO_JSON = {"logs"}


def _one_error_line(res: t.Any) -> dict[str, t.Any]:
    """The error of a failed command: one line (``--json``'s ``error``, else the ``error:``
    line on stderr, followed only by its hint and the saved output's path)."""
    assert "Traceback" not in res.output
    if not res.stdout.lstrip().startswith("{"):
        lines = res.stderr.splitlines()
        assert lines and lines[0].startswith("error: "), res.stderr
        assert all(ln.startswith(("  hint: ", "  full output: ")) for ln in lines[1:]), res.stderr
        return {"message": lines[0].removeprefix("error: "), "type": None}
    doc = json.loads(res.stdout)
    assert doc["ok"] is False, res.stdout
    message = doc["error"]["message"]
    assert "\n" not in message and "\x1b" not in message and len(message) < 600
    assert "Traceback" not in res.output
    return t.cast(dict[str, t.Any], doc["error"])


def _with(verb: str, kinds: tuple[type, ...], value: t.Any) -> bytes:
    """``verb``'s reply with ``value`` at its first key of ``kinds`` (at the top, else in a
    row of its first list of rows that has one)."""
    shape = ws.REPLY_SHAPES[verb]
    doc = _valid_doc(verb)
    try:
        return envelope(verb, {**doc, scalar_key(shape, *kinds): value})
    except LookupError:
        pass
    for key, tp in t.get_type_hints(shape, include_extras=True).items():
        (item,) = t.get_args(tp) if t.get_origin(tp) is list else (None,)
        if item is not None and isinstance(item, type) and hasattr(item, "__required_keys__"):
            with contextlib.suppress(LookupError):
                return envelope(verb, {**doc, key: [{**minimal(item), scalar_key(item, *kinds): value}]})
    raise LookupError(f"{verb}: no {kinds} value to attack")


def _id_key(verb: str) -> str | None:
    hints = t.get_type_hints(ws.REPLY_SHAPES[verb], include_extras=True)
    return next((k for k, v in hints.items() if "Matches" in str(v)), None)


def _with_id(verb: str, value: t.Any) -> bytes:
    key = _id_key(verb) or next(iter(t.get_type_hints(ws.REPLY_SHAPES[verb])))
    return envelope(verb, {**_valid_doc(verb), key: value})


ATTACKS: list[tuple[str, t.Callable[[str], bytes]]] = [
    ("not JSON", lambda verb: b"<html>502 Bad Gateway</html>"),
    ("no output", lambda verb: b""),
    ("a list", lambda verb: envelope(verb, ["a", "list"])),
    ("NaN", lambda verb: _with(verb, (int, float), float("nan"))),
    ("Infinity", lambda verb: _with(verb, (int, float), float("inf"))),
    ("1e308", lambda verb: _with(verb, (int, float), 1e308)),
    ("a huge string", lambda verb: _with(verb, (str,), "x" * 200_000)),
    ("a wrong type", lambda verb: _with_id(verb, 7)),
    ("a traversal id", lambda verb: _with_id(verb, "../../../.ssh")),
]
CASES = [(c, v, a) for c, v in COMMANDS for a in ATTACKS
         if a[0] != "a traversal id" or _id_key(v) is not None]


@pytest.mark.parametrize(("command", "verb", "attack"), CASES,
                         ids=[f"{v}-{a[0]}" for _, v, a in CASES])
def test_a_known_attack_is_one_error_line_with_exit_25(harness: Harness, command: list[str],
                                                       verb: str, attack: t.Any) -> None:
    harness.replies[verb] = attack[1](verb)
    res = harness.run(*command)
    assert res.exit_code == errors.REMOTE_FAILED, res.output
    _one_error_line(res)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
@pytest.mark.parametrize(("command", "verb"), COMMANDS, ids=[c[1] for c in COMMANDS])
def test_whatever_the_agent_answers_the_cli_exits_with_a_documented_code(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        command: list[str], verb: str, data: st.DataObject) -> None:
    with monkeypatch.context() as mp:
        harness = Harness(tmp_path_factory.mktemp("home"), mp)
        doc = data.draw(hostile(ws.REPLY_SHAPES[verb]))
        if verb == "logs" and isinstance(doc, dict):  # mostly a chunk whose bytes add up
            raw = base64.b64encode(data.draw(st.binary(max_size=64))).decode()
            doc = {**doc, **data.draw(st.sampled_from([{}, {"data_b64": raw, "offset": 0}]))}
        harness.replies[verb] = envelope(verb, doc)
        res = harness.run(*command)
        try:
            shapes.validate(ws.REPLY_SHAPES[verb], doc, where="test")
        except errors.ReplyShapeError:
            assert res.exit_code == errors.REMOTE_FAILED, res.output
            assert _one_error_line(res)["type"] in ("ReplyShapeError", None)


# --- a goodput ledger adds up ----------------------------------------------------------------

_CAUSES = t.get_args(ws.GoodputCause)


def _ledger(**fields: t.Any) -> dict[str, t.Any]:
    """A ``goodput`` reply of 100 s, 90 of them productive, that adds up."""
    causes = {**dict.fromkeys(_CAUSES, 0.0), "productive": 90.0, "startup": 10.0}
    doc = {**t.cast(dict[str, t.Any], minimal(ws.GoodputDoc)), "started_at": 1000.0,
           "now": 1100.0, "wall_s": 100.0, "goodput": 0.9, "causes": causes,
           "timeline": [["startup", 1000.0, 1010.0], ["productive", 1010.0, 1100.0]]}
    return {**doc, **fields}


_ATTEMPT = {**t.cast(dict[str, t.Any], minimal(ws.GoodputAttemptDoc)),
            "causes": dict.fromkeys(_CAUSES, 0.0)}


@pytest.mark.parametrize(("fields", "why"), [
    ({"causes": {**_ledger()["causes"], "productive": 5000.0}}, "the causes sum to 5010.000 s"),
    ({"goodput": 0.1}, "goodput 0.1 is not productive 90.000 s of 100.000 s"),
    ({"causes": {**dict.fromkeys(_CAUSES, 0.0), "productive": 100.0}, "goodput": 1.0,
      "now": 9e10}, "the wall time 100.000 s is not its start"),
    ({"causes": {"productive": 90.0, "startup": 10.0}}, "causes lack checkpoint"),
    ({"ended_at": 10.0}, "the wall time 100.000 s is not its start 1000.0 to its end 10.0"),
])
def test_a_goodput_ledger_that_does_not_add_up_is_one_error_line_with_exit_25(
        harness: Harness, fields: dict[str, t.Any], why: str) -> None:
    harness.replies["goodput"] = _ledger(**fields)
    res = harness.run("goodput")
    assert res.exit_code == errors.REMOTE_FAILED, res.output
    message = _one_error_line(res)["message"]
    assert "goodput: the ledger does not add up: " + why in message, message


def test_a_goodput_ledger_that_adds_up_is_shown(harness: Harness) -> None:
    harness.replies["goodput"] = _ledger(attempts=[_ATTEMPT])
    res = harness.run("goodput")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["causes"]["productive"] == 90.0


def test_more_attempt_rows_than_a_ledger_lists_are_refused_at_once(harness: Harness) -> None:
    """200,000 rows would take the terminal table minutes to draw."""
    harness.replies["goodput"] = _ledger(attempts=[_ATTEMPT] * 1025)
    res = harness.run("goodput")
    assert res.exit_code == errors.REMOTE_FAILED
    assert "attempts: List should have at most 1024 items" in _one_error_line(res)["message"]


def test_a_status_whose_goodput_brief_does_not_add_up_loses_that_line_never_the_status(
        harness: Harness) -> None:
    brief = {"run_id": "j", "wall_s": 100.0, "goodput": 0.99, "crashes": 0, "hangs": 0,
             "restarts": 0, "redeploys": 0, "effective_tok_s": None, "eta_s": None,
             "causes": {**dict.fromkeys(_CAUSES, 0.0), "productive": 5000.0}}
    harness.replies["status"] = {**_STATUS, "goodput": brief}
    res = harness.run("status")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["goodput"] is None


# --- loops over a remote offset --------------------------------------------------------------


@pytest.mark.parametrize("follow", [[], ["-f"]])
def test_logs_whose_offset_does_not_advance_ends_with_one_error(harness: Harness,
                                                                follow: list[str]) -> None:
    harness.replies["logs"] = {**_LOGS, "data_b64": "", "next_offset": 0, "eof": False, "size": 10}
    res = harness.run("logs", *follow)
    assert res.exit_code == errors.REMOTE_FAILED
    assert "does not advance" in _one_error_line(res)["message"]
    assert harness.container.verbs.count("logs") == 1  # asked once, never again


def test_logs_whose_offset_lies_about_its_bytes_ends_with_one_error(harness: Harness) -> None:
    harness.replies["logs"] = {**_LOGS, "next_offset": 0, "eof": False, "size": 10}
    res = harness.run("logs")
    assert res.exit_code == errors.REMOTE_FAILED
    assert "next_offset 0 is not offset 0 + the 3 bytes" in _one_error_line(res)["message"]


def test_logs_whose_bytes_are_not_base64_is_one_error(harness: Harness) -> None:
    harness.replies["logs"] = {**_LOGS, "data_b64": "not base64!"}
    res = harness.run("logs")
    assert res.exit_code == errors.REMOTE_FAILED
    assert "not base64" in _one_error_line(res)["message"]


def test_logs_of_another_offset_than_asked_is_one_error(harness: Harness) -> None:
    harness.replies["logs"] = {**_LOGS, "offset": 5, "next_offset": 8, "size": 8}
    res = harness.run("logs")
    assert res.exit_code == errors.REMOTE_FAILED
    assert "from byte 5, byte 0 was asked" in _one_error_line(res)["message"]


def test_the_hostile_text_and_numbers_cover_the_documented_attacks() -> None:
    assert "../../../.ssh" in HOSTILE_TEXT and any(len(s) > ws.TEXT_MAX for s in HOSTILE_TEXT)
    assert any(x != x for x in HOSTILE_NUMBERS) and 1e308 in HOSTILE_NUMBERS


# --- one boundary ----------------------------------------------------------------------------

#: where an agent verb may be run or its reply parsed, and why
BOUNDARY = {
    "opsctl/remote/agent_client.py": "the agent client: runs each verb and validates its reply",
    "opsctl/remote/command.py": "defines agent_argv (the container command of a verb)",
}


def test_only_the_agent_client_runs_an_agent_verb_or_parses_its_reply() -> None:
    import ast

    root = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted((root / "opsctl").rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel in BOUNDARY:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            name = node.id if isinstance(node, ast.Name) else \
                node.attr if isinstance(node, ast.Attribute) else None
            if isinstance(node, ast.alias):
                name = node.name
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "answer":
                name = "Agent.answer"  # what call() does after the remote part
            if name in ("agent_argv", "parse_reply", "Agent.answer"):
                found.append(f"{rel}:{getattr(node, 'lineno', '?')} {name}")
    assert found == [], "an agent reply read around the agent client"


def test_the_contract_pages_job_id_example_is_one_the_agent_makes() -> None:
    import re

    from remote_payload import wire

    page = (Path(__file__).resolve().parents[2] / "docs" / "contracts.md").read_text()
    ids = re.findall(r'"job_id": "([^"]+)"', page)
    assert ids
    for job_id in ids:
        assert re.fullmatch(wire.JOB_ID_PATTERN, job_id), job_id
        hex_digits = 2 * wire.JOB_ID_RANDOM_BYTES
        assert re.fullmatch(rf".+-\d{{8}}-\d{{6}}-[0-9a-f]{{{hex_digits}}}", job_id), job_id
