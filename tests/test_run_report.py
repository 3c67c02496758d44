"""`simulate --report DIR`: the page opens in headless Chromium with no console error; its
per-request table, compare section and diagrams are read through the browser's DOM."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unicache_fsm.scheduler import SimConfig, Simulation
from unicache_fsm.scheduler.compare import run_summary
from unicache_fsm.scheduler.html_report import CHART_IDS, render_report

CHROMIUM = next(
    (p for n in ("chromium", "chromium-browser") if (p := shutil.which(n)) is not None), None
)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: the page weight the issue allows at simulate's defaults
MAX_PAGE_BYTES = 1_500_000

# Run inside Chromium after the page loaded: real DOM queries, their answers written
# into the page as JSON (read back from --dump-dom).
_PROBE = """
<script>
window.addEventListener("load", function () {
  function rows(sel) {
    return Array.prototype.map.call(document.querySelectorAll(sel + " tbody tr"),
      function (tr) { return Array.prototype.map.call(tr.cells, function (td) {
        return td.textContent; }); });
  }
  function heads(sel) {
    return Array.prototype.map.call(document.querySelectorAll(sel + " thead th"),
      function (th) { return th.textContent; });
  }
  var width = document.documentElement.clientWidth;
  var diagrams = Array.prototype.map.call(document.querySelectorAll("div.diagram"),
    function (d) { var box = d.querySelector("svg").getBoundingClientRect();
      return {id: d.id, right: box.right, width: box.width, height: box.height,
              scroll: d.scrollWidth, client: d.clientWidth}; });
  var charts = Array.prototype.map.call(document.querySelectorAll("svg.chart-svg"),
    function (s) { return {id: s.id, width: s.getBoundingClientRect().width,
      legend: s.querySelectorAll("g.legend text").length,
      series: s.querySelectorAll(".series").length}; });
  var out = {width: width, pageScroll: document.documentElement.scrollWidth,
    requestHeads: heads("#requests"), requests: rows("#requests"),
    compare: rows("#compare-table"), settings: rows("#compare-settings"),
    model: (document.getElementById("ttft-model") || {}).textContent || "",
    diagrams: diagrams, charts: charts};
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def _chromium() -> str:
    if CHROMIUM is None:
        if IN_CI:
            pytest.fail("no chromium binary, and CI=true: scripts/test.sh installs Debian's")
        pytest.skip("no chromium binary (apt-get install chromium); CI fails instead")
    return CHROMIUM


def _simulate(*argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "unicache_fsm", "simulate", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def _dump(page: Path) -> tuple[str, str]:
    done = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1200,900",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=15000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def _probe(page: Path) -> tuple[dict[str, Any], list[str]]:
    """The probe's answers about `page` (run on a copy with the probe added), and the
    browser's console lines."""
    probed = page.with_name("probed.html")
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"))
    dom, log = _dump(probed)
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found is not None, dom[-2000:]
    answers = json.loads(
        found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )
    return answers, [line for line in log.splitlines() if "CONSOLE" in line]


def _problems(answers: dict[str, Any], console: list[str], baseline: dict[str, Any]) -> list[str]:
    """What is wrong with a probed page: console lines, a request whose sources do not
    add up, a compare row that does not show the baseline's own figure, a chart without
    a legend, a diagram or page wider than the window."""
    out = [f"console: {line}" for line in console]
    col = {h: i for i, h in enumerate(answers["requestHeads"])}
    for row in answers["requests"]:
        prompt = int(row[col["prompt tokens"]])
        parts = ("device", "host", "external store", "computed")
        if sum(int(row[col[p]]) for p in parts) != prompt:
            out.append(f"request {row[0]}: sources do not add up to {prompt}")
        if int(row[col["tokens saved"]]) != prompt - int(row[col["computed"]]):
            out.append(f"request {row[0]}: tokens saved is not prompt - computed")
        if float(row[col["modelled TTFT (ms)"]]) > float(row[col["cold TTFT (ms)"]]):
            out.append(f"request {row[0]}: modelled TTFT above the cold one")
    compare = {r[0]: r[1:] for r in answers["compare"]}
    shown = {
        "requests served": f"{baseline['requests_served']:,}",
        "device hit rate": f"{baseline['device_hit_rate']:.1%}",
        "external hit rate": f"{baseline['external_hit_rate']:.1%}",
    }
    for metric, text in shown.items():
        if compare.get(metric, [None])[0] != text:
            out.append(f"compare: {metric} baseline is not {text}")
    out += [f"chart {c['id']}: no legend" for c in answers["charts"] if c["legend"] < 1]
    for d in answers["diagrams"]:
        if d["right"] > answers["width"] or d["scroll"] > d["client"]:
            out.append(f"{d['id']}: wider than the page")
    if answers["pageScroll"] > answers["width"]:
        out.append("page: scrolls sideways")
    return out


def test_the_default_report_opens_answers_and_stays_light(tmp_path: Path) -> None:
    _chromium()
    base = tmp_path / "base.json"
    _simulate("--requests", "40", "--host-tokens", "4096", "--json", str(base))
    out = tmp_path / "report"
    _simulate("--baseline", str(base), "--report", str(out))  # every other setting default
    page = out / "index.html"
    text = page.read_text(encoding="utf-8")
    assert len(page.read_bytes()) < MAX_PAGE_BYTES
    assert "<script" not in text  # nothing to run
    assert not re.search(r'(?:src|href)="(?:https?:)?//', text)  # nothing fetched: offline
    answers, console = _probe(page)
    summary = json.loads(base.read_text())
    assert _problems(answers, console, summary) == []

    # the per-request table: one row per request (multi_turn reuses earlier turns)
    col = {h: i for i, h in enumerate(answers["requestHeads"])}
    assert len(answers["requests"]) == 400
    assert any(int(r[col["device"]]) > 0 for r in answers["requests"])
    assert "ms" in answers["model"] and "KiB" in answers["model"]
    # the compare section: a delta per figure, the settings that differ
    compare = {r[0]: r[1:] for r in answers["compare"]}
    assert compare["requests served"] == ["40", "400", "+360 (+900%)"]
    settings = {r[0]: r[1:] for r in answers["settings"]}
    assert settings["host_tokens"] == ["4096", "off"] and settings["requests"] == ["40", "400"]
    # charts only for what happened; the three machines drawn at a readable size
    ids = {c["id"] for c in answers["charts"]}
    assert {*CHART_IDS, "chart-occupancy-FULL", "chart-offloads"} <= ids
    assert "chart-faults" not in ids  # nothing injected: no Faults chart
    names = {d["id"] for d in answers["diagrams"]}
    assert {"diagram-node_residency", "diagram-load_transaction", "diagram-offload"} <= names
    assert all(d["width"] > 100 and d["height"] > 50 for d in answers["diagrams"])


def test_planted_page_defects_are_each_caught(tmp_path: Path) -> None:
    """The checks above can fail: a page with four planted defects (a script error, a
    diagram given back its fixed width, a request whose computed count is off, a
    baseline column showing the wrong run) is reported for each."""
    _chromium()
    sim = Simulation(SimConfig(requests=20), timeline=True)
    report = sim.run()
    assert sim.timeline is not None
    summary = run_summary(report, sim.requests)
    baseline = summary | {"requests_served": 7}
    wide = '<svg width="4000pt" height="100pt" viewBox="0 0 4000 100"><g/></svg>'
    text = render_report(
        report=report,
        timeline=sim.timeline,
        diagrams={"wide": wide},
        requests=sim.requests,
        summary=summary,
        baseline=baseline,
    )
    clean, console = _probe_text(tmp_path, text)
    assert _problems(clean, console, baseline) == []
    broken = text.replace("</body>", "<script>noSuchFunction();</script></body>")
    broken = broken.replace("max-width: 100%;", "")  # the diagram keeps its 4000pt
    first = next(iter(sim.requests))
    row = f"<tr><td>{first.rid}</td>"
    cells = broken[broken.index(row) :].split("</tr>", 1)[0]
    tds = cells.split("</td><td>")
    tds[7] = str(int(tds[7]) + 1)  # computed, off by one
    broken = broken.replace(cells, "</td><td>".join(tds), 1)
    broken = broken.replace(
        "<tr><td>requests served</td><td>7</td>", "<tr><td>requests served</td><td>20</td>"
    )
    answers, console = _probe_text(tmp_path, broken)
    found = _problems(answers, console, baseline)
    assert any("noSuchFunction" in p for p in found), found
    assert "diagram-wide: wider than the page" in found, found
    assert f"request {first.rid}: sources do not add up to {first.prompt_tokens}" in found, found
    assert "compare: requests served baseline is not 7" in found, found


def _probe_text(tmp_path: Path, text: str) -> tuple[dict[str, Any], list[str]]:
    page = tmp_path / "page.html"
    page.write_text(text, encoding="utf-8")
    return _probe(page)
