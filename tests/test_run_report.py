"""`simulate --report DIR`: the page renders in headless Chromium with every chart."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from unicache_fsm.scheduler import SimConfig, Simulation
from unicache_fsm.scheduler.html_report import CHART_IDS

CHROMIUM = next(
    (p for n in ("chromium", "chromium-browser") if (p := shutil.which(n)) is not None), None
)
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _chromium() -> str:
    if CHROMIUM is None:
        if IN_CI:
            pytest.fail("no chromium binary, and CI=true: scripts/test.sh installs Debian's")
        pytest.skip("no chromium binary (apt-get install chromium); CI fails instead")
    return CHROMIUM


def _simulate(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "report"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "unicache_fsm",
            "simulate",
            "--requests",
            "80",
            *extra,
            "--report",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    page = out / "index.html"
    assert page.is_file()
    return page


def _dump(page: Path) -> tuple[str, str]:
    done = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
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


def test_the_report_renders_every_chart_without_console_errors(tmp_path: Path) -> None:
    page = _simulate(tmp_path, "--host-tokens", "4096", "--faults", "refuse_load=0.3,seed=2")
    text = page.read_text(encoding="utf-8")
    assert "http://" not in text.split("<script", 1)[0]  # nothing fetched: self-contained
    assert not re.search(r"<script[^>]+src=", text)
    dom, log = _dump(page)
    console = [line for line in log.splitlines() if "CONSOLE" in line]
    assert console == [], console
    errors = re.search(r'<pre id="page-errors">(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(1).strip() == ""
    charts = [*CHART_IDS, "chart-occupancy-FULL", "chart-occupancy-host"]
    for chart in charts:
        assert f'<div class="chart" id="{chart}">' in dom, chart
        plot = dom.find(f'id="{chart}-plot"')  # plotly draws its SVG inside this div
        assert plot >= 0 and 'class="main-svg"' in dom[plot : plot + 5000], chart
    drawn = re.search(r'data-charts="(\d+)"', dom)
    assert drawn is not None and int(drawn.group(1)) == len(charts)
    for machine in ("node_residency", "load_transaction", "offload"):
        start = dom.find(f'id="diagram-{machine}"')
        assert start >= 0 and "<svg" in dom[start : start + 500], machine
    assert "leaked slots" in dom


def test_a_broken_page_is_caught(tmp_path: Path) -> None:
    """The check above can fail: a script error shows up on the console and in the DOM."""
    sim = Simulation(SimConfig(requests=20), timeline=True)
    report = sim.run()
    from unicache_fsm.scheduler.html_report import render_report

    assert sim.timeline is not None
    text = render_report(report=report, timeline=sim.timeline, diagrams={})
    page = tmp_path / "broken.html"
    page.write_text(text.replace("</body>", "<script>noSuchFunction();</script></body>"))
    dom, log = _dump(page)
    assert any("noSuchFunction" in line for line in log.splitlines() if "CONSOLE" in line)
    assert "noSuchFunction" in dom
