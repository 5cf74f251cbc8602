"""The wire shapes (``remote_payload/wire_shapes.py``) as pydantic sees them: JSON Schemas.

The payload defines its shapes with the stdlib's ``typing.TypedDict`` (it runs on the
container's python, with no third-party package), and pydantic refuses those before Python
3.12. :func:`pydantic_view` rebuilds a shape, recursively, as a ``typing_extensions``
TypedDict with the same keys, types and required/optional split, so ``opsctl schema`` and
the contract test use the one definition, unchanged.
"""

from __future__ import annotations

import functools
import types
import typing as t

import typing_extensions as te
from pydantic import TypeAdapter


def _is_typeddict(tp: t.Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _convert(tp: t.Any) -> t.Any:
    if _is_typeddict(tp):
        return pydantic_view(tp)
    origin = t.get_origin(tp)
    if origin is None:
        return tp
    args = tuple(_convert(a) for a in t.get_args(tp))
    if origin in (t.Union, types.UnionType):
        return t.Union[args]  # noqa: UP007 (built from a tuple of types)
    if origin is t.Literal:
        return tp
    return origin[args] if len(args) != 1 else origin[args[0]]


@functools.cache
def pydantic_view(shape: type) -> t.Any:
    """``shape`` as a ``typing_extensions.TypedDict`` pydantic accepts on Python 3.11."""
    hints = t.get_type_hints(shape, include_extras=True)  # keeps bounds (AtLeast)
    fields = {name: (_convert(tp) if name in shape.__required_keys__  # type: ignore[attr-defined]
                     else te.NotRequired[_convert(tp)]) for name, tp in hints.items()}
    view = te.TypedDict(shape.__name__, fields)  # type: ignore[misc]  # built at run time
    view.__doc__ = shape.__doc__
    return view


def json_schema(shape: type) -> dict[str, t.Any]:
    """The JSON Schema (draft 2020-12, pydantic's) of one wire shape."""
    return TypeAdapter(pydantic_view(shape)).json_schema()
