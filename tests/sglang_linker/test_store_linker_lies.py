"""`StoreLinker` inside SGLang 0.5.23's real cache, over stores that lie: nothing the store
says raises into SGLang's scheduler (with 0.5.23 that kills the worker), every completion
loop is bounded, and slots the store may still write stay fenced until its own
completion (or a reset) — a later request for the same slots recomputes instead — and
closed to it: a write that comes after SGLang took them back is refused.

The liar delegates to a real `MemoryStore` and lies about one thing at a time; it can
also hold its load batches back (`defer`), so the store writes only when the test says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from sglang_linker.engine import Engine
from unicache_fsm.integrations.sglang.buffers import SlotsRevokedError
from unicache_fsm.pools.transfer import PoolTransfer
from unicache_fsm.store import MemoryStore
from unicache_fsm.store.protocol import LoadBatchResult

TOKENS = list(range(1, 17))  # 4 pages of 4


class Runaway(BaseException):
    """Far more pops than any bounded caller makes (no fault containment catches it)."""


class Liar:
    """A `MemoryStore` that lies when told to.

    - `defer`: `start_loading` promises a batch id but the store starts it only at
      `run_loads()` (the store writes the slots later).
    - `extra_loads` / `extra_offloads`: completions reported beyond those it has; a pop
      with nothing there raises `IndexError`.
    - `answer`: what `pop_completed_load` answers instead of the real completion
      (a callable of the real one), consumed either way.
    - `lose_start`: `start_loading` starts the batch, then its answer is lost (raises).
    Past `runaway` pops a pop raises `Runaway`.
    """

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.defer = False
        self.extra_loads = 0
        self.extra_offloads = 0
        self.answer: Any = None
        self.lose_start = False
        self.pops = 0
        self.runaway = 1000
        self._queued: set[str] = set()
        self._deferred: set[str] = set()  # the promised batch's rids, not started yet
        self._promised = -1
        self._next = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _pop(self) -> None:
        self.pops += 1
        if self.pops > self.runaway:
            raise Runaway(self.pops)

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        queued = self.inner.load(rid, transfers)
        if queued:
            self._queued.add(rid)
        return queued

    def cancel_queued_load(self, rid: str) -> bool:
        if rid in self._deferred:
            return False  # in the promised batch: no longer queued
        cancelled = self.inner.cancel_queued_load(rid)
        self._queued.discard(rid)
        return cancelled

    def start_loading(self) -> int:
        if not self._queued:
            return -1
        if self.defer:
            self._deferred, self._queued = self._queued, set()
            self._promised, self._next = self._next, self._next + 1
            return self._promised
        self._queued.clear()
        batch = self.inner.start_loading()
        self._next = batch + 1
        if self.lose_start:
            raise ConnectionError("start_loading: the reply was lost")
        return batch

    def run_loads(self) -> None:
        """The promised batch starts and runs now (it writes its slots)."""
        assert self._deferred
        self._deferred = set()
        assert self.inner.start_loading() == self._promised
        self.inner.progress()

    def num_completed_loads(self) -> int:
        return self.inner.num_completed_loads() + self.extra_loads

    def pop_completed_load(self) -> LoadBatchResult:
        self._pop()
        if not self.inner.num_completed_loads():
            raise IndexError("pop from an empty deque")
        real = self.inner.pop_completed_load()
        return real if self.answer is None else self.answer(real)

    def num_completed_offloads(self) -> int:
        return self.inner.num_completed_offloads() + self.extra_offloads

    def pop_completed_offload(self) -> bool:
        self._pop()
        if not self.inner.num_completed_offloads():
            raise IndexError("pop from an empty deque")
        return self.inner.pop_completed_offload()


@pytest.fixture
def lied() -> tuple[Engine, Liar, Any]:
    store = Liar()
    engine = Engine(store)  # type: ignore[arg-type]
    wrote, _ = engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    yield engine, store, wrote
    engine.close()


def start_and_finish(engine: Engine, rid: str) -> tuple[Any, int, torch.Tensor | None, list[str]]:
    req, result = engine.match(TOKENS, rid)
    loaded, slots = engine.load_back(req, result)
    engine.cache.ready_to_load_host_cache()
    failed = engine.cache.finish_external_linker_loads([req])
    return req, loaded, slots, [r.rid for r in failed]


def test_an_overcounted_load_completion_fails_the_batch_and_fences_its_rows(
    lied: tuple[Engine, Liar, Any],
) -> None:
    """1. The store reports a completion it cannot pop while its batch has not run:
    nothing raises into SGLang, the batch fails (the request recomputes), and until the
    store's own completion no later load may use those rows."""
    engine, store, wrote = lied
    store.defer, store.extra_loads = True, 1
    _, loaded, slots, failed = start_and_finish(engine, "r1")
    store.defer, store.extra_loads = False, 0
    assert loaded == 16 and slots is not None and failed == ["r1"]
    linker = engine.store_linker
    assert linker.faults["pop_completed_load"] == 1 and linker.fenced() == 1
    engine.free(slots)  # SGLang frees an aborted request's slots
    req, result = engine.match(TOKENS, "r2")  # SGLang hands r2 the freed slots again
    again, again_slots = engine.load_back(req, result)
    assert (again, again_slots) == (0, None), "a load into rows the store may still write"
    store.run_loads()  # the store writes its batch now, and completes it
    _, loaded, slots3, failed = start_and_finish(engine, "r3")
    assert linker.fenced() == 0  # the batch's own completion released its rows
    assert loaded == 16 and slots3 is not None and failed == []
    assert engine.read(slots3).same(wrote)
    engine.free(slots3)


@pytest.mark.parametrize(
    "answer",
    [
        lambda real: None,
        lambda real: LoadBatchResult(real.batch, None, True),
        lambda real: LoadBatchResult(real.batch, real.rids, "true"),
        lambda real: LoadBatchResult(real.batch + 7, real.rids, True),
    ],
    ids=["none", "rids-none", "str-verdict", "unknown-batch"],
)
def test_a_malformed_completion_fails_the_batch(
    lied: tuple[Engine, Liar, Any], answer: Any
) -> None:
    """2. A completion that is not a well-formed one for the batch never lands it and
    never raises into SGLang: SGLang aborts the request, which recomputes."""
    engine, store, _ = lied
    store.answer = answer
    _, loaded, slots, failed = start_and_finish(engine, "r1")
    store.answer = None
    assert loaded == 16 and slots is not None and failed == ["r1"]
    assert engine.store_linker.faults.get("pop_completed_load", 0) >= 1
    engine.free(slots)


def test_an_absurd_load_count_pops_only_what_can_be_in_flight(
    lied: tuple[Engine, Liar, Any],
) -> None:
    """4. A count of 10**6 is not 10**6 pops: at most the batches in flight (and a small
    slack) are popped, the rest is a fault; the real batch still lands."""
    engine, store, wrote = lied
    store.extra_loads = 10**6 - 1
    store.pops = 0
    _, loaded, slots, failed = start_and_finish(engine, "r1")
    store.extra_loads = 0
    assert store.pops <= 3
    assert engine.store_linker.faults["num_completed_loads"] == 1
    assert loaded == 16 and slots is not None and failed == []
    assert engine.read(slots).same(wrote)
    engine.free(slots)


def test_reset_returns_when_the_count_never_drops_and_pops_fail(
    lied: tuple[Engine, Liar, Any],
) -> None:
    """4. The store's counts stay above zero and every pop fails: `reset` still returns
    (SGLang's `cache.reset()` calls it), having popped at most what could be in flight."""
    engine, store, _ = lied
    engine.compute(list(range(100, 116)))  # an offload in flight
    store.extra_loads = store.extra_offloads = 5
    store.pops = 0
    engine.cache.reset()
    store.extra_loads = store.extra_offloads = 0
    assert store.pops <= 10
    assert engine.pending_offloads() == 0
    assert engine.store_linker.in_flight() == {"loads": 0, "batches": 0, "verdicts": 0}


def test_an_overcounted_offload_completion_raises_nothing(lied: tuple[Engine, Liar, Any]) -> None:
    """1. An offload completion count the store cannot back: SGLang gets verdicts for
    the offloads that completed, nothing raises, nothing is popped beyond them."""
    engine, store, _ = lied
    engine.compute(list(range(100, 116)))
    store.extra_offloads = 3
    store.pops = 0
    engine.settle_offloads()
    store.extra_offloads = 0
    assert store.pops <= 1
    assert engine.store_linker.faults["num_completed_offloads"] >= 1


def test_a_lost_start_answer_fails_the_batch_and_fences_its_rows_until_a_reset(
    lied: tuple[Engine, Liar, Any],
) -> None:
    """1. `start_loading` started the batch, but its answer was lost: nothing raises into
    SGLang's `ready_to_load_host_cache`, the batch fails (SGLang aborts and recomputes),
    and its rows stay fenced — the store's completion names a batch never acknowledged —
    until a reset of the store returns."""
    engine, store, _ = lied
    store.lose_start = True
    _, loaded, slots, failed = start_and_finish(engine, "r1")
    store.lose_start = False
    assert loaded == 16 and slots is not None and failed == ["r1"]
    linker = engine.store_linker
    assert linker.faults["start_loading"] == 1 and linker.fenced() == 1
    engine.free(slots)
    req, result = engine.match(TOKENS, "r2")  # the same slots again: refused
    assert engine.load_back(req, result) == (0, None)
    engine.cache.reset()  # SGLang's reset: the store's reset returns, the fence goes
    assert linker.fenced() == 0


def test_a_failing_reset_raises_nothing_and_fences_what_was_in_flight(
    lied: tuple[Engine, Liar, Any],
) -> None:
    """4. The store's reset raises: SGLang's `cache.reset()` still returns, and the rows
    of the offload in flight stay fenced (the store may still read them) until a reset
    of the store returns."""
    engine, store, _ = lied
    engine.compute(list(range(100, 116)))  # an offload in flight

    def stuck() -> None:
        raise TimeoutError("reset: no answer")

    store.reset = stuck  # type: ignore[method-assign]
    engine.cache.reset()
    linker = engine.store_linker
    assert linker.faults["reset"] == 1 and linker.fenced() == 1
    del store.reset
    engine.cache.reset()
    assert linker.fenced() == 0


def test_a_late_write_never_lands_in_slots_sglang_reused(lied: tuple[Engine, Liar, Any]) -> None:
    """The store promised a batch and had not written it when SGLang finished it: the
    batch fails, SGLang frees its slots and hands them to a request that computes its
    own KV there. When the store finally writes the batch, the write is refused (the
    slots were closed to it before `finish` answered): the other request's KV stays."""
    engine, store, _ = lied
    store.defer, store.extra_loads = True, 1
    _, loaded, slots, failed = start_and_finish(engine, "r1")
    store.defer, store.extra_loads = False, 0
    assert loaded == 16 and slots is not None and failed == ["r1"]
    linker = engine.store_linker
    assert linker.open_pages()["write"] == 0  # closed before finish answered
    engine.free(slots)
    theirs, _ = engine.compute(list(range(200, 216)))  # SGLang reuses the freed slots
    reused = engine.computed_slots
    assert set(reused.tolist()) & set(slots.tolist()), "the test needs the slots reused"
    store.run_loads()  # the store writes its batch now
    assert isinstance(store.inner.last_error, SlotsRevokedError)
    assert engine.read(reused).same(theirs)  # the other request's KV, untouched
    store.inner.num_completed_loads()
    engine.poll()


def test_a_stuck_batch_fails_within_its_deadline(tmp_path: Any) -> None:
    """A store that never runs the batch it promised: the forward's waits return once
    the batch's deadline passed (never forever), the batch fails, SGLang aborts."""
    store = Liar()
    engine = Engine(store, load_timeout_s=0.2)  # type: ignore[arg-type]
    engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    store.defer = True
    loaded = engine.load([*TOKENS, 9], "r1")
    assert loaded.loaded == 16 and loaded.failed == ("r1",)
    assert engine.store_linker.fenced() == 1  # until the store's own completion
    engine.close()


def test_an_offload_whose_reply_was_lost_never_reads_slots_sglang_kept_no_lock_on(
    lied: tuple[Engine, Liar, Any],
) -> None:
    """The store queued an offload and its reply was lost: SGLang saw a refusal and keeps
    no lock on the node, so the node's slots may hold other KV by the time the store
    runs the offload. Its read is refused: nothing is filed under the node's keys."""
    engine, store, _ = lied
    real = store.inner.offload

    def lost(transfers: Sequence[PoolTransfer]) -> bool:
        real(transfers)
        raise ConnectionError("offload: the reply was lost")

    store.offload = lost  # type: ignore[method-assign]
    tokens = list(range(300, 316))
    engine.compute(tokens)
    del store.offload
    assert engine.pending_offloads() == 0  # SGLang took it as refused
    assert engine.store_linker.open_pages()["read"] == 0
    store.inner.progress()  # the store runs the offload it queued
    assert isinstance(store.inner.last_error, SlotsRevokedError)
    engine.evict_all()
    _, result = engine.match(tokens, "r9")
    assert result.host_hit_length == 0  # nothing stored under those keys
