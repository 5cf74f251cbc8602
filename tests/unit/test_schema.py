"""``opsctl schema``: a JSON Schema (draft 2020-12) for every ``--json`` document (every
command that takes ``--json`` has one), for trainer events and for the playbook and inventory
files; valid, closed where opsctl decides the keys, and refusing what it does not know with
exit 2. Real outputs are validated in ``tests/sandbox/test_schema_sandbox.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from opsctl import errors
from opsctl.cli import cli, schemas
from tests.cli_runner import run_cli
from tests.paths import REPO

STOPPED = {"job_id": "j", "state": "CANCELLED", "signals_sent": ["SIGINT"], "remaining_pids": [],
           "waited_s": 0.5, "exit_code": None, "signal": "SIGINT"}


def invoke(*args: str):
    return run_cli("schema", *args)


def test_without_a_command_it_lists_every_schema():
    res = invoke()
    assert res.exit_code == 0
    listed = [line.split("  ")[0] for line in res.stdout.splitlines()]
    assert listed == schemas.names()


@pytest.mark.parametrize("name", schemas.names())
def test_every_schema_is_a_valid_draft_2020_12_schema(name):
    res = invoke(*name.split())
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(doc)


def test_a_success_document_is_closed_and_an_error_document_always_fits():
    schema = schemas.document_schema("stop")
    v = Draft202012Validator(schema)
    ok = {"ok": True, **STOPPED}
    assert list(v.iter_errors(ok)) == []
    assert list(v.iter_errors({**ok, "surprise": 1})) != []  # closed: a new key is a change
    err = {"ok": False, "error": {"type": "UnknownJob", "message": "no job", "exit_code": 26,
                                  "hint": None, "log_path": None}}
    assert list(v.iter_errors(err)) == []


def test_events_are_open_but_the_keys_opsctl_reads_are_typed():
    v = Draft202012Validator(schemas.event_schema())
    assert list(v.iter_errors({"event": "step", "step": 1, "loss": 0.5, "_at": 1.0, "mine": [1]})) == []
    assert list(v.iter_errors({"event": "something-new", "anything": True})) == []
    assert list(v.iter_errors({"event": "step", "step": "one"})) != []
    assert list(v.iter_errors({"no": "event"})) != []


def test_an_unknown_command_is_a_usage_error_naming_the_ones_that_exist():
    res = invoke("nosuch")
    assert res.exit_code == errors.USAGE
    assert "status --all" in res.stderr and "event" in res.stderr


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=3))
def test_any_words_give_a_schema_or_exit_2_never_a_traceback(words):
    res = CliRunner().invoke(cli, ["schema", "--", *words])
    assert res.exit_code in (0, errors.USAGE), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_a_document_that_had_a_nan_still_validates_with_its_nonfinite_paths():
    from remote_payload import wire

    doc = {"ok": True, **STOPPED, wire.NONFINITE_KEY: ["waited_s"]}
    assert list(Draft202012Validator(schemas.document_schema("stop")).iter_errors(doc)) == []
    event = wire.finite_doc({"event": "step", "step": 3, "loss": float("nan")})
    assert event["loss"] is None and event[wire.NONFINITE_KEY] == ["loss"]
    assert list(Draft202012Validator(schemas.event_schema()).iter_errors(event)) == []


def _json_commands() -> list[str]:
    """Every command of the click tree that takes ``--json``, as ``opsctl schema`` names it."""
    import click

    found = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        if path and any("--json" in getattr(p, "opts", ()) for p in cmd.params):
            found.append(" ".join(path))
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])

    walk(cli, [])
    return found


def test_every_command_that_takes_json_has_a_schema():
    commands = _json_commands()
    assert len(commands) >= 24  # the walk found the tree (a broken walk must not pass)
    assert [c for c in commands if c not in schemas.DOCUMENTS] == []


def test_every_schema_names_a_command_that_exists():
    commands = set(_json_commands())
    assert [n for n in schemas.DOCUMENTS if n.split(" --")[0] not in commands] == []


def test_commands_that_print_the_same_document_share_its_one_definition():
    assert schemas.DOCUMENTS["queue move"][1] is schemas.DOCUMENTS["queue"][1]
    assert schemas.DOCUMENTS["pull"][1] is schemas.DOCUMENTS["push"][1]
    assert schemas.document_schema("queue move")["oneOf"] == schemas.document_schema("queue")["oneOf"]


def _yaml_files() -> list[tuple[str, Path]]:
    bundled = REPO / "opsctl" / "bundled"
    books = sorted((bundled / "playbooks").glob("*.yaml"))
    inventories = [bundled / "examples" / "hosts.yaml", *sorted((REPO / "inventory").glob("*.yaml"))]
    return [("playbook", p) for p in books] + [("inventory", p) for p in inventories]


@pytest.mark.parametrize(("kind", "path"), _yaml_files(), ids=lambda x: getattr(x, "name", x))
def test_every_bundled_playbook_and_the_example_inventory_validate_against_their_schema(kind, path):
    import yaml

    assert _yaml_files(), "no bundled files found"
    schema = json.loads(invoke(kind).stdout)
    Draft202012Validator.check_schema(schema)
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in Draft202012Validator(schema).iter_errors(doc)]
    assert problems == []


@pytest.mark.parametrize(("kind", "doc"), [
    ("playbook", {"name": "x", "command": []}),  # a job needs a command
    ("playbook", {"name": "x", "command": ["a"], "surprise": 1}),  # closed, as the loader is
    ("playbook", {"name": "x", "steps": []}),
    ("inventory", {"hosts": {"h": {"address": "10.0.0.1", "containers": {"99": {}}, "nope": 1}}}),
    ("inventory", []),
])
def test_the_file_schemas_refuse_what_the_loader_refuses(kind, doc):
    assert list(Draft202012Validator(schemas.file_schema(kind)).iter_errors(doc)) != []


def test_a_multi_node_runs_document_validates_against_its_schema():
    from opsctl.ops import multinode
    from tests.replies import status_doc

    rows = [multinode.NodeRow(0, "h:200", "h ct 200", status=status_doc(job_id="run-1")),
            multinode.NodeRow(1, "h:201", "h ct 201", error="connection refused",
                              error_exit_code=10)]
    report = multinode.RunReport("run-1", rows, playbook="p", outcome="RUNNING")
    v = Draft202012Validator(schemas.document_schema("status --nodes"))
    assert list(v.iter_errors({"ok": True, **report.to_dict()})) == []


def test_json_is_a_whole_word_a_name_glued_to_it_is_no_command():
    res = invoke("jobs--json")
    assert res.exit_code == errors.USAGE and "'jobs--json'" in res.stderr


@pytest.mark.parametrize("words", [["--json", "nosuch"], ["nosuch", "--json"], ["--json", ""]])
def test_an_unknown_name_with_json_is_the_error_document_on_stdout(words):
    res = invoke(*words)
    assert res.exit_code == errors.USAGE
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "ConfigError"


@pytest.mark.parametrize("name", ["", " ", "sta tus", "a'\"b", "\x1b[31mred", "status\n--all"])
def test_a_hostile_name_is_exit_2_with_its_control_characters_shown_as_codes(name):
    res = invoke(name)
    assert res.exit_code in (0, errors.USAGE)
    assert "\x1b" not in res.stderr and res.stderr.count("\n") <= 2


def test_the_global_json_flag_takes_schema_its_output_is_json():
    res = CliRunner().invoke(cli, ["--json", "schema", "status"], catch_exceptions=False)
    assert res.exit_code == 0 and json.loads(res.stdout)["title"] == "opsctl status --json"
    res = CliRunner().invoke(cli, ["--json", "schema", "nosuch"], catch_exceptions=False)
    assert res.exit_code == errors.USAGE and json.loads(res.stdout)["ok"] is False


@pytest.mark.parametrize("words", [["--json"], ["--json", "schema"]])
def test_the_list_with_json_is_one_document_naming_every_schema(words):
    args = ["schema", "--json"] if words == ["--json"] else ["--json", "schema"]
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0
    assert [r["name"] for r in json.loads(res.stdout)["schemas"]] == schemas.names()
