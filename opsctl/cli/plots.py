"""Pictures of a job's history: sparklines, terminal charts, PNG and SVG.

Pure data preparation and drawing; no click, no rich, no remote calls. The data is the
agent's bounded history (:class:`remote_payload.wire_shapes.HistoryDoc`: columns aligned with ``t``,
plus *marks* for recompiles, restarts, errors, hangs, diagnoses and the end).

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
from remote_payload.wire_shapes import HistoryDoc, HistoryMarkDoc

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
    on the edge, a negative loss on 0), nan a gap. A job's history is its trainer's output,
    so anything may be in it."""
    ts = _t(hist)
    keep = [i for i, x in enumerate(ts) if _in_range(x, *TIME_RANGE)]
    out = t.cast(dict[str, t.Any], dict(hist))
    for metric in METRICS.values():
        for col in metric.columns:
            raw: list[float | None] = out.get(col) or []
            if col in out:
                out[col] = [limits.clamp(raw[i], metric.low, metric.high) if raw[i] is not None
                            else None for i in keep if i < len(raw)]
    out["t"] = [ts[i] for i in keep]
    out["marks"] = [m for m in _marks(hist) if _in_range(m.get("t"), *TIME_RANGE)]
    out["bucket_s"] = limits.clamp(hist.get("bucket_s", 0.0), 0.0, TIME_RANGE[1]) or 0.0
    return t.cast(HistoryDoc, out)


def _in_range(x: object, low: float, high: float) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) \
        and low <= x <= high


def series(hist: HistoryDoc, metrics: t.Sequence[str] = DEFAULT_METRICS) -> list[Series]:
    """One :class:`Series` per metric that has at least one value in ``hist`` (drawable)."""
    hist = drawable(hist)
    out = []
    for name in metrics:
        metric = METRICS[name]
        for col in metric.columns:
            raw: list[float | None] = t.cast(t.Mapping[str, t.Any], hist).get(col) or []
            if any(x is not None for x in raw):
                vals = [None if x is None else x * metric.scale for x in raw]
                out.append(Series(metric, list(_t(hist)[:len(vals)]), vals[:len(_t(hist))]))
                break
    return out


def sparkline(values: t.Sequence[float | None], width: int = 40) -> str:
    """Unicode block sparkline, ``width`` characters at most; a gap (None) is a space."""
    if not values or width <= 0:
        return ""
    group = max(1, math.ceil(len(values) / width))
    cells: list[float | None] = []
    for i in range(0, len(values), group):
        chunk = [v for v in values[i:i + group] if v is not None]
        cells.append(sum(chunk) / len(chunk) if chunk else None)
    present = [c for c in cells if c is not None]
    if not present:
        return " " * len(cells)
    lo, hi = min(present), max(present)
    span = hi - lo
    top = len(BLOCKS) - 1
    return "".join(" " if c is None else BLOCKS[0 if span <= 0 else round((c - lo) / span * top)]
                   for c in cells)


@dataclass(frozen=True)
class SparkRow:
    label: str
    spark: str
    last: str
    low: str
    high: str


def sparkline_rows(hist: HistoryDoc | None, width: int = 40,
                   metrics: t.Sequence[str] = STATUS_METRICS) -> list[SparkRow]:
    """The lines ``opsctl status`` shows under the metrics: label, sparkline, last, range."""
    if hist is None:
        return []
    rows = []
    for s in series(hist, metrics):
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
    span = _t(hist)[-1] + hist.get("bucket_s", 0.0) - t0
    span = span if span > 0 else 1.0  # one row: t0 + 1e-9 is t0 again for a large t0
    n = math.ceil(len(_t(hist)) / max(1, math.ceil(len(_t(hist)) / width)))  # = the sparkline's cells
    cells = [" "] * n
    for m in _marks(hist):  # where two fall in one cell the more serious one is shown
        i = min(max(int((m["t"] - t0) / span * n), 0), n - 1)
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
    return min([_t(hist)[0], *(m["t"] for m in _marks(hist))]) if _t(hist) else 0.0


def _x(ts: t.Sequence[float], t0: float) -> tuple[list[float], str]:
    """Time as minutes (or hours, for long spans) since ``t0``, with the axis label."""
    span = (ts[-1] - t0) if ts else 0.0
    if span > 3 * 3600:
        return [(x - t0) / 3600.0 for x in ts], "hours since start"
    return [(x - t0) / 60.0 for x in ts], "minutes since start"


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
                    height_each: int = 12, color: bool = True) -> str:
    """The charts ``opsctl plot`` prints: one panel per metric, marks as vertical lines.

    Raises:
        ConfigError: plotext is missing (a broken install: it is a dependency), or nothing to draw.
    """
    try:
        import plotext as plx
    except ImportError:
        raise ConfigError("opsctl plot needs plotext, a dependency of opsctl that is missing here",
                          hint="pip install 'plotext>=5.2,<6' (or reinstall opsctl)") from None
    hist = drawable(hist)
    found = series(hist, metrics)
    if not found:
        raise ConfigError("no data to plot yet for these metrics",
                          hint="the job has logged no step events or GPU samples so far")
    t0 = start_of(hist)
    plx.main()  # the whole figure: clear_figure() alone clears only the active subplot, and
    plx.clear_figure()  # a last call's subplots (their data, their limits) would stay
    plx.subplots(len(found), 1)
    plx.plotsize(width, height_each * len(found))
    for i, s in enumerate(found, start=1):
        plx.subplot(i, 1)
        xs, ys = _pairs(s)
        x, xlabel = _x(xs, t0)
        plx.plot(x, ys, marker="braille")
        plx.xlim(*_span([*x, *((m["t"] - t0) / (3600.0 if xlabel.startswith("hours") else 60.0)
                               for m in _marks(drawable(hist)))]))
        plx.ylim(*_span(ys))  # plotext divides by the span: never 0 or a denormal one
        plx.title(s.metric.label)
        if i == len(found):
            plx.xlabel(xlabel)
        unit = 3600.0 if xlabel.startswith("hours") else 60.0
        for m in _marks(hist):
            plx.vline((m["t"] - t0) / unit, "red" if m["kind"] in ("error", "hang", "diagnosis") else
                      "magenta" if m["kind"] == "compile" else "blue")
    out = str(plx.build())
    plx.main()
    plx.clear_figure()
    return out if color else _ANSI.sub("", out)


def write_png(hist: HistoryDoc, metrics: t.Sequence[str], path: str, title: str = "") -> None:
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
    found = series(hist, metrics)
    if not found:
        raise ConfigError("no data to plot yet for these metrics")
    t0 = start_of(hist)
    fig, axes = plt.subplots(len(found), 1, sharex=True, figsize=(10, 2.4 * len(found)),
                             squeeze=False)
    xlabel = ""
    for ax, s in zip(axes[:, 0], found, strict=True):
        xs, ys = _pairs(s)
        x, xlabel = _x(xs, t0)
        ax.plot(x, ys, linewidth=1.2)
        ax.set_ylabel(s.metric.label)
        ax.grid(alpha=0.3)
        unit = 3600.0 if xlabel.startswith("hours") else 60.0
        for m in _marks(hist):
            ax.axvline((m["t"] - t0) / unit, color=MARK_COLOR.get(m["kind"], "k"), linewidth=0.8,
                       linestyle="--")
    axes[-1, 0].set_xlabel(xlabel + "  (dashed: " + ", ".join(
        sorted({m["kind"] for m in _marks(hist)})) + ")" if _marks(hist) else xlabel)
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
