"""The store's default path after its repeated work was cut: each check still has its
effect at the public boundary, and the shortcuts answer what the long ways answer."""

from __future__ import annotations

import itertools
import random

import attrs
import numpy as np
import pytest
import torch

from test_store_memory import KV, SWA, Rig, drain, kv_lookup, load_now, offload_now
from unicache_fsm.pools import LengthMismatchError, TensorTypeError
from unicache_fsm.pools.transfer import (
    InvalidPageKeyError,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from unicache_fsm.serving.ledger import StoreLedger
from unicache_fsm.store import MemoryStore, StoreTransferError, UnknownPoolError
from unicache_fsm.store.checksum import copy_checksums, page_checksum
from unicache_fsm.store.lookup import lookup_result

TRAILING = PoolHitPolicy.TRAILING_PAGES
Held = dict[PoolName, set[str]]


def _reference_boundaries(
    transfers: list[PoolTransfer], held: dict[PoolName, set[str]]
) -> tuple[tuple[int, ...], dict[str, int]]:
    """The LOOKUP rules of `unicache_fsm.store.lookup`, spelled out one boundary at a time."""
    kv = transfers[0]
    run = 0
    while run < len(kv.keys) and kv.keys[run] in held[KV]:
        run += 1
    extra: dict[str, int] = {}
    ok = set(range(1, run + 1))
    for t in transfers[1:]:
        mine = set()
        for b in range(1, run + 1):
            if t.hit_policy is PoolHitPolicy.ALL_PAGES:
                need = range(b)
            else:
                need = range(max(0, b - max(1, len(t.keys))), b)
            if all(kv.keys[i] in held[t.name] for i in need):
                mine.add(b)
        extra[str(t.name)] = max(mine, default=0)
        ok &= mine
    return tuple(sorted(ok)), extra


@pytest.mark.parametrize("seed", range(6))
def test_lookup_result_matches_the_rules_spelled_out(seed: int) -> None:
    rng = random.Random(seed)
    rig = Rig()
    for _ in range(40):
        keys = rig.chain(rng.randint(0, 7))
        held = {name: {k for k in keys if rng.random() < 0.8} for name in PoolName}
        transfers = [PoolTransfer(KV, keys=keys)]
        if keys and rng.random() < 0.7:
            n = rng.randint(1, len(keys))
            transfers.append(PoolTransfer(SWA, keys=keys[len(keys) - n :], hit_policy=TRAILING))
        if rng.random() < 0.5:
            transfers.append(PoolTransfer(PoolName.MAMBA, keys=keys))

        def present(
            pool: PoolName, ks: object, held: dict[PoolName, set[str]] = held
        ) -> list[bool]:
            return [k in held[pool] for k in ks]  # type: ignore[attr-defined]

        result = lookup_result(transfers, present)
        boundaries, extra = _reference_boundaries(transfers, held)
        assert result.restorable_prefix_pages == boundaries
        assert result.kv_hit_pages == (boundaries[-1] if boundaries else 0)
        assert result.extra_pool_hit_pages == extra


def test_lookup_still_names_an_unattached_or_unnamed_pool() -> None:
    rig = Rig()
    store = MemoryStore()
    store.attach({KV: rig.pools[KV]})
    keys = rig.chain(2)
    assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), keys)])
    with pytest.raises(UnknownPoolError, match="swa"):
        store.lookup(
            "r", [*kv_lookup(keys), PoolTransfer(SWA, keys=keys[-1:], hit_policy=TRAILING)]
        )
    # a plain string equal to a pool's value is not a pool name
    forged = PoolTransfer(SWA, keys=keys[-1:], hit_policy=TRAILING)
    object.__setattr__(forged, "name", "swa")
    with pytest.raises(UnknownPoolError):
        store.lookup("r", [*kv_lookup(keys), forged])
    # a forged key is refused however the transfer was made
    bad = PoolTransfer(KV, keys=keys)
    object.__setattr__(bad, "keys", (keys[0], "../etc"))
    with pytest.raises(InvalidPageKeyError):
        store.lookup("r", [bad])
    assert store.lookup("r", kv_lookup(keys)) == [1, 2]
    store.close()


@pytest.mark.parametrize("op", ["load", "offload"])
def test_request_errors_name_the_operation_pool_and_slots(op: str) -> None:
    rig = Rig()
    store = MemoryStore()
    store.attach(rig.pools)
    keys = rig.chain(2)
    assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 2), keys)])

    def submit(transfers: list[PoolTransfer]) -> bool:
        return store.load("r", transfers) if op == "load" else store.offload(transfers)

    slots = rig.alloc(SWA, 2)
    forged = PoolTransfer(SWA, slots, keys)
    object.__setattr__(forged, "device_indices", slots.to(torch.int32))
    with pytest.raises(TensorTypeError, match=f"{op} swa device_indices"):
        submit([forged])
    with pytest.raises(LengthMismatchError, match="3 keys"):
        submit([PoolTransfer(SWA, slots, [*keys, rig.chain(1)[0]])])
    with pytest.raises(StoreTransferError, match=f"{op}: the kv transfer has no device_indices"):
        submit([PoolTransfer(KV, keys=keys)])
    unnamed = PoolTransfer(SWA, slots, keys)
    object.__setattr__(unnamed, "name", "swa")
    with pytest.raises(UnknownPoolError):
        submit([unnamed])
    assert store.start_loading() == -1
    store.progress()
    assert drain(store) == ([], [])
    store.close()


def test_offload_capacity_counts_only_the_distinct_pages_it_lacks() -> None:
    rig = Rig()
    store = MemoryStore(capacity_pages=3)
    store.attach(rig.pools)
    keys = rig.chain(3)
    assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, 3), keys)])
    more = [*keys, *rig.chain(3, prefix=keys)]
    # 6 pages named, 3 of them held: 3 new ones could fit (accepted; room is made later)
    assert store.offload([PoolTransfer(KV, rig.fill(KV, 6), more)])
    # the same new key twice is one page; four distinct new ones never fit
    fresh = rig.chain(3)
    assert store.offload([PoolTransfer(KV, rig.fill(KV, 4), [*fresh, fresh[0]])])
    assert not store.offload([PoolTransfer(KV, rig.fill(KV, 4), rig.chain(4))])
    store.progress()
    assert len(drain(store)[1]) == 2
    store.check_invariants()
    store.close()


def test_page_headers_are_answered_and_checked_from_the_book_entries() -> None:
    rig = Rig()
    store = MemoryStore()
    store.attach(rig.pools)
    keys = rig.chain(3)
    src = rig.fill(KV, 3)
    assert offload_now(store, [PoolTransfer(KV, src, keys)])
    for i, key in enumerate(keys):
        header = store.header(KV, key)
        assert header is not None
        expected = page_checksum(rig.page(KV, src, i).view(torch.uint8).reshape(-1))
        assert (header.key, header.pool, header.checksum) == (key, KV, expected)
        assert header == store.header(KV, key)  # (a value: built on request, equal each time)
    dst = rig.alloc(KV, 3)
    assert load_now(store, "ok", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    stored = store.stored_bytes(KV, keys[1])
    assert stored is not None
    stored[0] ^= 1  # corrupt the middle page: it and the chain after it are dropped
    assert not load_now(store, "bad", [PoolTransfer(KV, rig.alloc(KV, 3), keys)])
    assert [store.contains(KV, k) for k in keys] == [True, False, False]
    assert store.rejected_pages == 1
    store.check_invariants()
    store.close()


def test_parent_memo_keeps_the_newest_facts_when_it_overflows() -> None:
    # more pages in one offload than the memo holds: it keeps the last ones stored
    rig = Rig(pages=4200)
    store = MemoryStore()
    store.attach({KV: rig.pools[KV]})
    n = 4100
    keys = rig.chain(n)
    assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, n), keys)])
    _, _, remembered = store.chain_books()
    # every page but the first has a parent; the 4096 newest of those facts are kept
    assert remembered == tuple(sorted((KV, k) for k in keys[n - 4096 :]))
    store.check_invariants()
    store.close()


def test_ledger_records_each_pool_keys_of_an_acknowledged_offload() -> None:
    rig = Rig()
    ledger = StoreLedger(MemoryStore())
    ledger.attach(rig.pools)
    keys = rig.chain(2)
    transfers = [
        PoolTransfer(KV, rig.fill(KV, 2), keys),
        PoolTransfer(SWA, rig.fill(SWA, 1), keys[-1:], TRAILING),
    ]
    assert ledger.offload(transfers)
    ledger.progress()
    assert ledger.pop_completed_offload()
    assert ledger.acknowledged == {(KV, keys[0]), (KV, keys[1]), (SWA, keys[1])}
    # a load batch acknowledges the pages of every load it named, and counts each rid
    ledger.acknowledged.clear()
    assert ledger.load("a", [PoolTransfer(KV, rig.alloc(KV, 1), keys[:1])])
    assert ledger.load("b", [PoolTransfer(SWA, rig.alloc(SWA, 1), keys[1:], TRAILING)])
    batch = ledger.start_loading()
    ledger.progress()
    result = ledger.pop_completed_load()
    assert (result.batch, result.rids, result.success) == (batch, ("a", "b"), True)
    assert ledger.acknowledged == {(KV, keys[0]), (SWA, keys[1])}
    assert ledger.landed_loads == {"a": 1, "b": 1}
    ledger.close()


def test_copy_checksums_rows_of_other_integer_types_and_refusals() -> None:
    src = np.arange(4 * 512, dtype=np.int64).astype(np.uint8).reshape(4, 512)
    dst = np.zeros_like(src)
    want = [page_checksum(memoryview(src[i].tobytes())) for i in (2, 0)]
    for rows in ([2, 0], [np.int64(2), np.int32(0)], np.array([2, 0])):
        dst[:] = 0
        assert copy_checksums(dst, [1, 3], src, rows) == want  # type: ignore[arg-type]
        assert np.array_equal(dst[[1, 3]], src[[2, 0]])
    with pytest.raises(TypeError, match="source row 1 is a bool"):
        copy_checksums(dst, [1, 3], src, [2, True])
    with pytest.raises(TypeError, match="destination holds int8"):
        copy_checksums(dst.view(np.int8), [1], src, [2])
    with pytest.raises(TypeError, match="source holds uint16"):
        copy_checksums(dst, [1], src.view(np.uint16), [2])


def test_pool_transfer_still_refuses_bad_keys_when_built() -> None:
    for bad in (["0" * 63], ("A" * 64,), "0" * 64, [1], itertools.repeat("x", 1)):
        with pytest.raises(InvalidPageKeyError):
            PoolTransfer(KV, keys=bad)


@pytest.mark.parametrize("seed", range(4))
def test_offload_parents_follow_the_rules_whatever_is_held_or_repeated(seed: int) -> None:
    """Offloads naming held pages anywhere, keys twice, held pages with no parent: the
    books end as the page-by-page rules say (a new page's parent is the key before it,
    or for the first the remembered one; a held chain start learns the key before it)."""
    rng = random.Random(seed)
    rig = Rig(pages=400)
    store = MemoryStore()
    store.attach({KV: rig.pools[KV]})
    universe = rig.chain(10)
    pages: dict[tuple[PoolName, str], tuple[PoolName, str] | None] = {}
    memo: dict[tuple[PoolName, str], tuple[PoolName, str]] = {}
    for _ in range(40):
        keys = [rng.choice(universe) for _ in range(rng.randint(1, 7))]
        if rng.random() < 0.3:
            store.evict([rng.choice(universe)])
            pages = {i: p for i, p in pages.items() if store.contains(KV, i[1])}
        seen: set[str] = set()
        born: list[tuple[tuple[PoolName, str], tuple[PoolName, str] | None]] = []
        for i, key in enumerate(keys):
            ident = (KV, key)
            before = (KV, keys[i - 1]) if i else None
            if ident in pages:
                if before is not None and pages[ident] is None and keys[i - 1] != key:
                    pages[ident] = memo[ident] = before
            elif key not in seen:
                born.append((ident, before if i else memo.get(ident)))
            seen.add(key)
        for ident, parent in born:
            pages[ident] = parent
            if parent is not None:
                memo[ident] = parent
        assert offload_now(store, [PoolTransfer(KV, rig.fill(KV, len(keys)), keys)])
        books, _, remembered = store.chain_books()
        assert books == tuple(sorted(pages.items()))
        assert remembered == tuple(sorted(memo))
        store.check_invariants()
    store.close()


def test_pool_transfer_checks_its_indices_and_stays_frozen() -> None:
    keys = Rig().chain(2)
    for bad in (torch.zeros(8, dtype=torch.int32), torch.zeros((2, 4), dtype=torch.int64), [0]):
        with pytest.raises(TensorTypeError, match="kv transfer device_indices"):
            PoolTransfer(KV, bad, keys)  # type: ignore[arg-type]
    t = PoolTransfer(KV, torch.arange(8), keys, TRAILING)
    assert (t.name, t.keys, t.hit_policy) == (KV, tuple(keys), TRAILING)
    assert t == PoolTransfer(KV, None, tuple(keys), TRAILING)  # (indices are not compared)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        t.keys = ()  # type: ignore[misc]
    with pytest.raises(InvalidPageKeyError):
        attrs.evolve(t, keys=("../etc",))
    assert attrs.evolve(t, keys=keys[:1]).keys == (keys[0],)
