"""The run report's content (issue 34): charts only for what happened, a legend always,
windowed hit rates, per-request figures that add up, the SWA note, the compare mode,
and the SVG chart helper the page is drawn with."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from unicache_fsm.cli import main
from unicache_fsm.fsm.conformance import check_trace, read_trace
from unicache_fsm.scheduler import SimConfig, Simulation
from unicache_fsm.scheduler.compare import BaselineError, compare, read_baseline, run_summary
from unicache_fsm.scheduler.html_report import render_report
from unicache_fsm.scheduler.report import swa_note
from unicache_fsm.scheduler.requests import RequestRecord, TtftModel
from unicache_fsm.scheduler.svg_chart import (
    MAX_POINTS,
    ChartInputError,
    Series,
    bar_chart,
    line_chart,
    nice_ticks,
)
from unicache_fsm.scheduler.timeline import Timeline

SVG = "{http://www.w3.org/2000/svg}"


def _run(**kw: object) -> Simulation:
    sim = Simulation(SimConfig(requests=30, **kw), timeline=True)  # type: ignore[arg-type]
    sim.run()
    return sim


def _page(sim: Simulation, **kw: object) -> str:
    assert sim.timeline is not None
    return render_report(
        report=sim.report, timeline=sim.timeline, diagrams={}, requests=sim.requests, **kw
    )  # type: ignore[arg-type]


# -- the SVG chart helper ------------------------------------------------------------


def test_ticks_are_round_and_reach_the_top() -> None:
    assert nice_ticks(4096) == [0, 1000, 2000, 3000, 4000, 5000]
    assert nice_ticks(1.0) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(7) == [0, 2, 4, 6, 8]
    assert nice_ticks(0) == [0.0, 1.0] and nice_ticks(math.nan) == [0.0, 1.0]
    assert nice_ticks(2, whole=True) == [0, 1, 2]  # counts: no half ticks
    assert nice_ticks(2) == [0, 0.5, 1.0, 1.5, 2.0]


def test_a_line_chart_is_svg_with_a_legend_even_for_one_series() -> None:
    svg = line_chart("t", [1, 2, 3], [Series("only", [0.1, 0.5, 0.2])], chart_id="c", percent=True)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg" and root.get("viewBox") and root.get("width") is None
    legend = root.find(f"{SVG}g[@class='legend']")
    assert legend is not None and [t.text for t in legend.iter(f"{SVG}text")] == ["only"]
    (line,) = root.iter(f"{SVG}polyline")
    assert len(line.get("points", "").split()) == 3


def test_a_gap_breaks_the_line_and_a_lone_point_is_a_dot() -> None:
    svg = line_chart("t", [1, 2, 3, 4, 5], [Series("s", [0.2, 0.3, None, 0.4, None])], chart_id="c")
    root = ET.fromstring(svg)
    assert len(list(root.iter(f"{SVG}polyline"))) == 1
    assert len(list(root.iter(f"{SVG}circle"))) == 1


def test_a_long_line_is_sampled_down_to_its_last_point() -> None:
    n = 10 * MAX_POINTS + 7
    svg = line_chart("t", list(range(n)), [Series("s", [float(i) for i in range(n)])], chart_id="c")
    (line,) = ET.fromstring(svg).iter(f"{SVG}polyline")
    points = line.get("points", "").split()
    assert len(points) <= MAX_POINTS + 1
    last_x = float(points[-1].split(",")[0])
    assert last_x == pytest.approx(760 - 16, abs=0.2)  # the run's last step is drawn


def test_stacked_bars_leave_out_zeros_and_stack() -> None:
    svg = bar_chart("b", [1, 2], [Series("a", [1, 0]), Series("b", [2, 3])], chart_id="c")
    rects = list(ET.fromstring(svg).iter(f"{SVG}rect"))
    assert len(rects) == 3  # a's zero is not drawn
    heights = [float(r.get("height", 0)) for r in rects]
    assert heights[1] == pytest.approx(2 * heights[0], rel=0.02)  # b=2 on a=1 at step 1


@pytest.mark.parametrize(
    ("x", "series", "culprit"),
    [
        ([1, 2], [], "no series"),
        ([], [Series("a", [])], "no x values"),
        ([1, 2], [Series("a", [1])], "series 'a' has 1 values for 2"),
        ([1, 2], [Series("a", [1, math.inf])], "series 'a' holds inf"),
        ([1, 2], [Series("a", [1, -1])], "series 'a' holds -1"),
    ],
)
def test_bad_chart_input_names_the_chart_and_the_series(
    x: list[float], series: list[Series], culprit: str
) -> None:
    with pytest.raises(ChartInputError, match=f"chart 'T': {culprit}"):
        bar_chart("T", x, series, chart_id="c")


# -- windows, requests, the modelled time to first token -----------------------------


def test_windowed_hit_rates_are_per_window_not_cumulative() -> None:
    tl = Timeline(
        steps=[1, 2, 3, 4, 5],
        counters={"tokens.prompt": [10, 20, 20, 40, 50], "tokens.device": [0, 10, 10, 30, 30]},
    )
    rates = tl.windowed_hit_rates(2)
    assert tl.window_ends(2) == [2, 4, 5]
    assert rates["device"] == [0.5, 1.0, 0.0]  # 10/20, 20/20, 0/10
    assert tl.hit_rates()["device"][-1] == pytest.approx(0.6)  # cumulative: 30/50
    assert tl.per_window("tokens.prompt", 2) == [20, 20, 10]
    quiet = Timeline(steps=[1, 2], counters={"tokens.prompt": [5, 5], "tokens.device": [5, 5]})
    assert quiet.windowed_hit_rates(1)["device"] == [1.0, None]  # nothing admitted: no rate
    assert Timeline(steps=list(range(1, 131))).window(60) == 3


def test_the_ttft_model_is_the_sum_it_states() -> None:
    model = TtftModel(
        prefill_seconds_per_token=0.001,
        kv_bytes_per_token=1000,
        host_bytes_per_second=1e6,
        store_bytes_per_second=1e5,
    )
    r = RequestRecord("r", 1, 100, device=40, host=20, external=10, computed=30)
    assert model.seconds(r) == pytest.approx(0.030 + 0.020 + 0.100)
    assert model.cold_seconds(r) == pytest.approx(0.1)
    assert r.hit == 70 and r.saved == 70


def test_every_request_is_accounted_and_adds_up_to_the_report() -> None:
    sim = _run(host_tokens=2048, faults="refuse_load=0.3,seed=2")
    records = list(sim.requests)
    r = sim.report
    assert len(records) == r.requests_served == 30
    assert sum(x.prompt_tokens for x in records) == r.prompt_tokens
    assert sum(x.device for x in records) == r.device_hit_tokens
    assert sum(x.host for x in records) == r.host_hit_tokens
    assert sum(x.external for x in records) == r.loaded_tokens
    assert sum(x.computed for x in records) == r.computed_tokens
    for x in records:
        assert x.device + x.host + x.external + x.computed == x.prompt_tokens, x
        assert x.finished_step is not None and 1 <= x.admitted_step <= x.finished_step


# -- the page ------------------------------------------------------------------------


def test_charts_only_for_what_happened() -> None:
    page = _page(_run())
    assert 'id="chart-faults"' not in page and "<h2>Faults</h2>" not in page
    assert "other (leaked)" not in page  # nothing leaked: no empty series
    assert 'data-series="submitted"' not in page  # no bar identical to "published"
    assert "offloads submitted:" in page and 'data-series="published"' in page
    assert 'id="no-loads"' in page and 'id="chart-loads"' not in page  # nothing loaded
    assert 'data-series="host"' not in page  # no host tier
    assert 'id="swa-note"' not in page


def test_injected_faults_and_loads_get_their_charts() -> None:
    page = _page(_run(pool_tokens=1536, host_tokens=1024, faults="refuse_load=0.5,seed=1"))
    assert 'id="chart-faults"' in page and 'data-series="injected: refuse_load"' in page
    assert 'id="chart-loads"' in page and 'data-series="committed"' in page
    assert 'data-series="host"' in page


def test_swa_outcomes_are_explained_where_the_hit_rates_show(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = _run(workload="few_shot", swa_window=64)
    assert sim.report.device_hit_tokens == 0  # the outcome the note explains
    page = _page(sim)
    note = page.index('id="swa-note"')
    assert page.index("<h2>Hit rates</h2>") < note < page.index('id="chart-hit-rates-window"')
    assert "trailing window" in page and "--swa-checkpoint" in page
    assert swa_note({"swa_window": 64, "swa_checkpoint": 128}) is not None
    assert "every 128 tokens" in (swa_note({"swa_window": 64, "swa_checkpoint": 128}) or "")
    argv = ["simulate", "--requests", "10", "--workload", "few_shot", "--swa-window", "64"]
    assert main([*argv, "--no-warm-up"]) == 0
    assert "note: SWA is on (window 64 tokens)" in capsys.readouterr().out


# -- --json PATH, --baseline ---------------------------------------------------------


def test_json_path_writes_the_summary_and_a_baseline_compares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "base.json"
    assert main(["simulate", "--requests", "20", "--no-warm-up", "--json", str(base)]) == 0
    assert "device hit rate" in capsys.readouterr().out  # the table is still printed
    summary = json.loads(base.read_text())
    assert summary["requests_served"] == 20 and summary["summary_format"] == 1
    assert {"ttft_mean_ms", "ttft_p95_ms", "tokens_saved", "ttft_model"} <= summary.keys()
    argv = ["simulate", "--requests", "30", "--no-warm-up", "--baseline", str(base)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"compared with {base}" in out and "settings that differ" in out
    line = next(x for x in out.splitlines() if x.startswith("requests served") and "+10" in x)
    assert "20" in line and "30" in line and "+10 (+50%)" in line


def test_compare_rows_and_deltas() -> None:
    base = {
        "requests_served": 10,
        "prompt_tokens": 100,
        "device_hit_rate": 0.25,
        "external_hit_rate": 0.5,
        "config": {"swa_window": None, "workload": "few_shot"},
    }
    cur = {
        "requests_served": 10,
        "prompt_tokens": 120,
        "device_hit_rate": 0.5,
        "external_hit_rate": 0.0,
        "ttft_mean_ms": 2.0,
        "config": {"swa_window": 64, "workload": "few_shot"},
    }
    c = compare(base, cur)
    assert c.settings == (("swa_window", "off", "64"),)
    rows = {r.metric: r for r in c.rows}
    assert (rows["device hit rate"].baseline, rows["device hit rate"].delta) == (
        "25.0%",
        "+25.0 pp",
    )
    assert rows["prompt tokens"].delta == "+20 (+20%)"
    assert rows["modelled TTFT, mean"].baseline == "-" and rows["modelled TTFT, mean"].delta == "-"


@pytest.mark.parametrize(
    ("content", "culprit"),
    [
        (b"{not json", "is not JSON"),
        (b"\xff\xfe", "is not UTF-8"),
        (b"[1, 2]", "holds a JSON list"),
        (b'{"requests_served": 1}', "lacks prompt_tokens, device_hit_rate"),
        (
            b'{"requests_served": 1, "prompt_tokens": 1, "device_hit_rate": true, '
            b'"external_hit_rate": 0}',
            "device_hit_rate must be a finite number, got true",
        ),
        (
            b'{"requests_served": 1, "prompt_tokens": NaN, "device_hit_rate": 0, '
            b'"external_hit_rate": 0}',
            "prompt_tokens must be a finite number",
        ),
        (
            b'{"requests_served": 1, "prompt_tokens": 1, "device_hit_rate": 0, '
            b'"external_hit_rate": 0, "config": "x"}',
            "config must be an object",
        ),
    ],
)
def test_a_bad_baseline_is_one_line_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, culprit: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(BaselineError, match="--baseline"):
        read_baseline(bad)
    report = tmp_path / "report"
    argv = ["simulate", "--requests", "10", "--baseline", str(bad), "--report", str(report)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and culprit in err and "--baseline" in err, err
    assert not report.exists()  # refused before the run: nothing written


def test_a_summary_from_before_the_per_request_figures_still_compares(tmp_path: Path) -> None:
    sim = _run()
    old = sim.report.as_dict()  # what `simulate --json` printed before this change
    current = run_summary(sim.report, sim.requests)
    rows = {r.metric: r for r in compare(old, current).rows}
    assert rows["modelled TTFT, mean"].baseline == "-"
    assert rows["device hit rate"].delta == "+0.0 pp"
    page = _page(sim, summary=current, baseline=old)
    assert 'id="compare-table"' in page and "Both runs have the same settings" in page


# -- trace records carry their step and time -----------------------------------------


def test_trace_records_carry_step_and_time_and_old_traces_still_check(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    sim = Simulation(SimConfig(requests=30, pool_tokens=1536), trace_path=trace)
    sim.run()
    records = list(read_trace(trace))
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and steps[0] >= 1 and steps[-1] <= sim.report.steps
    times = [r["t"] for r in records]
    assert times == sorted(times) and all(isinstance(t, float) for t in times)
    old = [{k: v for k, v in r.items() if k not in ("t", "step")} for r in records]
    assert check_trace(old).violation is None and check_trace(records).violation is None
    # the per-request view from a trace: a load is named by its request, within its steps
    loads = [r for r in records if r["machine"] == "load_transaction"]
    assert loads, "the small pool makes requests load from the store"
    by_rid = sim.requests.records
    for r in loads:
        req = by_rid[r["model"]]
        assert req.finished_step is not None
        assert req.admitted_step <= r["step"] <= req.finished_step, (r, req)
