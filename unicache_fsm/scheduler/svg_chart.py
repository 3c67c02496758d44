"""Charts as inline SVG text, drawn on the server: the run report's only chart code.

Why hand-written SVG and not a chart library: the report must open offline, so any
chart code is inlined into the page. plotly's bundle alone is 4.8 MB; a light library
(uPlot ~50 KB, Chart.js ~200 KB) would still be JavaScript to vendor, pin, license and
run in the reader's browser, for charts that never change once the run is over. The
report's charts are a handful of lines, stacked areas and stacked bars over scheduler
steps; drawing them here is ~250 lines, needs no dependency and no script in the page
(so no script error is possible), and yields a few kilobytes per chart that a test can
read as XML. Interactivity is what is given up; each point's value is still shown on
hover by the browser (an SVG ``<title>`` per point or bar).

- `Series(name, values)` — one named row of numbers (``None``: no value there; a line
  breaks, a bar is left out).
- `line_chart(title, x, series, ...)` — one polyline per series (or stacked areas with
  ``stacked=True``), y from 0, ``percent=True`` for shares in 0..1. Past `MAX_POINTS`
  x values it draws every k-th one (and the last), so a long run's page stays light.
- `bar_chart(title, labels, series, ...)` — one stacked bar per label.

Every chart has axes with round ticks, axis titles and a legend, even for a single
series (the legend says what the one line is). Input is checked: no series, series of
a length other than the x values', a negative bar or a value that is not finite raise
`ChartInputError` naming the chart and the series. The output is an ``<svg>`` element
with a ``viewBox`` and no fixed width, so it scales to its container.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

import attrs

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = [
    "MAX_POINTS",
    "PALETTE",
    "ChartInputError",
    "Series",
    "bar_chart",
    "line_chart",
    "nice_ticks",
]

#: the most points a line chart draws per series (a longer series is sampled evenly)
MAX_POINTS = 600

#: Okabe & Ito's colour-blind-safe palette, in the order series take it
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
)

_W, _H = 760, 300  # the drawing's own units (it scales with the page)
_LEFT, _RIGHT, _TOP, _BOTTOM = 62, 16, 34, 78  # room for ticks, titles and the legend


class ChartInputError(UnicacheFsmError, ValueError):
    """Data a chart cannot draw; names the chart and the series."""


def _values(values: Iterable[float | None]) -> tuple[float | None, ...]:
    return tuple(values)


@attrs.frozen
class Series:
    """One named row of values, aligned with the chart's x values (None: no value)."""

    name: str
    values: tuple[float | None, ...] = attrs.field(converter=_values)


def nice_ticks(top: float, count: int = 5, *, whole: bool = False) -> list[float]:
    """Round tick values from 0 to at least `top` (1, 2 or 5 times a power of ten apart;
    at least 1 apart with `whole`, for counts)."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    raw = max(top / max(1, count), 1.0 if whole else 0.0)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _label(value: float, percent: bool) -> str:
    if percent:
        return f"{value:.0%}"
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:.3g}"


def _check(title: str, n: int, series: Sequence[Series], *, bars: bool) -> None:
    if not series:
        msg = f"chart {title!r}: no series"
        raise ChartInputError(msg)
    if n == 0:
        msg = f"chart {title!r}: no x values"
        raise ChartInputError(msg)
    for s in series:
        if len(s.values) != n:
            msg = f"chart {title!r}: series {s.name!r} has {len(s.values)} values for {n} x values"
            raise ChartInputError(msg)
        for v in s.values:
            if v is None:
                continue
            if not math.isfinite(v) or (bars and v < 0):
                msg = f"chart {title!r}: series {s.name!r} holds {v!r}"
                raise ChartInputError(msg)


class _Frame:
    """The plot area: maps data to drawing units and draws axes, titles and legend."""

    def __init__(
        self, title: str, x_lo: float, x_hi: float, y_top: float, percent: bool, whole: bool
    ) -> None:
        self.title, self.percent = title, percent
        self.x_lo, self.x_hi = x_lo, x_hi if x_hi > x_lo else x_lo + 1
        self.ticks = nice_ticks(1.0 if percent and y_top <= 1 else y_top, whole=whole)
        self.y_hi = self.ticks[-1]

    def x(self, v: float) -> float:
        return _LEFT + (v - self.x_lo) / (self.x_hi - self.x_lo) * (_W - _LEFT - _RIGHT)

    def y(self, v: float) -> float:
        return _H - _BOTTOM - v / self.y_hi * (_H - _TOP - _BOTTOM)

    def axes(self, x_title: str, y_title: str, x_ticks: Sequence[tuple[float, str]]) -> list[str]:
        out = [f'<text class="title" x="{_LEFT}" y="20">{html.escape(self.title)}</text>']
        base = _H - _BOTTOM
        for t in self.ticks:
            yy = self.y(t)
            out.append(
                f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}"/>'
            )
            out.append(
                f'<text class="tick" x="{_LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">'
                f"{_label(t, self.percent)}</text>"
            )
        out.append(f'<line class="axis" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{base}" y2="{base}"/>')
        for xv, text in x_ticks:
            xx = self.x(xv)
            out.append(
                f'<text class="tick" x="{xx:.1f}" y="{base + 16}" text-anchor="middle">'
                f"{html.escape(text)}</text>"
            )
        out.append(
            f'<text class="axis-title" x="{(_LEFT + _W - _RIGHT) / 2}" y="{base + 34}" '
            f'text-anchor="middle">{html.escape(x_title)}</text>'
        )
        out.append(
            f'<text class="axis-title" x="14" y="{(_TOP + base) / 2}" text-anchor="middle" '
            f'transform="rotate(-90 14 {(_TOP + base) / 2})">{html.escape(y_title)}</text>'
        )
        return out


def _legend(names: Sequence[str], dashed: Sequence[bool] = ()) -> list[str]:
    out = ['<g class="legend">']
    x, y = _LEFT, _H - 18
    for i, name in enumerate(names):
        colour = PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="5 3"' if i < len(dashed) and dashed[i] else ""
        out.append(
            f'<line x1="{x}" x2="{x + 18}" y1="{y - 4}" y2="{y - 4}" stroke="{colour}" '
            f'stroke-width="3"{dash}/>'
        )
        out.append(f'<text class="legend-item" x="{x + 23}" y="{y}">{html.escape(name)}</text>')
        x += 36 + 7 * len(name)
        if x > _W - 120 and i + 1 < len(names):
            x, y = _LEFT, y + 14
    out.append("</g>")
    return out


def _x_ticks(x: Sequence[float], count: int = 8) -> list[tuple[float, str]]:
    lo, hi = x[0], x[-1]
    if hi <= lo:
        return [(lo, _label(lo, False))]
    ticks = [t + lo for t in nice_ticks(hi - lo, count) if t + lo <= hi]
    return [(t, _label(t, False)) for t in ticks]


def _svg(chart_id: str, title: str, body: list[str]) -> str:
    return "\n".join(
        [
            f'<svg class="chart-svg" id="{html.escape(chart_id)}" viewBox="0 0 {_W} {_H}" '
            f'role="img" aria-label="{html.escape(title)}" xmlns="http://www.w3.org/2000/svg">',
            *body,
            "</svg>",
        ]
    )


def line_chart(
    title: str,
    x: Sequence[float],
    series: Sequence[Series],
    *,
    chart_id: str,
    x_title: str = "scheduler step",
    y_title: str = "",
    percent: bool = False,
    stacked: bool = False,
) -> str:
    """Lines (or stacked areas) over `x`; see the module docstring."""
    _check(title, len(x), series, bars=stacked)
    if len(x) > MAX_POINTS:
        step = -(-len(x) // MAX_POINTS)
        keep = [*range(0, len(x) - 1, step), len(x) - 1]
        x = [x[i] for i in keep]
        series = [Series(s.name, [s.values[i] for i in keep]) for s in series]
    if stacked:
        tops = [sum(s.values[i] or 0.0 for s in series) for i in range(len(x))]
    else:
        tops = [v for s in series for v in s.values if v is not None]
    frame = _Frame(title, x[0], x[-1], max(tops, default=0.0), percent, whole=False)
    body = frame.axes(x_title, y_title, _x_ticks(x))
    below = [0.0] * len(x)
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        name = html.escape(s.name)
        if stacked:
            above = [b + (v or 0.0) for b, v in zip(below, s.values, strict=True)]
            upper = [f"{frame.x(xv):.1f},{frame.y(v):.1f}" for xv, v in zip(x, above, strict=True)]
            lower = [
                f"{frame.x(xv):.1f},{frame.y(v):.1f}"
                for xv, v in zip(reversed(x), reversed(below), strict=True)
            ]
            body.append(
                f'<polygon class="series" data-series="{name}" fill="{colour}" '
                f'fill-opacity="0.55" stroke="{colour}" points="{" ".join(upper + lower)}">'
                f"<title>{name}</title></polygon>"
            )
            below = above
            continue
        segments: list[list[str]] = [[]]
        for xv, v in zip(x, s.values, strict=True):
            if v is None:
                segments.append([])
            else:
                segments[-1].append(f"{frame.x(xv):.1f},{frame.y(v):.1f}")
        attrs_ = f'class="series" data-series="{name}" stroke="{colour}"'
        for seg in segments:
            if len(seg) > 1:
                body.append(
                    f'<polyline {attrs_} fill="none" stroke-width="2" points="{" ".join(seg)}">'
                    f"<title>{name}</title></polyline>"
                )
            elif seg:  # a lone point between gaps
                cx, cy = seg[0].split(",")
                body.append(
                    f'<circle {attrs_} fill="{colour}" r="2.5" cx="{cx}" cy="{cy}">'
                    f"<title>{name}</title></circle>"
                )
    body += _legend([s.name for s in series])
    return _svg(chart_id, title, body)


def bar_chart(
    title: str,
    labels: Sequence[float],
    series: Sequence[Series],
    *,
    chart_id: str,
    x_title: str = "scheduler step",
    y_title: str = "",
) -> str:
    """One stacked bar per label (a step or a window's last step); see the module
    docstring."""
    _check(title, len(labels), series, bars=True)
    n = len(labels)
    tops = [sum(s.values[i] or 0.0 for s in series) for i in range(n)]
    half = (labels[-1] - labels[0]) / max(1, n - 1) / 2 if n > 1 else 0.5
    frame = _Frame(
        title, labels[0] - half, labels[-1] + half, max(tops, default=0.0), False, whole=True
    )
    body = frame.axes(x_title, y_title, _x_ticks(labels))
    width = max(1.0, (frame.x(labels[0] + half) - frame.x(labels[0] - half)) * 0.8)
    below = [0.0] * n
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        name = html.escape(s.name)
        body.append(f'<g class="series" data-series="{name}" fill="{colour}">')
        for j, v in enumerate(s.values):
            if not v:
                continue
            top, bottom = frame.y(below[j] + v), frame.y(below[j])
            body.append(
                f'<rect x="{frame.x(labels[j]) - width / 2:.1f}" y="{top:.1f}" '
                f'width="{width:.1f}" height="{bottom - top:.1f}">'
                f"<title>{name}: {_label(v, False)} (to step {_label(labels[j], False)})"
                "</title></rect>"
            )
            below[j] += v
        body.append("</g>")
    body += _legend([s.name for s in series])
    return _svg(chart_id, title, body)
