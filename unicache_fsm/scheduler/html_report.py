"""The run report of ``simulate --report DIR``: one self-contained HTML page.

`write_report(folder, report=..., timeline=..., requests=..., diagrams=..., baseline=...)`
writes ``folder/index.html`` (creating the folder) and returns its path. The page holds
no script and fetches nothing: its charts are inline SVG drawn here
(`scheduler.svg_chart`, which says why no chart library), the machine diagrams are
Graphviz's SVG inline. It answers, in order:

- what ran and how it went: the summary table (`SimReport.rows()`);
- why SWA hit rates look as they do, when the run had an SWA window (``#swa-note``,
  `report.swa_note`);
- how it compares with a baseline run (``#compare``: the settings that differ and
  every figure side by side with its delta; only with ``baseline``);
- hit rates per window of steps (the share of each window's admitted prompt tokens
  served from the device, the host tier, the external store) and cumulative;
- per request (``#requests``, the first `MAX_REQUEST_ROWS`): admission and finish
  step, prompt tokens, where they came from (device, host, external store, computed),
  prefix hit, tokens saved, and a modelled time to first token, with the model stated
  above the table (`scheduler.requests.TtftModel`);
- pool occupancy over time, one stacked chart per pool (``other (leaked)`` only when
  something leaked);
- loads (committed, aborted per reason) and offloads (published, failed) per window,
  each chart only when something of its kind happened (a sentence otherwise);
  "submitted" is not a bar of its own: every offload submitted ends published or
  failed, and the caption says how many were still in flight at the end;
- faults per window, only when a fault was injected or contained;
- the coverage-coloured diagram of every machine, scaled to the page width.

Every chart is an ``<svg class="chart-svg" id="chart-...">``; `CHART_IDS` lists those
every run has (plus ``chart-occupancy-<pool>`` per pool, ``chart-loads``,
``chart-offloads`` and ``chart-faults`` when they have something to show, and
``diagram-<machine>`` per machine).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from unicache_fsm.scheduler.compare import compare
from unicache_fsm.scheduler.report import ABORT_REASONS, SimReport, swa_note
from unicache_fsm.scheduler.requests import RequestRecord, TtftModel
from unicache_fsm.scheduler.svg_chart import Series, bar_chart, line_chart
from unicache_fsm.scheduler.timeline import Timeline

__all__ = ["CHART_IDS", "MAX_REQUEST_ROWS", "render_report", "write_report"]

CHART_IDS = ("chart-hit-rates-window", "chart-hit-rates")

#: the per-request table shows at most this many requests (the page stays light)
MAX_REQUEST_ROWS = 1000

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1100px;
       padding: 0 1rem; color: #222; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
table { border-collapse: collapse; font-size: 0.85rem; }
td, th { padding: 2px 10px 2px 0; vertical-align: top; text-align: left; }
table.summary td:first-child { font-weight: 600; white-space: nowrap; }
table.numbers td:not(:first-child), table.numbers th:not(:first-child) { text-align: right; }
table.numbers th { border-bottom: 1px solid #999; }
.scroll { max-height: 28rem; overflow-y: auto; }
svg.chart-svg { width: 100%; height: auto; display: block; margin: 0.5rem 0 1rem; }
svg.chart-svg text { font-size: 12px; fill: #333; }
svg.chart-svg text.title { font-size: 14px; font-weight: 600; }
svg.chart-svg .grid { stroke: #e5e5e5; } svg.chart-svg .axis { stroke: #777; }
.note { background: #fff8e1; border-left: 4px solid #e69f00; padding: 0.5rem 0.8rem; }
.diagram { border: 1px solid #ddd; margin: 0.5rem 0 1rem; }
.diagram svg { display: block; max-width: 100%; height: auto; }
.caption { color: #555; font-size: 0.85rem; }
"""


def _esc(value: object) -> str:
    return html.escape(str(value))


def _table(
    columns: Sequence[str], rows: Iterable[Sequence[object]], *, table_id: str, numbers: bool
) -> str:
    cls = "numbers" if numbers else "summary"
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_esc(v)}</td>" for v in row) + "</tr>\n" for row in rows)
    return (
        f'<table class="{cls}" id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>\n{body}</tbody></table>"
    )


def _hit_rate_charts(tl: Timeline, host: bool) -> list[str]:
    kinds = ["device", "host", "external"] if host else ["device", "external"]
    w = tl.window()
    windowed = tl.windowed_hit_rates(w)
    running = tl.hit_rates()
    return [
        line_chart(
            f"Hit rate per window of {w} step{'s' if w > 1 else ''} "
            "(share of the prompt tokens admitted in the window)",
            tl.window_ends(w),
            [Series(k, windowed[k]) for k in kinds],
            chart_id="chart-hit-rates-window",
            y_title="share of tokens",
            percent=True,
        ),
        line_chart(
            "Cumulative hit rate (share of all prompt tokens so far)",
            tl.steps,
            [Series(k, running[k]) for k in [*kinds, "recomputed"]],
            chart_id="chart-hit-rates",
            y_title="share of tokens",
            percent=True,
        ),
    ]


def _occupancy(tl: Timeline, pool: str) -> str:
    occ = tl.occupancy[pool]
    parts = [
        Series("free", [o.free for o in occ]),
        Series("tree-owned", [o.tree for o in occ]),
        Series("reserved by loads", [o.loads for o in occ]),
        Series("held by requests", [o.requests for o in occ]),
    ]
    if any(o.other for o in occ):
        parts.append(Series("other (leaked)", [o.other for o in occ]))
    parts = [p for p in parts if any(p.values)] or parts[:1]
    return line_chart(
        f"{pool} pool occupancy",
        tl.steps,
        parts,
        chart_id=f"chart-occupancy-{pool}",
        y_title="tokens",
        stacked=True,
    )


def _bars(tl: Timeline, title: str, chart_id: str, series: list[tuple[str, str]]) -> str | None:
    """Per-window stacked bars of the counters in `series` ((label, counter name)); None
    when none of them moved."""
    w = tl.window()
    drawn = [Series(label, tl.per_window(name, w)) for label, name in series]
    drawn = [s for s in drawn if any(s.values)]
    if not drawn:
        return None
    per = f"per window of {w} steps" if w > 1 else "per step"
    return bar_chart(f"{title} {per}", tl.window_ends(w), drawn, chart_id=chart_id, y_title="count")


def _loads_and_offloads(tl: Timeline) -> list[str]:
    loads = [("committed", "loads.committed")]
    loads += [
        (f"aborted: {ABORT_REASONS.get(c, c)}", f"loads.aborted.{c}")
        for c in tl.names("loads.aborted.")
    ]
    out = [
        _bars(tl, "Loads from the external store", "chart-loads", loads)
        or '<p class="caption" id="no-loads">No load from the external store in this run.</p>'
    ]
    out.append(
        _bars(
            tl,
            "Offloads ended",
            "chart-offloads",
            [("published", "offloads.published"), ("failed", "offloads.failed")],
        )
        or '<p class="caption" id="no-offloads">No offload ended in this run.</p>'
    )
    submitted, published, failed = (
        (tl.counters.get(f"offloads.{k}") or [0])[-1] for k in ("submitted", "published", "failed")
    )
    out.append(
        f'<p class="caption">{submitted} offloads submitted: {published} published, {failed} '
        f"failed, {submitted - published - failed} still in flight at the last step (a "
        "submitted offload ends published or failed, so it has no bar of its own).</p>"
    )
    return out


def _faults(tl: Timeline) -> str | None:
    series = [(f"injected: {k}", f"faults.injected.{k}") for k in tl.names("faults.injected.")]
    series += [
        (f"contained in {k}", f"faults.contained.{k}") for k in tl.names("faults.contained.")
    ]
    return _bars(tl, "Faults", "chart-faults", series) if series else None


def _request_rows(records: Sequence[RequestRecord], model: TtftModel) -> list[list[object]]:
    rows: list[list[object]] = []
    for r in records[:MAX_REQUEST_ROWS]:
        share = f"{r.hit / r.prompt_tokens:.0%}" if r.prompt_tokens else "-"
        rows.append(
            [
                r.rid,
                r.admitted_step,
                "-" if r.finished_step is None else r.finished_step,
                r.prompt_tokens,
                r.device,
                r.host,
                r.external,
                r.computed,
                share,
                r.saved,
                f"{model.seconds(r) * 1e3:.2f}",
                f"{model.cold_seconds(r) * 1e3:.2f}",
            ]
        )
    return rows


_REQUEST_COLUMNS = (
    "request",
    "admitted (step)",
    "finished (step)",
    "prompt tokens",
    "device",
    "host",
    "external store",
    "computed",
    "prefix hit",
    "tokens saved",
    "modelled TTFT (ms)",
    "cold TTFT (ms)",
)


def _requests(records: Sequence[RequestRecord], model: TtftModel) -> list[str]:
    shown = min(len(records), MAX_REQUEST_ROWS)
    more = f" (the first {shown} of {len(records)})" if shown < len(records) else ""
    return [
        f"<h2>Requests{more}</h2>",
        f'<p class="caption" id="ttft-model">Where each request\'s prompt tokens came from. '
        f"{_esc(model.describe())}. Cold TTFT: the whole prompt recomputed.</p>",
        '<div class="scroll">',
        _table(_REQUEST_COLUMNS, _request_rows(records, model), table_id="requests", numbers=True),
        "</div>",
    ]


def _compare(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    c = compare(baseline, current)
    out = ['<section id="compare">', "<h2>Compared with the baseline run</h2>"]
    if c.settings:
        out.append(
            _table(
                ("setting", "baseline", "this run"),
                c.settings,
                table_id="compare-settings",
                numbers=False,
            )
        )
    else:
        out.append('<p class="caption">Both runs have the same settings.</p>')
    rows = [(r.metric, r.baseline, r.current, r.delta) for r in c.rows]
    out.append(
        _table(
            ("figure", "baseline", "this run", "delta"),
            rows,
            table_id="compare-table",
            numbers=True,
        )
    )
    out.append("</section>")
    return out


def _svg_body(svg: str) -> str:
    """A Graphviz SVG document as an inline element (no XML prolog, DOCTYPE or
    comments); the page's CSS scales it down to the page width (``max-width``)."""
    start = svg.find("<svg")
    if start < 0:
        msg = "a diagram is not SVG text"
        raise ValueError(msg)
    return re.sub(r"<!--.*?-->", "", svg[start:], flags=re.S)


def render_report(
    *,
    report: SimReport,
    timeline: Timeline,
    diagrams: Mapping[str, str],
    requests: Iterable[RequestRecord] = (),
    summary: Mapping[str, Any] | None = None,
    baseline: Mapping[str, Any] | None = None,
    model: TtftModel | None = None,
) -> str:
    """The page's HTML text (see the module docstring). `summary` is this run's JSON
    summary (`compare.run_summary`), needed with `baseline`."""
    model = model or TtftModel()
    records = list(requests)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>unicache-fsm simulate report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>unicache-fsm simulate report</h1>",
        _table(("", "this run"), report.rows(), table_id="summary", numbers=False),
    ]
    note = swa_note(report.config)
    if baseline is not None:
        if summary is None:
            msg = "render_report: a baseline needs this run's summary to compare with"
            raise ValueError(msg)
        parts += _compare(baseline, summary)
    parts.append("<h2>Hit rates</h2>")
    if note is not None:
        parts.append(f'<p class="note" id="swa-note">{_esc(note)}</p>')
    parts += _hit_rate_charts(timeline, bool(report.config.get("host_tokens")))
    parts += _requests(records, model)
    parts.append("<h2>Pool occupancy (tokens)</h2>")
    parts += [_occupancy(timeline, pool) for pool in timeline.occupancy]
    parts.append("<h2>Loads and offloads</h2>")
    parts += _loads_and_offloads(timeline)
    faults = _faults(timeline)
    if faults is not None:
        parts += ["<h2>Faults</h2>", faults]
    parts += [
        "<h2>Machines</h2>",
        '<p class="caption">Each arrow is labelled with how often this run took it: taken '
        "arrows blue (wider when taken more), never-taken arrows red and dashed.</p>",
    ]
    for name, svg in diagrams.items():
        parts.append(f"<h3>{_esc(name)}</h3>")
        parts.append(f'<div class="diagram" id="diagram-{_esc(name)}">{_svg_body(svg)}</div>')
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    folder: str | Path,
    *,
    report: SimReport,
    timeline: Timeline,
    diagrams: Mapping[str, str],
    requests: Iterable[RequestRecord] = (),
    summary: Mapping[str, Any] | None = None,
    baseline: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``folder/index.html``; returns its path."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    page = out / "index.html"
    text = render_report(
        report=report,
        timeline=timeline,
        diagrams=diagrams,
        requests=requests,
        summary=summary,
        baseline=baseline,
    )
    page.write_text(text, encoding="utf-8")
    return page
