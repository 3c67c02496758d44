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
    assert console == [], console

    # the per-request table: one row per request, its sources add up to its prompt
    heads = answers["requestHeads"]
    col = {h: i for i, h in enumerate(heads)}
    rows = answers["requests"]
    assert len(rows) == 400
    for row in rows:
        prompt = int(row[col["prompt tokens"]])
        parts = ("device", "host", "external store", "computed")
        assert sum(int(row[col[p]]) for p in parts) == prompt, row
        assert int(row[col["tokens saved"]]) == prompt - int(row[col["computed"]])
        assert float(row[col["modelled TTFT (ms)"]]) <= float(row[col["cold TTFT (ms)"]])
    assert any(int(r[col["device"]]) > 0 for r in rows)  # multi_turn reuses earlier turns
    assert "ms" in answers["model"] and "KiB" in answers["model"]

    # the compare section: the baseline's own figures, and a delta per figure
    summary = json.loads(base.read_text())
    compare = {r[0]: r[1:] for r in answers["compare"]}
    assert compare["requests served"][:2] == ["40", "400"]
    assert compare["device hit rate"][0] == f"{summary['device_hit_rate']:.1%}"
    assert compare["requests served"][2] == "+360 (+900%)"
    settings = {r[0]: r[1:] for r in answers["settings"]}
    assert settings["host_tokens"] == ["4096", "off"] and settings["requests"] == ["40", "400"]

    # every chart drew a legend; every diagram fits the page width (no sideways scroll)
    ids = {c["id"] for c in answers["charts"]}
    assert {*CHART_IDS, "chart-occupancy-FULL", "chart-offloads"} <= ids
    assert "chart-faults" not in ids  # nothing injected: no Faults chart
    assert all(c["legend"] >= 1 and c["series"] >= 1 for c in answers["charts"])
    names = {d["id"] for d in answers["diagrams"]}
    assert {"diagram-node_residency", "diagram-load_transaction", "diagram-offload"} <= names
    for d in answers["diagrams"]:
        assert d["right"] <= answers["width"] and d["scroll"] <= d["client"], d
        assert d["width"] > 100 and d["height"] > 50, d
    assert answers["pageScroll"] <= answers["width"]


def test_a_broken_page_is_caught(tmp_path: Path) -> None:
    """The checks above can fail: a script error reaches the console, a wide diagram is
    measured wider than the page."""
    sim = Simulation(SimConfig(requests=20), timeline=True)
    report = sim.run()
    assert sim.timeline is not None
    wide = '<svg width="4000pt" height="100pt" viewBox="0 0 4000 100"><g/></svg>'
    text = render_report(report=report, timeline=sim.timeline, diagrams={"wide": wide})
    page = tmp_path / "broken.html"
    broken = text.replace("</body>", "<script>noSuchFunction();</script></body>")
    broken = broken.replace("max-width: 100%;", "")  # undo the fit
    page.write_text(broken)
    answers, console = _probe(page)
    assert any("noSuchFunction" in line for line in console)
    (diagram,) = answers["diagrams"]
    assert diagram["scroll"] > diagram["client"] or diagram["right"] > answers["width"]
