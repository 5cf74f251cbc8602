"""What a program in the container prints is read through one checked boundary.

The transfer probe, ``tarsync``'s verbs and the payload's manifest once went through plain
``json.loads`` and indexing: ``[1,2]``, ``{}`` or 100,000 ``[`` from a hostile container was a
TypeError, a KeyError or a RecursionError traceback. Every such document now has a shape in
``remote_payload.wire_shapes.HELPER_SHAPES`` and is read by ``opsctl.remote.shapes.parse_doc``
(bounded bytes, nesting the parser refuses, the shape's value bounds): any bytes give the
document or one ``ReplyShapeError`` line (exit 25). An :mod:`ast` walk holds that no other
code under ``opsctl/`` calls ``json.loads``/``json.load`` unless :data:`ALLOWED` names it with
the reason its input is not the container's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.errors import REMOTE_FAILED, ReplyShapeError
from opsctl.remote import shapes
from remote_payload import wire_shapes as ws

ROOT = Path(__file__).resolve().parents[2]

#: ``module:function`` -> why that json.loads/json.load reads no container output
ALLOWED: dict[str, str] = {
    "opsctl.remote.shapes:parse_doc": "the boundary itself (through pydantic's validate_json)",
    "opsctl.sandbox.host:_read_state":
        "the sandbox's own state file, written by this machine's test harness",
    "opsctl.remote.mux_client:query":
        "a frame of this user's own mux server over its private unix socket",
    "opsctl.remote.mux_server:_read_line":
        "a request from this user's own CLI over the mux server's private unix socket",
    "opsctl.state.pulled:_load": "opsctl's own state file on this machine, bounded read",
    "opsctl.state.last_target:load": "opsctl's own state file on this machine",
}


def _json_reads() -> dict[str, int]:
    """``module:function`` -> line of each json.loads/json.load call under opsctl/."""
    found: dict[str, int] = {}
    for path in sorted((ROOT / "opsctl").rglob("*.py")):
        if "bundled" in path.parts:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))

        def visit(node: ast.AST, where: str, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                name = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = child.name if where == "<module>" else f"{where}.{child.name}"
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        name = where  # a nested function belongs to the one around it
                if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                        and child.func.attr in ("loads", "load")
                        and isinstance(child.func.value, ast.Name)
                        and child.func.value.id == "json"):
                    found.setdefault(f"{module}:{where}", child.lineno)
                visit(child, name)

        visit(tree, "<module>")
    return found


def test_no_code_under_opsctl_parses_json_outside_the_boundary_or_the_allow_list():
    found = _json_reads()
    unlisted = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not unlisted, ("json parsed outside shapes.parse_doc (move it onto the boundary, "
                          f"or allow-list it with its reason): {unlisted}")


def test_every_allow_list_entry_still_names_a_json_read():
    assert set(ALLOWED) <= set(_json_reads()) | {"opsctl.remote.shapes:parse_doc"}


HOSTILE = [b"", b"not json", b"[1,2]", b"{}", b"null", b"[" * 100_000, b"{\"a\":" * 50_000,
           b"\xff\xfe", b'{"kind": "dir"}', b"1e999999"]


@pytest.mark.parametrize("name", sorted(ws.HELPER_SHAPES))
@pytest.mark.parametrize("raw", HOSTILE, ids=lambda r: repr(r[:12]))
def test_a_hostile_helper_answer_is_one_reply_shape_error(name, raw):
    shape = ws.HELPER_SHAPES[name]
    try:
        shapes.parse_doc(shape, raw, where="pve1: container 200: pull: probe")
    except ReplyShapeError as exc:
        assert exc.exit_code == REMOTE_FAILED
        assert "\n" not in str(exc) and len(str(exc)) < 600
        assert str(exc).startswith("pve1: container 200: pull: probe: ")
    else:  # only an empty mapping ({}: a tree without files, no wheels there) is one
        assert name in ("tarsync stat", "wheelhouse list") and raw == b"{}"


def test_a_helper_answer_over_its_byte_cap_is_refused_unread():
    with pytest.raises(ReplyShapeError, match="more than the 10"):
        shapes.parse_doc(ws.PayloadManifestDoc, b'{"digest": "' + b"a" * 64 + b'"}',
                         where="manifest", limit=10)


def test_a_well_formed_probe_answer_is_the_document():
    doc = shapes.parse_doc(ws.TransferProbeDoc, b'{"rsync": null, "kind": "dir", '
                           b'"real": "/opt/opsctl/data/x", "homes": ["/root"]}', where="probe")
    assert doc == {"rsync": None, "kind": "dir", "real": "/opt/opsctl/data/x", "homes": ["/root"]}


def test_an_answer_after_a_banner_is_refused_naming_the_banner_not_the_payload():
    """A host whose shell prints for every command (a motd from a ForceCommand or a
    ``.bashrc``): the probe's document comes after it. rsync and tar cannot run through such a
    shell, so it stays a refusal, but one that says what to fix on the host."""
    probe = b'{"rsync": null, "kind": "dir", "real": "/opt/opsctl/data/x", "homes": ["/root"]}'
    with pytest.raises(ReplyShapeError) as caught:
        shapes.parse_doc(ws.TransferProbeDoc, b"Welcome to gpu1 (Ubuntu 22.04 LTS)\n" + probe,
                         where="gpu1: push: probe")
    assert "banner or motd" in (caught.value.hint or ""), caught.value.hint
    with pytest.raises(ReplyShapeError) as other:  # plain garbage keeps the payload's hint
        shapes.parse_doc(ws.TransferProbeDoc, b"Traceback (most recent call last):\n  oops\n",
                         where="gpu1: push: probe")
    assert "banner" not in (other.value.hint or ""), other.value.hint


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(ws.HELPER_SHAPES)),
       st.one_of(st.binary(max_size=300),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                              lambda c: st.lists(c, max_size=5)
                              | st.dictionaries(st.sampled_from(
                                  ["kind", "rsync", "real", "homes", "root", "entries", "send",
                                   "delete", "ok", "files", "bytes", "deleted", "torn",
                                   "digest", "sha256", "skipped", "x"]), c, max_size=6),
                              max_leaves=20).map(lambda v: __import__("json").dumps(v).encode())))
def test_any_bytes_are_the_document_or_one_reply_shape_error(name, raw):
    try:
        shapes.parse_doc(ws.HELPER_SHAPES[name], raw, where="h: ct 1: step")
    except ReplyShapeError as exc:
        assert "\n" not in str(exc)
