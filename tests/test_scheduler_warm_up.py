"""`scheduler.warm_up`: the throwaway run `simulate` serves before its clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unicache_fsm.cli import main
from unicache_fsm.scheduler import SimConfig, SimConfigError, Simulation, warm_up

#: report fields that are timings (they differ from run to run)
TIMINGS = {"wall_seconds", "requests_per_second", "fsm_seconds", "fsm_share"}


def _untimed(report: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in report.items() if k not in TIMINGS}


def _report(config: SimConfig) -> dict[str, object]:
    return _untimed(Simulation(config).run().as_dict())


def test_a_run_after_a_warm_up_reports_the_same() -> None:
    config = SimConfig(requests=40, faults="refuse_load=0.3,fail_batch_midway=every:3,seed=2")
    before = _report(config)
    warm_up(config)
    assert _report(config) == before


def test_the_warm_up_never_touches_the_configured_store(tmp_path: Path) -> None:
    folder = tmp_path / "pages"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    warm_up(SimConfig(requests=20, store=f"file:{folder}"))
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


def test_a_bad_config_is_refused_by_the_warm_up_too() -> None:
    with pytest.raises(SimConfigError, match="--page-size"):
        warm_up(SimConfig(page_size=12))


def test_the_cli_reports_the_same_with_or_without_the_warm_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reports = []
    for extra in ([], ["--no-warm-up"]):
        assert main(["simulate", "--requests", "30", "--json", *extra]) == 0
        reports.append(_untimed(json.loads(capsys.readouterr().out)))
    assert reports[0] == reports[1]
    assert reports[0]["requests_served"] == 30
