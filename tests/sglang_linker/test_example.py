"""examples/sglang_external_cache.py: two SGLang caches share one real Redis server."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from unicache_fsm.fsm.conformance import check_trace, read_trace
from unicache_fsm.fsm.loader import bundled_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sglang_external_cache.py"


def test_the_second_instance_loads_the_first_ones_kv_from_redis(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("_example_sglang", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trace = tmp_path / "second.jsonl"
    assert module.main(["--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "32 in Redis; loaded 32; failed 0; KV bytes equal to instance 1's: True" in out
    assert check_trace(list(read_trace(trace)), bundled_spec).violation is None
