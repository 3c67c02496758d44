"""Benchmarks stay runnable: each `main` runs in quick mode and exits 0.

No timing is asserted: benchmarks print ratios; tests only keep them from rotting.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> object:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"bench_{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "marker"),
    [("dispatch", "x hand"), ("pools", "vs plain copy"), ("build", "load+valid")],
)
def test_benchmark_runs_quick(name: str, marker: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = _load(name)
    assert module.main(["--quick"]) == 0  # type: ignore[attr-defined]
    assert marker in capsys.readouterr().out
