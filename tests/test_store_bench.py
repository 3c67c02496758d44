"""The store benchmark stays runnable: `main(["--quick"])` exits 0 and prints its table.

No timing is asserted (the benchmark verifies the bytes it moved itself).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from unicache_fsm.testing.redis_server import available

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_store.py"


def test_bench_store_runs_quick(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("_bench_store", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    try:
        assert module.main(["--quick", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "offload (pool -> store)" in out and "vs gather/scatter" in out
    # the file and Redis stores, each against its raw client (Redis where it is installed)
    assert out.count("store / raw") == 1 + available()
    assert "load, not in page cache" in out
