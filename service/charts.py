"""Server-side charts: coordinates computed here, drawn as inline SVG by a Jinja macro.

No JavaScript library and no network: the dashboard works offline, and every label goes through
the template's autoescaping like any other text.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Sequence

from matplotlib.ticker import EngFormatter

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


@dataclass
class Series:
    """One line or set of points; y None means no value at that x (a gap)."""

    name: str
    points: Sequence[tuple[float, float | None]]
    color: str = PALETTE[0]
    line: bool = True
    dots: bool = True
    dashed: bool = False
    # Drawn as steps (a value holds until the next point), as a best-so-far curve is.
    step: bool = False
    # One tooltip per point (same order as points), shown as the SVG <title>.
    titles: Sequence[str] | None = None


@dataclass
class Chart:
    width: int
    height: int
    title: str
    y_label: str
    x_label: str
    plot: tuple[float, float, float, float]  # left, top, right, bottom
    paths: list[dict] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    # Only the series that drew something: a legend names no line that is not there.
    legend: list[dict] = field(default_factory=list)
    # Events with no value (failed trials): crosses on the x axis, each with a tooltip.
    x_marks: list[dict] = field(default_factory=list)
    empty: bool = False


_SI = EngFormatter(sep="")
_SECONDS = EngFormatter(unit="s")


def si(v: float) -> str:
    """A plain number with an SI prefix: 1k, 1.5M, 20 (never 1e+03k)."""
    return str(_SI(v))


def microseconds(us: float) -> str:
    """A latency given in microseconds, as seconds with an SI prefix and at most four significant
    digits: 370 ns, 3.785 µs, 1.2 ms."""
    return str(_SECONDS(float(f"{us * 1e-6:.4g}")))


LEGEND_CHAR_PX = 6.5
LEGEND_ROW_PX = 16


def _log_ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    e = math.floor(math.log10(lo))
    while 10 ** e <= hi * 1.0001:
        for m in (1, 2, 5):
            t = m * 10 ** e
            if lo / 1.0001 <= t <= hi * 1.0001:
                ticks.append(t)
        e += 1
    if len(ticks) > 8:
        ticks = [t for t in ticks if math.isclose(math.log10(t) % 1, 0, abs_tol=1e-9)] or ticks
    return ticks or [lo, hi]


def _lin_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    if integer:
        step = max(1, step)
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _legend(entries: Sequence[tuple[str, str, bool, str]], left: float, right: float) -> list[dict]:
    """Legend entries (name, color, dashed, marker: line, dot or cross) laid out in rows from
    the plot's left edge, wrapping at its right edge."""
    out, x, row = [], left + 8, 0
    for name, color, dashed, marker in entries:
        w = 30 + LEGEND_CHAR_PX * len(name)
        if x + w > right and x > left + 8:
            x, row = left + 8, row + 1
        out.append({"name": name, "color": color, "dashed": dashed, "x": round(x, 1),
                    "y": 14 + row * LEGEND_ROW_PX, "marker": marker})
        x += w + 14
    return out


def make_chart(series: Sequence[Series], *, title: str, y_label: str, x_label: str = "",
               x_ticks: Sequence[tuple[float, str]] | None = None, log_y: bool = True,
               width: int = 1100, height: int = 300,
               y_format: Callable[[float], str] = si,
               x_marks: Sequence[tuple[float, str]] = (), x_marks_name: str = "failed",
               x_marks_color: str = PALETTE[1]) -> Chart:
    """Scale the series into a width x height SVG with ticks; log y when values span decades.
    The SVG scales to its container's width (the viewBox keeps the proportions); `y_format`
    labels the y ticks and the points' tooltips. `x_marks` (x, tooltip) are events without a
    value, drawn as crosses on the x axis and named `x_marks_name` in the legend."""
    drawn = [s for s in series
             if any(y is not None and math.isfinite(y) and y > 0 for _, y in s.points)]
    left, right = 72.0, width - 16.0
    entries = [(s.name, s.color, s.dashed, "line" if s.line else "dot") for s in drawn]
    if x_marks:
        entries.append((x_marks_name, x_marks_color, False, "cross"))
    legend = _legend(entries, left, right)
    top = 28.0 + (legend[-1]["y"] - 14 if legend else 0)
    bottom = height - 44.0
    chart = Chart(width, height, title, y_label, x_label, (left, top, right, bottom))
    chart.legend = legend
    series = drawn
    ys = [y for s in series for _, y in s.points if y is not None and y > 0 and math.isfinite(y)]
    xs = [x for s in series for x, _ in s.points] + [x for x, _ in x_marks]
    if not ys or not xs:
        chart.empty = True
        return chart
    y_lo, y_hi = min(ys), max(ys)
    use_log = log_y and y_hi / y_lo > 5
    if use_log:
        y_lo, y_hi = y_lo / 1.3, y_hi * 1.3
        f_lo, f_hi = math.log10(y_lo), math.log10(y_hi)
    else:
        pad = (y_hi - y_lo) * 0.1 or y_hi * 0.1 or 1.0
        y_lo, y_hi = max(0.0, y_lo - pad), y_hi + pad
        f_lo, f_hi = y_lo, y_hi
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1

    def sx(x: float) -> float:
        return round(left + (x - x_lo) / (x_hi - x_lo) * (right - left), 1)

    def sy(y: float) -> float:
        f = math.log10(y) if use_log else y
        return round(bottom - (f - f_lo) / (f_hi - f_lo) * (bottom - top), 1)

    for s in series:
        segments: list[list[tuple[float, float]]] = [[]]
        dots = []
        for i, (x, y) in enumerate(s.points):
            if y is None or not math.isfinite(y) or (use_log and y <= 0):
                if segments[-1]:
                    segments.append([])
                continue
            p = (sx(x), sy(y))
            if s.step and segments[-1]:
                segments[-1].append((p[0], segments[-1][-1][1]))
            segments[-1].append(p)
            title = s.titles[i] if s.titles is not None else f"{s.name}: {y_format(y)}"
            dots.append({"x": p[0], "y": p[1], "title": title})
        chart.paths.append({
            "name": s.name, "color": s.color, "dashed": s.dashed,
            "lines": [" ".join(f"{x},{y}" for x, y in seg) for seg in segments
                      if s.line and len(seg) > 1],
            "dots": dots if s.dots else [],
        })
    ticks = _log_ticks(y_lo, y_hi) if use_log else _lin_ticks(y_lo, y_hi)
    chart.y_ticks = [(sy(t), y_format(t)) for t in ticks if t > 0 or not use_log]
    if x_ticks is None:
        integer = all(float(x).is_integer() for x in xs)
        x_ticks = [(t, si(t)) for t in _lin_ticks(x_lo, x_hi, 8, integer=integer)]
    chart.x_ticks = [(sx(x), label) for x, label in x_ticks if x_lo <= x <= x_hi]
    chart.x_marks = [{"x": sx(x), "y": bottom - 6, "title": t, "color": x_marks_color}
                     for x, t in x_marks]
    return chart
