"""The test session's Hypothesis constant pool is frozen (see conftest.py): loading a
local module outside the package mid-run, as the benchmark and example tests do, leaves
what later derandomized hunts draw unchanged."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hypothesis.internal.conjecture import providers

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_store.py"


def test_a_module_loaded_mid_run_adds_no_constants() -> None:
    before = providers._get_local_constants()
    name = "_hunt_determinism_bench_store"
    spec = importlib.util.spec_from_file_location(name, BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # where Hypothesis looks for local modules
    try:
        spec.loader.exec_module(module)
        after = providers._get_local_constants()
    finally:
        del sys.modules[name]
    assert after is before and len(after) == len(before)
