"""click parameter types that refuse bad values at parse time (exit 2, nothing sent).

Why here: a value the client can judge never leaves it. ``--timeout nan`` or ``--grace -1``
would reach the remote (``timeout -k 2 nan …``), ``--poll 1e308`` would overflow
``time.sleep``, and ``--job ../x`` would travel to the container before the agent refused it.

Every numeric option is a :class:`Number` with a finite range: one definition, which
``--help`` shows, the error names, and README's "Input limits" lists (:func:`ranges`, checked
against the README by ``tests/test_readme.py``).
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

HOUR = 3600.0
DAY = 86400.0


class Number(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A finite number in ``[low, high]`` (``low`` excluded with ``low_open``), float or int.

    ``nan``, ``inf``, ``1e999``, ``0x10`` and ``1.5`` for an int are refused with one line
    naming the range.
    """

    def __init__(self, low: float, high: float, *, integer: bool = False, low_open: bool = False,
                 unit: str = ""):
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"a range is finite: {low}..{high}")
        self.low, self.high, self.integer, self.low_open, self.unit = low, high, integer, low_open, unit
        self.name = "integer" if integer else (unit or "number")

    def describe(self) -> str:
        """The range in words, e.g. ``> 0 and <= 3600 s`` (README and errors)."""
        def fmt(x: float) -> str:
            return str(int(x)) if self.integer or float(x).is_integer() else f"{x:g}"
        unit = f" {self.unit}" if self.unit else ""
        kind = "an integer" if self.integer else "a number"
        lower = f"> {fmt(self.low)}" if self.low_open else f">= {fmt(self.low)}"
        return f"{kind} {lower} and <= {fmt(self.high)}{unit}"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "INTEGER" if self.integer else "SECONDS" if self.unit == "s" else "NUMBER"

    def convert(self, value: t.Any, param: click.Parameter | None, ctx: click.Context | None) -> t.Any:
        number: float | int
        if isinstance(value, bool):
            self.fail(f"{value!r} is not a number", param, ctx)
        if self.integer:
            if isinstance(value, int):
                number = value
            else:
                text = str(value).strip()
                if not re.fullmatch(r"[+-]?[0-9]{1,30}", text):
                    self.fail(f"{str(value)[:40]!r} is not {self.describe()}", param, ctx)
                number = int(text)
        else:
            if isinstance(value, int | float):
                number = float(value)
            else:
                text = str(value).strip()
                # decimal notation only: no "0x10", "1_0", "infinity", "nan"
                if not re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", text):
                    self.fail(f"{str(value)[:40]!r} is not {self.describe()}", param, ctx)
                number = float(text)
        if not math.isfinite(number) or not self._inside(number):
            self.fail(f"{str(value)[:40]} is out of range: {self.describe()}", param, ctx)
        return number

    def _inside(self, number: float) -> bool:
        return (number > self.low if self.low_open else number >= self.low) and number <= self.high


class ZeroOrNumber(Number):
    """0 (the option is off) or a number in ``[low, high]``: a period so short it would run
    its work back to back (``--doctor-every 0.001``) is refused, not taken at its word."""

    def describe(self) -> str:
        return f"0 (never) or {super().describe()}"

    def _inside(self, number: float) -> bool:
        return number == 0 or super()._inside(number)


def seconds(high: float, *, allow_zero: bool = False) -> Number:
    """A duration in seconds, ``> 0`` (or ``>= 0``) and at most ``high``."""
    return Number(0, high, low_open=not allow_zero, unit="s")


def integer(low: int, high: int, unit: str = "") -> Number:
    return Number(low, high, integer=True, unit=unit)


class JobId(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A job id as the agent accepts it (:data:`remote_payload.wire.JOB_ID_PATTERN`)."""

    name = "job-id"

    def convert(self, value: t.Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not JOB_ID_RE.fullmatch(text):
            self.fail(f"{text!r} is not a job id (letters, digits, '.', '_', '-'; "
                      "at most 128; starts with a letter or digit)", param, ctx)
        return text


class RunName(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A run as ``opsctl goodput`` names it: a job id (or prefix), a ``--run-id``, or the
    absolute out-dir it trains into (printable, at most :data:`MAX_RUN_CHARS`)."""

    name = "run"

    def convert(self, value: t.Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if JOB_ID_RE.fullmatch(text) or (
                text.startswith("/") and len(text) <= MAX_RUN_CHARS and text.isprintable()):
            return text
        self.fail(f"{text[:80]!r} is not a run: a job id, a --run-id or an absolute out-dir",
                  param, ctx)


MAX_RUN_CHARS = 4096


class ContainerId(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A Proxmox container id, by the one rule :mod:`opsctl.config.ctid` (100-999999999)."""

    name = "ctid"

    def describe(self) -> str:
        """The range in words (README, "Input limits"), as :meth:`Number.describe`."""
        return f"an integer >= {ctid_rule.MIN_CTID} and <= {ctid_rule.MAX_CTID}"

    def convert(self, value: t.Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            if isinstance(value, int) and not isinstance(value, bool):
                return ctid_rule.check_ctid(value)
            return ctid_rule.parse_ctid(str(value))
        except ConfigError as exc:
            self.fail(exc.message.removeprefix("--ct: "), param, ctx)


# The ranges, named by what they bound (README, "Input limits", lists each option's).
POLL = seconds(HOUR)  # --poll: a poll at most hourly
SECONDS = seconds(7 * DAY)  # --timeout of deploy/wait/exec/diag
SECONDS_OR_ZERO = seconds(HOUR, allow_zero=True)  # --grace of stop
DEADLINE = seconds(HOUR)  # --deadline of a fleet status
REFRESH = seconds(HOUR)  # --refresh of the dashboard
PULL_EVERY = seconds(HOUR, allow_zero=True)  # --refresh of tensorboard (0: pull once)
#: --doctor-every of the dashboard: 0 (never) or at least a minute (a doctor runs host commands
#: and takes seconds; more often would keep every host busy with it)
DOCTOR_EVERY = ZeroOrNumber(60, 7 * DAY, unit="s")
COUNT = integer(0, 1_000_000)  # --lines, --tail, --history
OFFSET = integer(0, 2**53, "bytes")  # --offset of logs (a JSON-safe integer)
PARALLEL = integer(1, 256)  # --parallel of a fleet status
THREADS = integer(1, 256)  # --threads of the compile probe
BWLIMIT = integer(1, 10**9, "KiB/s")  # --bwlimit of push/pull
PORT = integer(0, 65535)  # --port of the dashboard (0: any free one)
WIDTH = integer(20, 10_000, "columns")  # --width of plot
CTID = ContainerId()  # --ct, --nodes' CT: opsctl.config.ctid's one rule
JOB_ID = JobId()
RUN = RunName()


def ranges(group: click.Group) -> list[str]:
    """Every numeric option of ``group``'s commands and its range, one README line each:
    ``- `--poll` (`logs`, `status`): a number > 0 and <= 3600 s``."""
    seen: dict[tuple[str, str], set[str]] = {}

    def walk(cmd: click.Command, path: str) -> None:
        for p in cmd.params:
            if isinstance(p, click.Option) and isinstance(p.type, Number | ContainerId):
                name = max(p.opts, key=len)
                seen.setdefault((name, p.type.describe()), set()).add(path)
        if isinstance(cmd, click.Group):
            for sub_name, sub in cmd.commands.items():
                walk(sub, f"{path} {sub_name}".strip())

    walk(group, "")
    return [f"- `{name}` ({', '.join(f'`{c}`' for c in sorted(cmds))}): {rng}"
            for (name, rng), cmds in sorted(seen.items())]


def numeric_params(group: click.Group) -> list[tuple[str, click.Parameter]]:
    """Every parameter of ``group``'s commands whose values are numbers (for the test that
    they all have a range: :class:`Number` or :class:`ContainerId`)."""
    out: list[tuple[str, click.Parameter]] = []

    def walk(cmd: click.Command, path: str) -> None:
        for p in cmd.params:
            if isinstance(p.type, Number | ContainerId | click.types.IntParamType | click.types.FloatParamType
                          | click.IntRange | click.FloatRange):
                out.append((path, p))
        if isinstance(cmd, click.Group):
            for sub_name, sub in cmd.commands.items():
                walk(sub, f"{path} {sub_name}".strip())

    walk(group, "")
    return out
