"""The external-store contract, as a reusable suite, run here against `MemoryStore`.

`StoreContract` holds every protocol test; a backend reuses it by subclassing it in a
``Test*`` class that provides a ``store_factory`` fixture (a callable taking
``capacity_pages=None`` and returning a fresh, unattached store) and, for the corruption
test, overriding `corrupt`; a backend whose failed loads may leave unchecked bytes in
their own reserved slots (the protocol allows it) sets `failed_load_leaves_slots`
False (every other slot is still checked untouched). `LargeRig` has 128 KiB pages, for
backends that move large pages by another path than small ones. `Rig` builds real
torch pools (KV, SWA, MAMBA) on CPU and fills pages with random bytes. After the
contract: memory-store specifics (store-side machines, background mode, invariants) and
a Hypothesis state machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar

import pytest
import torch

from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools import (
    DuplicatePagesError,
    ForeignSlotsError,
    KVPool,
    LengthMismatchError,
    PagedAllocator,
    TensorTypeError,
    UnalignedSlotsError,
)
from unicache_fsm.pools.transfer import (
    InvalidPageKeyError,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)
from unicache_fsm.store import (
    LOAD_MACHINE,
    OFFLOAD_MACHINE,
    ExternalStore,
    LoadBatchResult,
    MemoryStore,
    NoCompletionError,
    StoreClosedError,
    StoreConfigError,
    StoreLoad,
    StoreLoadState,
    StoreOffloadState,
    StoreStateError,
    StoreTransferError,
    UnknownPoolError,
    lookup_result,
    restorable_prefix_pages,
)

KV, SWA, MAMBA = PoolName.KV, PoolName.SWA, PoolName.MAMBA
TRAILING = PoolHitPolicy.TRAILING_PAGES
StoreFactory = Callable[..., ExternalStore]


class Rig:
    """Real CPU pools of page size P with allocators, and helpers to fill and read pages."""

    P = 4
    LAYERS = 2
    WIDTH = 8

    def __init__(self, pages: int = 64) -> None:
        self.allocs = {
            name: PagedAllocator(pages * self.P, self.P, name=name.value) for name in PoolName
        }
        self.pools = {
            name: KVPool.for_allocator(a, self.LAYERS, self.WIDTH)
            for name, a in self.allocs.items()
        }
        self.gen = torch.Generator().manual_seed(1234)
        self._chains = 0

    def chain(self, n: int, prefix: Sequence[str] = ()) -> list[str]:
        """`n` fresh page keys, continuing `prefix` (a hash chain of distinct tokens)."""
        self._chains += 1
        tokens = [self._chains * 100_000 + t for t in range((len(prefix) + n) * self.P)]
        prior = prefix[-1] if prefix else None
        return [*prefix, *page_hashes(tokens[len(prefix) * self.P :], self.P, prior)][len(prefix) :]

    def alloc(self, pool: PoolName, n_pages: int) -> torch.Tensor:
        slots = self.allocs[pool].alloc(n_pages * self.P)
        assert slots is not None, "rig pool exhausted"
        return slots

    def fill(self, pool: PoolName, n_pages: int) -> torch.Tensor:
        """Allocate `n_pages` and write random bytes into them."""
        slots = self.alloc(pool, n_pages)
        data = torch.randn(
            (slots.numel(), self.LAYERS, self.WIDTH), generator=self.gen, dtype=torch.float32
        )
        self.pools[pool].write_pages(slots, data.to(torch.float16))
        return slots

    def read(self, pool: PoolName, slots: torch.Tensor) -> torch.Tensor:
        return self.pools[pool].read_pages(slots)

    def page(self, pool: PoolName, slots: torch.Tensor, i: int) -> torch.Tensor:
        return self.read(pool, slots[i * self.P : (i + 1) * self.P])


def drain(store: ExternalStore) -> tuple[list[LoadBatchResult], list[bool]]:
    loads = [store.pop_completed_load() for _ in range(store.num_completed_loads())]
    offloads = [store.pop_completed_offload() for _ in range(store.num_completed_offloads())]
    return loads, offloads


def offload_now(store: ExternalStore, transfers: Sequence[PoolTransfer]) -> bool:
    assert store.offload(transfers)
    store.progress()
    (ok,) = drain(store)[1]
    return ok


def load_now(store: ExternalStore, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
    assert store.load(rid, transfers)
    batch = store.start_loading()
    assert batch >= 0
    store.progress()
    loads, _ = drain(store)
    assert [(r.batch, r.rids) for r in loads] == [(batch, (rid,))]
    return loads[0].success


def kv_lookup(keys: Sequence[str], **trailing: int) -> list[PoolTransfer]:
    """A LOOKUP: the KV transfer plus a TRAILING_PAGES transfer per pool named."""
    out = [PoolTransfer(KV, keys=keys)]
    for name, n in trailing.items():
        out.append(PoolTransfer(PoolName(name), keys=keys[len(keys) - n :], hit_policy=TRAILING))
    return out


class LargeRig(Rig):
    """A `Rig` with 128 KiB pages (P=4, 2 layers x 8192 fp16)."""

    WIDTH = 8192


class StoreContract:
    """Every `ExternalStore` passes these; see the module docstring for how to reuse."""

    failed_load_leaves_slots: ClassVar[bool] = True

    @pytest.fixture
    def rig(self) -> Rig:
        return Rig()

    @pytest.fixture
    def store(self, store_factory: StoreFactory, rig: Rig) -> Iterator[ExternalStore]:
        store = store_factory()
        store.attach(rig.pools)
        yield store
        store.close()

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        """Flip bytes of a stored page (backends override this)."""
        assert isinstance(store, MemoryStore)
        view = store.stored_bytes(pool, key)
        assert view is not None
        view[:8] ^= 0xFF

    # -- round trips ----------------------------------------------------------------------

    def test_is_an_external_store(self, store: ExternalStore) -> None:
        assert isinstance(store, ExternalStore)

    def test_round_trip_writes_exact_bytes_into_other_slots(
        self, store: ExternalStore, rig: Rig
    ) -> None:
        keys = rig.chain(5)
        src = rig.fill(KV, 5)
        assert offload_now(store, [PoolTransfer(KV, src, keys)])
        assert store.lookup("r", kv_lookup(keys)) == [1, 2, 3, 4, 5]
        dst = rig.alloc(KV, 5)
        assert load_now(store, "r", [PoolTransfer(KV, dst, keys)])
        assert torch.equal(rig.read(KV, dst), rig.read(KV, src))

    def test_round_trip_of_kv_and_swa_window(self, store: ExternalStore, rig: Rig) -> None:
        keys = rig.chain(6)
        kv_src, swa_src = rig.fill(KV, 6), rig.fill(SWA, 2)
        offload = [PoolTransfer(KV, kv_src, keys), PoolTransfer(SWA, swa_src, keys[-2:], TRAILING)]
        assert offload_now(store, offload)
        assert store.lookup("r", kv_lookup(keys, swa=2)) == [6]
        kv_dst, swa_dst = rig.alloc(KV, 6), rig.alloc(SWA, 2)
        load = [PoolTransfer(KV, kv_dst, keys), PoolTransfer(SWA, swa_dst, keys[-2:], TRAILING)]
        assert load_now(store, "r", load)
        assert torch.equal(rig.read(KV, kv_dst), rig.read(KV, kv_src))
        assert torch.equal(rig.read(SWA, swa_dst), rig.read(SWA, swa_src))

    def test_load_of_a_prefix_and_of_a_middle_page(self, store: ExternalStore, rig: Rig) -> None:
        keys = rig.chain(4)
        src = rig.fill(KV, 4)
        assert offload_now(store, [PoolTransfer(KV, src, keys)])
        dst = rig.alloc(KV, 2)
        assert load_now(store, "a", [PoolTransfer(KV, dst, [keys[2], keys[0]])])
        assert torch.equal(rig.page(KV, dst, 0), rig.page(KV, src, 2))
        assert torch.equal(rig.page(KV, dst, 1), rig.page(KV, src, 0))

    def test_offload_completions_are_fifo(self, store: ExternalStore, rig: Rig) -> None:
        for _ in range(3):
            assert store.offload([PoolTransfer(KV, rig.fill(KV, 2), rig.chain(2))])
        assert store.num_completed_offloads() in (0, 1, 2, 3)  # background may be quick
        store.progress()
        assert drain(store) == ([], [True, True, True])

    def test_one_batch_holds_every_queued_load(self, store: ExternalStore, rig: Rig) -> None:
        keys = rig.chain(3)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 3), keys)])
        for rid in ("a", "b", "c"):
            assert store.load(rid, [PoolTransfer(KV, rig.alloc(KV, 1), keys[:1])])
        batch = store.start_loading()
        assert store.start_loading() == -1
        store.progress()
        assert drain(store) == ([LoadBatchResult(batch, ("a", "b", "c"), True)], [])

    def test_pop_with_nothing_completed_is_a_typed_error(self, store: ExternalStore) -> None:
        with pytest.raises(NoCompletionError):
            store.pop_completed_load()
        with pytest.raises(NoCompletionError):
            store.pop_completed_offload()
        assert store.start_loading() == -1

    # -- lookup rules ---------------------------------------------------------------------

    def test_lookup_all_pages_is_the_leading_run(self, store: ExternalStore, rig: Rig) -> None:
        keys = rig.chain(5)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 5), keys)])
        assert store.evict([keys[2]], KV) == 1
        assert not store.contains(KV, keys[2]) and store.contains(KV, keys[3])
        assert store.lookup("r", kv_lookup(keys)) == [1, 2]
        assert store.evict([keys[0]]) == 1
        assert store.lookup("r", kv_lookup(keys)) == []
        assert store.lookup("r", kv_lookup(rig.chain(3))) == []

    def test_lookup_extra_all_pages_pool_bounds_the_prefix(
        self, store: ExternalStore, rig: Rig
    ) -> None:
        keys = rig.chain(4)
        both = [
            PoolTransfer(KV, rig.fill(KV, 4), keys),
            PoolTransfer(MAMBA, rig.fill(MAMBA, 3), keys[:3]),
        ]
        assert offload_now(store, both)
        assert store.lookup("r", [PoolTransfer(KV, keys=keys), PoolTransfer(MAMBA, keys=keys)]) == [
            1,
            2,
            3,
        ]

    def test_lookup_trailing_pages_gives_sparse_sets(self, store: ExternalStore, rig: Rig) -> None:
        # KV holds pages 0..5; SWA holds windows only around node ends: pages 0, 3, 4.
        keys = rig.chain(6)
        swa_keys = [keys[0], keys[3], keys[4]]
        offload = [
            PoolTransfer(KV, rig.fill(KV, 6), keys),
            PoolTransfer(SWA, rig.fill(SWA, 3), swa_keys),
        ]
        assert offload_now(store, offload)
        # window N = 2: L valid iff pages [L-2, L) are present (clipped at the tail start)
        assert store.lookup("r", kv_lookup(keys, swa=2)) == [1, 5]
        # N = 1: L valid iff page L-1 is present
        assert store.lookup("r", kv_lookup(keys, swa=1)) == [1, 4, 5]
        # N = 3: [2, 5) misses page 2
        assert store.lookup("r", kv_lookup(keys, swa=3)) == [1]

    def test_lookup_intersects_sets_where_min_of_maxima_is_wrong(
        self, store: ExternalStore, rig: Rig
    ) -> None:
        keys = rig.chain(6)
        offload = [
            PoolTransfer(KV, rig.fill(KV, 6), keys),
            PoolTransfer(SWA, rig.fill(SWA, 3), [keys[0], keys[3], keys[4]]),
            PoolTransfer(MAMBA, rig.fill(MAMBA, 1), [keys[3]]),
        ]
        assert offload_now(store, offload)
        assert store.lookup("r", kv_lookup(keys, swa=2)) == [1, 5]  # own max 5
        assert store.lookup("r", kv_lookup(keys, mamba=1)) == [4]  # own max 4
        # min of the maxima (6, 5, 4) would claim 4, which SWA cannot restore
        assert store.lookup("r", kv_lookup(keys, swa=2, mamba=1)) == []

    def test_lookup_rejects_malformed_requests(self, store: ExternalStore, rig: Rig) -> None:
        keys = rig.chain(4)
        with pytest.raises(StoreTransferError, match="no KV transfer"):
            store.lookup("r", [PoolTransfer(SWA, keys=keys[-2:], hit_policy=TRAILING)])
        with pytest.raises(StoreTransferError, match="twice"):
            store.lookup("r", [PoolTransfer(KV, keys=keys), PoolTransfer(KV, keys=keys)])
        with pytest.raises(StoreTransferError, match="last 2"):
            store.lookup(
                "r",
                [
                    PoolTransfer(KV, keys=keys),
                    PoolTransfer(SWA, keys=keys[:2], hit_policy=TRAILING),
                ],
            )
        with pytest.raises(StoreTransferError, match="ALL_PAGES"):
            store.lookup("r", [PoolTransfer(KV, keys=keys, hit_policy=TRAILING)])

    # -- failures -------------------------------------------------------------------------

    def test_corrupt_page_fails_the_whole_batch(self, store: ExternalStore, rig: Rig) -> None:
        keys, other = rig.chain(3), rig.chain(2)
        src, other_src = rig.fill(KV, 3), rig.fill(KV, 2)
        assert offload_now(store, [PoolTransfer(KV, src, keys)])
        assert offload_now(store, [PoolTransfer(KV, other_src, other)])
        self.corrupt(store, KV, keys[1])
        assert store.lookup("r", kv_lookup(keys)) == [1, 2, 3]  # presence is not integrity
        dst, other_dst = rig.alloc(KV, 3), rig.alloc(KV, 2)
        pool = rig.pools[KV].data
        before = pool.clone()
        assert store.load("bad", [PoolTransfer(KV, dst, keys)])
        assert store.load("good", [PoolTransfer(KV, other_dst, other)])
        batch = store.start_loading()
        store.progress()
        assert drain(store)[0] == [LoadBatchResult(batch, ("bad", "good"), False)]
        outside = torch.ones(pool.shape[0], dtype=torch.bool)
        outside[torch.cat((dst, other_dst))] = False
        assert torch.equal(pool[outside], before[outside])  # no slot but the loads' own
        if self.failed_load_leaves_slots:
            assert torch.equal(pool[dst], before[dst])  # corrupt bytes never written

    def test_corrupt_page_is_dropped_with_the_chain_after_it(
        self, store: ExternalStore, rig: Rig
    ) -> None:
        """A page that fails its checksum is not reported again: LOOKUP stops before it
        (the chain after it is dropped too), so nobody loads and aborts on it forever."""
        keys = rig.chain(4)
        src = rig.fill(KV, 4)
        assert offload_now(store, [PoolTransfer(KV, src, keys)])
        self.corrupt(store, KV, keys[1])
        assert not load_now(store, "bad", [PoolTransfer(KV, rig.alloc(KV, 4), keys)])
        assert store.lookup("again", kv_lookup(keys)) == [1]
        assert [store.contains(KV, k) for k in keys] == [True, False, False, False]
        assert offload_now(store, [PoolTransfer(KV, src, keys)])  # stored again, good
        dst = rig.alloc(KV, 4)
        assert load_now(store, "good", [PoolTransfer(KV, dst, keys)])
        assert torch.equal(rig.read(KV, dst), rig.read(KV, src))

    def test_a_leading_held_key_links_a_chain_offloaded_in_parts(
        self, store_factory: StoreFactory, rig: Rig
    ) -> None:
        """Pages 0-3, then 3-7 (page 3 already held): capacity eviction takes page 7,
        the chain's end, not page 3 in its middle."""
        store = store_factory(capacity_pages=8)
        store.attach(rig.pools)
        keys = rig.chain(8)
        src = rig.fill(KV, 8)
        p = rig.P
        assert offload_now(store, [PoolTransfer(KV, src[: 4 * p], keys[:4])])
        assert offload_now(store, [PoolTransfer(KV, src[3 * p :], keys[3:])])
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 1), rig.chain(1))])
        assert store.lookup("x", kv_lookup(keys)) == [1, 2, 3, 4, 5, 6, 7]
        store.close()

    def test_keys_are_write_once(self, store: ExternalStore, rig: Rig) -> None:
        keys = rig.chain(2)
        first, second = rig.fill(KV, 2), rig.fill(KV, 2)
        assert not torch.equal(rig.read(KV, first), rig.read(KV, second))
        assert offload_now(store, [PoolTransfer(KV, first, keys)])
        assert offload_now(store, [PoolTransfer(KV, second, keys)])
        dst = rig.alloc(KV, 2)
        assert load_now(store, "r", [PoolTransfer(KV, dst, keys)])
        assert torch.equal(rig.read(KV, dst), rig.read(KV, first))

    def test_load_is_refused_for_a_missing_key_and_a_busy_rid(
        self, store: ExternalStore, rig: Rig
    ) -> None:
        keys = rig.chain(3)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 3), keys)])
        assert not store.load("r", [PoolTransfer(KV, rig.alloc(KV, 4), [*keys, rig.chain(1)[0]])])
        assert store.load("r", [PoolTransfer(KV, rig.alloc(KV, 3), keys)])
        assert not store.load("r", [PoolTransfer(KV, rig.alloc(KV, 3), keys)])  # queued
        batch = store.start_loading()
        assert not store.load("r", [PoolTransfer(KV, rig.alloc(KV, 3), keys)])  # started
        store.progress()
        assert drain(store)[0] == [LoadBatchResult(batch, ("r",), True)]
        assert store.load("r", [PoolTransfer(KV, rig.alloc(KV, 3), keys)])  # done: free again

    def test_page_evicted_after_queueing_fails_the_batch(
        self, store: ExternalStore, rig: Rig
    ) -> None:
        keys = rig.chain(3)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 3), keys)])
        assert store.load("r", [PoolTransfer(KV, rig.alloc(KV, 3), keys)])
        assert store.evict([keys[2]]) == 1
        batch = store.start_loading()
        store.progress()
        assert drain(store)[0] == [LoadBatchResult(batch, ("r",), False)]

    def test_cancel_queued_but_not_started(self, store: ExternalStore, rig: Rig) -> None:
        keys = rig.chain(2)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), keys)])
        dst = rig.alloc(KV, 2)
        before = rig.read(KV, dst).clone()
        assert store.load("a", [PoolTransfer(KV, dst, keys)])
        assert store.cancel_queued_load("a")
        assert not store.cancel_queued_load("a")
        assert not store.cancel_queued_load("never")
        assert store.start_loading() == -1
        store.progress()
        assert drain(store) == ([], [])
        assert torch.equal(rig.read(KV, dst), before)
        assert store.load("b", [PoolTransfer(KV, rig.alloc(KV, 2), keys)])
        batch = store.start_loading()
        assert not store.cancel_queued_load("b")
        store.progress()
        assert drain(store)[0] == [LoadBatchResult(batch, ("b",), True)]

    def test_reset_fails_everything_pending_and_keeps_stored_pages(
        self, store: ExternalStore, rig: Rig
    ) -> None:
        keys = rig.chain(2)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), keys)])
        # A background store may finish started work before reset: only what is still
        # pending must fail, and every accepted job completes exactly once.
        assert store.load("started", [PoolTransfer(KV, rig.alloc(KV, 2), keys)])
        started = store.start_loading()
        assert store.load("queued", [PoolTransfer(KV, rig.alloc(KV, 2), keys)])
        new_keys = rig.chain(1)
        assert store.offload([PoolTransfer(KV, rig.fill(KV, 1), new_keys)])
        store.reset()
        loads, offloads = drain(store)
        assert [r.rids for r in loads] == [("started",), ("queued",)]
        assert loads[0].batch == started and not loads[1].success
        assert loads[1].batch not in (-1, started)
        assert len(offloads) == 1
        assert store.contains(KV, new_keys[0]) == offloads[0]
        store.progress()
        assert drain(store) == ([], [])
        assert store.start_loading() == -1
        assert store.contains(KV, keys[0]) and store.contains(KV, keys[1])
        dst = rig.alloc(KV, 2)
        assert load_now(store, "again", [PoolTransfer(KV, dst, keys)])

    def test_closed_store_raises_on_every_call(self, store_factory: StoreFactory, rig: Rig) -> None:
        store = store_factory()
        store.attach(rig.pools)
        keys = rig.chain(1)
        store.close()
        store.close()  # idempotent
        t = PoolTransfer(KV, rig.alloc(KV, 1), keys)
        calls: list[Callable[[], object]] = [
            lambda: store.attach(rig.pools),
            lambda: store.lookup("r", kv_lookup(keys)),
            lambda: store.load("r", [t]),
            store.start_loading,
            store.num_completed_loads,
            store.pop_completed_load,
            lambda: store.cancel_queued_load("r"),
            lambda: store.offload([t]),
            store.num_completed_offloads,
            store.pop_completed_offload,
            store.progress,
            lambda: store.evict(keys),
            lambda: store.contains(KV, keys[0]),
            store.reset,
        ]
        for call in calls:
            with pytest.raises(StoreClosedError):
                call()

    # -- bad input: typed error, nothing queued -------------------------------------------

    def _assert_nothing_queued(self, store: ExternalStore) -> None:
        assert store.start_loading() == -1
        store.progress()
        assert drain(store) == ([], [])

    @pytest.mark.parametrize("op", ["load", "offload"])
    def test_bad_transfers_raise_typed_errors_and_queue_nothing(
        self, store: ExternalStore, rig: Rig, op: str
    ) -> None:
        keys = rig.chain(2)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), keys)])

        def submit(transfers: list[PoolTransfer]) -> bool:
            return store.load("r", transfers) if op == "load" else store.offload(transfers)

        def forged(**fields: object) -> PoolTransfer:
            t = PoolTransfer(KV, rig.alloc(KV, 2), keys)
            for name, value in fields.items():
                object.__setattr__(t, name, value)  # bypass the constructor's own checks
            return t

        slots = rig.alloc(KV, 2)
        cases: list[tuple[type[Exception], list[PoolTransfer]]] = [
            (InvalidPageKeyError, [forged(keys=(keys[0], "../etc"))]),
            (TensorTypeError, [forged(device_indices=slots.to(torch.int32))]),
            (LengthMismatchError, [PoolTransfer(KV, slots, [*keys, rig.chain(1)[0]])]),
            (UnalignedSlotsError, [PoolTransfer(KV, slots + 1, keys)]),
            (
                ForeignSlotsError,
                [PoolTransfer(KV, torch.arange(8, dtype=torch.int64) + 10**6, keys)],
            ),
            (StoreTransferError, [PoolTransfer(KV, keys=keys)]),
            (StoreTransferError, []),
            (StoreTransferError, [PoolTransfer(KV, slots, keys), PoolTransfer(KV, slots, keys)]),
        ]
        if op == "load":
            twice = torch.cat([slots[: rig.P], slots[: rig.P]])
            cases.append((DuplicatePagesError, [PoolTransfer(KV, twice, keys)]))
        for error, transfers in cases:
            with pytest.raises(error):
                submit(transfers)
            self._assert_nothing_queued(store)
        with pytest.raises(InvalidPageKeyError, match="64 lowercase hex"):
            PoolTransfer(KV, slots, ["../etc", keys[1]])

    def test_unknown_pool_is_a_typed_error(self, store_factory: StoreFactory, rig: Rig) -> None:
        store = store_factory()
        store.attach({KV: rig.pools[KV]})
        keys = rig.chain(2)
        swa = PoolTransfer(SWA, rig.alloc(SWA, 2), keys, TRAILING)
        with pytest.raises(UnknownPoolError, match="swa"):
            store.offload([PoolTransfer(KV, rig.fill(KV, 2), keys), swa])
        with pytest.raises(UnknownPoolError):
            store.load("r", [swa])
        with pytest.raises(UnknownPoolError):
            store.lookup("r", kv_lookup(keys, swa=1))
        self._assert_nothing_queued(store)
        store.close()

    def test_attach_rejects_unequal_page_sizes(self, store_factory: StoreFactory, rig: Rig) -> None:
        store = store_factory()
        other = KVPool(16, 2, 1, 4)
        with pytest.raises(StoreConfigError, match="page sizes"):
            store.attach({KV: rig.pools[KV], SWA: other})
        with pytest.raises(StoreConfigError):
            store.attach({KV: object()})  # type: ignore[dict-item]
        store.close()

    # -- capacity -------------------------------------------------------------------------

    def test_capacity_evicts_chain_ends_first(self, store_factory: StoreFactory, rig: Rig) -> None:
        store = store_factory(capacity_pages=6)
        store.attach(rig.pools)
        x, y, w = rig.chain(4), rig.chain(2), rig.chain(2)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 4), x)])
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), y)])
        # full: two new pages evict x's end, then its new end (not x's head, the oldest)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), w)])
        assert store.lookup("x", kv_lookup(x)) == [1, 2]
        assert store.lookup("y", kv_lookup(y)) == [1, 2]
        assert store.lookup("w", kv_lookup(w)) == [1, 2]
        # a branch off x's prefix keeps that prefix (it is part of the offload) and takes
        # the least recently used chain end instead: y's
        z = rig.chain(1, prefix=x[:2])
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 3), [*x[:2], *z])])
        assert store.lookup("z", kv_lookup([*x[:2], *z])) == [1, 2, 3]
        assert store.lookup("y", kv_lookup(y)) == [1]
        assert store.lookup("w", kv_lookup(w)) == [1, 2]
        store.close()

    def test_capacity_never_evicts_pages_of_queued_loads(
        self, store_factory: StoreFactory, rig: Rig
    ) -> None:
        store = store_factory(capacity_pages=4)
        store.attach(rig.pools)
        x = rig.chain(4)
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 4), x)])
        dst = rig.alloc(KV, 4)
        assert store.load("r", [PoolTransfer(KV, dst, x)])
        assert not offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), rig.chain(2))])
        assert not store.offload([PoolTransfer(KV, rig.fill(KV, 5), rig.chain(5))])  # never fits
        batch = store.start_loading()
        store.progress()
        assert drain(store)[0] == [LoadBatchResult(batch, ("r",), True)]
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), rig.chain(2))])
        assert store.lookup("x", kv_lookup(x)) == [1, 2]
        store.close()


class TestMemoryStore(StoreContract):
    copy_threads: ClassVar[int | None] = None  # the stores' `copy_threads`

    @pytest.fixture(params=["sync", "background"])
    def store_factory(self, request: pytest.FixtureRequest) -> StoreFactory:
        background = request.param == "background"

        def make(capacity_pages: int | None = None) -> ExternalStore:
            store = MemoryStore(
                capacity_pages=capacity_pages, background=background, copy_threads=self.copy_threads
            )
            made.append(store)
            return store

        made: list[MemoryStore] = []
        yield make
        for store in made:
            if not store._closed:
                store.check_invariants()
            assert store.last_error is None
            store.close()


class TestMemoryStoreLargePages(TestMemoryStore):
    """The contract again with 128 KiB pages: these move one copy each, checksummed piece
    by piece as they land (so a failed load may leave bytes in its own slots)."""

    failed_load_leaves_slots = False

    @pytest.fixture
    def rig(self) -> Rig:
        return LargeRig()


# -- memory-store specifics -----------------------------------------------------------------


def _states(store: MemoryStore) -> list[tuple[str, str]]:
    out = []
    for record in store.recent_jobs():
        if isinstance(record, StoreLoad):
            out.append((record.rid, LOAD_MACHINE.state_of(record)))
        else:
            out.append((f"offload {record.seq}", OFFLOAD_MACHINE.state_of(record)))
    return out


def test_store_side_machines_end_in_the_right_states() -> None:
    rig = Rig()
    store = MemoryStore()
    store.attach(rig.pools)
    keys, other = rig.chain(2), rig.chain(2)
    assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), keys)])
    assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), other)])
    assert load_now(store, "ok", [PoolTransfer(KV, rig.alloc(KV, 2), keys)])
    view = store.stored_bytes(KV, keys[0])
    assert view is not None
    view[0] ^= 1
    assert not load_now(store, "corrupt", [PoolTransfer(KV, rig.alloc(KV, 2), keys)])
    assert not store.contains(KV, keys[0])  # dropped: it is never loaded again
    assert store.load("cancelled", [PoolTransfer(KV, rig.alloc(KV, 2), other)])
    assert store.cancel_queued_load("cancelled")
    assert store.load("reset", [PoolTransfer(KV, rig.alloc(KV, 2), other)])
    assert store.offload([PoolTransfer(KV, rig.fill(KV, 1), rig.chain(1))])
    store.reset()
    assert _states(store) == [
        ("offload 0", StoreOffloadState.LANDED),
        ("offload 1", StoreOffloadState.LANDED),
        ("ok", StoreLoadState.LANDED),
        ("corrupt", StoreLoadState.FAILED),
        ("cancelled", StoreLoadState.CANCELLED),
        ("offload 2", StoreOffloadState.FAILED),
        ("reset", StoreLoadState.FAILED),
    ]
    assert all(
        (LOAD_MACHINE if isinstance(r, StoreLoad) else OFFLOAD_MACHINE).is_final(r)
        for r in store.recent_jobs()
    )
    store.close()


def test_headers_carry_key_pool_length_and_checksum() -> None:
    rig = Rig()
    store = MemoryStore()
    store.attach(rig.pools)
    keys = rig.chain(2)
    src = rig.fill(KV, 2)
    assert offload_now(store, [PoolTransfer(KV, src, keys)])
    header = store.header(KV, keys[1])
    assert header is not None
    assert (header.key, header.pool, header.nbytes) == (keys[1], KV, rig.pools[KV].page_nbytes)
    stored = store.stored_bytes(KV, keys[1])
    assert stored is not None
    assert torch.equal(stored, rig.page(KV, src, 1).view(torch.uint8).reshape(-1))
    assert store.header(SWA, keys[1]) is None and store.stored_bytes(KV, rig.chain(1)[0]) is None
    assert sorted(store.stored_keys(KV)) == sorted(keys) and store.num_pages == 2
    store.close()


def test_reattach_is_refused_while_busy_and_checks_layouts() -> None:
    rig = Rig()
    store = MemoryStore()
    store.attach(rig.pools)
    keys = rig.chain(1)
    assert store.offload([PoolTransfer(KV, rig.fill(KV, 1), keys)])
    with pytest.raises(StoreStateError):
        store.attach(rig.pools)
    store.progress()
    drain(store)
    with pytest.raises(StoreConfigError, match="bytes"):
        store.attach({KV: KVPool(64, Rig.P, 3, Rig.WIDTH)})
    store.attach(rig.pools)
    store.close()


def test_constructor_arguments_are_checked() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(StoreConfigError):
            MemoryStore(capacity_pages=bad)  # type: ignore[arg-type]
    with pytest.raises(StoreConfigError):
        MemoryStore(history=-1)


def test_scattered_rows_and_slab_growth_keep_bytes_exact() -> None:
    rig = Rig(pages=128)
    store = MemoryStore()
    store.attach(rig.pools)
    chains = [(rig.chain(5), rig.fill(KV, 5)) for _ in range(8)]
    for keys, src in chains:
        assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True] * 8
    # punch holes, then store a chain that must take scattered rows
    store.evict([k for keys, _ in chains[::2] for k in keys[1::2]])
    last = (rig.chain(9), rig.fill(KV, 9))
    assert offload_now(store, [PoolTransfer(KV, last[1], last[0])])
    for keys, src in [*chains[1::2], last]:
        dst = rig.alloc(KV, len(keys))
        assert load_now(store, "r", [PoolTransfer(KV, dst, keys)])
        assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    store.check_invariants()
    store.close()


def test_slab_reserves_contiguous_runs_first_then_scattered() -> None:
    from unicache_fsm.store.memory import _Slab

    slab = _Slab(8)
    assert slab.reserve(0) == []
    rows = slab.reserve(10)
    assert rows == list(range(10)) and slab.data.shape[0] == 16 and slab.num_free == 6
    slab.release([1, 2, 5, 7, 8])
    assert slab.num_free == 11
    assert slab.reserve(3) == [10, 11, 12]  # the first run of 3 free rows
    assert slab.reserve(2) == [1, 2]  # a run of 2 exists among the holes
    # no run of 6 among 5, 7, 8, 13, 14, 15: the first free rows, ascending
    assert slab.reserve(6) == [5, 7, 8, 13, 14, 15]
    assert slab.num_free == 0 and not any(slab.free)
    assert slab.reserve(3) == [16, 17, 18]  # grown


def test_slab_grows_in_place_within_its_reserve_and_moves_rows_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from unicache_fsm.store import memory
    from unicache_fsm.store.memory import _Slab

    monkeypatch.setattr(memory, "SLAB_RESERVE_BYTES", 8 * 64)  # 64 rows of 8 bytes
    slab = _Slab(8)
    rows = slab.reserve(16)
    slab.data[rows] = torch.arange(16, dtype=torch.uint8).view(16, 1)
    first = slab.data.data_ptr()
    rows += slab.reserve(30)  # grown within the reserve: the rows did not move
    assert slab.data.shape[0] == 46 and slab.data.data_ptr() == first
    slab.data[rows[16:]] = torch.arange(16, 46, dtype=torch.uint8).view(30, 1)
    rows += slab.reserve(40)  # past the reserve: moved, bytes kept
    assert slab.data.shape[0] >= 86 and slab.num_free == slab.data.shape[0] - 86
    assert slab.data[rows[:46], 0].tolist() == list(range(46))


def test_slab_copy_holds_the_rows_in_use_apart_from_the_original() -> None:
    import copy

    from unicache_fsm.store.memory import _Slab

    slab = _Slab(8)
    rows = slab.reserve(5)
    slab.data[rows] = torch.arange(5, dtype=torch.uint8).view(5, 1)
    slab.release([3])
    twin = copy.deepcopy(slab)
    assert twin.data.shape == slab.data.shape and torch.equal(twin.data, slab.data)
    assert twin.free == slab.free and twin.num_free == slab.num_free
    twin.data[0] = 99
    twin.reserve(1)
    assert slab.data[0, 0].item() == 0 and slab.free[3] == 1  # the original is untouched


def test_slab_copy_reserves_no_address_space_past_its_rows() -> None:
    """A search deep-copies stores at every step: a copy holds its rows in use and no
    reserve (which would cost an allocation of `SLAB_RESERVE_BYTES` of address space
    per copy and pool); it reserves when it first grows, keeping its bytes."""
    import copy

    from unicache_fsm.store.memory import _Slab

    slab = _Slab(8)
    rows = slab.reserve(5)
    slab.data[rows] = torch.arange(5, dtype=torch.uint8).view(5, 1)
    twin = copy.deepcopy(slab)
    assert twin.data.untyped_storage().nbytes() == twin.data.nbytes == slab.data.nbytes
    more = twin.reserve(40)
    assert twin.data[rows, 0].tolist() == list(range(5)) and len(set(rows + more)) == 45
    assert slab.data.shape[0] == 16 and slab.num_free == 11  # the original is untouched


def test_background_store_completes_without_progress() -> None:
    rig = Rig()
    store = MemoryStore(background=True)
    store.attach(rig.pools)
    keys = rig.chain(3)
    assert store.offload([PoolTransfer(KV, rig.fill(KV, 3), keys)])
    deadline = time.monotonic() + 10
    while store.num_completed_offloads() == 0:
        assert time.monotonic() < deadline, "worker never completed the offload"
        time.sleep(0.001)
    assert store.pop_completed_offload()
    store.close()
    assert store._worker is not None and not store._worker.is_alive()


# -- Hypothesis: the memory store against a model -------------------------------------------
# The public kit's `unicache_fsm.testing.store_machine.MemoryStoreMachine` is that machine;
# tests/test_testing_store.py runs it.


def test_lookup_result_reports_every_figure_of_the_rules() -> None:
    keys = Rig().chain(6)
    held = {KV: set(keys), SWA: {keys[0], keys[3], keys[4]}, MAMBA: {keys[3]}}

    def present(pool: PoolName, ks: Sequence[str]) -> list[bool]:
        return [k in held[pool] for k in ks]

    result = lookup_result(kv_lookup(keys, swa=2), present)
    assert result == PoolTransferResult(5, {"swa": 5}, (1, 5))
    result = lookup_result(kv_lookup(keys, swa=2, mamba=1), present)
    assert result == PoolTransferResult(0, {"swa": 5, "mamba": 4}, ())
    assert restorable_prefix_pages(kv_lookup(keys, mamba=1), present) == [4]
    held[KV].discard(keys[2])  # the KV run bounds everything
    assert lookup_result(kv_lookup(keys, swa=2), present) == PoolTransferResult(1, {"swa": 1}, (1,))
    assert lookup_result(kv_lookup([]), present) == PoolTransferResult(0, {}, ())


@pytest.mark.parametrize("background", [False, True])
def test_calls_from_many_threads_keep_the_books(background: bool) -> None:
    rig = Rig(pages=256)
    store = MemoryStore(background=background, capacity_pages=40)
    store.attach(rig.pools)
    work = [(rig.chain(4), rig.fill(KV, 4), rig.alloc(KV, 4)) for _ in range(8)]
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            keys, src, dst = work[i]
            assert store.offload([PoolTransfer(KV, src, keys)])
            store.progress()
            store.lookup(f"r{i}", kv_lookup(keys))
            if store.load(f"r{i}", [PoolTransfer(KV, dst, keys)]):
                store.start_loading()
            store.progress()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store.progress()
    loads, offloads = drain(store)
    assert offloads == [True] * len(work)
    landed = {rid for r in loads if r.success for rid in r.rids}
    assert sum(len(r.rids) for r in loads) == len({rid for r in loads for rid in r.rids})
    for i, (_, src, dst) in enumerate(work):
        if f"r{i}" in landed:
            assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    store.check_invariants()
    assert store.last_error is None
    store.close()
