"""Pictures of a job's history: sparklines, terminal charts, PNG and SVG.

Pure data preparation and drawing; no click, no rich, no remote calls. The data is the
agent's bounded history (:class:`remote_payload.wire_shapes.HistoryDoc`: columns aligned with ``t``,
plus *marks* for recompiles, restarts, errors, hangs, diagnoses and the end).

A curve ends at the newest sample as it came (the history's ``last``, or the values the
status text beside it shows: :func:`status_latest`), not at the mean of the last bucket. By
time, a step metric is drawn from the step table when it has more rows than the time
buckets (a short job: its step events themselves); by step (``opsctl plot --by step``) from
the step table alone, the marks placed at the step the job was at.

* :func:`sparkline_rows` — one line per metric for ``opsctl status``;
* :func:`terminal_charts` — ``opsctl plot`` (plotext), marks as vertical lines;
* :func:`write_png` — ``opsctl plot --png`` (matplotlib, Agg backend);
* :func:`svg_chart` — the dashboard's inline charts (every text escaped).

plotext is a dependency (``opsctl plot`` works after a plain ``pip install``); matplotlib, for
``--png`` only, is the ``plots`` extra. Both are imported only when drawn.
"""

from __future__ import annotations

import html
import math
import re
import typing as t
from dataclasses import dataclass

from opsctl.errors import ConfigError, LocalWriteError
from remote_payload import limits
from remote_payload.wire_shapes import HistoryDoc, HistoryMarkDoc, HistoryPointDoc

if t.TYPE_CHECKING:
    from remote_payload.wire_shapes import StatusDoc

BLOCKS = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Metric:
    name: str  # what --metric takes
    columns: tuple[str, ...]  # history columns, first one present wins
    label: str
    scale: float = 1.0  # shown value = raw * scale
    fmt: str = "{:.3g}"
    low: float = 0.0  # raw values are drawn clamped to [low, high] (:func:`drawable`)
    high: float = 1e9


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("loss", ("loss",), "loss", fmt="{:.4f}"),
    Metric("tok_s", ("tok_s",), "Ktok/s", 1e-3, "{:.2f}", high=1e12),
    Metric("gpu_util", ("gpu_util",), "GPU util %", fmt="{:.0f}", high=100.0),
    Metric("mem", ("gpu_mem_gib", "mem_gib"), "GPU mem GiB", fmt="{:.1f}", high=1e6),
    Metric("mfu", ("mfu",), "MFU", fmt="{:.3f}", high=1.0),
    Metric("feature_wait_pct", ("feature_wait_pct",), "feature wait %", fmt="{:.0f}",
           high=100.0),
)}
DEFAULT_METRICS = ("loss", "tok_s", "gpu_util", "mem")
#: what a chart's x axis counts: seconds since the start, or the trainer's optimizer steps
AXES = ("time", "step")
STATUS_METRICS = ("loss", "tok_s", "gpu_util")
MARK_LETTER = {"compile": "C", "restart": "R", "error": "E", "hang": "H", "end": "X",
               "diagnosis": "D"}
MARK_COLOR = {"compile": "#8e44ad", "restart": "#2980b9", "error": "#c0392b", "hang": "#d35400",
              "end": "#7f8c8d", "diagnosis": "#c0392b"}


@dataclass(frozen=True)
class Series:
    metric: Metric
    t: list[float]
    v: list[float | None]

    @property
    def values(self) -> list[float]:
        return [x for x in self.v if x is not None]

    @property
    def last(self) -> float | None:
        vals = self.values
        return vals[-1] if vals else None


def parse_metrics(text: str | None) -> tuple[str, ...]:
    """``"loss,tok_s"`` → ("loss", "tok_s"); None → the defaults.

    Raises:
        ConfigError: an unknown metric name.
    """
    if not text:
        return DEFAULT_METRICS
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in METRICS]
    if bad or not names:
        raise ConfigError(f"unknown metric {', '.join(bad) or text!r}",
                          hint=f"choose from {', '.join(METRICS)}")
    return names


_SINCE = re.compile(r"(?P<n>[0-9]+(?:\.[0-9]+)?)(?P<unit>[smhd]?)")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str | None) -> float | None:
    """``"6h"`` → 21600.0 seconds (units s, m, h, d; none = seconds); None stays None.

    Raises:
        ConfigError: not a positive duration.
    """
    if text is None:
        return None
    m = _SINCE.fullmatch(text.strip())
    if m is None or float(m["n"]) <= 0:
        raise ConfigError(f"--since {text!r} is not a duration", hint="e.g. 90s, 30m, 6h, 2d")
    return float(m["n"]) * _UNIT_S[m["unit"]]


def _t(hist: HistoryDoc) -> list[float]:
    return hist.get("t", [])


def _marks(hist: HistoryDoc) -> list[HistoryMarkDoc]:
    return hist.get("marks", [])


#: epoch seconds a chart's time axis can hold (years 1970 to ~5000)
TIME_RANGE = (0.0, 1e11)


def drawable(hist: HistoryDoc) -> HistoryDoc:
    """``hist`` as a chart can draw it: rows and marks whose time is no finite number in
    :data:`TIME_RANGE` dropped, every value clamped to its metric's range (1e308 and inf land
    on the edge, a negative loss on 0), nan a gap; the step table and the newest samples
    likewise. A job's history is its trainer's output, so anything may be in it."""
    ts = _t(hist)
    keep = [i for i, x in enumerate(ts) if _in_range(x, *TIME_RANGE)]
    out = t.cast(dict[str, t.Any], dict(hist))
    steps = t.cast(dict[str, t.Any], dict(hist.get("steps") or {}))
    step_ts: list[t.Any] = steps.get("t") or []
    step_keep = [i for i, x in enumerate(steps.get("step") or [])
                 if i < len(step_ts) and _in_range(step_ts[i], *TIME_RANGE) and _in_range(x, 0, 2**53)]
    last = t.cast(dict[str, HistoryPointDoc], dict(hist.get("last") or {}))
    for metric in METRICS.values():
        for col in metric.columns:
            if col in out:
                out[col] = _clamped(out.get(col) or [], keep, metric)
            if col in steps:
                steps[col] = _clamped(steps.get(col) or [], step_keep, metric)
            point = last.get(col)
            if point is not None:
                v = limits.clamp(point.get("v"), metric.low, metric.high)
                if v is not None and _in_range(point.get("t"), *TIME_RANGE):
                    last[col] = {**point, "v": v}
                else:
                    del last[col]
    out["t"] = [ts[i] for i in keep]
    out["marks"] = [m for m in _marks(hist) if _in_range(m.get("t"), *TIME_RANGE)]
    out["bucket_s"] = limits.clamp(hist.get("bucket_s", 0.0), 0.0, TIME_RANGE[1]) or 0.0
    if "last" in out:
        out["last"] = last
    if "steps" in out:
        steps["step"] = [steps["step"][i] for i in step_keep]
        steps["t"] = [step_ts[i] for i in step_keep]
        out["steps"] = steps
    return t.cast(HistoryDoc, out)


def _clamped(raw: list[float | None], keep: list[int], metric: Metric) -> list[float | None]:
    return [limits.clamp(raw[i], metric.low, metric.high) if raw[i] is not None else None
            for i in keep if i < len(raw)]


def _in_range(x: object, low: float, high: float) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) \
        and low <= x <= high


def _number(x: object) -> float | None:
    return float(x) if _in_range(x, -math.inf, math.inf) else None  # type: ignore[arg-type]


def _present(col: t.Sequence[float | None]) -> int:
    return sum(x is not None for x in col)


def _rows(hist: HistoryDoc, col: str, by: str) -> tuple[list[float], list[float | None]]:
    """``col``'s x values and values (drawable ``hist``): by step from the step table; by
    time from the time buckets, or from the step table when it has more values of ``col``
    (in time order: after a restart the steps come again)."""
    steps = t.cast(t.Mapping[str, t.Any], hist.get("steps") or {})
    by_step: list[float | None] = steps.get(col) or []
    if by == "step":
        xs = [float(x) for x in steps.get("step") or []]
        return xs[:len(by_step)], by_step[:len(xs)]
    by_time: list[float | None] = t.cast(t.Mapping[str, t.Any], hist).get(col) or []
    if _present(by_step) > _present(by_time):
        pairs = sorted(zip(steps.get("t") or [], by_step, strict=False), key=lambda p: p[0])
        return [float(p[0]) for p in pairs], [p[1] for p in pairs]
    ts = _t(hist)
    return list(ts[:len(by_time)]), by_time[:len(ts)]


def _ending_at(xs: list[float], vals: list[float | None], end: HistoryPointDoc | None,
               by: str) -> tuple[list[float], list[float | None]]:
    """The curve ending at ``end`` (the newest sample): it replaces a last row at the same x
    (by time: at or after it) and follows a row before it; by step, an end before the last row
    (after a restart from an earlier step) leaves the curve as it is."""
    while vals and vals[-1] is None:
        xs, vals = xs[:-1], vals[:-1]
    x_end = None if end is None else (end.get("t") if by == "time" else end.get("step"))
    if end is None or not isinstance(x_end, int | float) or isinstance(x_end, bool):
        return xs, vals
    if xs and by == "time" and x_end <= xs[-1]:
        # by time nothing is newer than the newest sample: a row at or past it is the same
        # moment (a row's time is its samples' mean, rounded), so the curve ends at its value
        return xs, [*vals[:-1], end["v"]]
    if xs and x_end < xs[-1]:
        return xs, vals
    if xs and x_end == xs[-1]:
        return xs, [*vals[:-1], end["v"]]
    return [*xs, float(x_end)], [*vals, end["v"]]


def series(hist: HistoryDoc, metrics: t.Sequence[str] = DEFAULT_METRICS, *, by: str = "time",
           latest: t.Mapping[str, HistoryPointDoc] | None = None) -> list[Series]:
    """One :class:`Series` per metric that has at least one value in ``hist`` (drawable),
    ending at the newest sample: ``latest`` (what a status text shows, :func:`status_latest`)
    where it has the column, else the history's own ``last``."""
    merged = t.cast(HistoryDoc, {**hist, "last": {**(hist.get("last") or {}), **(latest or {})}})
    hist = drawable(merged)
    last = t.cast(t.Mapping[str, HistoryPointDoc], hist.get("last") or {})
    out = []
    for name in metrics:
        metric = METRICS[name]
        for col in metric.columns:
            xs, raw = _rows(hist, col, by)
            if any(x is not None for x in raw):
                xs, raw = _ending_at(xs, raw, last.get(col), by)
                vals = [None if x is None else x * metric.scale for x in raw]
                out.append(Series(metric, xs, vals))
                break
    return out


def status_latest(st: StatusDoc) -> dict[str, HistoryPointDoc]:
    """The newest values a status text shows, as history samples: the metrics line's (the
    last step event's) and, while the job lives, the GPU table's (mean utilisation, memory
    in use). The history file is written every few seconds, so its own last row may be older
    than the line beside the sparkline."""
    out: dict[str, HistoryPointDoc] = {}
    now = _number(st.get("now")) or 0.0
    step = st.get("last_step") or {}
    at = _number(step.get("_at")) or now
    n = step.get("step")
    for col in ("loss", "tok_s", "mfu", "mem_gib", "feature_wait_pct"):
        v = _number(step.get(col))
        if v is not None:
            point: HistoryPointDoc = {"t": at, "v": v}
            if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 2**53:
                point["step"] = n
            out[col] = point
    if st.get("alive"):
        gpus = st.get("gpus") or []
        utils = [u for u in (_number(g.get("util_pct")) for g in gpus) if u is not None]
        mems = [m for m in (_number(g.get("mem_used_mib")) for g in gpus) if m is not None]
        if utils:
            out["gpu_util"] = {"t": now, "v": math.fsum(utils) / len(utils)}
        if mems:
            out["gpu_mem_gib"] = {"t": now, "v": math.fsum(mems) / 1024.0}
    return out


def sparkline(values: t.Sequence[float | None], width: int = 40) -> str:
    """Unicode block sparkline, ``width`` characters at most; a gap (None) is a space.

    The last cell is the last value itself (never a mean with the ones before it), so the
    line ends where the value printed after it says; past ``width`` values the others are
    means of ``width - 1`` nearly equal groups."""
    if not values or width <= 0:
        return ""
    cells: list[float | None]
    if len(values) <= width:
        cells = list(values)
    else:
        head, n = values[:-1], width - 1
        cells = []
        for i in range(n):
            chunk = [v for v in head[i * len(head) // n:(i + 1) * len(head) // n] if v is not None]
            cells.append(_mean(chunk) if chunk else None)
        cells.append(values[-1])
    present = [c for c in cells if c is not None]
    if not present:
        return " " * len(cells)
    lo, hi = min(present), max(present)
    span = hi - lo
    top = len(BLOCKS) - 1
    return "".join(" " if c is None else BLOCKS[0 if span <= 0 else round((c - lo) / span * top)]
                   for c in cells)


def _mean(values: t.Sequence[float]) -> float:
    """The mean of clamped values (finite, so their sum is too: a drawable value is at most
    a metric's high)."""
    return math.fsum(values) / len(values)


@dataclass(frozen=True)
class SparkRow:
    label: str
    spark: str
    last: str
    low: str
    high: str


def sparkline_rows(hist: HistoryDoc | None, width: int = 40,
                   metrics: t.Sequence[str] = STATUS_METRICS,
                   latest: t.Mapping[str, HistoryPointDoc] | None = None) -> list[SparkRow]:
    """The lines ``opsctl status`` shows under the metrics: label, sparkline, last, range;
    each ends at ``latest`` (:func:`status_latest`: the values the text beside it shows)."""
    if hist is None:
        return []
    rows = []
    for s in series(hist, metrics, latest=latest):
        vals = s.values
        f = s.metric.fmt
        rows.append(SparkRow(s.metric.label, sparkline(s.v, width), f.format(vals[-1]),
                             f.format(min(vals)), f.format(max(vals))))
    return rows


def mark_line(hist: HistoryDoc, width: int) -> str:
    """Letters under a sparkline of ``width`` cells where the marks fall (C compile, R restart…)."""
    hist = drawable(hist)
    if not _t(hist) or not _marks(hist) or width <= 0:
        return ""
    t0 = _t(hist)[0]
    ends = [_t(hist)[-1] + hist.get("bucket_s", 0.0),
            *(p["t"] for p in t.cast(dict[str, HistoryPointDoc], hist.get("last") or {}).values())]
    span = max(ends) - t0
    span = span if span > 0 else 1.0  # one row: t0 + 1e-9 is t0 again for a large t0
    cells = [" "] * width
    for m in _marks(hist):  # where two fall in one cell the more serious one is shown
        i = min(max(int((m["t"] - t0) / span * width), 0), width - 1)
        letter = MARK_LETTER.get(m["kind"], "?")
        if _RANK.get(letter, 0) >= _RANK.get(cells[i], -1):
            cells[i] = letter
    return "".join(cells)


_RANK = {" ": -1, "X": 0, "C": 1, "R": 2, "E": 3, "H": 3, "D": 4}


def legend(hist: HistoryDoc) -> list[str]:
    """One line per mark kind present: ``C compile ×3 (last: drafter_step)``; remote text raw,
    the caller makes it safe for where it is shown."""
    seen: dict[str, list[str]] = {}
    for m in _marks(hist):
        seen.setdefault(m["kind"], []).append(m["label"])
    return [f"{MARK_LETTER.get(k, '?')} {k} ×{len(v)} (last: {v[-1]})" for k, v in seen.items()]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def start_of(hist: HistoryDoc) -> float:
    """The time axis' zero: the first row, or an earlier mark (the first compile)."""
    hist = drawable(hist)
    steps = t.cast(t.Mapping[str, t.Any], hist.get("steps") or {})
    firsts = [*_t(hist)[:1], *(steps.get("t") or [])[:1]]
    return min([*firsts, *(m["t"] for m in _marks(hist))]) if firsts else 0.0


def _x(ts: t.Sequence[float], t0: float) -> tuple[list[float], str]:
    """Time as minutes (or hours, for long spans) since ``t0``, with the axis label."""
    span = (ts[-1] - t0) if ts else 0.0
    if span > 3 * 3600:
        return [(x - t0) / 3600.0 for x in ts], "hours since start"
    return [(x - t0) / 60.0 for x in ts], "minutes since start"


def mark_steps(hist: HistoryDoc) -> list[tuple[HistoryMarkDoc, float]]:
    """Each mark with the step the job was at then (drawable ``hist``): the step of the
    latest step row at or before the mark's time, the first row's for an earlier mark; none
    without a step table."""
    steps = t.cast(t.Mapping[str, t.Any], hist.get("steps") or {})
    rows = sorted(zip(steps.get("t") or [], steps.get("step") or [], strict=False))
    if not rows:
        return []
    out = []
    for m in _marks(hist):
        before = [s for at, s in rows if at <= m["t"]]
        out.append((m, float(before[-1] if before else rows[0][1])))
    return out


def _axis(hist: HistoryDoc, by: str, found: t.Sequence[Series]
          ) -> tuple[t.Callable[[t.Sequence[float]], list[float]], str,
                     list[tuple[HistoryMarkDoc, float]]]:
    """The x transform, its label and the marks' x positions of a chart ``by`` time or step."""
    if by == "step":
        return list, "step", mark_steps(hist)
    t0 = start_of(hist)
    _, label = _x([x for s in found for x in s.t] or [t0], t0)
    unit = 3600.0 if label.startswith("hours") else 60.0
    return (lambda xs: [(x - t0) / unit for x in xs]), label, [
        (m, (m["t"] - t0) / unit) for m in _marks(hist)]


def check_axis(by: str, metrics: t.Sequence[str]) -> None:
    """Refuse what cannot be drawn ``by`` that axis before anything is fetched.

    Raises:
        ConfigError: an unknown axis, or only GPU metrics by step (GPU samples have no step).
    """
    if by not in AXES:
        raise ConfigError(f"--by {by!r} is not an axis", hint="--by time or --by step")
    if by == "step" and all(name == "gpu_util" for name in metrics):
        raise ConfigError("gpu_util has no step: the GPU samples are taken by time",
                          hint="plot it --by time, or add loss, tok_s, mfu or mem")


def _span(values: t.Sequence[float]) -> tuple[float, float]:
    """Axis limits around ``values`` that a chart can divide by: a span of at least a
    millionth of their size (and of 1e-9), centred on them when they are all one value."""
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    least = max(abs(lo), abs(hi), 1e-3) * 1e-6
    if hi - lo < least:
        mid = (lo + hi) / 2
        return mid - least, mid + least
    return lo, hi


def _pairs(s: Series) -> tuple[list[float], list[float]]:
    pts = [(x, y) for x, y in zip(s.t, s.v, strict=False) if y is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def terminal_charts(hist: HistoryDoc, metrics: t.Sequence[str], *, width: int = 100,
                    height_each: int = 12, color: bool = True, by: str = "time") -> str:
    """The charts ``opsctl plot`` prints: one panel per metric, marks as vertical lines,
    ``by`` time (minutes or hours since the start) or by step.

    Raises:
        ConfigError: plotext is missing (a broken install: it is a dependency), or nothing to draw.
    """
    try:
        import plotext as plx
    except ImportError:
        raise ConfigError("opsctl plot needs plotext, a dependency of opsctl that is missing here",
                          hint="pip install 'plotext>=5.2,<6' (or reinstall opsctl)") from None
    hist = drawable(hist)
    found = _found(hist, metrics, by)
    to_x, xlabel, marks = _axis(hist, by, found)
    plx.main()  # the whole figure: clear_figure() alone clears only the active subplot, and
    plx.clear_figure()  # a last call's subplots (their data, their limits) would stay
    plx.subplots(len(found), 1)
    plx.plotsize(width, height_each * len(found))
    for i, s in enumerate(found, start=1):
        plx.subplot(i, 1)
        xs, ys = _pairs(s)
        x = to_x(xs)
        plx.plot(x, ys, marker="braille")
        plx.xlim(*_span([*x, *(mx for _, mx in marks)]))
        plx.ylim(*_span(ys))  # plotext divides by the span: never 0 or a denormal one
        plx.title(s.metric.label)
        if i == len(found):
            plx.xlabel(xlabel)
        for m, mx in marks:
            plx.vline(mx, "red" if m["kind"] in ("error", "hang", "diagnosis") else
                      "magenta" if m["kind"] == "compile" else "blue")
    out = str(plx.build())
    plx.main()
    plx.clear_figure()
    return out if color else _ANSI.sub("", out)


def _found(hist: HistoryDoc, metrics: t.Sequence[str], by: str) -> list[Series]:
    """The series to draw.

    Raises:
        ConfigError: none of ``metrics`` has a value ``by`` that axis.
    """
    found = series(hist, metrics, by=by)
    if not found:
        raise ConfigError("no data to plot yet for these metrics" + (" by step" if by == "step" else ""),
                          hint="the job's history holds no finite value of them so far (no step "
                               "event or GPU sample that carries them)" if by == "time" else
                               "by step, only the step events' metrics are drawn (loss, tok_s, "
                               "mfu, mem, feature_wait_pct); the GPU samples have no step")
    return found


def write_png(hist: HistoryDoc, metrics: t.Sequence[str], path: str, title: str = "",
              by: str = "time") -> None:
    """The same charts as a PNG (matplotlib, headless).

    Raises:
        ConfigError: matplotlib is not installed, or nothing to draw.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--png needs matplotlib", hint="pip install 'opsctl[plots]'") from None
    hist = drawable(hist)
    found = _found(hist, metrics, by)
    to_x, xlabel, marks = _axis(hist, by, found)
    fig, axes = plt.subplots(len(found), 1, sharex=True, figsize=(10, 2.4 * len(found)),
                             squeeze=False)
    for ax, s in zip(axes[:, 0], found, strict=True):
        xs, ys = _pairs(s)
        ax.plot(to_x(xs), ys, linewidth=1.2)
        ax.set_ylabel(s.metric.label)
        ax.grid(alpha=0.3)
        for m, mx in marks:
            ax.axvline(mx, color=MARK_COLOR.get(m["kind"], "k"), linewidth=0.8, linestyle="--")
    axes[-1, 0].set_xlabel(xlabel + "  (dashed: " + ", ".join(
        sorted({m["kind"] for m, _ in marks})) + ")" if marks else xlabel)
    _save_figure(fig, path, title)


def _save_figure(fig: t.Any, path: str, title: str) -> None:
    """Title, lay out and write a figure as PNG through the atomic writer, then free it (a
    failed write still closes the figure, so a long dashboard does not leak them)."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        write_file_atomic(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    finally:
        plt.close(fig)


def check_output_path(path: str) -> None:
    """Refuse, before anything is fetched, an output path that cannot become a regular file:
    a directory that does not exist, a special file (``/dev/full``, a FIFO), a directory.

    Raises:
        ConfigError: the path cannot be written (exit 2).
    """
    import os
    import stat

    target = os.path.abspath(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write here: {exc.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path}: not a regular file; nothing written",
                          hint="name a new or existing .png file")
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise ConfigError(f"{path}: directory {parent} does not exist; nothing written")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{path}: directory {parent} is not writable; nothing written")


def write_file_atomic(path: str, write: t.Callable[[t.BinaryIO], object]) -> None:
    """``write`` into a temporary file next to ``path``, fsync, then rename over ``path``
    (:func:`remote_payload.safe_write.write_with`): ``path`` is either its old self or the
    complete new file, never half of one (a full disk, Ctrl-C), and never a link's target.

    Raises:
        ConfigError: the file could not be written completely (the reason named; exit 2).
    """
    from remote_payload import safe_write

    check_output_path(path)
    try:
        safe_write.write_with(path, write)
    except safe_write.DestinationError as exc:
        raise LocalWriteError.of(exc) from None


def svg_chart(s: Series, marks: t.Sequence[t.Any], *, width: int = 320, height: int = 70,
              escape: t.Callable[[str], str] = html.escape) -> str:
    """A small inline SVG line chart of one series with its marks; every text through ``escape``
    (the dashboard's also neutralises control characters in the marks' remote labels)."""
    xs, ys = _pairs(s)
    esc = escape
    head = (f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="{esc(s.metric.label)}">')
    if not xs:
        return head + "</svg>"
    pad = 4.0
    t0, t1 = xs[0], xs[-1] if xs[-1] > xs[0] else xs[0] + 1.0
    lo, hi = min(ys), max(ys)
    hi = hi if hi > lo else lo + 1.0

    def px(x: float) -> float:
        return pad + (x - t0) / (t1 - t0) * (width - 2 * pad)

    def py(y: float) -> float:
        return height - pad - (y - lo) / (hi - lo) * (height - 2 * pad - 12)

    parts = [head]
    for m in marks:
        if t0 <= m["t"] <= t1 + 1:
            x = px(min(m["t"], t1))
            parts.append(f'<line x1="{x:.1f}" y1="12" x2="{x:.1f}" y2="{height}" '
                         f'stroke="{MARK_COLOR.get(m["kind"], "#999")}" stroke-dasharray="3,2">'
                         f"<title>{esc(m['kind'])}: {esc(m['label'])}</title></line>")
    pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
    parts.append(f'<polyline fill="none" stroke="#2c7be5" stroke-width="1.5" points="{pts}"/>')
    f = s.metric.fmt
    parts.append(f'<text x="{pad}" y="10" font-size="10">{esc(s.metric.label)} '
                 f"{esc(f.format(ys[-1]))} (min {esc(f.format(min(ys)))}, "
                 f"max {esc(f.format(max(ys)))})</text></svg>")
    return "".join(parts)


#: the colour of each cause of a run's goodput ledger in its PNG timeline
GOODPUT_COLOR = {"productive": "#27ae60", "startup": "#16a085", "compile": "#8e44ad",
                 "checkpoint": "#2980b9", "stall": "#c0392b", "lost": "#e74c3c",
                 "shutdown": "#7f8c8d", "restart_gap": "#f1c40f", "queue_wait": "#f39c12",
                 "unknown": "#bdc3c7"}


def goodput_segments(doc: t.Mapping[str, t.Any]) -> list[tuple[str, float, float]]:
    """The ledger's timeline as ``(cause, start, end)`` a chart can draw: a segment of an
    unknown cause, of times outside :data:`TIME_RANGE`, or empty, is dropped."""
    out = []
    for seg in doc.get("timeline") or []:
        if not (isinstance(seg, list) and len(seg) == 3 and seg[0] in GOODPUT_COLOR):
            continue
        lo, hi = seg[1], seg[2]
        if _in_range(lo, *TIME_RANGE) and _in_range(hi, *TIME_RANGE) and hi > lo:
            out.append((str(seg[0]), float(lo), float(hi)))
    return out


def write_goodput_png(doc: t.Mapping[str, t.Any], path: str, title: str = "") -> None:
    """``opsctl goodput --png``: the run's timeline as coloured bands (one per cause), its
    attempts' starts as ticks, and the time per cause as bars.

    Raises:
        ConfigError: matplotlib is not installed, or the ledger has no time yet.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--png needs matplotlib", hint="pip install 'opsctl[plots]'") from None
    segs = goodput_segments(doc)
    if not segs:
        raise ConfigError("the run has no time to draw yet")
    t0 = segs[0][1]
    span = max(segs[-1][2] - t0, 1e-9)
    unit, label = (3600.0, "hours") if span > 3 * 3600 else (60.0, "minutes")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 4.2),
                                      gridspec_kw={"height_ratios": [1, 2]})
    for cause, lo, hi in segs:
        top.broken_barh([((lo - t0) / unit, (hi - lo) / unit)], (0, 1),
                        facecolors=GOODPUT_COLOR[cause])
    for a in doc.get("attempts") or []:
        start = a.get("start")
        if _in_range(start, *TIME_RANGE):
            top.axvline((float(start) - t0) / unit, color="k", linewidth=0.6)
    top.set_yticks([])
    top.set_xlabel(f"{label} since the run's start (ticks: attempt starts)")
    causes = {k: v for k, v in (doc.get("causes") or {}).items()
              if k in GOODPUT_COLOR and _in_range(v, 0.0, TIME_RANGE[1]) and v > 0}
    names = list(causes)
    bottom.barh(names, [causes[n] / unit for n in names],
                color=[GOODPUT_COLOR[n] for n in names])
    bottom.invert_yaxis()
    bottom.set_xlabel(label)
    _save_figure(fig, path, title)
