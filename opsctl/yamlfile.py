"""Load YAML keeping line numbers, and turn pydantic errors into path:line messages.

Why: a bad playbook field must be reported as ``playbooks/x.yaml:12 healthy_when.event:
...`` so the user can jump straight to it.
"""

from __future__ import annotations

import typing as t
from pathlib import Path

import pydantic
import yaml

from opsctl.errors import ConfigError

Loc = tuple[t.Any, ...]


def _walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key: t.Any = key_node.value
            if key_node.tag == "tag:yaml.org,2002:int":
                key = int(key)
            _walk(value_node, (*loc, key), lines)
            lines[(*loc, key)] = key_node.start_mark.line + 1  # the key's line, not the value's
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*loc, i), lines)


def load(path: Path) -> tuple[t.Any, dict[Loc, int]]:
    """Parse ``path``; returns the data and a map from key path to 1-based line.

    Raises:
        ConfigError: unreadable file or YAML syntax error (with its line).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    lines: dict[Loc, int] = {}
    if node is not None:
        _walk(node, (), lines)
    return data, lines


M = t.TypeVar("M", bound=pydantic.BaseModel)


def validate(model: type[M], data: t.Any, path: Path, lines: dict[Loc, int],
             *, prefix: Loc = ()) -> M:
    """Validate ``data`` into ``model``; errors name the file, line and field path.

    Raises:
        ConfigError: one line per problem, the first problem's line in the message.
    """
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(x for x in (*prefix, *err["loc"]))
            line = _line_for(loc, lines)
            dotted = ".".join(str(x) for x in loc) or "(top level)"
            problems.append(f"{path}:{line}: {dotted}: {err['msg']}")
        message = problems[0] if len(problems) == 1 else \
            f"{len(problems)} problems: " + "; ".join(problems)
        raise ConfigError(message) from None


def _line_for(loc: Loc, lines: dict[Loc, int]) -> int:
    # pydantic may add tags (e.g. union member names) to loc: drop from the end until known.
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)
