"""Faults, releases and resets: every load ends committed or aborted-and-recomputed.

Each `FaultKind` of `store/faults.py` is injected deterministically (every eligible
call) only during the phase where it applies, then switched off. The request must end
either committed or aborted and recomputed — never stuck — with the audit clean after
every step and no lock left once everything finished.

The whole module runs once per store backend (memory, file, redis: `backends.py`): the
`backend` fixture puts that backend under every `System` built here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from backends import BACKENDS, Backend
from unicache_fsm.linker.load import AbortReason
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule
from unicache_fsm.testing import system
from unicache_fsm.testing.system import kv_bytes
from unicache_fsm.tree import EvictParams

P = 4


class System(system.System):
    """`testing.system.System` with the module's backend as its store."""

    backend_under_test: Backend | None = None

    @classmethod
    def build(cls, page_size: int, **kw: Any) -> system.System:
        backend = cls.backend_under_test
        if backend is not None and backend.name != "memory":
            capacity = kw.pop("capacity_pages", None)
            kw["store_factory"] = lambda: backend.make(capacity_pages=capacity)
        return system.System.build(page_size, **kw)


@pytest.fixture(autouse=True, params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    chosen = Backend(request.param)
    System.backend_under_test = chosen
    yield chosen
    System.backend_under_test = None
    chosen.cleanup()


def key_of(pages: int, p: int = P, base: int = 100) -> tuple[int, ...]:
    return tuple(range(base, base + pages * p))


def always(kind: FaultKind, delay_steps: int = 2) -> FaultPolicy:
    return FaultPolicy({kind: FaultRule(every=1)}, delay_steps=delay_steps)


def build(swa: bool) -> System:
    return System.build(P, swa=swa, faults=FaultPolicy())


def offloaded(s: System, rid: str, key: tuple[int, ...]) -> None:
    """Compute `key` and settle its offload; its nodes end stored."""
    req = s.compute(rid, key)
    assert req.offload is not None and req.offload.state == "published"
    s.audit()


def loads_again(s: System, key: tuple[int, ...]) -> None:
    """Recovery: after the tree forgets `key`, a new request loads it from the store."""
    s.evict_all()
    again = s.serve("again", key)
    assert again.outcome == "committed"
    assert again.slots is not None
    assert torch.equal(s.full_bytes(again.slots), kv_bytes(key, 0))


# -- faults on the load path -----------------------------------------------------------
LOAD_FAULTS = {
    FaultKind.FAIL_LOOKUP: "miss",
    FaultKind.REFUSE_LOAD: AbortReason.STORE_REFUSED,
    FaultKind.EVICT_AFTER_LOOKUP: AbortReason.STORE_REFUSED,
    FaultKind.FAIL_BATCH_BEFORE_START: AbortReason.LOAD_FAILED,
    FaultKind.FAIL_BATCH_MIDWAY: AbortReason.LOAD_FAILED,
    FaultKind.DELAY_COMPLETION: "committed",
}


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.parametrize("kind", list(LOAD_FAULTS), ids=lambda k: k.value)
def test_load_fault_ends_committed_or_recomputed(kind: FaultKind, swa: bool) -> None:
    s = build(swa)
    x = key_of(6)
    offloaded(s, "A", x)
    s.evict_all()
    s.faulty.policy = always(kind, delay_steps=3)
    b = s.begin("B", (*x, 7))
    s.audit()
    sentinel = None
    if b.prepared:
        assert b.load is not None
        reserved = b.load.transfers[0].device_indices
        assert reserved is not None
        sentinel = torch.full((reserved.numel(), 2, 4), -7.0, dtype=torch.float16)
        s.kv.write_pages(reserved, sentinel)
        s.linker.start_loading()
        s.store.progress()
        if kind is FaultKind.FAIL_BATCH_BEFORE_START:
            assert torch.equal(s.kv.read_pages(reserved), sentinel), "bytes landed anyway"
        if kind is FaultKind.FAIL_BATCH_MIDWAY:
            assert torch.equal(s.kv.read_pages(reserved), kv_bytes(x, 0)), "nothing landed"
        s.linker.finish_loads()
        s.audit()
        s.drive()
    s.faulty.policy = FaultPolicy()
    assert s.faulty.inner is s.backend
    expected = LOAD_FAULTS[kind]
    if expected == "miss":
        assert b.load is None and s.linker.stats.lookup_faults == 1
    elif expected == "committed":
        assert b.load is not None and b.load.state == "committed"
    else:
        assert b.load is not None and b.load.state == "aborted"
        assert b.load.abort_reason is expected
        assert s.linker.stats.loads_aborted == {expected.value: 1}
        assert not b.load.transfers, "an aborted load still names reserved slots"
    s.complete(b)
    s.audit()
    assert b.slots is not None
    assert torch.equal(s.full_bytes(b.slots), kv_bytes(s.aligned(b.key), 0))
    loads_again(s, x)
    s.assert_quiet()


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_delayed_load_completion_is_not_stuck(swa: bool) -> None:
    s = build(swa)
    x = key_of(6)
    offloaded(s, "A", x)
    s.evict_all()
    s.faulty.policy = always(FaultKind.DELAY_COMPLETION, delay_steps=3)
    b = s.begin("B", x)
    assert b.load is not None
    s.linker.start_loading()
    rounds = 0
    while b.load.state != "committed":
        s.store.progress()
        s.linker.finish_loads()
        s.audit()
        rounds += 1
        assert rounds <= 10, "the delayed load never completed"
    assert rounds == 4  # held back for delay_steps progress() calls
    s.complete(b)
    s.assert_quiet()


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_store_evicts_between_queue_and_batch(swa: bool) -> None:
    """The store loses a page after queueing the load: the batch fails, B recomputes."""
    s = System.build(P, swa=swa)
    x = key_of(6)
    offloaded(s, "A", x)
    hashes = [h for n in s.tree.nodes() for h in (n.hashes or ())]
    s.evict_all()
    b = s.begin("B", x)
    assert b.load is not None and b.prepared
    s.check_stored = False
    s.store.evict(hashes[3:4])
    s.drive()
    assert b.load.state == "aborted" and b.load.abort_reason is AbortReason.LOAD_FAILED
    s.complete(b)
    s.check_stored = True
    s.assert_quiet()


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_tree_evicts_the_anchor_between_lookup_and_load(swa: bool) -> None:
    """Nobody locked the device prefix: it is evicted before LOAD, which aborts."""
    s = System.build(P, swa=swa)
    x = key_of(8)
    offloaded(s, "A1", x[: 4 * P])
    offloaded(s, "A2", x)
    s.tree.evict(EvictParams(num_tokens=4 * P))
    b = s.begin("B", x, load=False, lock=False)
    assert b.load is not None and b.match is not None
    assert b.match.device.prefix_len == 4 * P
    s.evict_all()
    assert not s.linker.load_back(b.load)
    assert b.load.state == "aborted" and b.load.abort_reason is AbortReason.NO_SLOTS
    s.audit()
    s.complete(b)
    s.assert_quiet()


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_no_slots_aborts_and_frees_what_was_reserved(swa: bool) -> None:
    """LOAD cannot reserve (everything else is locked): ABORT frees exactly what it took."""
    s = System.build(P, swa=swa, full_pages=16, swa_pages=8)
    x = key_of(6)
    offloaded(s, "A", x)
    s.evict_all()
    blockers = []
    if swa:
        # the FULL pool has room, the SWA pool does not: LOAD fails part-way
        blocker = s.compute("W", key_of(8, base=900), swa_boundary=0)
    else:
        blocker = s.compute("W", key_of(12, base=900))
    assert blocker.last_node is not None
    # a lock pins only its path's trailing SWA window (SGLang 0.5.23): lock every
    # node of the blocker so that none of its SWA can be evicted
    blockers += [s.lock(n) for n in blocker.last_node.path_from_root()]
    free_full = s.allocator.available_size()
    b = s.begin("B", x)
    assert b.load is not None and not b.prepared
    assert b.load.abort_reason is AbortReason.NO_SLOTS
    assert s.allocator.available_size() == free_full
    s.audit()
    for node in blockers:
        s.unlock(node)
    s.evict_all()
    assert s.serve("C", x).outcome == "committed"
    s.assert_quiet()


# -- faults on the offload path --------------------------------------------------------
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.parametrize(
    "kind", [FaultKind.REFUSE_OFFLOAD, FaultKind.FAIL_OFFLOAD], ids=lambda k: k.value
)
def test_failed_offload_unstores_and_is_retried(kind: FaultKind, swa: bool) -> None:
    s = build(swa)
    x = key_of(6)
    s.faulty.policy = always(kind)
    a = s.compute("A", x, settle=False)
    assert a.offload is not None
    if kind is FaultKind.REFUSE_OFFLOAD:
        assert a.offload.state == "failed", "a refused offload fails at once"
    s.audit()
    s.drive()
    s.faulty.policy = FaultPolicy()
    assert a.offload.state == "failed"
    assert not s.stored_nodes() and not any(n.offloading for n in s.tree.nodes())
    # one record per node (with SWA the 6-page leaf is an older part + its last window)
    assert s.linker.stats.offloads_failed == len(list(s.tree.nodes()))
    s.assert_quiet()
    # eligible again: the next non-chunked insert walk offloads the chain again
    again = s.compute("A2", x)
    assert again.offload is not None and again.offload.state == "published"
    assert s.stored_nodes() == list(s.tree.nodes())
    loads_again(s, x)
    s.assert_quiet()


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_delayed_offload_keeps_the_chain_locked(swa: bool) -> None:
    s = build(swa)
    x = key_of(6)
    s.faulty.policy = always(FaultKind.DELAY_COMPLETION, delay_steps=3)
    a = s.compute("A", x, settle=False)
    assert a.offload is not None
    for _ in range(3):
        s.store.progress()
        assert s.linker.poll_offloads() == []
        assert a.offload.state == "pending"
        s.evict_all()  # nothing in flight may be evicted
        assert len(list(s.tree.nodes())) >= 1
        assert all(n.offloading for n in s.tree.nodes())
        s.audit()
    s.store.progress()
    done = s.linker.poll_offloads()  # one record per node, `a.offload` the last
    assert done[-1] is a.offload and len(done) == len(list(s.tree.nodes()))
    assert all(r.state == "published" for r in done)
    s.faulty.policy = FaultPolicy()
    loads_again(s, x)
    s.assert_quiet()


# -- release_request at each load state ------------------------------------------------
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.parametrize("state", ["idle", "queued", "loading", "committed"])
def test_release_request_at_each_state(state: str, swa: bool) -> None:
    s = System.build(P, swa=swa)
    x = key_of(6)
    offloaded(s, "A", x)
    s.evict_all()
    free_full = s.allocator.available_size()
    b = s.begin("B", x, load=state != "idle")
    assert b.load is not None
    load = b.load
    if state in ("loading", "committed"):
        s.linker.start_loading()
    if state == "committed":
        s.store.progress()
        s.linker.finish_loads()
        assert load.state == "committed"
        stats = s.linker.describe()
        s.linker.release_request("B")
        assert load.state == "committed" and s.linker.describe() == stats
        s.complete(b)
        s.assert_quiet()
        return
    reserved = None if state == "idle" else load.transfers[0].device_indices
    s.linker.release_request("B")
    s.audit()
    if state == "loading":
        # deferred: the store may still write into the reserved slots
        assert load.state == "prepared.loading" and load.abort_pending
        assert s.allocator.available_size() == free_full - len(x)
        # another request allocates meanwhile: it must not get B's slots
        other = s.compute("C", key_of(6, base=700))
        assert other.slots is not None and reserved is not None
        assert not set(other.slots.tolist()) & set(reserved.tolist())
        s.store.progress()
        assert s.linker.finish_loads() == [load]
        s.audit()
    else:
        assert s.store.start_loading() == -1, "the store still holds a cancelled load"
    assert load.state == "aborted" and load.abort_reason is AbortReason.RELEASED
    assert not load.transfers and "B" not in s.linker.loads
    s.unlock(b.lock)
    s.evict_all()
    assert s.allocator.available_size() == s.kv.layout.size
    assert s.serve("D", x).outcome == "committed"
    s.assert_quiet()


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_release_while_loading_and_the_batch_fails(swa: bool) -> None:
    s = build(swa)
    x = key_of(6)
    offloaded(s, "A", x)
    s.evict_all()
    b = s.begin("B", x)
    assert b.load is not None
    s.faulty.policy = always(FaultKind.FAIL_BATCH_MIDWAY)
    s.linker.start_loading()
    s.linker.release_request("B")
    s.drive()
    assert b.load.state == "aborted" and b.load.abort_reason is AbortReason.LOAD_FAILED
    s.unlock(b.lock)
    s.assert_quiet()


def test_match_again_while_loading() -> None:
    s = System.build(P)
    x = key_of(8)
    offloaded(s, "A", x)
    s.evict_all()
    b = s.begin("B", x)
    s.linker.start_loading()
    again = s.linker.match("B", x)  # the scheduler retries the request
    assert again.load is not None
    s.audit()  # the loading load's slots and lock are still the linker's
    s.store.progress()
    s.linker.finish_loads()  # the old load ends (aborted: released)
    assert b.load is not None and b.load.state == "aborted"
    assert s.linker.load_back(again.load)
    s.linker.start_loading()
    s.store.progress()
    assert s.linker.finish_loads() == [again.load]
    assert again.load.state == "committed" and again.load.endpoint is not None
    s.tree.dec_lock_ref(again.load.endpoint)  # the lock COMMIT handed over
    s.unlock(b.lock)
    s.assert_quiet()


# -- reset -----------------------------------------------------------------------------
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_reset_with_loads_and_offloads_in_flight(swa: bool) -> None:
    s = System.build(P, swa=swa)
    x, y = key_of(6), key_of(6, base=500)
    offloaded(s, "A", x)
    offloaded(s, "A2", y)
    s.evict_all()
    idle = s.begin("idle", x, load=False)
    queued = s.begin("queued", y)
    loading = s.begin("loading", (*x, *key_of(1, base=40)))
    s.linker.start_loading()  # takes both prepared loads
    assert queued.load is not None and loading.load is not None
    queued2 = s.begin("queued2", (*y, *key_of(1, base=41)))
    assert queued2.load is not None and queued2.load.state == "prepared.queued"
    assert loading.load.state == "prepared.loading"
    w = s.compute("W", key_of(5, base=900), settle=False)
    assert w.offload is not None and w.offload.state == "pending"
    offloading = [n for n in s.tree.nodes() if n.offloading]
    assert offloading
    s.audit()
    s.linker.reset()
    s.audit()
    assert not s.linker.loads and not s.linker.offloads and not s.linker.locks_held()
    for req in (idle, queued, queued2, loading):
        assert req.load is not None and req.load.state == "aborted"
        assert req.load.abort_reason is AbortReason.RESET
    assert w.offload.state == "failed"
    assert not any(n.external_cache_stored or n.offloading for n in offloading)
    for req in (idle, queued, queued2, loading):
        s.unlock(req.lock)
    s.assert_quiet()
    # the linker keeps working after a reset
    s.drive()
    assert s.serve("after", x).outcome == "committed"
    s.assert_quiet()


def test_reset_does_not_leave_stale_offload_verdicts() -> None:
    s = System.build(P, capacity_pages=4)
    w_key, y_key = key_of(4, base=300), key_of(4, base=600)
    w = s.compute("W", w_key, settle=False)
    s.store.progress()  # W's offload completed in the store, not yet polled
    s.linker.reset()  # W's record fails; the store's True stays queued for popping
    assert w.offload is not None and w.offload.state == "failed"
    s.evict_all()
    b = s.begin("B", w_key)  # a queued load pins W's pages: the store is full
    assert b.prepared
    y = s.compute("Y", y_key, settle=False)  # cannot fit: this offload fails
    s.store.progress()
    s.linker.poll_offloads()
    assert y.offload is not None and y.offload.state == "failed"
    s.audit()  # before the fix: Y is "stored" but its pages are not in the store
    s.drive()
    s.complete(b)
    s.assert_quiet()
