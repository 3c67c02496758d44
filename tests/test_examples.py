"""Every example's `main()` runs and succeeds, so the examples cannot rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from redis_helpers import REDIS_SKIP
from unicache_fsm import cli
from unicache_fsm.fsm.conformance import read_trace

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


def test_tcp_example_trace_checks_and_a_teleport_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    assert _main("tcp")(["--trace", str(trace)]) == 0  # type: ignore[operator]
    out = capsys.readouterr().out
    assert "guard 'ack_matches' rejected it" in out
    assert "server   done" in out and "client   done" in out
    spec = str(EXAMPLES / "tcp.toml")
    assert cli.main(["check-trace", "--spec", spec, str(trace)]) == 0
    assert "every step is legal" in capsys.readouterr().out
    # forge: the server, live in syn_received, is "initialized" straight into established
    records = list(read_trace(trace))
    i = next(i for i, r in enumerate(records) if r["dest"] == "syn_received")
    forged = {**records[i], "source": "", "trigger": "<init>", "dest": "established"}
    records.insert(i + 1, forged)
    for seq, record in enumerate(records, start=1):
        record["seq"] = seq
    bad = tmp_path / "teleport.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert cli.main(["check-trace", "--spec", spec, str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"illegal step at record {i + 2}, seq {i + 2}" in out
    assert "'server' initialized again while live in 'syn_received'" in out


def test_order_example_runs_on_both_executors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "order.jsonl"
    assert _main("order")(["--trace", str(trace)]) == 0  # type: ignore[operator]
    out = capsys.readouterr().out
    assert "executors agree: True" in out
    assert "refused: guard 'payment_captured'" in out and "refund 99" in out
    assert cli.main(["check-trace", "--spec", str(EXAMPLES), str(trace)]) == 0
