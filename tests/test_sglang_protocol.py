"""The machines of SGLang 0.5.23's linker protocol, driven by `ProtocolMonitor` from
call records (no SGLang needed: tests/sglang/ drives them from SGLang's real cache)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from unicache_fsm.fsm.conformance import check_trace, read_trace
from unicache_fsm.fsm.errors import IllegalTransitionError
from unicache_fsm.fsm.loader import bundled_spec
from unicache_fsm.integrations.protocol import (
    MonitorConfigError,
    ProtocolMonitor,
    ProtocolViolation,
)


def _load_round(m: ProtocolMonitor, rid: str, index: int, landed: bool = True) -> None:
    assert m.before_lookup(rid)
    assert m.before_load(rid)
    m.after_load(rid, True)
    assert m.before_start()
    m.after_start(index)
    assert m.before_finish(index)
    m.after_finish(index, landed)


def _offload_round(m: ProtocolMonitor, n: int, ok: bool = True) -> None:
    for _ in range(n):
        assert m.before_offload()
        m.after_offload(True, 2)
    assert m.before_count()
    m.after_count(n)
    for _ in range(n):
        assert m.before_pop()
        m.after_pop(ok)


def test_a_legal_run_ends_every_load_and_offload(tmp_path: Path) -> None:
    trace = tmp_path / "run.jsonl"
    m = ProtocolMonitor(trace=trace)
    _load_round(m, "r1", 0)
    _load_round(m, "r2", 1, landed=False)
    _offload_round(m, 2)
    assert m.before_load("r3")
    m.after_load("r3", False)  # refused
    assert m.before_load("r4")
    m.after_load("r4", True)
    assert m.before_cancel("r4")
    m.after_cancel("r4", True)
    assert m.before_close()
    m.after_close()
    m.close_trace()
    assert m.loads == [] and not m.offloads and not m.batches
    cov = m.coverage()
    assert cov.missing(bundled_spec("sglang_load")) == [
        "drop: queued -> dropped",
        "drop: started -> dropped",
    ]
    records = list(read_trace(trace))
    result = check_trace(records, lambda name: bundled_spec(name))
    assert result.violation is None, result.violation
    ends = {r["model"]: r["dest"] for r in records if r["machine"] == "sglang_load"}
    assert ends == {
        "load 'r1' #1": "landed",
        "load 'r2' #2": "failed",
        "load 'r3' #3": "refused",
        "load 'r4' #4": "cancelled",
    }


def test_finish_before_start_names_the_queued_load_and_its_history() -> None:
    m = ProtocolMonitor()
    m.before_load("r1")
    m.after_load("r1", True)
    with pytest.raises(ProtocolViolation) as info:
        m.before_finish(0)
    err = info.value
    assert isinstance(err, IllegalTransitionError)
    assert (err.machine, err.model, err.state, err.trigger) == (
        "sglang_load",
        "load 'r1' #1",
        "queued",
        "finish",
    )
    assert err.history == ("load('r1') -> True: answer -> queued",)
    assert "history of load 'r1' #1" in str(err)
    assert m.loads[0].state == "queued"  # nothing changed


def test_finish_of_an_index_never_started_is_refused_by_the_guard() -> None:
    m = ProtocolMonitor()
    with pytest.raises(ProtocolViolation) as info:
        m.before_finish(7)
    assert (info.value.machine, info.value.trigger, info.value.guard) == (
        "sglang_linker",
        "finish",
        "batch_started",
    )


def test_a_completion_popped_twice_is_caught() -> None:
    m = ProtocolMonitor()
    m.before_offload()
    m.after_offload(True, 1)
    m.before_offload()
    m.after_offload(True, 1)
    m.before_count()
    m.after_count(1)
    assert m.before_pop()
    m.after_pop(True)
    with pytest.raises(ProtocolViolation) as info:  # the second offload was not reported
        m.before_pop()
    assert (info.value.model, info.value.state) == ("offload #2", "pending")
    m.before_count()
    m.after_count(1)
    m.before_pop()
    m.after_pop(True)
    with pytest.raises(ProtocolViolation) as info:  # nothing left at all
        m.before_pop()
    assert (info.value.machine, info.value.guard) == ("sglang_linker", "completion_reported")


def test_a_call_after_close_is_illegal_and_record_mode_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = ProtocolMonitor()
    m.before_close()
    m.after_close()
    with pytest.raises(ProtocolViolation) as info:
        m.before_load("r1")
    assert (info.value.state, info.value.allowed) == ("closed", ())
    rec = ProtocolMonitor(mode="record")
    rec.before_close()
    rec.after_close()
    with caplog.at_level(logging.ERROR):
        assert rec.before_load("r1") is False
    assert len(rec.violations) == 1 and "cannot load" in caplog.text


def test_reset_drops_what_is_in_flight() -> None:
    m = ProtocolMonitor()
    m.before_load("r1")
    m.after_load("r1", True)
    m.before_start()
    m.after_start(0)
    m.before_offload()
    m.after_offload(True, 1)
    m.before_reset()
    m.after_reset()
    assert not m.loads and not m.offloads and not m.batches
    drops = {k[0]: n for k, n in m.counter.counts.items() if k[2] == "drop"}
    assert drops == {"sglang_load": 1, "sglang_offload": 1}
    with pytest.raises(ProtocolViolation):
        m.before_finish(0)  # the reset forgot the batch


def test_a_started_load_cannot_be_cancelled() -> None:
    m = ProtocolMonitor()
    m.before_load("r1")
    m.after_load("r1", True)
    m.before_start()
    m.after_start(3)
    m.before_cancel("r1")
    with pytest.raises(ProtocolViolation) as info:
        m.after_cancel("r1", True)
    assert (info.value.state, info.value.trigger) == ("started", "cancel")


def test_bad_mode_is_a_typed_error() -> None:
    with pytest.raises(MonitorConfigError) as info:
        ProtocolMonitor(mode="loud")
    assert info.value.argument == "mode"


def test_the_trace_is_json_lines_of_the_three_machines(tmp_path: Path) -> None:
    m = ProtocolMonitor(trace=tmp_path / "t.jsonl")
    _load_round(m, "a", 0)
    m.close_trace()
    machines = {json.loads(line)["machine"] for line in (tmp_path / "t.jsonl").open()}
    assert machines == {"sglang_linker", "sglang_load"}


def test_importing_the_sglang_integration_without_sglang_is_one_typed_error() -> None:
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is importable here (tests/sglang_linker covers it)")
    from unicache_fsm.integrations.errors import SglangUnavailableError

    with pytest.raises(SglangUnavailableError, match=r"needs SGLang 0\.5\.23") as info:
        import unicache_fsm.integrations.sglang  # noqa: F401
    assert isinstance(info.value, ImportError)


def test_every_declared_transition_of_the_three_machines_is_taken() -> None:
    m = ProtocolMonitor()
    _load_round(m, "landed", 0)
    _load_round(m, "failed", 1, landed=False)
    m.before_load("refused")
    m.after_load("refused", False)
    m.before_load("cancelled")
    m.after_load("cancelled", True)
    m.before_cancel("cancelled")
    m.after_cancel("cancelled", True)
    _offload_round(m, 1, ok=True)
    _offload_round(m, 1, ok=False)
    m.before_offload()
    m.after_offload(False, 1)
    for rid in ("started", "queued"):  # dropped by the reset below
        m.before_load(rid)
        m.after_load(rid, True)
        if rid == "started":
            m.before_start()
            m.after_start(2)
    m.before_offload()
    m.after_offload(True, 1)  # pending
    m.before_offload()
    m.after_offload(True, 1)
    m.before_count()
    m.after_count(1)  # one completed, one pending
    m.before_reset()
    m.after_reset()
    m.before_close()
    m.after_close()
    cov = m.coverage()
    for name in ("sglang_linker", "sglang_load", "sglang_offload"):
        assert cov.missing(bundled_spec(name)) == [], name


# -- answers the cache acts on (issue 31, item 6) ---------------------------------------


def _offloads(m: ProtocolMonitor, n: int) -> None:
    for _ in range(n):
        m.before_offload()
        m.after_offload(True, 1)


@pytest.mark.parametrize("count", [-1, 3, 1.0, "1", None, True])
def test_a_count_the_linker_cannot_back_is_a_violation_and_reports_nothing(
    count: object,
) -> None:
    m = ProtocolMonitor()
    _offloads(m, 2)
    assert m.before_count()
    with pytest.raises(ProtocolViolation) as info:
        m.after_count(count)
    assert (info.value.machine, info.value.trigger, info.value.guard) == (
        "sglang_linker",
        "count_answer",
        "count_backed",
    )
    assert f"num_completed_offloads() -> {count!r}" in str(info.value)
    assert [o.state for o in m.offloads] == ["pending", "pending"]  # nothing reported
    with pytest.raises(ProtocolViolation):
        m.before_pop()


def test_a_count_within_what_is_in_flight_reports_the_oldest() -> None:
    import numpy as np

    m = ProtocolMonitor()
    _offloads(m, 2)
    m.before_count()
    m.after_count(0)
    m.before_count()
    m.after_count(np.int64(2))  # an integer, whatever computed it
    assert [o.state for o in m.offloads] == ["completed", "completed"]


def test_a_start_that_reuses_an_index_in_flight_is_a_violation() -> None:
    m = ProtocolMonitor()
    for rid in ("r1", "r2"):
        m.before_load(rid)
        m.after_load(rid, True)
        m.before_start()
        if rid == "r1":
            m.after_start(4)
    with pytest.raises(ProtocolViolation) as info:
        m.after_start(4)  # batch 4 (r1) has not finished
    assert (info.value.trigger, info.value.guard) == ("start_answer", "index_free")
    assert "start_layer_wise_loading() -> 4" in str(info.value)
    assert [r.state for r in m.loads] == ["started", "queued"]  # r2 not merged into 4
    assert [r.rid for r in m.batches[4]] == ["r1"]
    # once batch 4 finished, its index may come back
    m.before_finish(4)
    m.after_finish(4, True)
    m.before_start()
    m.after_start(4)
    assert [r.rid for r in m.batches[4]] == ["r2"]


@pytest.mark.parametrize("index", ["0", None, 1.5, False])
def test_a_start_answering_no_int_is_a_violation(index: object) -> None:
    m = ProtocolMonitor()
    m.before_load("r1")
    m.after_load("r1", True)
    m.before_start()
    with pytest.raises(ProtocolViolation) as info:
        m.after_start(index)
    assert info.value.guard == "index_free"
    assert m.loads[0].state == "queued" and not m.batches


def test_a_cancel_answered_true_for_a_rid_never_queued_is_a_violation() -> None:
    m = ProtocolMonitor()
    assert m.before_cancel("ghost")
    with pytest.raises(ProtocolViolation) as info:
        m.after_cancel("ghost", True)
    assert (info.value.machine, info.value.state, info.value.trigger) == (
        "sglang_load",
        "requested",
        "cancel",
    )
    assert "cancel_queued_load('ghost') -> True" in str(info.value)
    # the same rid after its load was refused, or after it already finished
    m.before_load("r1")
    m.after_load("r1", False)
    m.before_cancel("r1")
    with pytest.raises(ProtocolViolation):
        m.after_cancel("r1", True)
    m.before_cancel("r1")
    m.after_cancel("r1", False)  # the honest answer is fine


@pytest.mark.parametrize("answer", ["False", "True", None, 1, 0])
def test_a_verdict_that_is_not_a_bool_is_a_violation_not_a_landing(answer: object) -> None:
    m = ProtocolMonitor()
    m.before_load("r1")
    m.after_load("r1", True)
    m.before_start()
    m.after_start(0)
    m.before_finish(0)
    with pytest.raises(ProtocolViolation) as info:
        m.after_finish(0, answer)
    assert (info.value.machine, info.value.state, info.value.trigger) == (
        "sglang_load",
        "started",
        "finish",
    )
    assert f"-> {answer!r}" in str(info.value)
    ends = {k[3] for k in m.counter.counts if k[0] == "sglang_load" and k[2] == "finish"}
    assert ends == set()  # neither landed nor failed
    assert not m.batches and not m.loads  # the batch ended whatever it answered


@pytest.mark.parametrize("answer", ["False", None, 1])
def test_every_other_answer_that_is_not_a_bool_is_a_violation(answer: object) -> None:
    m = ProtocolMonitor(mode="record")
    m.before_load("r1")
    m.after_load("r1", answer)
    m.before_load("r2")
    m.after_load("r2", True)
    m.before_cancel("r2")
    m.after_cancel("r2", answer)
    m.before_offload()
    m.after_offload(answer, 1)
    _offloads(m, 1)
    m.before_count()
    m.after_count(1)
    m.before_pop()
    m.after_pop(answer)
    triggers = [(v.machine, v.trigger, v.state) for v in m.violations]
    assert triggers == [
        ("sglang_load", "answer", "requested"),
        ("sglang_load", "cancel", "queued"),
        ("sglang_offload", "answer", "requested"),
        ("sglang_offload", "pop", "completed"),
    ]
    assert [r.rid for r in m.loads] == ["r2"]  # r1 never queued, r2 not cancelled


def test_record_mode_keeps_checking_after_a_bad_answer(caplog: pytest.LogCaptureFixture) -> None:
    m = ProtocolMonitor(mode="record")
    _offloads(m, 1)
    m.before_count()
    with caplog.at_level(logging.ERROR):
        m.after_count(-1)
    assert len(m.violations) == 1 and "count_backed" in caplog.text
    m.before_count()
    m.after_count(1)
    assert m.before_pop()
    m.after_pop(True)
    assert len(m.violations) == 1 and not m.offloads
