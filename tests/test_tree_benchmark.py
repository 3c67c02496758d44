"""The tree benchmark stays runnable: `main(["--quick"])` exits 0 and prints its tables.

No timing is asserted (benchmarks print ratios; the suite never fails on speed).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_tree.py"


def _load(name: str) -> Any:
    """benchmarks/bench_tree.py as a fresh module called `name`."""
    spec = importlib.util.spec_from_file_location(name, BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_tree_quick_runs(capsys: pytest.CaptureFixture[str]) -> None:
    module = _load("_bench_tree")
    assert module.main(["--quick", "--requests", "300"]) == 0
    out = capsys.readouterr().out
    assert "ops/s (tree calls)" in out and "absolute targets" in out
    verdicts = [line.split()[-1] for line in out.splitlines() if line.endswith(("met", "MISSED"))]
    assert len(verdicts) == 4 + 2  # P = 16 and 1, hashing on and off; eviction at 1k, 10k
    assert "CPU us/node" in out and "interleaved rounds" in out


def test_bench_tree_vs_sglang_says_skipped_without_sglang(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torch")
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is importable here: the comparison would run")
    module = _load("_bench_tree_vs")
    assert module.main(["--vs-sglang", "--quick"]) == 0
    assert "skipped: sglang is not installed" in capsys.readouterr().out


def test_bench_tree_workload_shape() -> None:
    module = _load("_bench_tree_w")
    keys = module.workload(500)
    assert len(keys) == 500 and {len(k) for k in keys} == {256 + 64}
    assert len({k[:256] for k in keys}) <= 100
    tails = [k[256:] for k in keys]
    assert len({t for tail in tails for t in tail}) == 500 * 64  # tails never repeat


def test_eviction_rounds_evict_then_refill_the_tree_to_its_size() -> None:
    module = _load("_bench_tree_e")
    bench = module.EvictionBench(300)
    tree, alloc = bench.tree, bench.alloc
    leaves = sorted(n.id for n in tree.nodes() if not n.children)
    nodes, free = tree.node_count, alloc.available_size()
    assert len(leaves) == 300 and nodes == 400  # 100 prompts, 300 leaves under them
    wall, cpu = bench.round(150)
    assert wall > 0 and cpu >= 0
    after = sorted(n.id for n in tree.nodes() if not n.children)
    assert len(after) == 300 and tree.node_count == nodes and alloc.available_size() == free
    assert len(set(leaves) - set(after)) == 150  # the 150 evicted leaves were replaced
    tree.check()
