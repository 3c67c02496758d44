"""`ContractMonitor` around the `StoreLinker` of SGLang 0.5.23's real cache: planted
misuses are caught with the load's or offload's history (raise mode stops the call
before the wrapped linker sees it; record mode logs and calls through), and a monitored
run's trace and coverage go through the CLI (`check-trace`, `diagram --coverage`).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_linker.engine import Engine
from unicache_fsm.fsm.errors import IllegalTransitionError
from unicache_fsm.fsm.loader import bundled_spec
from unicache_fsm.integrations.protocol import ProtocolViolation
from unicache_fsm.store import MemoryStore

TOKENS = list(range(1, 17))


def _stored_and_evicted(engine: Engine) -> None:
    engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()


def test_finish_before_start_is_caught_before_the_linker_sees_it() -> None:
    engine = Engine(MemoryStore())
    _stored_and_evicted(engine)
    req, result = engine.match(TOKENS, "r1")
    loaded, _slots = engine.load_back(req, result)
    assert loaded == 16
    # the scheduler forgets ready_to_load_host_cache(): SGLang finishes index -1
    with pytest.raises(ProtocolViolation) as info:
        engine.cache.finish_external_linker_loads([req])
    err = info.value
    assert isinstance(err, IllegalTransitionError)
    assert (err.machine, err.model, err.state, err.trigger) == (
        "sglang_load",
        "load 'r1' #1",
        "queued",
        "finish",
    )
    assert err.call == "finish_layer_wise_loading(-1)"
    assert err.history == ("load('r1') -> True: answer -> queued",)
    assert engine.store_linker.in_flight()["loads"] == 1  # StoreLinker was not called
    engine.close()


def test_a_completion_popped_twice_is_caught() -> None:
    engine = Engine(MemoryStore())
    engine.compute(TOKENS)
    wrapper = engine.cache.linker
    assert wrapper.num_completed_offloads() == 1
    assert wrapper.take_completed_offloads(1) == [True]
    with pytest.raises(ProtocolViolation) as info:  # popped again before the commit
        wrapper.take_completed_offloads(1)
    assert (info.value.machine, info.value.guard) == ("sglang_linker", "completion_reported")
    assert "pop_completed_offload(): pop -> open" in info.value.history
    engine.close()


def test_a_load_after_close_is_caught_and_sglang_frees_its_slots() -> None:
    engine = Engine(MemoryStore())
    _stored_and_evicted(engine)
    req, result = engine.match(TOKENS, "r1")  # the hit marker survives close
    free_before = engine.allocator.available_size()
    engine.cache.linker.close()
    with pytest.raises(ProtocolViolation) as info:
        engine.load_back(req, result)
    assert (info.value.state, info.value.trigger) == ("closed", "load")
    assert info.value.history[-1] == "close(): close -> closed"
    assert engine.allocator.available_size() == free_before  # SGLang aborted: slots freed


def test_record_mode_logs_the_misuse_and_calls_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = Engine(MemoryStore(), mode="record")
    engine.compute(TOKENS)
    wrapper = engine.cache.linker
    wrapper.num_completed_offloads()
    wrapper.take_completed_offloads(1)
    logging.disable(logging.NOTSET)
    try:
        with caplog.at_level(logging.ERROR, logger="unicache_fsm.integrations.protocol"):
            # called through: StoreLinker has no completion to give, and raises nothing
            # into SGLang's scheduler (it answers failed)
            assert wrapper.take_completed_offloads(1) == [False]
    finally:
        logging.disable(logging.WARNING)
    assert engine.monitor is not None and len(engine.monitor.monitor.violations) == 1
    assert "protocol violation" in caplog.text and "cannot pop" in caplog.text


def test_a_monitored_run_passes_check_trace_and_draws_its_coverage(tmp_path: Path) -> None:
    trace = tmp_path / "sglang.jsonl"
    engine = Engine(MemoryStore(), swa_window=8, trace=trace)
    _stored_and_evicted(engine)
    loaded = engine.load([*TOKENS, 5], "r1")
    engine.insert_loaded(loaded)
    engine.settle_offloads()
    engine.close()
    assert engine.monitor is not None
    coverage = tmp_path / "sglang.coverage.json"
    engine.monitor.save_coverage(coverage)

    cli = [sys.executable, "-m", "unicache_fsm"]
    checked = subprocess.run([*cli, "check-trace", str(trace)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    drawn = subprocess.run(
        [*cli, "diagram", "sglang_load", "--coverage", str(coverage)],
        capture_output=True,
        text=True,
    )
    assert drawn.returncode == 0, drawn.stderr
    # the arrows SGLang took carry their counts, the others are marked never taken
    assert "queued --> started : start (1x)" in drawn.stdout
    assert "started --> landed : finish [accepted] (1x)" in drawn.stdout
    assert "queued --> cancelled : cancel (never taken)" in drawn.stdout
    assert engine.monitor.coverage().missing(bundled_spec("sglang_load")) == [
        "answer: requested -> refused",
        "finish: started -> failed",
        "cancel: queued -> cancelled",
        "drop: queued -> dropped",
        "drop: started -> dropped",
    ]
