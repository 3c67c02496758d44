"""Traces, coverage and trace conformance, from a real simulation run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unicache_fsm.cli import main
from unicache_fsm.fsm.conformance import check_trace, read_trace
from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.diagram import render_dot, render_mermaid
from unicache_fsm.fsm.loader import bundled_spec


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("trace")
    trace = folder / "run.jsonl"
    rc = main(["simulate", "--requests", "60", "--pool-tokens", "1536", "--trace", str(trace)])
    assert rc == 0
    return trace, trace.with_suffix(".coverage.json")


def test_a_recorded_trace_replays_cleanly(run: tuple[Path, Path]) -> None:
    result = check_trace(read_trace(run[0]))
    assert result.ok and result.records > 100 and result.models > 10


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r: {**r, "trigger": "commit"}, "no 'commit'"),
        (lambda r: {**r, "source": "aborted"}, "the model is in"),
        (lambda r: {**r, "machine": "nope"}, "unknown machine"),
        (lambda r: {k: v for k, v in r.items() if k != "dest"}, "lacks dest"),
    ],
)
def test_the_first_illegal_step_is_reported(run: tuple[Path, Path], mutate, reason) -> None:  # type: ignore[no-untyped-def]
    records = list(read_trace(run[0]))
    i = next(i for i, r in enumerate(records) if r["trigger"] == "submit")
    records[i] = mutate(records[i])
    records[i + 1] = {**records[i + 1], "trigger": "bogus"}  # a later error is not the first
    result = check_trace(records)
    assert result.violation is not None
    assert result.violation.record["seq"] == records[i]["seq"]
    assert reason in result.violation.reason
    assert f"seq {records[i]['seq']}" in result.violation.describe()


def test_check_trace_cli_exit_codes(run: tuple[Path, Path], tmp_path: Path) -> None:
    assert main(["check-trace", str(run[0])]) == 0
    bad = tmp_path / "bad.jsonl"
    records = list(read_trace(run[0]))
    records[3] = {**records[3], "source": "nowhere"}
    bad.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["check-trace", str(bad)]) == 1


def test_coverage_file_round_trips_and_marks_arrows(run: tuple[Path, Path]) -> None:
    cov = Coverage.load(run[1])
    spec = bundled_spec("offload")
    declared = cov.declared(spec)
    assert declared[(0, "queued")] > 0  # submit: queued -> pending
    text = render_mermaid(spec, coverage=declared)
    assert f"({declared[(0, 'queued')]}x)" in text
    missing = cov.missing(spec)
    for label in missing:
        trigger = label.split(":")[0]
        assert any(trigger in line and "never taken" in line for line in text.splitlines())
    dot = render_dot(
        bundled_spec("node_residency"), coverage=cov.declared(bundled_spec("node_residency"))
    )
    assert "style=dashed" in dot and "penwidth" in dot
    again = Coverage()
    again.merge(cov)
    assert again.counts == cov.counts
