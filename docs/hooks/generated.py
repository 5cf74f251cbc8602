"""MkDocs hook: the parts of the docs that would drift if they were written by hand.

A page holds a marker line ``<!-- generated: NAME -->`` and this hook replaces it, at build
time, with text made from the code itself:

- ``exit-codes``: the table of :data:`opsctl.errors.EXIT_CODES`;
- ``module-map``: every module of ``opsctl`` and ``remote_payload`` with the first line of its
  docstring, read with :mod:`ast` (nothing is imported, so a module with heavy imports costs
  nothing and a missing docstring shows as such);
- ``trainer-flags``: every flag of the trainer, from its ``TrainArgs`` dataclass;
- ``wire-shapes``: every shape in ``remote_payload/wire_shapes.py`` (agent replies and the
  shapes inside them, trainer events) as a table of keys and types;
- ``prometheus-metrics`` and ``prometheus-alerts``: the series of the dashboard's ``/metrics``
  (``opsctl.cli.prometheus_metrics.FAMILIES``) and the example alerting rules file;
- ``playbook-fields``, ``pipeline-fields``, ``inventory-fields``, ``torch-build-fields``: a
  table per pydantic model of the configuration files (every key, its type, default and the
  ``Field(description=...)`` written on the model), nested models after their parent;
- ``agent-verbs``: every verb of the container agent (``VERBS`` in
  ``remote_payload/agent/__main__.py``, read with :mod:`ast`), by the module that serves it;
- ``json-schemas``: every ``opsctl schema NAME`` (a command's ``--json`` document, trainer
  events, the playbook and inventory files) with what it describes, from
  :mod:`opsctl.cli.schemas`;
- ``cli-examples``: every command's examples (the ``examples`` its ``--help`` ends with, see
  :mod:`opsctl.cli.command`), walking the click tree, since mkdocs-click's reference shows a
  command's help and options but not its epilog;
- ``diagnosis``: a section per id of :data:`remote_payload.wire.DIAGNOSIS_IDS`, with the
  severity, the meaning (the signature's predicate docstring) and the fix (its hint) that
  ``status`` shows, from ``remote_payload/agent/diagnosis.py``'s ``SIGNATURES``.

MkDocs' own hook mechanism is used (``hooks:`` in ``mkdocs.yml``) rather than a plugin
package: three small generators do not justify a dependency. ``tests/unit/test_docs.py`` runs the
same functions, so a broken generator fails the tests as well as ``mkdocs build --strict``.
"""

from __future__ import annotations

import ast
import re
import sys
import typing as t
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)
PACKAGES = ("opsctl", "remote_payload")


def _import_root() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def exit_codes() -> str:
    _import_root()
    from opsctl import errors

    rows = ["| code | meaning |", "| --- | --- |"]
    rows += [f"| {code} | {meaning} |" for code, meaning in sorted(errors.EXIT_CODES.items())]
    rows.append(f"| *n* | {errors.PASSED_THROUGH.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def _first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc:
        return "(no docstring)"
    return doc.strip().splitlines()[0].replace("|", "\\|")


def module_rows() -> list[tuple[str, str]]:
    """(dotted module name, first docstring line) of every module, packages first."""
    rows = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "wheels" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            rows.append((name, _first_line(path)))
    return sorted(rows)


def module_map() -> str:
    rows = ["| module | what it is for |", "| --- | --- |"]
    rows += [f"| `{name}` | {line} |" for name, line in module_rows()]
    return "\n".join(rows)


def agent_verbs() -> dict[str, list[str]]:
    """The agent's verbs by the module that serves them, in ``VERBS``' order, read from
    ``remote_payload/agent/__main__.py`` without running it."""
    tree = ast.parse((ROOT / "remote_payload" / "agent" / "__main__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "VERBS" and node.value is not None):
            verbs = ast.literal_eval(node.value)
            break
    else:
        raise ValueError("remote_payload/agent/__main__.py has no VERBS table")
    by_module: dict[str, list[str]] = {}
    for verb, module in verbs.items():
        by_module.setdefault(module, []).append(verb)
    return by_module


def agent_verb_table() -> str:
    rows = ["| verbs | served by |", "| --- | --- |"]
    rows += [f"| {' '.join(f'`{v}`' for v in verbs)} | `{module}` |"
             for module, verbs in agent_verbs().items()]
    return "\n".join(rows)


def diagnosis_sections() -> str:
    """One section per signature of the agent's diagnosis table: id, severity, meaning, fix.

    The meaning is the predicate's docstring and the fix the row's hint, so the page says
    exactly what ``status`` would."""
    _import_root()
    from remote_payload import wire
    from remote_payload.agent import diagnosis

    by_id = {sig.cause: sig for sig in diagnosis.SIGNATURES}
    out = []
    for cause in wire.DIAGNOSIS_IDS:
        sig = by_id[cause]
        meaning = " ".join((sig.match.__doc__ or "").split()).replace("``", "`")
        out.append(f"### `{cause}`\n\n*{sig.severity}*. {meaning}\n\n**Fix:** {sig.hint}\n")
    return "\n".join(out)


def _type_text(tp: t.Any) -> str:
    import types

    origin = t.get_origin(tp)
    if origin is t.Annotated:  # a value constraint of wire_shapes (Matches, MaxLen, AtLeast...)
        base, *marks = t.get_args(tp)
        return f"{_type_text(base)} ({', '.join(_mark_text(m) for m in marks)})"
    if origin in (t.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in t.get_args(tp))
    if origin is t.Literal:
        return " | ".join(f'"{a}"' for a in t.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_text(a) for a in t.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and hasattr(tp, "__required_keys__"):
        return f"[{tp.__name__}](#{tp.__name__.lower()})"
    return getattr(tp, "__name__", str(tp)).replace("Any", "any")


def _mark_text(mark: t.Any) -> str:
    """One constraint of a shape's value, as a reader of the tables wants it."""
    kind, value = type(mark).__name__, mark.value
    if kind == "Matches":
        return f"matches `{value}`"
    if kind in ("MaxLen", "MaxItems"):
        return f"at most {value:,} {'characters' if kind == 'MaxLen' else 'entries'}"
    if kind in ("AtLeast", "AtMost"):
        number = f"{value:,}" if isinstance(value, int) else f"{value:g}"
        return f"{'>=' if kind == 'AtLeast' else '<='} {number}"
    return repr(mark)


def _shape_section(shape: type) -> str:
    hints = t.get_type_hints(shape, include_extras=True)
    required = shape.__required_keys__  # type: ignore[attr-defined]
    doc = " ".join((shape.__doc__ or "").split()) if shape.__doc__ != dict.__doc__ else ""
    rows = [f"### {shape.__name__}", "", doc, "", "| key | type | always there |", "| --- | --- | --- |"]
    rows += [f"| `{k}` | {_type_text(v).replace('|', chr(92) + '|')} | {'yes' if k in required else ''} |"
             for k, v in hints.items()]
    return "\n".join(rows) + "\n"


def _nested(shape: type, seen: dict[str, type]) -> None:
    if shape.__name__ in seen:
        return
    seen[shape.__name__] = shape

    def walk(tp: t.Any) -> None:
        if isinstance(tp, type) and hasattr(tp, "__required_keys__"):
            _nested(tp, seen)
        for arg in t.get_args(tp):
            walk(arg)

    for tp in t.get_type_hints(shape).values():
        walk(tp)


def wire_shapes() -> str:
    """Every reply shape (with the shapes inside it) and every event shape, as tables."""
    _import_root()
    from remote_payload import wire_shapes as ws

    replies: dict[str, type] = {}
    for shape in ws.REPLY_SHAPES.values():
        _nested(shape, replies)
    verbs = ", ".join(f"`{verb}` → [{s.__name__}](#{s.__name__.lower()})"
                      for verb, s in ws.REPLY_SHAPES.items())
    out = ["## Reply shapes", "", f"By verb: {verbs}.", ""]
    out += [_shape_section(s) for s in replies.values()]
    out += ["## Event shapes", "", "Events are open: any JSON object with a string `event` is one, "
            "and any event may carry more keys than these.", ""]
    out += [_shape_section(s) for s in ws.EVENT_SHAPES.values()]
    return "\n".join(out)


def json_schemas() -> str:
    """Every schema ``opsctl schema`` prints, one row each, from its registry."""
    _import_root()
    from opsctl.cli import schemas

    rows = ["| `opsctl schema …` | describes |", "| --- | --- |"]
    for name in schemas.names():
        what = schemas.what(name).replace("|", "\\|")
        rows.append(f"| `{name}` | {what} |")
    return "\n".join(rows)


def trainer_flags() -> str:
    """Every flag of ``python -m remote_payload.trainer``: one per ``TrainArgs`` field, with its
    default and help, exactly as the trainer's own parser builds them (no torch import)."""
    import dataclasses

    _import_root()
    from remote_payload.trainer.config import TrainArgs

    rows = ["| flag | default | what |", "| --- | --- | --- |"]
    for f in dataclasses.fields(TrainArgs):
        default = "" if f.default is dataclasses.MISSING else f"`{f.default!r}`"
        what = " ".join(str(f.metadata.get("help", "")).split()).replace("|", "\\|")
        rows.append(f"| `--{f.name.replace('_', '-')}` | {default} | {what} |")
    return "\n".join(rows)


def prometheus_metrics() -> str:
    """Every series of the dashboard's ``/metrics``: name, labels, meaning (from ``FAMILIES``)."""
    _import_root()
    from opsctl.cli.prometheus_metrics import FAMILIES

    rows = ["| series | labels | what |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | {', '.join(f'`{lab}`' for lab in labels)} | {what} |"
             for name, what, labels in FAMILIES]
    return "\n".join(rows)


def prometheus_alerts() -> str:
    """The example alerting rules file, as it is (the suite checks it with ``promtool``)."""
    text = (ROOT / "docs" / "examples" / "opsctl-alerts.yml").read_text(encoding="utf-8")
    return "```yaml\n" + text.rstrip("\n") + "\n```"


def _model_type_text(tp: t.Any, anchors: dict[type, str]) -> str:
    """A field's annotation as the YAML author sees it: models link to their own table."""
    import types

    origin = t.get_origin(tp)
    if origin is t.Annotated:
        return _model_type_text(t.get_args(tp)[0], anchors)
    if origin in (t.Union, types.UnionType):
        return " or ".join(_model_type_text(a, anchors) for a in t.get_args(tp))
    if origin is t.Literal:
        return " or ".join(f"`{a}`" for a in t.get_args(tp))
    if origin is list:
        return f"list of {_model_type_text(t.get_args(tp)[0], anchors)}"
    if origin is dict:
        key, value = (_model_type_text(a, anchors) for a in t.get_args(tp))
        return f"map of {key} to {value}"
    if tp is type(None):
        return "null"
    if tp in anchors:
        return f"[{anchors[tp]}](#{anchors[tp].replace(' ', '-')})"
    if tp is t.Any:
        return "any"
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
        getattr(tp, "__name__", ""), getattr(tp, "__name__", str(tp)))


def _default_text(field: t.Any) -> str:
    import json

    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def model_tables(sections: t.Sequence[tuple[str, type]]) -> str:
    """One table per (heading, pydantic model): key, type, default, what (the field's
    ``description``). A field without a description is an error: the table would be
    silent about it (``tests/unit/test_docs.py`` runs every block)."""
    anchors = {model: heading for heading, model in sections}
    out = []
    for heading, model in sections:
        rows = [f"### {heading}", ""]
        doc = (model.__doc__ or "").strip()
        if doc and doc != "A base class for creating Pydantic models.":
            rows += [" ".join(doc.split("\n\n")[0].split()).replace("``", "`"), ""]
        rows += ["| key | type | default | what |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            if not field.description:
                raise ValueError(f"{model.__name__}.{name} has no Field(description=...)")
            rows.append(f"| `{name}` | {_cell(_model_type_text(field.annotation, anchors))} | "
                        f"{_cell(_default_text(field))} | {_cell(field.description)} |")
        out.append("\n".join(rows) + "\n")
    return "\n".join(out)


def playbook_fields() -> str:
    _import_root()
    from opsctl.config import playbook as pb

    return model_tables([("playbook", pb.Playbook), ("healthy_when", pb.HealthyWhen),
                         ("restart", pb.RestartPolicy), ("torch", pb.TorchSpec),
                         ("files", pb.FileSpec)])


def pipeline_fields() -> str:
    _import_root()
    from opsctl.config import pipeline

    return model_tables([("pipeline", pipeline.Pipeline), ("steps", pipeline.Step)])


def inventory_fields() -> str:
    _import_root()
    from opsctl.config import inventory

    return model_tables([("inventory file", inventory.InventoryFile), ("hosts", inventory.HostSpec),
                         ("containers", inventory.ContainerSpec)])


def cli_examples() -> str:
    """A code block: each command's path as a comment, then its examples, in tree order."""
    _import_root()
    import click

    from opsctl.cli import cli

    out: list[str] = []

    def walk(cmd: click.Command, path: str) -> None:
        out.extend(["", f"# {path}", *getattr(cmd, "examples", ())])
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                walk(sub, f"{path} {name}")

    walk(cli, "opsctl")
    return "\n".join(["```bash", *out[1:], "```"])


def torch_build_fields() -> str:
    _import_root()
    from opsctl.config import torch_builds

    return model_tables([("torch_builds", torch_builds.BuildSpec)])


GENERATORS: dict[str, t.Callable[[], str]] = {
    "exit-codes": exit_codes, "module-map": module_map, "diagnosis": diagnosis_sections,
    "agent-verbs": agent_verb_table, "cli-examples": cli_examples,
    "wire-shapes": wire_shapes, "json-schemas": json_schemas,
    "trainer-flags": trainer_flags,
    "prometheus-metrics": prometheus_metrics, "prometheus-alerts": prometheus_alerts,
    "playbook-fields": playbook_fields, "pipeline-fields": pipeline_fields,
    "inventory-fields": inventory_fields, "torch-build-fields": torch_build_fields,
}


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced; an unknown marker name is an error."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, **_: t.Any) -> str:
    return render(markdown)
