"""click parameter types that refuse bad values at parse time (exit 2, nothing sent).

Why: ``--timeout nan`` or ``--grace -1`` used to reach the remote (``timeout -k 2 nan …``) or
crash; ``--job ../x`` was only refused by the agent in the container.
"""

from __future__ import annotations

import math
import re
import typing as t

import click

from opsctl.config import ctid as ctid_rule
from opsctl.errors import ConfigError
from remote_payload.wire import JOB_ID_PATTERN

JOB_ID_RE = re.compile(JOB_ID_PATTERN)


class Seconds(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A finite number of seconds, ``> 0`` (or ``>= 0`` with ``allow_zero``)."""

    name = "seconds"

    def __init__(self, *, allow_zero: bool = False):
        self.allow_zero = allow_zero

    def convert(self, value: t.Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float) and math.isfinite(value):
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        if number < 0 or (number == 0 and not self.allow_zero):
            self.fail(f"{value!r} must be {'>= 0' if self.allow_zero else '> 0'} seconds", param, ctx)
        return number


class JobId(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A job id as the agent accepts it (:data:`remote_payload.wire.JOB_ID_PATTERN`)."""

    name = "job-id"

    def convert(self, value: t.Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not JOB_ID_RE.fullmatch(text):
            self.fail(f"{text!r} is not a job id (letters, digits, '.', '_', '-'; "
                      "at most 128; starts with a letter or digit)", param, ctx)
        return text


class ContainerId(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A Proxmox container id, by the one rule :mod:`opsctl.config.ctid` (100-999999999)."""

    name = "ctid"

    def convert(self, value: t.Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            if isinstance(value, int) and not isinstance(value, bool):
                return ctid_rule.check_ctid(value)
            return ctid_rule.parse_ctid(str(value))
        except ConfigError as exc:
            self.fail(exc.message.removeprefix("--ct: "), param, ctx)


SECONDS = Seconds()
SECONDS_OR_ZERO = Seconds(allow_zero=True)
JOB_ID = JobId()
CTID = ContainerId()
COUNT = click.IntRange(min=0)
