"""The wire shapes (``remote_payload/wire_shapes.py``) as pydantic sees them: the CLI's
validation of every agent reply, and the JSON Schemas of ``opsctl schema``.

The payload defines its shapes with the stdlib's ``typing.TypedDict`` (it runs on the
container's python, with no third-party package), and pydantic refuses those before Python
3.12. :func:`pydantic_view` rebuilds a shape, recursively, as a ``typing_extensions``
TypedDict with the same keys, types and required/optional split, so the CLI validates a
reply against the one definition, unchanged: :func:`validate` returns the reply as that
TypedDict (keys the shape does not name are dropped: a newer agent may send more), and
mypy checks every key the CLI reads against the same class.

Each :class:`~pydantic.TypeAdapter` is built once, on first use (building one costs a few
milliseconds; a ``status`` poll validates one reply).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing as t

import typing_extensions as te
from pydantic import ConfigDict, TypeAdapter, ValidationError

from opsctl.errors import ReplyShapeError

T = t.TypeVar("T")

#: A reply may carry keys this opsctl does not know (a newer agent): dropped, never an error.
#: Strict: the agent sends each value as its own JSON type, so ``"1"`` or ``true`` where an
#: int is due (an exit code of ``true`` read as 1) and ``"yes"`` where a bool is due are a
#: broken reply, never converted. No NaN or Infinity: the agent writes none (``dumps_strict``),
#: and the renderers do arithmetic on every number.
_CONFIG = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

#: What a key from the reply may carry that a terminal or a log reader would act on.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _is_typeddict(tp: t.Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _is_record(tp: t.Any) -> bool:
    """A TypedDict, a dataclass or a NamedTuple: printed as a JSON object of its fields."""
    return _is_typeddict(tp) or (isinstance(tp, type) and (
        dataclasses.is_dataclass(tp) or (issubclass(tp, tuple) and hasattr(tp, "_fields"))))


def _required(shape: type) -> frozenset[str]:
    if _is_typeddict(shape):
        return frozenset(shape.__required_keys__)  # type: ignore[attr-defined]
    if dataclasses.is_dataclass(shape):
        return frozenset(f.name for f in dataclasses.fields(shape)
                         if f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
    defaults = getattr(shape, "_field_defaults", {})
    return frozenset(n for n in shape._fields if n not in defaults)  # type: ignore[attr-defined]


@functools.cache
def reply_records() -> frozenset[type]:
    """Every record a reply shape is made of (``REPLY_SHAPES`` and what they hold): the
    shapes whose values get the default bounds of ``wire_shapes`` (a reply is untrusted)."""
    from remote_payload import wire_shapes as ws

    seen: set[type] = set()

    def walk(tp: t.Any) -> None:
        if _is_record(tp):
            if tp in seen:
                return
            seen.add(tp)
            for hint in t.get_type_hints(tp, include_extras=True).values():
                walk(hint)
        for arg in t.get_args(tp):
            walk(arg)

    for shape in (ws.AgentReplyDoc, *ws.REPLY_SHAPES.values(), *ws.HELPER_SHAPES.values()):
        walk(shape)
    return frozenset(seen)


def _default_bound(tp: t.Any) -> t.Any:
    """A reply's ``str`` or ``int`` without a bound of its own, with the default one."""
    from remote_payload import wire_shapes as ws

    if tp is str:
        return t.Annotated[str, ws.MaxLen(ws.TEXT_MAX)]
    if tp is int:
        return t.Annotated[int, ws.AtLeast(ws.INT_MIN), ws.AtMost(ws.INT_MAX)]
    return tp


def pydantic_type(tp: t.Any, *, bounded: bool = False) -> t.Any:
    """``tp`` with every TypedDict, dataclass or NamedTuple in it replaced by its
    :func:`pydantic_view` (``list[StatusDoc]``, ``StopDoc | None``...). ``bounded`` (a
    reply's value): a string, an integer, a list or an object without a bound of its own
    gets its type's default bound (``wire_shapes.TEXT_MAX``, ``ITEMS_MAX``, 64 bits)."""
    from remote_payload import wire_shapes as ws

    if _is_record(tp):
        return pydantic_view(tp)
    origin = t.get_origin(tp)
    if origin is None:
        return _default_bound(tp) if bounded else tp
    if origin is t.Annotated:  # bounds of its own: kept; a list's entries still get theirs
        base, *marks = t.get_args(tp)
        if t.get_origin(base) in (list, dict):
            base = _container(base, bounded=bounded)
        return t.Annotated[(base, *marks)]
    if origin is t.Literal:
        return tp
    if origin in (t.Union, types.UnionType):
        return t.Union[tuple(pydantic_type(a, bounded=bounded) for a in t.get_args(tp))]  # noqa: UP007
    built = _container(tp, bounded=bounded)
    if bounded and origin in (list, dict):
        return t.Annotated[built, ws.MaxItems(ws.ITEMS_MAX)]
    return built


def _container(tp: t.Any, *, bounded: bool) -> t.Any:
    args = tuple(pydantic_type(a, bounded=bounded) for a in t.get_args(tp))
    origin = t.get_origin(tp)
    return origin[args] if len(args) != 1 else origin[args[0]]


@functools.cache
def pydantic_view(shape: type) -> t.Any:
    """``shape`` (a TypedDict, or a report dataclass or NamedTuple that a command prints as an
    object of its fields) as a ``typing_extensions.TypedDict`` pydantic accepts on Python
    3.11, with the same keys, types and required keys."""
    hints = t.get_type_hints(shape, include_extras=True)  # keeps bounds (AtLeast, MaxLen...)
    required = _required(shape)
    bounded = shape in reply_records()
    fields = {name: (te.Required if name in required else te.NotRequired)[
        pydantic_type(tp, bounded=bounded)] for name, tp in hints.items()}
    view = te.TypedDict(shape.__name__, fields)  # type: ignore[misc]  # built at run time
    view.__doc__ = shape.__doc__
    view.__pydantic_config__ = _CONFIG  # type: ignore[attr-defined]
    return view


@functools.cache
def adapter(shape: type) -> TypeAdapter[t.Any]:
    """The one validator of ``shape`` (built on first use, then kept)."""
    return TypeAdapter(pydantic_view(shape))


@functools.cache
def _doc_adapter(shape: t.Any) -> TypeAdapter[t.Any]:
    if _is_record(shape):
        return adapter(shape)
    return TypeAdapter(pydantic_type(shape, bounded=True), config=_CONFIG)


#: bytes of a helper's document read (a listing of a million entries fits)
DOC_BYTES = 256 << 20


#: What a document with lines printed before it means: the target's shell prints for every
#: command (an agent reply, its last line, survives that; rsync's and tar's streams do not).
BANNER_HINT = ("something on the target prints on stdout before every command's output (a "
               "banner or motd from sshd's ForceCommand or the SSH user's shell rc file): file "
               "transfers need a quiet non-interactive shell; print only when interactive")


def printed_before(raw: bytes) -> bool:
    """Whether ``raw`` is lines of something else, then a JSON object on its last line."""
    lines = raw.strip().splitlines()
    return len(lines) > 1 and lines[-1].lstrip().startswith(b"{") and \
        not lines[0].lstrip().startswith((b"{", b"["))


def parse_doc(shape: t.Any, raw: bytes, *, where: str, limit: int = DOC_BYTES) -> t.Any:
    """The one way opsctl reads a JSON document a program in the container printed (a shape
    of ``wire_shapes.HELPER_SHAPES``): at most ``limit`` bytes, then pydantic's JSON parser
    (its own nesting limit: a 100k-deep ``[[[`` is an error, never a RecursionError), then
    ``shape`` with the reply bounds. Returns the document as ``shape`` types it.

    ``where`` names the document in the error (``"pve1 ct 200: pull: list"``).

    Raises:
        ReplyShapeError: too large, not JSON, too deeply nested or not ``shape`` (one line).
    """
    name = getattr(shape, "__name__", None) or "document"
    hint = ("the container's python3 or opsctl payload answered something else; check the "
            "container (`opsctl deploy` ships this opsctl's payload)")
    if len(raw) > limit:
        raise ReplyShapeError(f"{where}: the answer has {len(raw)} bytes, more than the {limit} "
                              f"a {name} may have", hint=hint)
    try:
        return _doc_adapter(shape).validate_json(raw.strip() or b"null")
    except ValidationError as exc:
        not_json = exc.errors(include_url=False)[0]["type"] == "json_invalid"
        what = "is not JSON" if not_json else f"is not a {name}"
        if not_json and printed_before(raw):
            hint = BANNER_HINT
        raise ReplyShapeError(
            f"{where}: the answer {what}: {first_problem(exc).removeprefix('(the document): ')}"
            + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else "")
            + (f": {inert(raw[:80].decode('utf-8', 'replace'), 80)}" if not_json else ""),
            hint=hint) from None


def json_schema(shape: type) -> dict[str, t.Any]:
    """The JSON Schema (draft 2020-12, pydantic's) of one wire shape."""
    return adapter(shape).json_schema()


def validate(shape: type[T], data: t.Any, *, where: str) -> T:
    """``data`` checked against ``shape``: the same document, typed as ``shape``.

    ``where`` names the reply in the error (``"pve1 ct 200: status"``).

    Raises:
        ReplyShapeError: ``data`` is not ``shape`` (one line: the first wrong field and why).
    """
    try:
        return t.cast(T, adapter(t.cast(type, shape)).validate_python(data))
    except ValidationError as exc:
        raise ReplyShapeError(
            f"{where}: the reply is not a {shape.__name__}: {first_problem(exc)}"
            + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""),
            hint="the container's payload may be from another opsctl version: "
                 "`opsctl deploy` ships this one's") from None


def first_problem(exc: ValidationError) -> str:
    """The first wrong field of ``exc`` and why, as one inert line of at most 200 characters."""
    err = exc.errors(include_url=False, include_input=False)[0]
    path = ".".join(str(p) for p in err["loc"]) or "(the document)"
    return inert(f"{path}: {err['msg']}", 200)


def inert(text: str, limit: int) -> str:
    """``text`` (from a reply) as one inert line: control characters shown as their codes
    (``\\x1b``), cut at ``limit`` characters."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."
