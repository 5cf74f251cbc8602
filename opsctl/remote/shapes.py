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


def pydantic_type(tp: t.Any) -> t.Any:
    """``tp`` with every TypedDict, dataclass or NamedTuple in it replaced by its
    :func:`pydantic_view` (``list[StatusDoc]``, ``StopDoc | None``...)."""
    if _is_record(tp):
        return pydantic_view(tp)
    origin = t.get_origin(tp)
    if origin is None:
        return tp
    args = tuple(pydantic_type(a) for a in t.get_args(tp))
    if origin in (t.Union, types.UnionType):
        return t.Union[args]  # noqa: UP007 (built from a tuple of types)
    if origin is t.Literal:
        return tp
    return origin[args] if len(args) != 1 else origin[args[0]]


@functools.cache
def pydantic_view(shape: type) -> t.Any:
    """``shape`` (a TypedDict, or a report dataclass or NamedTuple that a command prints as an
    object of its fields) as a ``typing_extensions.TypedDict`` pydantic accepts on Python
    3.11, with the same keys, types and required keys."""
    hints = t.get_type_hints(shape, include_extras=True)  # keeps bounds (AtLeast)
    required = _required(shape)
    fields = {name: (pydantic_type(tp) if name in required else te.NotRequired[pydantic_type(tp)])
              for name, tp in hints.items()}
    view = te.TypedDict(shape.__name__, fields)  # type: ignore[misc]  # built at run time
    view.__doc__ = shape.__doc__
    view.__pydantic_config__ = _CONFIG  # type: ignore[attr-defined]
    return view


@functools.cache
def adapter(shape: type) -> TypeAdapter[t.Any]:
    """The one validator of ``shape`` (built on first use, then kept)."""
    return TypeAdapter(pydantic_view(shape))


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
            f"{where}: the reply is not a {shape.__name__}: {_first_problem(exc)}"
            + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""),
            hint="the container's payload may be from another opsctl version: "
                 "`opsctl deploy` ships this one's") from None


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors(include_url=False, include_input=False)[0]
    path = ".".join(str(p) for p in err["loc"]) or "(the document)"
    # a hostile key (a dict field's) stays one inert line: control characters shown as \xNN
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", f"{path}: {err['msg']}")
    return text if len(text) <= 200 else text[:197] + "..."
