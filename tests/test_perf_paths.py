"""Issue 16's fast paths, side by side with the simple path each one replaces: the same
answers for good input, the same typed errors (and nothing changed) for bad input."""

from __future__ import annotations

import random

import pytest
import torch

from unicache_fsm import hashing
from unicache_fsm.linker import ranks
from unicache_fsm.linker.load import LoadState
from unicache_fsm.pools import KVPool, PagedAllocator, slots
from unicache_fsm.pools.errors import PoolError
from unicache_fsm.pools.transfer import (
    InvalidPageKeyError,
    PoolName,
    PoolTransfer,
    check_page_key,
    check_page_keys,
)
from unicache_fsm.scheduler import SimConfig, Simulation
from unicache_fsm.scheduler.report import dispatch_cost
from unicache_fsm.serving import invariants as inv
from unicache_fsm.serving.kv import POISON, same_kv
from unicache_fsm.serving.system import System
from unicache_fsm.tree import EvictParams, InsertParams, RadixTree, TreeConfig
from unicache_fsm.tree.components import select_adopted_pages
from unicache_fsm.tree.residency import BACKING_UP, ExecutorKind

KV = PoolName.KV


def _outcome(call: object) -> tuple[str, object]:
    assert callable(call)
    try:
        got = call()
    except (PoolError, ranks.RankGroupError, InvalidPageKeyError) as exc:
        return type(exc).__name__, str(exc)
    return "ok", got.tolist() if isinstance(got, torch.Tensor) else got


# -- select_adopted_pages ------------------------------------------------------------------
def _select_by_mask(
    transfer: PoolTransfer,
    ranges: list[tuple[int, int]],
    prefix_len: int,
    p: int,
    extra: torch.Tensor,
) -> tuple[tuple[list[int], tuple[str, ...]] | None, list[int] | None]:
    """The simple path: a page mask, a slot mask, boolean indexing."""
    assert transfer.device_indices is not None
    n = transfer.num_pages
    coverage = prefix_len - n * p
    keep = torch.zeros(n, dtype=torch.bool)
    for start, end in ranges:
        lo, hi = max(start, coverage), min(end, prefix_len)
        if lo < hi:
            keep[(lo - coverage) // p : (hi - coverage) // p] = True
    if not bool(keep.any()):
        return None, None
    pages = keep.nonzero().flatten().tolist()
    mask = keep.repeat_interleave(p)
    return (
        (transfer.device_indices[mask].tolist(), tuple(transfer.keys[i] for i in pages)),
        extra[mask].tolist(),
    )


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_select_adopted_pages_agrees_with_the_mask_path(page_size: int) -> None:
    rng = random.Random(page_size)
    p = page_size
    for _ in range(200):
        n = rng.randint(1, 12)
        prefix_len = (rng.randint(0, 4) + n) * p
        keys = hashing.page_hashes(list(range(rng.randint(0, 10**6), 10**7)[: n * p]), p)
        idx = torch.tensor(rng.sample(range(p, 10**5), n * p), dtype=torch.int64)
        transfer = PoolTransfer(KV, idx, tuple(keys))
        extra = torch.tensor(rng.sample(range(10**5), n * p), dtype=torch.int64)
        ranges, at = [], 0
        while at < prefix_len:  # sorted, disjoint, page-aligned ranges (as inserts record)
            lo = at + rng.randint(0, 3) * p
            hi = lo + rng.randint(1, 4) * p
            if hi > prefix_len + 2 * p:
                break
            ranges.append((lo, hi))
            at = hi + p
        cut, cut_extra = select_adopted_pages(transfer, ranges, prefix_len, p, extra)
        want, want_extra = _select_by_mask(transfer, ranges, prefix_len, p, extra)
        if want is None:
            assert cut is None and cut_extra is None
            continue
        assert cut is not None and cut.device_indices is not None and cut_extra is not None
        assert (cut.device_indices.tolist(), cut.keys) == want
        assert cut_extra.tolist() == want_extra
        assert cut.name is KV and cut.hit_policy is transfer.hit_policy


# -- PagedAllocator.free_page_list -----------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 16])
def test_free_page_list_agrees_with_free_of_the_pages_slots(page_size: int) -> None:
    rng = random.Random(page_size)
    p = page_size
    kinds = ("good", "free", "twice", "page0", "beyond", "negative", "not_int", "bool")
    for kind in kinds * 5:
        ids: list[object] = rng.sample(range(5, 25), rng.randint(1, 5))
        extra = {
            "free": rng.randint(1, 4),
            "twice": ids[0],
            "page0": 0,
            "beyond": 33,
            "negative": -2,
            "not_int": 7.0,
            "bool": True,
        }
        if kind != "good":
            ids.insert(rng.randrange(len(ids) + 1), extra[kind])
        outcomes, states = [], []
        for by_id in (True, False):
            alloc = PagedAllocator(32 * p, p)
            taken = alloc.alloc(24 * p)
            assert taken is not None
            alloc.free(taken[: 4 * p])  # pages 1 .. 4 are free again
            before = alloc.allocated_page_ids().tolist()
            if by_id:
                outcome = _outcome(lambda a=alloc, i=ids: a.free_page_list(i, "pages to free"))
            elif kind in ("not_int", "bool"):
                outcome = ("TensorTypeError", None)  # no slot tensor holds such a page id
            else:
                pages = torch.tensor(ids, dtype=torch.int64)
                slots_ = (pages.unsqueeze(1) * p + torch.arange(p)).reshape(-1)
                outcome = _outcome(lambda a=alloc, s=slots_: a.free(s))
            outcomes.append((outcome[0], None if outcome[0] == "ok" else kind))
            after = alloc.allocated_page_ids().tolist()
            if outcome[0] != "ok":
                assert after == before  # a refused call changes nothing
            states.append(after)
        assert outcomes[0] == outcomes[1], (kind, outcomes)
        assert states[0] == states[1]


# -- KVPool.write_pages: the list path and the tensor path -----------------------------------
@pytest.mark.parametrize("pages", [1, 3, 9, 20])
def test_kv_write_pages_small_and_tensor_paths_agree(
    pages: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = 16
    results = []
    for small in (slots.SMALL_SLOTS, 0):
        monkeypatch.setattr(slots, "SMALL_SLOTS", small)
        alloc = PagedAllocator(64 * p, p)
        pool = KVPool(64 * p, p, 2, 4)
        s = alloc.alloc(pages * p)
        assert s is not None
        rows = torch.arange(pages * p * 8, dtype=torch.float16).view(-1, 2, 4)
        pool.write_pages(s, rows)
        twice = torch.cat([s, s[:p]])
        data = torch.cat([rows, rows[:p]])
        bad = _outcome(lambda pool=pool, t=twice, d=data: pool.write_pages(t, d))
        results.append((pool.data.clone(), bad[0]))
    assert torch.equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1] == "DuplicatePagesError"


# -- check_page_keys -----------------------------------------------------------------------
def test_check_page_keys_agrees_with_checking_each_key() -> None:
    rng = random.Random(0)
    good = hashing.page_hashes(list(range(64)), 4)
    bad = ["../etc", good[0].upper(), good[0][:-1], 7, None, b"x" * 64]
    for _ in range(300):
        keys = rng.sample(good, rng.randint(0, 5))
        if rng.random() < 0.5:
            keys.insert(rng.randrange(len(keys) + 1), rng.choice(bad))
        for shape in (tuple, list):
            given = shape(keys)
            batch = _outcome(lambda k=given: check_page_keys(k))
            each = _outcome(lambda k=keys: tuple(check_page_key(x) for x in k))
            assert batch[0] == each[0], keys
            if batch[0] == "ok":
                assert batch[1] == each[1]
    assert _outcome(lambda: check_page_keys(good[0]))[0] == "InvalidPageKeyError"  # one str


# -- rank reductions -----------------------------------------------------------------------
def test_int_checks_of_rank_reductions_agree_with_the_loop() -> None:
    rng = random.Random(1)
    group = ranks.SingleRank()
    odd: list[object] = [True, 2.0, "3", None]
    for _ in range(300):
        n = rng.randint(0, 8)
        values: list[object] = [rng.randint(0, 9) for _ in range(rng.randint(0, 6))]
        if rng.random() < 0.3:
            values.insert(rng.randrange(len(values) + 1), rng.choice(odd))
        if rng.random() < 0.3:
            values.append(rng.choice([0, n + 1, -1]))
        reduced = _outcome(lambda v=values: group.all_reduce_min(v))  # type: ignore[arg-type]
        assert reduced[0] == ("ok" if all(type(v) is int for v in values) else "RankGroupError")
        if reduced[0] == "ok":
            assert reduced[1] == values
        fast = _outcome(lambda v=values, n=n: ranks.intersect_restorable(group, v, n))  # type: ignore[arg-type]
        inside = [v for v in values if type(v) is int and 1 <= v <= n]
        if len(inside) != len(values):
            assert fast[0] == "RankGroupError"
        else:
            assert fast == ("ok", max(inside, default=0))


# -- the dispatch calibration, once per process --------------------------------------------
def test_dispatch_cost_is_measured_once_per_executor_class_and_spec() -> None:
    one = Simulation(SimConfig(requests=4)).executors
    two = Simulation(SimConfig(requests=4)).executors
    ref = Simulation(SimConfig(requests=4, executor=ExecutorKind.REFERENCE)).executors
    for a, b, r in zip(one, two, ref, strict=True):
        assert type(a) is type(b) and a is not b and a.spec == b.spec
        cost = dispatch_cost(a)
        assert cost > 0 and dispatch_cost(b) == cost  # reused, not measured again
        assert dispatch_cost(r) > 0 and type(r) is not type(a)  # measured on its own


# -- the tree frees an evicted node's pages by id --------------------------------------------
@pytest.mark.parametrize("page_size", [1, 16])
def test_eviction_frees_the_same_pages_by_id_as_by_slots(page_size: int) -> None:
    """`check_slots` on (ids from the ownership books) and off (`free` of the slots)."""
    p = page_size
    rng = random.Random(p)
    keys = [tuple(rng.randrange(1, 9) for _ in range(rng.randint(1, 6) * p)) for _ in range(40)]
    states = []
    for check in (True, False):
        alloc = PagedAllocator(256 * p, p)
        tree = RadixTree(alloc, TreeConfig(check_slots=check))
        for key in keys:
            m = tree.match_prefix(key)
            fresh = alloc.alloc(len(key) - m.prefix_len)
            assert fresh is not None
            tree.insert(InsertParams(key, torch.cat([m.device_indices, fresh]), m.prefix_len))
        freed = [tree.evict(EvictParams(num_tokens=3 * p)).num_tokens for _ in range(8)]
        tree.check()
        states.append((freed, alloc.allocated_page_ids().tolist(), alloc.available_size()))
    assert states[0] == states[1]


def test_an_evicted_node_whose_pages_were_freed_behind_the_trees_back_is_a_double_free() -> None:
    alloc = PagedAllocator(64 * 4, 4)
    tree = RadixTree(alloc)
    key = tuple(range(1, 9))
    value = alloc.alloc(8)
    assert value is not None
    tree.insert(InsertParams(key, value))
    alloc.free(value[:4])  # a caller's bug: a page the tree holds
    with pytest.raises(PoolError, match="double free"):
        tree.evict(EvictParams(num_tokens=8))


# -- load verification ---------------------------------------------------------------------
class _CorruptingSimulation(Simulation):
    """Garbles one page of every loaded span just before it is verified (and restores
    it after, so the audits still pass)."""

    def _verify(self, req, load):  # type: ignore[no-untyped-def]
        assert load.slots is not None
        page = load.slots[load.device_hit_len : load.device_hit_len + self.page_size]
        saved = self.kv.read_pages(page)
        self.kv.write_pages(page, torch.full_like(saved, POISON))
        try:
            super()._verify(req, load)
        finally:
            self.kv.write_pages(page, saved)


def test_load_verification_catches_a_garbled_loaded_page() -> None:
    config = SimConfig(requests=120, audit_every=10)
    clean = Simulation(config).run()
    assert clean.loads_committed > 0 and clean.loads_mismatched == 0
    bad = _CorruptingSimulation(config).run()
    assert bad.loads_committed == clean.loads_committed
    assert bad.loads_mismatched == bad.loads_committed and bad.loads_verified == 0


# -- the eviction heap's leaf test, one set lookup -------------------------------------------
def test_evictable_leaf_agrees_with_the_node_flags() -> None:
    s = System.build(4, full_pages=96, host_pages=32)
    rng = random.Random(3)
    stems = [tuple(rng.randrange(1, 50) for _ in range(8)) for _ in range(3)]
    seen: set[str] = set()
    for i in range(12):
        key = rng.choice(stems) + tuple(rng.randrange(1, 50) for _ in range(rng.randint(1, 3) * 4))
        s.compute(f"r{i}", key, settle=i % 3 == 0)  # some offloads stay in flight
        if i % 4 == 1:
            s.lock(s.tree.match_prefix(key).last_device_node)
        if i == 6:
            s.tree.evict(EvictParams(num_tokens=16))
        for n in [s.tree.root, *s.tree.nodes()]:
            seen.add(n.residency)
            simple = (
                n.parent is not None
                and n.device_resident
                and n.lock_ref == 0
                and not n.offloading
                and n.residency not in BACKING_UP
                and not any(c.device_resident for c in n.children.values())
            )
            assert s.tree.evictable_leaf(n) == simple, n
    assert len(seen) > 2  # offloading, stored, ... not only one residency


# -- KV writes into a CPU pool: NumPy row assignment / page by page vs index_copy_ ----------
@pytest.mark.parametrize(("page_size", "width"), [(1, 4), (16, 64), (16, 512)])
def test_kv_write_page_ids_matches_index_copy(page_size: int, width: int) -> None:
    """4 KiB pages take the NumPy row assignment, 32 KiB ones the per-page copy."""
    rng = random.Random(width)
    pool = KVPool(64 * page_size, page_size, 2, width)
    reference = pool.data.clone().view(65, -1)
    for _ in range(20):
        pages = torch.tensor(rng.sample(range(1, 65), rng.randint(1, 12)), dtype=torch.int64)
        data = torch.randn(len(pages) * page_size, 2, width).to(pool.dtype)
        pool.write_page_ids(pages, data)
        reference.index_copy_(0, pages, data.reshape(len(pages), -1))
        assert torch.equal(pool.data.view(65, -1), reference)
    view = pool.data[page_size : 3 * page_size]  # data that is a view of the pool itself
    expected = view.clone()
    pool.write_page_ids(torch.tensor([2, 1]), view)
    assert torch.equal(pool.data[page_size : 3 * page_size], expected.roll(page_size, 0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("page_size", "width"), [(4, 4), (16, 512)])
def test_kv_write_page_ids_of_strided_data_and_other_dtypes(
    page_size: int, width: int, dtype: torch.dtype
) -> None:
    """Non-contiguous data, a dtype NumPy cannot view (bfloat16: the torch path), a
    tensor that requires grad, and overlapping views of the pool: index_copy_'s rows."""
    rng = random.Random(page_size * width)
    pool = KVPool(32 * page_size, page_size, 2, width, dtype=dtype)
    pool.data.copy_(torch.randn(pool.data.shape).to(dtype))
    reference = pool.data.clone().view(33, -1)
    for k in range(12):
        pages = torch.tensor(rng.sample(range(1, 33), rng.randint(1, 6)), dtype=torch.int64)
        n = len(pages) * page_size
        if k % 3 == 0:  # strided: [n, width, 2] transposed to [n, 2, width]
            data = torch.randn(n, width, 2).to(dtype).transpose(1, 2)
        elif k % 3 == 1:
            data = (
                torch.randn(n, 2, width, dtype=torch.float32)
                .to(dtype)
                .requires_grad_(dtype.is_floating_point)
            )
        else:  # the pool's own rows, shifted by one page: overlaps the destination
            data = pool.data[page_size : n + page_size]
        want = data.detach().reshape(len(pages), -1).clone()
        pool.write_page_ids(pages, data)
        reference.index_copy_(0, pages, want)
        assert torch.equal(pool.data.view(33, -1), reference)


@pytest.mark.parametrize(("page_size", "width"), [(1, 4), (16, 64), (16, 512)])
def test_kv_read_page_ids_matches_index_select(page_size: int, width: int) -> None:
    """32 KiB pages are read page by page, smaller ones by index_select: the same rows,
    into a fresh tensor or into `out`, repeated pages included."""
    rng = random.Random(width + 1)
    pool = KVPool(64 * page_size, page_size, 2, width)
    pool.data.copy_(torch.randn(pool.data.shape).to(pool.dtype))
    rows = pool.data.view(65, -1)
    for _ in range(20):
        pages = torch.tensor(
            [rng.randrange(1, 65) for _ in range(rng.randint(0, 12))], dtype=torch.int64
        )
        want = rows.index_select(0, pages).view(-1, 2, width)
        assert torch.equal(pool.read_page_ids(pages), want)
        out = torch.full_like(want, 3.0)
        assert pool.read_page_ids(pages, out=out) is out
        assert torch.equal(out, want)


# -- page digests: the memo against SHA-256 itself ------------------------------------------
def test_page_digests_memo_gives_the_chained_sha256(monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    rng = random.Random(5)
    for limit in (hashing.DIGEST_MEMO_SIZE, 3):  # the default bound, and one cleared often
        monkeypatch.setattr(hashing, "DIGEST_MEMO_SIZE", limit)
        for _ in range(100):
            p = rng.choice((1, 4, 16))
            tokens = [rng.randrange(0, 5) for _ in range(rng.randint(0, 6) * p + rng.randint(0, 2))]
            packed = hashing.pack_tokens(tokens)
            prior = rng.choice((b"", hashlib.sha256(b"seed").digest()))
            want, prev = [], prior
            for start in range(0, len(packed) // (4 * p) * 4 * p, 4 * p):
                prev = hashlib.sha256(prev + packed[start : start + 4 * p]).digest()
                want.append(prev)
            # the memo is the Python path's (native=False); the native chain has none
            for native in (False, True):
                assert hashing.page_digests(packed, p, prior, native=native) == want
            assert hashing.page_digests(packed, p, prior, native=False) == want  # recalled


# -- same_kv: NumPy's comparison against torch.equal of the bytes ---------------------------
def test_same_kv_agrees_with_torch_equal_of_the_bytes() -> None:
    rng = random.Random(9)
    for _ in range(200):
        shape = (rng.randint(0, 9), 2, rng.choice((1, 3, 4, 64)))
        a = torch.randn(*shape).to(torch.float16)
        b = a.clone()
        if a.numel() and rng.random() < 0.5:
            b.view(-1)[rng.randrange(a.numel())] += 1
        if rng.random() < 0.2:
            b = b.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
        want = torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        assert same_kv(a, b) == want
    assert not same_kv(torch.zeros(4, 2, 2), torch.zeros(4, 2, 2, dtype=torch.float16))
    assert not same_kv(torch.zeros(4, 2, 2), torch.zeros(2, 4, 2))


# -- all_members: a NumPy mark table against torch.isin ------------------------------------
def test_all_members_agrees_with_torch_isin() -> None:
    rng = random.Random(16)
    cases = [
        ([], []),
        ([], [3]),
        ([3], []),
        ([0], [0]),
        ([-1], [0, 1]),  # negative ids: the torch path
        ([5], [-2, 5]),
        ([1 << 30], [1 << 30]),  # past the mark table's bound: the torch path
        ([7], [1, 2, 3]),  # larger than every member
    ]
    for _ in range(300):
        within = [rng.randrange(0, 200) for _ in range(rng.randint(0, 40))]
        pool = within if within and rng.random() < 0.7 else list(range(0, 220))
        values = [rng.choice(pool) for _ in range(rng.randint(0, 30))]
        cases.append((values, within))
    for values, within in cases:
        v = torch.tensor(values, dtype=torch.int64)
        w = torch.tensor(within, dtype=torch.int64)
        want = bool(torch.isin(v, w).all())
        assert inv.all_members(v, w) == want, (values, within)


def test_committed_load_sound_names_a_kept_slot_the_tree_does_not_own() -> None:
    system = System.build(4, full_pages=16)
    system.compute("a", list(range(16)))
    system.evict_all()  # the store holds the prefix; the device does not
    req = system.begin("b", list(range(16)))
    system.drive(audit=False)
    load = req.load
    assert load is not None and load.state == LoadState.COMMITTED
    inv.committed_load_sound(system.tree, load)  # sound as committed
    kv = next(t for t in load.committed if t.name is KV)
    assert kv.device_indices is not None
    free = system.allocator.alloc(4)
    assert free is not None
    kv.device_indices[:4] = free  # a kept page the tree does not own
    with pytest.raises(inv.InvariantViolation, match="does not own"):
        inv.committed_load_sound(system.tree, load)


# -- KVPool.fill_pages: one fill against writing rows of the value --------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 4])
def test_fill_pages_agrees_with_writing_rows_of_the_value(
    page_size: int, dtype: torch.dtype
) -> None:
    p = page_size
    a = PagedAllocator(32 * p, p)
    pool = KVPool.for_allocator(a, 2, 3, dtype=dtype)
    twin = KVPool.for_allocator(a, 2, 3, dtype=dtype)
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(pool.data.shape, generator=gen).to(dtype)
    pool.data.copy_(start)
    twin.data.copy_(start)
    slots = a.alloc(6 * p)
    assert slots is not None
    pool.fill_pages(slots, POISON)
    twin.write_pages(slots, torch.full((6 * p, 2, 3), POISON, dtype=dtype))
    assert torch.equal(pool.data, twin.data)
    # a repeated page gets the value like every other
    again = torch.cat([slots[:p], slots[:p]])
    pool.fill_pages(again, -1.0)
    twin.write_pages(slots[:p], torch.full((p, 2, 3), -1.0, dtype=dtype))
    assert torch.equal(pool.data, twin.data)
    # bad slots: the read path's typed error, and nothing changed
    before = pool.data.clone()
    for bad in (torch.tensor([0] * p), slots[: p + 1] if p > 1 else torch.tensor([10**6])):
        with pytest.raises(PoolError) as fill_err:
            pool.fill_pages(bad, 7.0)
        with pytest.raises(PoolError) as read_err:
            pool.read_pages(bad)
        assert type(fill_err.value) is type(read_err.value)
    with pytest.raises(PoolError, match="fill value"):
        pool.fill_pages(slots, "x")  # type: ignore[arg-type]
    assert torch.equal(pool.data, before)


# -- the pool's cached NumPy rows follow a copy ---------------------------------------------
@pytest.mark.parametrize("width", [3, 4096])  # small pages (one NumPy op), 32 KiB ones
def test_a_copied_pool_and_store_move_their_own_bytes(width: int) -> None:
    """`copy.deepcopy` (and the explorer's snapshot) of a pool and a memory store: the
    copy's page moves read and write the copy's memory, never the original's."""
    import copy

    from unicache_fsm.store import MemoryStore
    from unicache_fsm.testing.explore import snapshot

    p = 4
    a = PagedAllocator(16 * p, p)
    pool = KVPool.for_allocator(a, 2, width)
    store = MemoryStore()
    store.attach({KV: pool})
    src = a.alloc(3 * p)
    assert src is not None
    pool.write_pages(src, torch.full((3 * p, 2, width), 5.0, dtype=pool.dtype))
    keys = hashing.page_hashes(list(range(3 * p)), p)
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert store.pop_completed_offload()
    original = pool.data.clone()
    free = a.free_page_ids()
    copies = [copy.deepcopy({"a": a, "pool": pool, "store": store})]
    copies.append(snapshot({"s": {"a": a, "pool": pool, "store": store}})["s"])
    for c in copies:
        pool2, store2, a2 = c["pool"], c["store"], c["a"]
        pool2.fill_pages(src, 1.0)
        pool2.write_pages(src[:p], torch.full((p, 2, width), 2.0, dtype=pool.dtype))
        assert torch.equal(pool.data, original)  # the original is untouched
        assert float(pool2.read_pages(src[:p]).max()) == 2.0
        dst = a2.alloc(3 * p)
        assert dst is not None
        assert store2.load("r", [PoolTransfer(KV, dst, keys)])
        store2.start_loading()
        store2.progress()
        assert store2.pop_completed_load().success
        assert bool((pool2.read_pages(dst) == 5.0).all())  # landed in the copy's pool
        assert torch.equal(pool.data, original)
        # the copy's allocator pops and pushes its own stack and flags
        assert torch.equal(a.free_page_ids(), free)
        assert a2.free_page_ids().numel() == free.numel() - 3
        a2.free(dst)
        a2.free(src)
        assert a2.free_page_ids().numel() == free.numel() + 3
        assert torch.equal(a.free_page_ids(), free)
        with pytest.raises(PoolError):
            a2.free(src)  # a double free in the copy
        a.free(src)  # the original still holds them
        again = a.alloc(3 * p)
        assert again is not None and sorted(again.tolist()) == sorted(src.tolist())
        store2.close()
    store.close()
