"""Load YAML keeping line numbers, and turn pydantic errors into path:line messages.

Why: a bad playbook field must be reported as ``playbooks/x.yaml:12 healthy_when.event:
...`` so the user can jump straight to it.

Booleans are YAML 1.2's: only ``true``/``false`` (``True``, ``TRUE``, ``False``, ``FALSE``).
PyYAML reads YAML 1.1, where ``on``, ``off``, ``yes``, ``no``, ``y`` and ``n`` are booleans
too, so the documented ``restart: {max_restarts: 3, on: [failed]}`` had the key ``True``
and did not load; here ``on:`` is the key ``"on"`` and ``no`` the string ``"no"``.
"""

from __future__ import annotations

import re
import typing as t
from pathlib import Path

import pydantic
import yaml

from opsctl.errors import ConfigError
from remote_payload import boundedread

Loc = tuple[t.Any, ...]


#: Largest playbook or inventory file read (real ones are a few KiB); bounds memory and time.
MAX_BYTES = 1 << 20


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases: an opsctl file never needs them, and an alias bomb
    (``a: &a [*b, *b, …]`` nested ten levels) expands to billions of nodes downstream."""

    def compose_node(self, parent: yaml.Node | None, index: t.Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases (*{event.anchor}) are not allowed here", event.start_mark)
        node: yaml.Node | None = super().compose_node(parent, index)
        return node


_BOOL = "tag:yaml.org,2002:bool"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver(  # YAML 1.2's core schema: true and false only
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _construct_int(loader: yaml.constructor.SafeConstructor, node: yaml.Node) -> int:
    """YAML's int rules (hex, binary, octal, base 60, ``_``); a text the int pattern matches
    but no number reads (``0b_``) is a YAML error at its line, not a ``ValueError``."""
    try:
        return int(loader.construct_yaml_int(t.cast(yaml.ScalarNode, node)))
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None, None, f"{node.value!r} is not a number", node.start_mark) from None


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)  # type: ignore[type-var]
#: a key's line is filed under the key the document loads (``0x10`` is 16), never under
#: ``int()`` of its text (which refused ``0x10``)
_INT = yaml.constructor.SafeConstructor()


def _walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int], path: Path) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, t.Any], int] = {}
        for key_node, value_node in node.value:
            key: t.Any = key_node.value
            if key_node.tag == "tag:yaml.org,2002:int":
                key = _construct_int(_INT, key_node)  # 0x10, 0b11, 017, 1:30 as loaded
            if isinstance(key_node, yaml.ScalarNode):
                line = key_node.start_mark.line + 1
                if (key_node.tag, key) in first:
                    raise ConfigError(f"{path}:{line}: duplicate key {key!r} (first at line "
                                      f"{first[(key_node.tag, key)]}); each key may appear once")
                first[(key_node.tag, key)] = line
            _walk(value_node, (*loc, key), lines, path)
            lines[(*loc, key)] = key_node.start_mark.line + 1  # the key's line, not the value's
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*loc, i), lines, path)


def _read(path: Path) -> bytes:
    """The file's bytes: a regular file of at most :data:`MAX_BYTES`, never a FIFO or device
    (:func:`remote_payload.boundedread.read_regular`; a link the user made is followed).

    Raises:
        ConfigError: unreadable, not a regular file, or too large.
    """
    try:
        return boundedread.read_regular(path, MAX_BYTES, follow_links=True)
    except boundedread.Refused as exc:
        if exc.why == boundedread.TOO_LARGE:
            raise ConfigError(f"{path}: larger than {MAX_BYTES // 1024} KiB; not a playbook or "
                              "inventory") from None
        raise ConfigError(f"{path}: not a regular file (a FIFO, device or directory is "
                          "never read as a playbook or inventory)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                          "save the file as UTF-8") from None


def load(path: Path) -> tuple[t.Any, dict[Loc, int]]:
    """Parse ``path``; returns the data and a map from key path to 1-based line.

    Untrusted input is bounded: at most :data:`MAX_BYTES` of a regular file, UTF-8 only,
    no aliases, no duplicate keys, bounded nesting.

    Raises:
        ConfigError: unreadable or oversized file, not UTF-8, YAML syntax error, an alias,
            or a duplicate key (each with its line).
    """
    text = _decode(path, _read(path))
    lines: dict[Loc, int] = {}
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)  # its reader refuses control characters (a YAMLError)
        node = loader.get_single_node()
        if node is not None:
            _walk(node, (), lines, path)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    except ConfigError:  # already named, with its line (a duplicate key)
        raise
    except ValueError as exc:  # a value a pattern matched that no constructor reads (._)
        raise ConfigError(f"{path}: a value YAML cannot read ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a playbook or inventory") from None
    finally:
        if loader is not None:
            loader.dispose()
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
