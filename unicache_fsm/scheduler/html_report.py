"""The run report of ``simulate --report DIR``: one self-contained HTML page.

`write_report(folder, report=..., timeline=..., diagrams=...)` writes
``folder/index.html`` (creating the folder) and returns its path. The page needs no
network: plotly's JavaScript is inlined once and the machine diagrams are inline SVG.
It shows

- the summary table (`SimReport.rows()`, the leaked-slot count among them);
- hit rates over time: the running share of prompt tokens served from the device,
  the host tier (when there is one), the external store, and recomputed;
- pool occupancy over time, one chart per pool: free, owned by the tree, reserved by
  loads, held by requests (and ``other``, which stays 0 when nothing leaks);
- load outcomes per step (committed, aborted per reason) and offload verdicts per
  step (submitted, published, failed);
- fault events per step (injected per kind, contained per store call);
- the coverage-coloured diagram of every machine (`diagrams`: name -> SVG text).

Every chart is a ``<div class="chart" id="chart-...">``; `CHART_IDS` lists the fixed
ones (plus ``chart-occupancy-<pool>`` per pool and ``diagram-<machine>`` per machine).
The page records script errors into ``#page-errors`` and sets ``data-charts`` on
``<body>`` to the number of charts that drew, once all of them did.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from pathlib import Path

import plotly.graph_objects as go

from unicache_fsm.scheduler.report import ABORT_REASONS, SimReport
from unicache_fsm.scheduler.timeline import Timeline

__all__ = ["CHART_IDS", "render_report", "write_report"]

CHART_IDS = ("chart-hit-rates", "chart-loads", "chart-offloads", "chart-faults")

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1100px;
       color: #222; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
table.summary { border-collapse: collapse; font-size: 0.9rem; }
table.summary td { padding: 2px 12px 2px 0; vertical-align: top; }
table.summary td:first-child { font-weight: 600; white-space: nowrap; }
.chart { min-height: 320px; }
.diagram { overflow-x: auto; border: 1px solid #ddd; margin: 0.5rem 0 1rem; }
.diagram svg { height: auto; }
#page-errors:empty { display: none; }
#page-errors { color: #b00; white-space: pre-wrap; }
"""

# Errors go into the page (and stay on the console): a test reads them from the DOM.
_ERRORS = """
<pre id="page-errors"></pre>
<script>
(function () {
  var box = document.getElementById("page-errors");
  function note(text) { box.textContent += text + "\\n"; }
  window.addEventListener("error", function (e) { note("error: " + e.message); });
  window.addEventListener("unhandledrejection", function (e) {
    note("unhandled rejection: " + e.reason);
  });
  var original = console.error;
  console.error = function () {
    note("console.error: " + Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
})();
</script>
"""

_DONE = """
<script>
window.addEventListener("load", function () {
  var charts = document.querySelectorAll("div.chart .js-plotly-plot");
  var drawn = Array.prototype.filter.call(charts, function (c) {
    return c.querySelector("svg.main-svg") !== null;
  });
  document.body.dataset.charts = String(drawn.length);
});
</script>
"""

_LAYOUT = {
    "height": 340,
    "margin": {"l": 60, "r": 20, "t": 50, "b": 45},
    "template": "plotly_white",
}


def _figure(title: str, y_title: str, *, barmode: str | None = None) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title="scheduler step", yaxis_title=y_title, **_LAYOUT)
    if barmode is not None:
        fig.update_layout(barmode=barmode)
    return fig


def _hit_rates(tl: Timeline, host: bool) -> go.Figure:
    fig = _figure("Hit rates over time (share of prompt tokens so far)", "share of tokens")
    rates = tl.hit_rates()
    kinds = (
        ["device", "host", "external", "recomputed"]
        if host
        else ["device", "external", "recomputed"]
    )
    for kind in kinds:
        fig.add_scatter(x=tl.steps, y=rates[kind], mode="lines", name=kind)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    return fig


def _occupancy(tl: Timeline, pool: str) -> go.Figure:
    fig = _figure(f"{pool} pool occupancy over time", "tokens")
    occ = tl.occupancy[pool]
    parts = {
        "free": [o.free for o in occ],
        "tree-owned": [o.tree for o in occ],
        "reserved by loads": [o.loads for o in occ],
        "held by requests": [o.requests for o in occ],
        "other (leaked)": [o.other for o in occ],
    }
    for name, ys in parts.items():
        fig.add_scatter(x=tl.steps, y=ys, mode="lines", stackgroup="pool", name=name)
    return fig


def _loads(tl: Timeline) -> go.Figure:
    fig = _figure("Load outcomes per step", "loads", barmode="stack")
    fig.add_bar(x=tl.steps, y=tl.per_step("loads.committed"), name="committed")
    for code in tl.names("loads.aborted."):
        label = f"aborted: {ABORT_REASONS.get(code, code)}"
        fig.add_bar(x=tl.steps, y=tl.per_step(f"loads.aborted.{code}"), name=label)
    if not any(tl.counters.get("loads.committed", [])) and not tl.names("loads.aborted."):
        fig.add_annotation(
            text="no load from the store in this run", showarrow=False, y=0.5, yref="paper"
        )
    return fig


def _offloads(tl: Timeline) -> go.Figure:
    fig = _figure("Offload verdicts per step", "offloads", barmode="group")
    for verdict in ("submitted", "published", "failed"):
        fig.add_bar(x=tl.steps, y=tl.per_step(f"offloads.{verdict}"), name=verdict)
    return fig


def _faults(tl: Timeline) -> go.Figure:
    fig = _figure("Fault events per step", "events", barmode="stack")
    series = [(f"injected: {k}", f"faults.injected.{k}") for k in tl.names("faults.injected.")]
    series += [
        (f"contained in {k}", f"faults.contained.{k}") for k in tl.names("faults.contained.")
    ]
    for label, name in series:
        fig.add_bar(x=tl.steps, y=tl.per_step(name), name=label)
    if not series:
        fig.add_scatter(x=tl.steps, y=[0] * len(tl.steps), mode="lines", name="no faults")
        fig.add_annotation(
            text="no fault injected or contained in this run", showarrow=False, y=0.5, yref="paper"
        )
    return fig


def _svg_body(svg: str) -> str:
    """An SVG document as an inline element (no XML prolog or DOCTYPE)."""
    start = svg.find("<svg")
    if start < 0:
        msg = "a diagram is not SVG text"
        raise ValueError(msg)
    return re.sub(r"<!--.*?-->", "", svg[start:], flags=re.S)


def render_report(*, report: SimReport, timeline: Timeline, diagrams: Mapping[str, str]) -> str:
    """The page's HTML text (see the module docstring)."""
    charts: list[tuple[str, str, go.Figure]] = [
        ("Hit rates", "chart-hit-rates", _hit_rates(timeline, report.host_hit_tokens > 0)),
    ]
    charts += [
        ("Pool occupancy" if i == 0 else "", f"chart-occupancy-{pool}", _occupancy(timeline, pool))
        for i, pool in enumerate(timeline.occupancy)
    ]
    charts += [
        ("Loads and offloads", "chart-loads", _loads(timeline)),
        ("", "chart-offloads", _offloads(timeline)),
        ("Faults", "chart-faults", _faults(timeline)),
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>unicache-fsm simulate report</title>",
        f"<style>{_STYLE}</style></head><body>",
        _ERRORS,
        "<h1>unicache-fsm simulate report</h1>",
        '<table class="summary">',
    ]
    parts += [
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in report.rows()
    ]
    parts.append("</table>")
    for i, (heading, div_id, fig) in enumerate(charts):
        if heading:
            parts.append(f"<h2>{html.escape(heading)}</h2>")
        snippet = fig.to_html(
            full_html=False,
            include_plotlyjs=i == 0,
            div_id=f"{div_id}-plot",
            config={"displaylogo": False, "responsive": True},
        )
        parts.append(f'<div class="chart" id="{div_id}">{snippet}</div>')
    parts.append("<h2>Machines (arrows coloured by how often this run took them)</h2>")
    for name, svg in diagrams.items():
        parts.append(f"<h3>{html.escape(name)}</h3>")
        parts.append(
            f'<div class="diagram" id="diagram-{html.escape(name)}">{_svg_body(svg)}</div>'
        )
    parts += [_DONE, "</body></html>"]
    return "\n".join(parts)


def write_report(
    folder: str | Path, *, report: SimReport, timeline: Timeline, diagrams: Mapping[str, str]
) -> Path:
    """Write ``folder/index.html``; returns its path."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    text = render_report(report=report, timeline=timeline, diagrams=diagrams)
    page.write_text(text, encoding="utf-8")
    return page
