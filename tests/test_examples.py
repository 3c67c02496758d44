"""Every example's `main()` runs and succeeds, so the examples cannot rot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from redis_helpers import REDIS_SKIP

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _main(name: str) -> object:
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_scheduler_loop_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main("scheduler_loop")() == 0  # type: ignore[operator]
    assert "KV identical: True" in capsys.readouterr().out


@REDIS_SKIP
def test_shared_store_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main("shared_store")(["--requests", "60"]) == 0  # type: ignore[operator]
    out = capsys.readouterr().out
    assert out.count("  shared: the second process loaded") == 2  # file and Redis
    assert "NOT shared" not in out
