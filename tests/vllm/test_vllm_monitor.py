"""`MonitoredManager` / `MonitoredWorker` around vLLM 0.33.0's own CPU manager: legal use
passes and leaves a trace `check-trace` accepts; every planted misuse (by the caller or
by the manager) is reported, before the wrapped manager is touched where it is the
caller's, and recorded instead of raised in record mode."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Collection
from pathlib import Path

import pytest
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingWorker,
    OffloadKey,
    ReqContext,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm_mutants import (
    DropsAfterLoadManager,
    EarlyHitManager,
    KeepsFailedManager,
    NameAnswerManager,
    RestoresStoredManager,
)

from unicache_fsm.integrations.protocol import MonitorConfigError
from unicache_fsm.integrations.vllm import (
    MonitoredManager,
    MonitoredWorker,
    OffloadingProtocol,
    OffloadingViolation,
    WrongAnswerError,
)
from unicache_fsm.integrations.vllm.driver import offload_keys
from unicache_fsm.integrations.vllm.machines import REMEMBERED, BlockState

K = offload_keys(6)


def _monitored(manager: CPUOffloadingManager | None = None, **kw: object) -> MonitoredManager:
    return MonitoredManager(manager or CPUOffloadingManager(num_chunks=2), **kw)  # type: ignore[arg-type]


def _begin(m: MonitoredManager, rid: str = "r") -> ReqContext:
    ctx = ReqContext(rid)
    with m.lock:
        m.on_new_request(ctx)
    return ctx


def _stored(m: MonitoredManager, ctx: ReqContext, keys: list[OffloadKey]) -> None:
    with m.lock:
        out = m.prepare_store(keys, ctx)
        assert out is not None
        m.complete_store(out.keys_to_store, ctx)


def test_legal_use_passes_and_its_trace_replays(tmp_path: Path) -> None:
    trace = tmp_path / "vllm.jsonl"
    m = _monitored(trace=trace)
    ctx = _begin(m)
    with m.lock:
        assert m.lookup(K[0], ctx) is LookupResult.MISS
        out = m.prepare_store([K[0], K[1]], ctx)
        assert out is not None and out.keys_to_store == [K[0], K[1]]
        assert m.lookup(K[0], ctx) is LookupResult.HIT_PENDING
        m.complete_store([K[0]], ctx)
        m.complete_store([K[1]], ctx, success=False)
        assert m.lookup(K[0], ctx) is LookupResult.HIT
        assert m.lookup(K[1], ctx) is LookupResult.MISS
        m.prepare_load([K[0]], ctx)
        m.prepare_load([K[0]], ctx)
    assert m.protocol.block_state(K[0]) is BlockState.LOADING
    with m.lock:
        m.complete_load([K[0]], ctx)
        m.complete_load([K[0]], ctx)
        out = m.prepare_store([K[2], K[3]], ctx)  # two chunks: K[0] is evicted for them
        assert out is not None and out.evicted_keys == [K[0]]
        m.on_request_finished(ctx)
        m.reset_cache()
    m.shutdown()
    assert m.protocol.violations == []
    taken = m.coverage().counts["vllm_block"]
    assert taken[("storing", "complete", "failed")] == 1
    assert taken[("loading", "unload", "loading")] == 1
    assert taken[("stored", "evict", "evicted")] == 1
    cli = [sys.executable, "-m", "unicache_fsm", "check-trace", str(trace)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_call_without_the_lock_is_refused_and_changes_nothing() -> None:
    m = _monitored()
    ctx = _begin(m)
    with pytest.raises(OffloadingViolation, match="call") as info:
        m.prepare_store([K[0]], ctx)
    assert info.value.state == "unlocked"
    with m.lock:
        assert m.lookup(K[0], ctx) is LookupResult.MISS  # the store never reached vLLM


def test_reentering_a_real_lock_is_reported_instead_of_deadlocking() -> None:
    class Locked(CPUOffloadingManager):
        real = threading.Lock()

        @property
        def lock(self) -> threading.Lock:  # type: ignore[override]
            return self.real

    m = _monitored(Locked(num_chunks=2))
    with m.lock, pytest.raises(OffloadingViolation, match="acquire"), m.lock:
        pass
    assert not Locked.real.locked()


def test_shutdown_under_the_lock_is_a_violation() -> None:
    m = _monitored()
    with m.lock, pytest.raises(OffloadingViolation, match="shutdown"):
        m.shutdown()


def test_loading_a_block_whose_store_has_not_completed_is_refused_before_vllm() -> None:
    m = _monitored()
    ctx = _begin(m)
    with m.lock:
        m.prepare_store([K[0]], ctx)
        with pytest.raises(OffloadingViolation, match="storing"):
            m.prepare_load([K[0]], ctx)  # vLLM itself would only assert
        assert m.lookup(K[0], ctx) is LookupResult.HIT_PENDING


def test_loading_a_key_never_stored_and_completing_a_load_never_prepared() -> None:
    m = _monitored()
    ctx = _begin(m)
    _stored(m, ctx, [K[0]])
    with m.lock:
        with pytest.raises(OffloadingViolation, match="absent"):
            m.prepare_load([K[0], K[5]], ctx)
        assert m.protocol.block_state(K[0]) is BlockState.STORED  # nothing half-applied
        with pytest.raises(OffloadingViolation, match="unload"):
            m.complete_load([K[0]], ctx)


def test_requests_must_be_announced_and_not_finished() -> None:
    m = _monitored()
    with m.lock, pytest.raises(OffloadingViolation, match="unseen"):
        m.lookup(K[0], ReqContext("stranger"))
    ctx = _begin(m)
    with m.lock:
        m.on_request_finished(ctx)
        with pytest.raises(OffloadingViolation, match="finished"):
            m.prepare_store([K[0]], ctx)
        m.complete_store([K[0]], ctx)  # a completion after the finish is allowed
    with m.lock, pytest.raises(OffloadingViolation, match=r"active|begin"):
        m.on_new_request(ReqContext("r"))


def _load_one_then_store(m: MonitoredManager) -> None:
    ctx = _begin(m)
    _stored(m, ctx, [K[0], K[1]])
    with m.lock:
        m.prepare_load([K[0]], ctx)  # K[1] stays idle: the manager lets the policy evict
        m.prepare_store([K[2]], ctx)


def test_a_policy_evicting_a_block_a_load_holds_is_caught() -> None:
    m = _monitored(
        CPUOffloadingManager(
            num_chunks=2,
            cache_policy="EvictsLoadingPolicy",
            cache_policy_module_path="vllm_mutants",
        )
    )
    with pytest.raises(OffloadingViolation, match=r"evict.*loading|loading.*evict"):
        _load_one_then_store(m)


def test_a_policy_evicting_a_block_being_stored_is_caught() -> None:
    m = _monitored(
        CPUOffloadingManager(
            num_chunks=2,
            cache_policy="EvictsStoringPolicy",
            cache_policy_module_path="vllm_mutants",
        )
    )
    ctx = _begin(m)
    with m.lock:
        m.prepare_store([K[1]], ctx)  # in flight, and first in FIFO order
    _stored(m, ctx, [K[0]])  # idle: the manager lets the policy evict
    with m.lock, pytest.raises(OffloadingViolation, match="storing"):
        m.prepare_store([K[2]], ctx)


def test_a_hit_while_the_store_is_in_flight_is_caught() -> None:
    m = _monitored(EarlyHitManager(num_chunks=2))
    ctx = _begin(m)
    with m.lock:
        m.prepare_store([K[0]], ctx)
        with pytest.raises(OffloadingViolation, match="found"):
            m.lookup(K[0], ctx)


def test_a_failed_store_that_stays_loadable_is_caught() -> None:
    m = _monitored(KeepsFailedManager(num_chunks=2))
    ctx = _begin(m)
    with m.lock:
        m.prepare_store([K[0]], ctx)
        m.complete_store([K[0]], ctx, success=False)
        with pytest.raises(OffloadingViolation, match="shared"):
            m.lookup(K[0], ctx)


def test_a_shared_store_may_show_blocks_stored_elsewhere() -> None:
    m = _monitored(KeepsFailedManager(num_chunks=2), shared=True)
    ctx = _begin(m)
    with m.lock:
        m.prepare_store([K[0]], ctx)
        m.complete_store([K[0]], ctx, success=False)
        assert m.lookup(K[0], ctx) is LookupResult.HIT  # another writer may have stored it
        m.prepare_load([K[0]], ctx)
    assert m.protocol.violations == []


def test_blocks_dropped_without_a_report_are_caught() -> None:
    m = _monitored(DropsAfterLoadManager(num_chunks=2))
    ctx = _begin(m)
    _stored(m, ctx, [K[0]])
    with m.lock:
        m.prepare_load([K[0]], ctx)
        m.complete_load([K[0]], ctx)
        with pytest.raises(OffloadingViolation, match="lose"):
            m.lookup(K[0], ctx)


def test_storing_a_block_already_stored_is_caught() -> None:
    m = _monitored(RestoresStoredManager(num_chunks=4))
    ctx = _begin(m)
    _stored(m, ctx, [K[0]])
    with m.lock, pytest.raises(OffloadingViolation, match="store"):
        m.prepare_store([K[0], K[1]], ctx)


def test_a_wrong_answer_type_is_caught() -> None:
    m = _monitored(NameAnswerManager(num_chunks=2))
    ctx = _begin(m)
    with m.lock, pytest.raises(WrongAnswerError, match="LookupResult"):
        m.lookup(K[0], ctx)


def test_stray_keys_in_keys_to_store_are_a_wrong_answer() -> None:
    class Stray(CPUOffloadingManager):
        def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext):  # type: ignore[no-untyped-def]
            out = super().prepare_store(keys, req_context)
            if out is not None:
                out.keys_to_store = [*out.keys_to_store, K[5]]
            return out

    m = _monitored(Stray(num_chunks=4))
    ctx = _begin(m)
    with m.lock, pytest.raises(WrongAnswerError, match="not offered"):
        m.prepare_store([K[0]], ctx)


def test_record_mode_keeps_every_violation_and_calls_through() -> None:
    m = _monitored(mode="record")
    ctx = ReqContext("never-announced")
    m.prepare_store([K[0]], ctx)  # no lock, unknown request: two violations, still called
    with m.lock:
        assert m.lookup(K[0], ctx) is LookupResult.HIT_PENDING
    kinds = [v.trigger for v in m.protocol.violations if isinstance(v, OffloadingViolation)]
    assert kinds[:2] == ["call", "submit"]


def test_a_bad_mode_is_a_typed_error() -> None:
    with pytest.raises(MonitorConfigError, match="mode"):
        OffloadingProtocol(mode="loud")


class _ScriptedWorker(OffloadingWorker):
    """A worker that answers what the test scripts (the real part is the monitor)."""

    def __init__(self) -> None:
        self.accept = True
        self.finished: list[TransferResult] = []
        self.waited: list[set[int]] = []

    def submit_store(self, job_id, src_spec, dst_spec):  # type: ignore[no-untyped-def]
        return self.accept

    def submit_load(self, job_id, src_spec, dst_spec, expedited=False):  # type: ignore[no-untyped-def]
        return self.accept

    def get_finished(self) -> list[TransferResult]:
        out, self.finished = self.finished, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        self.waited.append(job_ids)


def test_worker_jobs_are_reported_once_and_ids_not_reused_in_flight() -> None:
    inner = _ScriptedWorker()
    w = MonitoredWorker(inner, protocol=OffloadingProtocol())
    assert w.submit_store(1, None, None)
    with pytest.raises(OffloadingViolation, match="running"):
        w.submit_load(1, None, None)
    w.wait({1})
    with pytest.raises(WrongAnswerError, match="accepted"):
        w.wait({7})
    inner.finished = [TransferResult(1, True)]
    assert w.get_finished() == [TransferResult(1, True)]
    inner.finished = [TransferResult(1, True)]
    with pytest.raises(OffloadingViolation, match="finish"):
        w.get_finished()
    inner.accept = False
    assert not w.submit_store(2, None, None)
    inner.finished = [TransferResult(2, False)]
    with pytest.raises(OffloadingViolation):
        w.get_finished()  # a refused job never finishes


def test_a_manager_that_raises_leaves_the_books_as_they_were() -> None:
    class Broken(CPUOffloadingManager):
        def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext):  # type: ignore[no-untyped-def]
            raise ConnectionError("backing tier down")

    m = _monitored(Broken(num_chunks=2))
    ctx = _begin(m)
    with m.lock, pytest.raises(ConnectionError):
        m.prepare_store([K[0]], ctx)
    assert m.protocol.block_state(K[0]) is BlockState.ABSENT
    assert m.protocol.manager.state == "unlocked"  # the lock was released on the way out
    assert m.protocol.violations == []


def test_the_books_stay_bounded_over_a_long_run() -> None:
    p = OffloadingProtocol()
    for i in range(REMEMBERED + 10):
        p.acquire()
        p.begin_request(f"r{i}")
        p.finish_request(f"r{i}")
        p.release()
    assert p.requests == {} and len(p.finished) == REMEMBERED
    with pytest.raises(OffloadingViolation, match="finished"):
        p.submit(f"r{REMEMBERED + 9}", "lookup(...)")
