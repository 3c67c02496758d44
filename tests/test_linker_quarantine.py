"""Stores that lie: nothing a store says frees slots it may still touch; every call returns.

Each store here is a small, independent liar over the real `MemoryStore` (which runs its
loads and offloads only when `progress()` is called, so a test decides when the store
writes or reads device pages). The lie is the one a test names: a completion count the
store cannot back, a malformed completion, a lost `start_loading` answer, a batch id it
never started. The linker must end the requests involved (they recompute) and hold the
slots the store may still touch in its quarantine (`ExternalLinker.quarantine`, the
fourth term of slot conservation in the audit) until the store's own completion for that
job is popped, or a reset of the store returns.

"Another owner" below takes every free slot and fills it with a sentinel: if the linker
freed slots the store still writes, the store's late write lands in another owner's KV.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from unicache_fsm.store.errors import StoreProtocolError
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import LoadBatchResult
from unicache_fsm.testing.system import System, kv_bytes

P = 4
SENTINEL = -7.0


class Runaway(BaseException):
    """A store call made far more often than any bounded caller makes it (a
    `BaseException`, so no fault containment swallows it: the runaway loop stops)."""


class Liar(MemoryStore):
    """A memory store with one lie switched on at a time (all off: an honest store).

    - `extra_loads` / `extra_offloads`: completions reported beyond those it has; a pop
      with none there raises (`IndexError`), like a store that miscounted.
    - `lose_start`: `start_loading` starts the batch, then its answer is lost (raises).
    - `phantom`: `start_loading` with nothing queued answers a fresh batch id anyway.
    - `rids`: the completion names these instead of the batch's rids (e.g. None).
    Every pop is counted; past `runaway` pops a call raises `Runaway`.
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.extra_loads = 0
        self.extra_offloads = 0
        self.lose_start = False
        self.phantom = False
        self.rids: Any = "real"
        self.pops = 0
        self.runaway = 1000
        self._phantoms = 10_000

    def _count_pop(self) -> None:
        self.pops += 1
        if self.pops > self.runaway:
            raise Runaway(self.pops)

    def start_loading(self) -> int:
        batch = super().start_loading()
        if self.lose_start:
            raise ConnectionError("start_loading: the reply was lost")
        if batch == -1 and self.phantom:
            self._phantoms += 1
            return self._phantoms
        return batch

    def num_completed_loads(self) -> int:
        return super().num_completed_loads() + self.extra_loads

    def pop_completed_load(self) -> LoadBatchResult:
        self._count_pop()
        if not super().num_completed_loads():
            raise IndexError("pop from an empty deque")
        result = super().pop_completed_load()
        if self.rids != "real":
            return LoadBatchResult(result.batch, self.rids, result.success)
        return result

    def num_completed_offloads(self) -> int:
        return super().num_completed_offloads() + self.extra_offloads

    def pop_completed_offload(self) -> bool:
        self._count_pop()
        if not super().num_completed_offloads():
            raise IndexError("pop from an empty deque")
        return super().pop_completed_offload()


def key_of(pages: int, base: int = 100) -> tuple[int, ...]:
    return tuple(range(base, base + pages * P))


def built(**kw: Any) -> tuple[System, Liar]:
    """A system over a `Liar`; the linker does not reset an idle store by itself (the
    tests watch the quarantine wait for the store's own signal) unless asked to."""
    store = Liar()
    kw.setdefault("reset_when_idle", False)
    return System.build(P, store_factory=lambda: store, **kw), store


def stored_then_evicted(s: System, key: tuple[int, ...]) -> None:
    s.compute("A", key)
    assert all(n.external_cache_stored for n in s.tree.nodes())
    s.evict_all()


def another_owner(s: System) -> torch.Tensor:
    """Take every free FULL slot and fill it with the sentinel; the slots taken."""
    slots = s.alloc(s.allocator.available_size())
    s.kv.write_pages(slots, torch.full((slots.numel(), 2, 4), SENTINEL, dtype=torch.float16))
    return slots


def untouched(s: System, slots: torch.Tensor) -> bool:
    return bool((s.kv.read_pages(slots) == SENTINEL).all())


def protocol_fault(s: System, operation: str) -> StoreProtocolError:
    fault = s.linker.last_store_fault
    assert isinstance(fault, StoreProtocolError), fault
    assert fault.operation == operation, fault
    return fault


def prepared(s: System, rid: str, key: tuple[int, ...]) -> torch.Tensor:
    """Begin `rid` over a stored `key`: its load is prepared; the FULL slots reserved."""
    req = s.begin(rid, key)
    assert req.load is not None and req.prepared
    reserved = req.load.transfers[0].device_indices
    assert reserved is not None
    return reserved


def finish(s: System, rid: str, key: tuple[int, ...]) -> None:
    """Complete `rid` (committed or recomputed): its slots hold its own KV."""
    req = s.requests[rid]
    s.complete(req)
    assert req.slots is not None
    assert torch.equal(s.full_bytes(req.slots), kv_bytes(s.aligned(key), 0))


# -- 1. miscounts and lost replies ----------------------------------------------------
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_an_overcounted_load_completion_quarantines_the_batch(swa: bool) -> None:
    """The store reports a completion it cannot pop while its batch still runs: the
    request recomputes, but its slots stay out of reach until the batch's own completion."""
    s, store = built(swa=swa)
    x = key_of(4)
    stored_then_evicted(s, x)
    reserved = prepared(s, "r", x)
    assert s.linker.start_loading() >= 0
    store.extra_loads = 1
    s.finish_loads()  # the pop fails: which batch ended, if any, is unknown
    store.extra_loads = 0
    load = s.requests["r"].load
    assert load is not None and load.state == "aborted"
    assert s.linker.stats.store_faults["pop_completed_load"] == 1
    other = another_owner(s)
    assert not set(other.tolist()) & set(reserved.tolist()), "slots reused under the store"
    full, _ = s.linker.quarantined_slots()
    assert torch.equal(torch.cat(full), reserved)
    store.progress()  # the store finally writes its batch
    assert untouched(s, other), "the store wrote into another owner's KV"
    s.allocator.free(other)
    s.finish_loads()  # the batch's own completion releases the quarantine
    assert s.linker.quarantined_slots() == ([], [])
    assert s.linker.stats.quarantine_released == 1
    s.audit()  # free + tree + reserved + quarantined = capacity
    finish(s, "r", x)
    s.assert_quiet()


def test_an_overcounted_offload_completion_keeps_the_nodes() -> None:
    """The store reports an offload completion it cannot pop while the offload is still
    to read the nodes' pages: the nodes stay locked (not evicted, their slots not handed
    on), so the store files the chain's own bytes under its keys."""
    s, store = built()
    x = key_of(4)
    a = s.compute("A", x, settle=False)
    assert a.offload is not None and a.offload.state == "pending"
    store.extra_offloads = 1
    assert s.linker.poll_offloads() == []
    store.extra_offloads = 0
    assert s.linker.stats.store_faults["pop_completed_offload"] == 1
    assert all(n.offloading and n.lock_ref for n in s.tree.nodes())
    s.evict_all()
    assert list(s.tree.nodes()), "evicted while the store may still read it"
    other = another_owner(s)
    store.progress()  # the store reads the chain's pages now
    s.allocator.free(other)
    s.linker.poll_offloads()  # its completion: the held offload ends (failed, unlocked)
    assert not any(n.offloading or n.lock_ref for n in s.tree.nodes())
    assert len(s.linker.quarantine) == 0
    s.evict_all()
    again = s.serve("again", x)  # the store's copy: the chain's own bytes
    assert again.outcome == "committed" and again.slots is not None
    assert torch.equal(s.full_bytes(again.slots), kv_bytes(x, 0))
    s.assert_quiet()


def test_offloads_after_a_lost_offload_completion_publish_nothing_unproven() -> None:
    """A pop that fails may have consumed a completion: from then on no verdict can be
    matched to its offload, so none is published; each later completion releases the
    oldest held offload, and a reset releases the rest."""
    s, store = built()
    x, y = key_of(2), key_of(2, base=900)
    s.compute("X", x, settle=False)
    store.progress()
    store.extra_offloads = 0

    def lost() -> bool:
        MemoryStore.pop_completed_offload(store)  # consumed, and the answer lost
        raise TimeoutError("no answer")

    store.pop_completed_offload = lost  # type: ignore[method-assign]
    assert s.linker.poll_offloads() == []
    del store.pop_completed_offload
    s.compute("Y", y, settle=False)  # queued behind the held one
    assert s.linker.stats.offloads_quarantined == 2
    store.progress()
    ended = s.linker.poll_offloads()  # Y's completion: releases X (the oldest), failed
    assert [r.state for r in ended] == ["failed"]
    assert not any(n.external_cache_stored for n in s.tree.nodes())
    s.assert_quiet()  # Y is held, accounted for (locks, conservation)
    s.linker.reset()
    assert len(s.linker.quarantine) == 0
    assert not any(n.lock_ref or n.offloading for n in s.tree.nodes())
    s.assert_quiet()


def test_a_lost_start_answer_then_nothing_queued_frees_nothing() -> None:
    """`start_loading` started the batch, but its answer was lost; the next call says
    nothing is queued (true: it runs). The load ends, its slots stay quarantined until
    a reset of the store returns."""
    s, store = built()
    x = key_of(4)
    stored_then_evicted(s, x)
    reserved = prepared(s, "r", x)
    store.lose_start = True
    assert s.linker.start_loading() == -1
    store.lose_start = False
    assert s.linker.start_loading() == -1  # the store: nothing queued
    s.finish_loads()
    load = s.requests["r"].load
    assert load is not None and load.state == "aborted"
    other = another_owner(s)
    assert not set(other.tolist()) & set(reserved.tolist()), "slots reused under the store"
    full, _ = s.linker.quarantined_slots()
    assert torch.equal(torch.cat(full), reserved)
    store.progress()  # the lost batch runs
    assert untouched(s, other), "the store wrote into another owner's KV"
    s.allocator.free(other)
    s.finish_loads()  # a completion for a batch the linker never heard of: a fault
    protocol_fault(s, "pop_completed_load")
    s.audit()
    finish(s, "r", x)
    s.linker.reset()
    assert s.linker.quarantined_slots() == ([], [])
    s.assert_quiet()


# -- 2. malformed completions -----------------------------------------------------------
@pytest.mark.parametrize("rids", [None, ("r", 3), "r"], ids=["none", "int-rid", "str"])
def test_a_completion_with_malformed_rids_ends_the_load(rids: Any) -> None:
    """A completion whose rids are not a tuple of str is a protocol fault: the load ends
    (its anchor lock goes, the request recomputes), nothing escapes the linker."""
    s, store = built()
    x = key_of(4)
    stored_then_evicted(s, x)
    prepared(s, "r", x)
    store.rids = rids
    s.drive()
    store.rids = "real"
    load = s.requests["r"].load
    assert load is not None and load.state == "aborted"
    assert load.abort_reason is not None and load.abort_reason.value == "load_failed"
    assert protocol_fault(s, "pop_completed_load").value.rids == rids
    assert not any(n.lock_ref for n in s.tree.nodes() if n is not load.anchor)
    finish(s, "r", x)
    s.assert_quiet()
    s.linker.reset()
    assert s.linker.quarantined_slots() == ([], [])


def test_a_completion_naming_other_rids_ends_the_load() -> None:
    s, store = built()
    x = key_of(4)
    stored_then_evicted(s, x)
    prepared(s, "r", x)
    store.rids = ("someone-else",)
    s.drive()
    store.rids = "real"
    load = s.requests["r"].load
    assert load is not None and load.state == "aborted"
    assert "someone-else" in str(protocol_fault(s, "pop_completed_load"))
    finish(s, "r", x)
    s.linker.reset()
    s.assert_quiet()


def test_a_phantom_batch_leaves_completions_in_step() -> None:
    """The store answers a batch id with nothing queued (a batch it never runs): the
    completions of the real batches after it still end their own batches."""
    s, store = built()
    keys = [key_of(2, base=100 * (i + 1)) for i in range(3)]
    for i, k in enumerate(keys):
        s.compute(f"A{i}", k)
    s.evict_all()
    store.phantom = True
    assert s.linker.start_loading() >= 0  # nothing of ours queued: a phantom batch
    for i, k in enumerate(keys):
        req = s.begin(f"r{i}", k)
        assert req.prepared
        s.drive()
        assert req.load is not None and req.load.state == "committed", req.load
        finish(s, f"r{i}", k)
    assert s.linker.stats.loads_committed == 3
    s.assert_quiet()


def test_a_batch_id_already_in_flight_is_a_fault_and_frees_nothing() -> None:
    """The store answers the id of the batch in flight again: the second batch's loads
    cannot be told from the first's; they end, their slots held until a reset."""
    s, store = built()
    x, y = key_of(2), key_of(2, base=900)
    s.compute("X", x)
    s.compute("Y", y)
    s.evict_all()
    rx = prepared(s, "rx", x)
    first = s.linker.start_loading()
    ry = prepared(s, "ry", y)
    store.start_loading = lambda: first  # type: ignore[method-assign]
    assert s.linker.start_loading() == -1
    del store.start_loading
    assert "already in flight" in str(protocol_fault(s, "start_loading"))
    s.finish_loads()
    load = s.requests["ry"].load
    assert load is not None and load.state == "aborted"
    other = another_owner(s)
    assert not set(other.tolist()) & set(ry.tolist()), "slots reused under the store"
    s.allocator.free(other)
    store.progress()
    s.drive()
    assert s.requests["rx"].load is not None
    assert s.requests["rx"].load.state == "committed", "the first batch is its own"
    assert not set(rx.tolist()) & set(torch.cat(s.linker.quarantined_slots()[0]).tolist())
    finish(s, "rx", x)
    finish(s, "ry", y)
    s.linker.reset()
    s.assert_quiet()


def test_a_completion_popped_twice_ends_nothing_twice() -> None:
    """The store answers one completion twice: the repeat names a batch no longer in
    flight (a fault); the batch after it recomputes, and its own completion frees it."""
    s, store = built()
    x, y = key_of(2), key_of(2, base=900)
    s.compute("X", x)
    s.compute("Y", y)
    s.evict_all()
    prepared(s, "rx", x)
    s.linker.start_loading()
    ry = prepared(s, "ry", y)
    s.linker.start_loading()
    store.progress()
    real = store.pop_completed_load
    answers = [real()]
    answers.append(answers[0])  # the repeat

    def twice() -> LoadBatchResult:
        return answers.pop(0) if answers else real()

    store.pop_completed_load = twice  # type: ignore[method-assign]
    store.extra_loads = 1
    s.finish_loads()
    store.extra_loads = 0
    del store.pop_completed_load
    rx_load, ry_load = s.requests["rx"].load, s.requests["ry"].load
    assert rx_load is not None and rx_load.state == "committed"
    assert ry_load is not None and ry_load.state == "aborted"
    assert torch.equal(torch.cat(s.linker.quarantined_slots()[0]), ry)
    s.finish_loads()  # the second batch's own completion
    assert s.linker.quarantined_slots() == ([], []), "its own completion came: freed"
    assert not set(ry.tolist()) & {int(v) for v in s.tree.path_slots(rx_load.endpoint)}
    finish(s, "rx", x)
    finish(s, "ry", y)
    s.assert_quiet()


# -- 4. bounded calls ---------------------------------------------------------------------
def test_reset_returns_when_the_count_never_drops_and_every_pop_fails() -> None:
    s, store = built()
    x = key_of(4)
    stored_then_evicted(s, x)
    prepared(s, "r", x)
    s.linker.start_loading()
    store.extra_loads = 5  # the store says 5 more, and has none of them
    store.extra_offloads = 5
    s.linker.reset()  # returns
    assert store.pops <= 10
    assert s.linker.stats.store_faults["reset"] >= 1
    finish(s, "r", x)
    s.assert_quiet()


def test_an_absurd_completion_count_pops_only_what_can_be_in_flight() -> None:
    s, store = built()
    x = key_of(4)
    stored_then_evicted(s, x)
    prepared(s, "r", x)
    s.linker.start_loading()
    store.progress()
    store.extra_loads = 10**6 - 1
    store.pops = 0
    s.finish_loads()
    assert store.pops <= 3  # the batch in flight, and a small slack
    assert s.linker.stats.store_faults["num_completed_loads"] == 1
    load = s.requests["r"].load
    assert load is not None and load.state == "committed"
    finish(s, "r", x)
    store.extra_loads = 0
    s.assert_quiet()


def test_a_failing_reset_quarantines_what_the_store_may_still_touch() -> None:
    """A reset that raises is no sign the store stopped: the in-flight load's slots and
    the pending offload's nodes stay held until a reset returns."""
    s, store = built()
    x, y = key_of(4), key_of(2, base=900)
    stored_then_evicted(s, x)
    reserved = prepared(s, "r", x)
    s.linker.start_loading()
    s.compute("Y", y, settle=False)

    def stuck() -> None:
        raise TimeoutError("reset: no answer")

    store.reset = stuck  # type: ignore[method-assign]
    s.linker.reset()
    assert all(n.lock_ref for n in s.tree.nodes() if n.key == y), "unlocked under the store"
    other = another_owner(s)
    assert not set(other.tolist()) & set(reserved.tolist()), "slots reused under the store"
    s.allocator.free(other)
    full, _ = s.linker.quarantined_slots()
    assert torch.equal(torch.cat(full), reserved)
    s.audit()
    del store.reset
    s.linker.reset()
    assert len(s.linker.quarantine) == 0
    finish(s, "r", x)
    s.assert_quiet()


def test_an_idle_linker_resets_the_store_to_release_its_quarantine() -> None:
    """By default (`LinkerConfig.reset_when_idle`), once nothing of the linker's is in
    flight, it resets the store: the reset returning is the trusted signal, the slots
    come back, and the quiesced store writes nothing more into them."""
    s, store = built(reset_when_idle=True)
    x = key_of(4)
    stored_then_evicted(s, x)
    prepared(s, "r", x)
    s.linker.start_loading()
    store.extra_loads = 1
    s.finish_loads()
    store.extra_loads = 0
    other = another_owner(s)
    store.progress()
    assert untouched(s, other), "the store wrote into another owner's KV"
    s.allocator.free(other)
    assert s.linker.stats.idle_resets == 1
    assert len(s.linker.quarantine) == 0
    finish(s, "r", x)
    s.assert_quiet()
