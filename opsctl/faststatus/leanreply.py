"""An agent's ``status`` reply read without pydantic: the same document, or no answer.

Why: importing pydantic and building the reply models of :mod:`opsctl.remote.models` cost
~50 ms of a ~300 ms `opsctl status --json`, to check a document that is, nearly always,
already exactly what ``JobStatus.model_validate(data).model_dump(mode="json")`` gives back.

How: the models are described once as a *shape* (:func:`shape_of`: field names in order,
types, defaults), derived from the pydantic models themselves and cached as JSON under
``$OPSCTL_HOME/cache/``, keyed by the digest of the sources it depends on. :func:`normalize`
walks a reply along that shape and rebuilds what ``model_dump(mode="json")`` would: fields
in model order, defaults for the absent ones, unknown keys dropped, an ``int`` in a
``float`` field as a float. Everything else that pydantic would coerce, repair or refuse
(a string for a number, a bad enum value, a damaged ``history``) is :class:`Unsure`: the
caller then takes the pydantic path with the same reply, so errors and repairs are exactly
pydantic's. ``tests/sandbox/test_status_fast.py`` pins both paths to the same document.

This is our own code because pydantic has no import-free validator; the rule it follows is
"accept only what pydantic would return unchanged", never a second schema.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import typing as t
from pathlib import Path

from opsctl.config import paths

Shape = list[t.Any]  # ["int"|"float"|"str"|"bool"|"any"|"dict"] | ["list", S] | ["opt", S]
#                     | ["enum", [values]] | ["model", [[name, S, required, default], ...]]

#: pydantic's JSON parser refuses a lone UTF-16 surrogate that ``json.loads`` accepts.
_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|"
                        r"(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_INT_MAX = 2**63
_FLOAT_EXACT = 2**53


class Unsure(Exception):
    """The reply is not one pydantic returns unchanged (or a model has no shape): ask pydantic."""


# --- the shape, from the models ----------------------------------------------------------


def shape_of(model: type[t.Any]) -> Shape:
    """The shape of a pydantic model (imports pydantic; only on a cache miss).

    Raises:
        Unsure: the model uses something :func:`normalize` cannot reproduce (another
            ``extra`` mode, aliases, serializers, a validator not known to keep valid values).
    """
    from opsctl.remote import models

    if model.model_config.get("extra", "ignore") != "ignore":
        raise Unsure(f"{model.__name__}: extra={model.model_config.get('extra')}")
    deco = model.__pydantic_decorators__
    if deco.model_validators or deco.field_serializers or deco.model_serializers \
            or deco.computed_fields or set(deco.field_validators) - models.IDENTITY_ON_VALID:
        raise Unsure(f"{model.__name__}: validators or serializers")
    fields = []
    for name, info in model.model_fields.items():
        if info.alias not in (None, name) or info.serialization_alias not in (None, name) \
                or info.exclude:
            raise Unsure(f"{model.__name__}.{name}: alias or exclude")
        required = info.is_required()
        default = None if required else info.get_default(call_default_factory=True)
        if json.loads(json.dumps(default)) != default:
            raise Unsure(f"{model.__name__}.{name}: default {default!r} is not JSON")
        fields.append([name, _shape(info.annotation), required, default])
    return ["model", fields]


def _shape(ann: t.Any) -> Shape:
    import enum
    import types

    import pydantic

    origin, args = t.get_origin(ann), t.get_args(ann)
    if ann in (int, float, str, bool):
        return [ann.__name__]
    if ann is t.Any:
        return ["any"]
    if origin is dict and args == (str, t.Any):
        return ["dict"]
    if origin is list and len(args) == 1:
        return ["list", _shape(args[0])]
    if origin in (t.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return ["opt", _shape(next(a for a in args if a is not type(None)))]
    if origin is t.Literal and all(type(a) is str for a in args):
        return ["enum", list(args)]
    if isinstance(ann, type) and issubclass(ann, enum.Enum) \
            and all(type(m.value) is str for m in ann):
        return ["enum", [m.value for m in ann]]
    if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
        return shape_of(ann)
    raise Unsure(f"no shape for {ann!r}")


def _digest() -> str:
    """What a cached shape depends on: the models, the wire enums and this module."""
    h = hashlib.sha256()
    here = Path(__file__)
    for p in (here.parent.parent / "remote" / "models.py", paths.payload_source() / "wire.py", here):
        h.update(p.read_bytes())
    return h.hexdigest()


def cached_shape(name: str) -> Shape:
    """The shape of ``opsctl.remote.models.<name>``, from the cache or built (and cached).

    Raises:
        Unsure: the model has no shape.
    """
    path = paths.home() / "cache" / "reply-shapes.json"
    digest = _digest()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc["digest"] == digest:
            return t.cast(Shape, doc["shapes"][name])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from opsctl.remote import models

    shapes = {"JobStatus": shape_of(models.JobStatus)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"digest": digest, "shapes": shapes}), encoding="utf-8")
        tmp.replace(path)
    except OSError:  # a cache: failing to write it costs speed, nothing else
        tmp.unlink(missing_ok=True)
    return shapes[name]


# --- reading a reply along a shape ------------------------------------------------------


def normalize(value: t.Any, shape: Shape) -> t.Any:
    """``value`` as pydantic's ``model_dump(mode="json")`` of it would be.

    Raises:
        Unsure: pydantic would coerce, repair or refuse ``value``.
    """
    kind = shape[0]
    tp = type(value)
    if kind == "model":
        if tp is not dict:
            raise Unsure("not an object")
        out = {}
        for name, sub, required, default in shape[1]:
            if name in value:
                out[name] = normalize(value[name], sub)
            elif required:
                raise Unsure(f"{name} missing")
            else:
                out[name] = type(default)() if isinstance(default, (list, dict)) else default
        return out
    if kind == "opt":
        return None if value is None else normalize(value, shape[1])
    if kind == "list":
        if tp is not list:
            raise Unsure("not a list")
        return [normalize(v, shape[1]) for v in value]
    if kind == "float":
        if tp is float:
            return value
        if tp is int and abs(value) <= _FLOAT_EXACT:
            return float(value)
    elif kind == "int":
        if tp is int and abs(value) < _INT_MAX:
            return value
    elif kind in ("str", "bool"):
        if tp.__name__ == kind:
            return value
    elif kind == "enum":
        if tp is str and value in shape[1]:
            return value
    elif kind == "dict":
        if tp is dict:
            return value
    elif kind == "any":
        return value
    raise Unsure(f"{kind}: {tp.__name__}")


def reply_data(stdout: bytes) -> t.Any:
    """The ``data`` of an agent's successful reply, as :func:`agent_client.parse_reply` reads it.

    Raises:
        Unsure: anything but a plain ``{"ok": true, ...}`` document (errors included).
    """
    text = stdout.decode("utf-8", "replace").strip()
    line = text.splitlines()[-1] if text else ""
    if _SURROGATE.search(line):
        raise Unsure("lone surrogate")
    try:
        doc = json.loads(line)
    except ValueError:
        raise Unsure("not JSON") from None
    if type(doc) is not dict or doc.get("ok") is not True or type(doc.get("verb")) is not str \
            or type(doc.get("agent_version", 1)) is not int \
            or type(doc.get("error")) not in (dict, type(None)):
        raise Unsure("not a successful reply")
    return doc.get("data")
