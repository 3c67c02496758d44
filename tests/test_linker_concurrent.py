"""A concurrent insert between a load's LOOKUP and its COMMIT.

Request B finds a prefix in the store and reserves slots for it; before B's load lands,
request C computes (part of) the same prefix and inserts it. At COMMIT the tree already
holds those pages: B's loaded copies are duplicates and are freed, only the pages the
tree adopted are kept (`load.committed`), B's slots are the tree's canonical ones, and
every slot is accounted for.
"""

from __future__ import annotations

import pytest
import torch

from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.testing.system import System, kv_bytes
from unicache_fsm.tree import ComponentType, EvictParams

FULL, SWA = ComponentType.FULL, ComponentType.SWA


def key_of(pages: int, p: int, base: int = 100) -> tuple[int, ...]:
    return tuple(range(base, base + pages * p))


def slots_of(t: PoolTransfer) -> torch.Tensor:
    assert t.device_indices is not None
    return t.device_indices


def reserved_of(s: System, rid: str) -> dict[PoolName, torch.Tensor]:
    load = s.linker.loads[rid]
    return {t.name: slots_of(t).clone() for t in load.transfers}


def free_pages(s: System, pool: PoolName) -> set[int]:
    if pool is PoolName.KV:
        return set(s.allocator.free_page_ids().tolist())
    return set(s.allocator.swa_free_page_ids().tolist())  # type: ignore[union-attr]


def pages_of(slots: torch.Tensor, p: int) -> set[int]:
    return set((slots[::p] // p).tolist())


@pytest.mark.parametrize("p", [1, 16])
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.parametrize("when", ["after_load_back", "after_start_loading"])
@pytest.mark.parametrize("c_pages", [3, 8], ids=["C-partial", "C-whole"])
def test_concurrent_insert_keeps_only_adopted_pages(
    p: int, swa: bool, when: str, c_pages: int
) -> None:
    s = System.build(p, swa=swa)
    x = key_of(8, p)
    s.compute("A", x)
    s.evict_all()
    b = s.begin("B", x)
    assert b.load is not None and b.prepared
    reserved = reserved_of(s, "B")
    if when == "after_start_loading":
        s.linker.start_loading()
        assert b.load.state == "prepared.loading"
    c = s.compute("C", x[: c_pages * p], settle=True)
    s.audit()
    assert c.slots is not None
    canonical_c = c.slots.clone()
    free_before = s.allocator.available_size()

    if when == "after_load_back":
        s.linker.start_loading()
    s.store.progress()
    assert s.linker.finish_loads() == [b.load]
    load = b.load
    assert load.state == "committed" and load.slots is not None
    # C's pages are canonical: B uses them, its own copies of them are gone
    assert torch.equal(load.slots[: c_pages * p], canonical_c)
    assert torch.equal(s.full_bytes(load.slots), kv_bytes(x, 0))
    adopted_pages = 8 - c_pages
    kv = [t for t in load.committed if t.name is PoolName.KV]
    if adopted_pages:
        assert len(kv) == 1
        assert kv[0].num_pages == adopted_pages
        assert torch.equal(slots_of(kv[0]), reserved[PoolName.KV][c_pages * p :])
        assert kv[0].keys == load.tail_hashes[c_pages:]
        assert torch.equal(load.slots[c_pages * p :], slots_of(kv[0]))
    else:
        assert kv == []
    assert s.linker.stats.pages_loaded == adopted_pages
    assert s.linker.stats.pages_duplicate == c_pages
    # every reserved FULL page that was not adopted is free again
    kept = pages_of(slots_of(kv[0]), p) if kv else set()
    dropped = pages_of(reserved[PoolName.KV], p) - kept
    assert len(dropped) == c_pages
    assert dropped <= free_pages(s, PoolName.KV)
    assert s.allocator.available_size() == free_before + c_pages * p
    if swa:
        swa_kept = [t for t in load.committed if t.name is PoolName.SWA]
        kept_swa = pages_of(slots_of(swa_kept[0]), p) if swa_kept else set()
        assert pages_of(reserved[PoolName.SWA], p) - kept_swa <= free_pages(s, PoolName.SWA)
        # B's window reads the right SWA bytes through the mapping
        live, got = s.swa_bytes_of(load.slots)
        assert bool(live[-s.window :].all())
        assert torch.equal(got, kv_bytes(x, 0, swa=True)[live])
    s.audit()
    s.complete(b)
    s.assert_quiet()


@pytest.mark.parametrize("p", [1, 16])
@pytest.mark.parametrize("c_offload_in_flight", [False, True], ids=["C-settled", "C-offloading"])
def test_swa_tombstone_in_the_window_takes_the_loaded_pages(
    p: int, c_offload_in_flight: bool
) -> None:
    """C computed a longer key, so B's window lies on C's SWA tombstone.

    Unlocked, the tombstone takes B's loaded FULL and SWA pages (C's FULL is freed);
    locked by C's offload in flight, it keeps C's FULL and pairs it with B's SWA
    (B's FULL copy is freed).
    """
    s = System.build(p, swa=True, window_pages=2)
    x = key_of(8, p)
    s.compute("A", x)
    s.evict_all()
    b = s.begin("B", x)
    assert b.load is not None and b.prepared
    reserved = reserved_of(s, "B")
    longer = key_of(12, p)  # same first 8 pages, C's window is pages 10..11
    c = s.compute("C", longer, settle=not c_offload_in_flight)
    assert c.slots is not None
    c_window_full = c.slots[6 * p : 8 * p].clone()
    s.audit()
    s.linker.start_loading()
    s.store.progress()
    assert s.linker.finish_loads() == [b.load]
    load = b.load
    assert load.state == "committed" and load.slots is not None
    ctx = load.ctx
    assert ctx is not None
    assert ctx.adopted_ranges.get(ComponentType.SWA) == [(6 * p, 8 * p)]
    swa_kept = [t for t in load.committed if t.name is PoolName.SWA]
    assert len(swa_kept) == 1 and swa_kept[0].num_pages == 2
    kv = [t for t in load.committed if t.name is PoolName.KV]
    if c_offload_in_flight:
        assert kv == [], "a locked tombstone keeps its FULL slots"
        assert torch.equal(load.slots[6 * p : 8 * p], c_window_full)
        assert s.linker.stats.pages_duplicate == 8
    else:
        assert len(kv) == 1 and kv[0].num_pages == 2
        assert torch.equal(slots_of(kv[0]), reserved[PoolName.KV][6 * p :])
        assert torch.equal(load.slots[6 * p : 8 * p], reserved[PoolName.KV][6 * p :])
        assert pages_of(c_window_full, p) <= free_pages(s, PoolName.KV)
    assert torch.equal(s.full_bytes(load.slots), kv_bytes(x, 0))
    live, got = s.swa_bytes_of(load.slots)
    assert bool(live[6 * p : 8 * p].all()) and not bool(live[: 6 * p].any())
    assert torch.equal(got, kv_bytes(x[6 * p :], 6 * p, swa=True))
    s.audit()
    s.drive()
    s.complete(b)
    s.assert_quiet()


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_two_loads_of_one_prefix_in_one_batch(swa: bool) -> None:
    """B and C both load the same prefix: the first commit publishes, the second is all
    duplicates and ends with the first one's slots."""
    p = 4
    s = System.build(p, swa=swa)
    x = key_of(6, p)
    s.compute("A", x)
    s.evict_all()
    b = s.begin("B", x)
    c = s.begin("C", x)
    assert b.prepared and c.prepared and b.load is not None and c.load is not None
    s.audit()
    ended = s.drive()
    assert ended == [b.load, c.load]
    assert b.load.state == c.load.state == "committed"
    assert b.load.slots is not None and c.load.slots is not None
    assert torch.equal(b.load.slots, c.load.slots)
    assert s.linker.stats.pages_loaded == 6 and s.linker.stats.pages_duplicate == 6
    s.complete(b)
    s.complete(c)
    s.assert_quiet()


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_anchor_split_between_load_back_and_commit(swa: bool) -> None:
    """Another request matches inside B's device prefix: the anchor's node splits, the
    linker's lock and path walk still hold."""
    p = 4
    s = System.build(p, swa=swa)
    x = key_of(8, p)
    s.compute("A1", x[: 4 * p])
    s.compute("A2", x)
    s.tree.evict(EvictParams(num_tokens=4 * p))
    b = s.begin("B", x)
    assert b.load is not None and b.prepared and b.match is not None
    anchor = b.load.anchor
    assert anchor.start < 3 * p < anchor.end
    s.compute("C", (*x[: 3 * p], *key_of(2, p, base=700)))  # splits the anchor's node
    assert anchor.start == 3 * p, "the anchor node was not split"
    s.audit()
    s.drive()
    assert b.load.state == "committed" and b.load.slots is not None
    assert torch.equal(b.load.slots[: 4 * p], b.match.device.device_indices)
    assert torch.equal(s.full_bytes(b.load.slots), kv_bytes(x, 0))
    s.complete(b)
    s.assert_quiet()


def test_load_restores_the_window_of_swa_evicted_device_nodes() -> None:
    """The device prefix is cut back where SWA was evicted; the load brings the window
    back, and the tombstone in the window takes the loaded FULL and SWA pages."""
    p = 4
    s = System.build(p, swa=True, window_pages=2)
    y = key_of(7, p)
    x = y[: 6 * p]
    first = s.compute("A1", x[: 2 * p], swa_boundary=0)  # [0, 2P) keeps live SWA
    s.compute("A2", x)  # [2P, 4P) tombstone, [4P, 6P) live
    s.compute("A3", y)  # [6P, 7P) below it: SWA pressure tombstones internal nodes only
    assert first.last_node is not None
    guard = s.lock(first.last_node)
    s.tree.evict(EvictParams(swa_num_tokens=2 * p))  # tombstones [4P, 6P)
    s.unlock(guard)
    assert [n.slots(SWA) is None for n in sorted(s.tree.nodes(), key=lambda n: n.start)] == [
        False,
        True,
        True,
        False,
    ]
    window_node = next(n for n in s.tree.nodes() if n.start == 4 * p)
    assert window_node.slots(FULL) is not None
    old_full = window_node.slots(FULL).clone()
    b = s.begin("B", x)
    assert b.match is not None and b.load is not None
    assert b.match.device.prefix_len == 2 * p and b.match.external_hit_len == 4 * p
    s.drive()
    load = b.load
    assert load.state == "committed" and load.slots is not None
    kv = [t for t in load.committed if t.name is PoolName.KV]
    assert len(kv) == 1 and kv[0].num_pages == 2  # only the window's tombstone adopted
    assert s.linker.stats.pages_duplicate == 2
    assert pages_of(old_full, p) <= free_pages(s, PoolName.KV)
    live, got = s.swa_bytes_of(load.slots)
    assert bool(live[4 * p :].all())
    assert torch.equal(got, kv_bytes(x, 0, swa=True)[live])
    s.complete(b)
    s.assert_quiet()
