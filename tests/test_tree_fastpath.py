"""The tree's fast paths keep their contracts: the match handle, packed keys, raw page
digests, the duplicate release and the incrementally kept eviction heap.

Behaviour only (no timing): each test would fail if the fast path returned something
else than the plain definition it replaces.
"""

from __future__ import annotations

import gc
import random
from array import array

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.hashing import (
    InvalidPriorHashError,
    InvalidTokenError,
    PageSizeError,
    pack_tokens,
    page_digest_bytes,
    page_digests,
    page_hashes,
    prior_digest,
)
from unicache_fsm.pools import PagedAllocator
from unicache_fsm.pools.errors import PoolError
from unicache_fsm.tree import EvictParams, InsertParams, RadixTree, TreeConfig, TreeError
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.walk import TokenKey, pack_key, packed_common_len


def serve(tree: RadixTree, key: tuple[int, ...]) -> None:
    """Match, allocate the tail, insert (a scheduler's step)."""
    m = tree.match_prefix(key)
    fresh = tree.allocator.alloc(len(key) - m.prefix_len)
    assert fresh is not None
    value = torch.cat([m.device_indices, fresh])
    tree.insert(InsertParams(key, value, prev_prefix_len=m.prefix_len))


@pytest.mark.parametrize("page_size", [1, 4])
def test_match_handle_reads_the_path_slots_even_after_a_split(page_size: int) -> None:
    p = page_size
    tree = RadixTree(PagedAllocator(64 * p, p))
    key = tuple(range(1, 8 * p + 1))
    serve(tree, key)
    m = tree.match_prefix(key)
    before = m.device_indices
    assert m.prefix_len == len(key) == before.numel()
    tree.split(m.last_device_node, 3 * p)  # the path changes shape, not its slots
    assert torch.equal(m.device_indices, before)
    got = m.device_indices
    got.fill_(-1)  # the caller's copy, never the tree's
    assert torch.equal(tree.match_prefix(key).device_indices, before)
    tree.check()


def test_match_handle_refuses_a_path_evicted_since_the_match() -> None:
    tree = RadixTree(PagedAllocator(64, 1))
    serve(tree, (1, 2, 3, 4))
    m = tree.match_prefix((1, 2, 3, 4))
    tree.evict(EvictParams(num_tokens=4))
    with pytest.raises(TreeError, match="lost its device slots"):
        _ = m.device_indices


def test_empty_match_is_an_empty_tensor_of_the_tree() -> None:
    tree = RadixTree(PagedAllocator(64, 1))
    m = tree.match_prefix((5, 6))
    assert m.prefix_len == 0 and m.device_indices.dtype == torch.int64
    assert m.device_indices.numel() == 0 and m.last_device_node is tree.root


def test_page_digests_are_the_page_hashes_raw() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(0, 1 << 32) for _ in range(40)]
    seed = "ab" * 32
    digests = page_digests(pack_tokens(tokens), 4, prior_digest(seed))
    assert [d.hex() for d in digests] == page_hashes(tokens, 4, seed)
    assert page_digests(pack_tokens(tokens[:3]), 4) == []


@pytest.mark.parametrize("native", [True, False])
def test_page_digest_bytes_are_the_page_digests_end_to_end(native: bool) -> None:
    rng = random.Random(4)
    for page_size in (1, 3, 16):
        tokens = [rng.randrange(0, 1 << 32) for _ in range(5 * page_size + page_size // 2)]
        packed, prior = pack_tokens(tokens), prior_digest("cd" * 32)
        joined = page_digest_bytes(packed, page_size, prior, native=native)
        assert joined == b"".join(page_digests(packed, page_size, prior, native=False))
        assert len(joined) == 32 * 5
        # bytes-like inputs of other types, and a chain head, take the checked path
        for head in (prior, b""):
            want = page_digest_bytes(packed, page_size, head, native=native)
            for kind in (bytearray, memoryview):
                got = page_digest_bytes(kind(packed), page_size, kind(head), native=native)
                assert got == want
    with pytest.raises(PageSizeError):
        page_digest_bytes(pack_tokens([1, 2, 3, 4]), True, native=native)  # type: ignore[arg-type]
    with pytest.raises(InvalidPriorHashError):
        page_digest_bytes(pack_tokens([1, 2, 3, 4]), 4, b"x" * 33, native=native)
    assert page_digest_bytes(pack_tokens([1, 2]), 4, native=native) == b""
    with pytest.raises(InvalidPriorHashError):
        page_digest_bytes(pack_tokens([1, 2, 3, 4]), 4, b"short", native=native)
    with pytest.raises(PageSizeError):
        page_digest_bytes(pack_tokens([1, 2, 3, 4]), 0, native=native)


def test_a_node_keeps_its_digests_in_one_bytes_object_and_lists_them() -> None:
    tree = RadixTree(PagedAllocator(64, 4))
    key = tuple(range(1, 13))
    serve(tree, key)
    (node,) = [n for n in tree.nodes() if n.parent is not None]
    assert isinstance(node.digest_bytes, bytes) and len(node.digest_bytes) == 3 * 32
    assert node.digests == [node.digest_bytes[i : i + 32] for i in (0, 32, 64)]
    assert node.hashes == page_hashes(key, 4) == [d.hex() for d in node.digests]
    assert node.last_digest() == node.digests[-1] and node.last_hash() == node.hashes[-1]
    assert not gc.is_tracked(node.digest_bytes)  # nothing per page for a collection to visit
    tree.split(node, 4)  # each half keeps its own pages' digests
    top = node.parent
    assert top is not None and top.digests is not None and node.digests is not None
    assert [d.hex() for d in top.digests + node.digests] == page_hashes(key, 4)
    tree.check()


@pytest.mark.parametrize("hash_pages", [True, False])
def test_bad_token_is_refused_before_any_change(hash_pages: bool) -> None:
    tree = RadixTree(PagedAllocator(64, 2), TreeConfig(hash_pages=hash_pages))
    serve(tree, (1, 2, 3, 4))
    bad = (1, 2, 9, -1 if hash_pages else 1 << 64)
    value = tree.allocator.alloc(4)
    assert value is not None
    nodes = [(n.id, n.key) for n in tree.nodes()]
    with pytest.raises(InvalidTokenError) as info:
        tree.insert(InsertParams(bad, value))
    assert info.value.index == 3
    assert [(n.id, n.key) for n in tree.nodes()] == nodes  # no split happened
    tree.allocator.free(value)
    tree.check()


def test_hashes_chain_across_splits_and_nodes() -> None:
    tree = RadixTree(PagedAllocator(256, 2))
    a = tuple(range(1, 17))
    b = a[:6] + tuple(range(100, 110))
    serve(tree, a)
    serve(tree, b)  # splits a's node after 6 tokens
    for key in (a, b):
        node = tree.match_prefix(key).last_device_node
        chain = [h for n in node.path_from_root() for h in n.hashes or []]
        assert chain == page_hashes(key, 2)
    tree.check()


def test_duplicate_insert_frees_exactly_the_callers_duplicates() -> None:
    alloc = PagedAllocator(64 * 4, 4)
    tree = RadixTree(alloc)
    key = tuple(range(1, 17))
    serve(tree, key)
    held = alloc.available_size()
    again = alloc.alloc(16)
    assert again is not None
    tree.insert(InsertParams(key, again))  # every page a duplicate: all go back
    assert alloc.available_size() == held
    again2 = alloc.alloc(16)  # and the freed pages are allocatable once more
    assert again2 is not None and set(again2.tolist()) == set(again.tolist())
    alloc.free(again2)
    tree.check()


def lru_reference(tree: RadixTree) -> list[int]:
    """The eviction order by definition: the LRU evictable leaf, one at a time."""
    order = []
    while True:
        leaves = [n for n in tree.nodes() if tree.evictable_leaf(n)]
        if not leaves:
            return order
        victim = min(leaves, key=lambda n: (n.last_access, n.id))
        order.append(victim.id)
        tree.remove_device_copy(victim)


def test_eviction_heap_evicts_in_lru_order_after_locks_and_touches() -> None:
    def build() -> tuple[RadixTree, list[object]]:
        rng = random.Random(11)
        tree = RadixTree(PagedAllocator(4096, 2))
        keys = []
        for i in range(60):
            head = (rng.randrange(1, 6), rng.randrange(1, 6))
            keys.append((*head, 100 + 2 * i, 101 + 2 * i))
            serve(tree, keys[-1])
        receipts = []
        for i, key in enumerate(keys):
            m = tree.match_prefix(key)
            if i % 7 == 0:
                receipts.append(tree.inc_lock_ref(m.last_device_node))
        for r in receipts[::2]:
            tree.dec_lock_ref(r.node, r)
        tree.check()
        return tree, receipts

    reference, _ = build()
    want = lru_reference(reference)
    tree, _ = build()
    got = []
    while True:
        before = {n.id for n in tree.nodes() if n.device_resident}
        freed = tree.evict(EvictParams(num_tokens=1)).num_tokens
        after = {n.id for n in tree.nodes() if n.device_resident}
        if not freed:
            break
        assert len(before - after) == 1
        got.extend(before - after)
        tree.check()
    assert got == want and got


@pytest.mark.parametrize("hash_pages", [True, False])
@pytest.mark.parametrize("page_size", [1, 2, 16])
def test_packed_common_len_is_the_page_by_page_common_prefix(
    page_size: int, hash_pages: bool
) -> None:
    # the in-place byte compares (whole node, then a binary search over pages) give the
    # common whole-page prefix that a page-by-page tuple comparison gives
    p, rng = page_size, random.Random(page_size)
    fmt, width = ("I", 4) if hash_pages else ("q", 8)
    for _ in range(300):
        mine = [rng.randrange(3) for _ in range(rng.randint(1, 12) * p)]
        pos = rng.randrange(3) * p
        key = [rng.randrange(3) for _ in range(pos)] + mine[:p]  # the first page matches
        for i in range(rng.randint(0, 13) * p):
            same = i + p < len(mine) and rng.random() < 0.9
            key.append(mine[i + p] if same else rng.randrange(3))
        node = TreeNode(id=1, key=tuple(mine), start=0, parent=None)
        node.packed = array(fmt, mine).tobytes()
        end = len(key)
        expected = p
        while (
            expected + p <= min(len(mine), end - pos)
            and key[pos + expected : pos + expected + p] == mine[expected : expected + p]
        ):
            expected += p
        packed = array(fmt, key).tobytes()
        assert packed_common_len(node, packed, pos, end, p, width) == expected


# -- the chain memo of page_digests: prefixes, extensions and divergent chains ----------------
@pytest.mark.parametrize("limit", [None, 3])
def test_page_digests_recalls_prefixes_and_extensions_as_sha256_computes_them(
    limit: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from unicache_fsm import hashing

    if limit is not None:  # a memo cleared often, and chains too long to be kept
        monkeypatch.setattr(hashing, "DIGEST_MEMO_SIZE", limit)

    def reference(packed: bytes, p: int, prior: bytes) -> list[bytes]:
        out, prev = [], prior
        for start in range(0, len(packed) // (4 * p) * 4 * p, 4 * p):
            prev = hashlib.sha256(prev + packed[start : start + 4 * p]).digest()
            out.append(prev)
        return out

    rng = random.Random(11)
    for p in (1, 2):
        base = [rng.randrange(0, 3) for _ in range(8 * p)]
        prior = hashlib.sha256(b"x").digest()
        variants = [
            base,  # computed
            base[: 3 * p],  # a prefix: recalled
            base + [7] * (2 * p),  # an extension: only the new pages hashed
            base + [7] * p + [1],  # a shorter extension with a partial page
            base[: 5 * p] + [9] * (3 * p),  # same first page, diverging mid-way
            base,  # the original chain again (its entry was replaced)
            base[: 2 * p] + [5] * (8 * p),  # longer than the chain kept, diverging in it
            base[p:],  # another first page
        ]
        for tokens in variants:
            for chain_prior in (prior, b""):
                packed = pack_tokens(tokens)
                want = reference(packed, p, chain_prior)
                # the memo is the Python path's (native=False); the native chain has none
                got = page_digests(packed, p, chain_prior, native=False)
                assert got == want
                got.append(b"caller's")  # the caller's list: the memo is not changed
                assert page_digests(packed, p, chain_prior, native=False) == want
                assert page_digests(packed, p, chain_prior) == want


# -- TokenKey: a key that keeps its packing behaves as the tuple of its tokens -----------------
def replay(keys: list[tuple[int, ...]], wrap: bool, p: int, hash_pages: bool) -> list[object]:
    """Serve every key, a third of them a second time as a whole-key insert; return
    what every call answered and the tree's final shape."""
    from unicache_fsm.tree import TokenKey

    tree = RadixTree(PagedAllocator(4096 * p, p), TreeConfig(hash_pages=hash_pages))
    seen: list[object] = []
    for i, raw in enumerate(keys):
        key = TokenKey(raw) if wrap else raw
        m = tree.match_prefix(key)
        seen.append((m.prefix_len, m.device_indices.tolist()))
        fresh = tree.allocator.alloc(len(key) - m.prefix_len)
        assert fresh is not None
        r = tree.insert(
            InsertParams(key, torch.cat([m.device_indices, fresh]), prev_prefix_len=m.prefix_len)
        )
        seen.append((r.prefix_len, r.last_device_node is not None))
        if i % 3 == 0:
            value = tree.allocator.alloc(len(key))
            assert value is not None
            seen.append(tree.insert(InsertParams(key, value)).prefix_len)
    tree.check()
    seen.append(sorted((n.start, n.key, tuple(n.hashes or ())) for n in tree.nodes()))
    return seen


@pytest.mark.parametrize(("page_size", "hash_pages"), [(1, True), (4, True), (4, False)])
def test_a_token_key_serves_like_a_tuple(page_size: int, hash_pages: bool) -> None:
    rng = random.Random(page_size)
    p = page_size
    heads = [tuple(rng.randrange(0, 50) for _ in range(rng.randint(1, 6) * p)) for _ in range(4)]
    keys = [rng.choice(heads)[: rng.randint(0, 6) * p] + (1000 + i,) * p for i in range(60)]
    assert replay(keys, True, p, hash_pages) == replay(keys, False, p, hash_pages)


def test_a_token_key_is_its_tuple_and_refuses_bad_tokens_where_a_tuple_does() -> None:
    from unicache_fsm.tree import TokenKey

    key = TokenKey(torch.tensor([3, 1, 2]))
    assert key == (3, 1, 2) and hash(key) == hash((3, 1, 2)) and type(key[1:]) is tuple
    assert key.packed("I") == pack_tokens((3, 1, 2))
    assert key.packed("q") == array("q", (3, 1, 2)).tobytes()
    wide = TokenKey((1, 1 << 40))  # not u32: packed by the tree, as a tuple would be
    tree = RadixTree(PagedAllocator(16, 1), TreeConfig(hash_pages=False))
    assert tree.match_prefix(wide).prefix_len == 0
    hashed = RadixTree(PagedAllocator(16, 1))
    with pytest.raises(InvalidTokenError) as info:
        hashed.match_prefix(wide)
    assert info.value.index == 1
    with pytest.raises(InvalidTokenError):
        wide.packed("I")


def test_audit_memo_stays_within_its_byte_bound_and_still_checks_hashes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The audit remembers each node's digest chain; a node's key is its whole packed
    key, so the memo is bounded in bytes as well as chains (long keys, many trees)."""
    from unicache_fsm.tree import audit as audit_mod

    bound = 64 << 10
    monkeypatch.setattr(audit_mod, "_CHAINS_BYTES", bound)
    monkeypatch.setattr(audit_mod, "_CHAINS", {})
    monkeypatch.setattr(audit_mod, "_chains_bytes", 0)
    for i in range(12):  # 12 trees of one 8k-token key each: 32 KiB packed per key
        tree = RadixTree(PagedAllocator(8192, 16))
        serve(tree, tuple(range(i, i + 8192)))
        tree.check()
        held = sum(
            len(prior) + len(packed) + len(got)
            for (prior, packed, _), got in audit_mod._CHAINS.items()
        )
        assert held <= bound
    # the memo still answers the chain the key hashes to: a wrong digest is caught
    (node,) = [n for n in tree.nodes() if n.parent is not None]
    assert node.digest_bytes is not None
    node.digest_bytes = bytes(32) + node.digest_bytes[32:]
    with pytest.raises(TreeError, match="page hashes do not chain"):
        tree.check()


def _snapshot(tree: RadixTree) -> tuple[object, ...]:
    """What an insert may change: free pages, every node's key, slots and hashes."""
    nodes = sorted(
        (n.start, n.key, n.data[next(iter(n.data))].tolist(), n.hashes) for n in tree.nodes()
    )
    return tree.allocator.free_page_ids().tolist(), nodes


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("view", ["plain", "negative bit", "strided"])
def test_large_duplicate_inserts_check_and_free_like_the_plain_tensor(
    page_size: int, view: str
) -> None:
    """Inserts past the small-slot paths (NumPy checks, id-list frees) take any view
    of the caller's slots as its values: a negative-bit view or a strided one frees
    and adopts exactly what the plain tensor does; bad slots raise before any change."""
    p = page_size
    rng = random.Random(p)
    head = tuple(rng.randrange(1, 50_000) for _ in range(40 * p))  # 280+ slots a key
    keys = [head + tuple(range(10_000 * i, 10_000 * i + 24 * p)) for i in range(1, 4)]
    results = []
    for form in ("plain", view):
        alloc = PagedAllocator(4096 * p, p)
        tree = RadixTree(alloc)
        for key in keys:
            value = alloc.alloc(len(key))
            assert value is not None
            if form == "negative bit":
                value = (-value)._neg_view()
            elif form == "strided":
                value = torch.stack([value, torch.zeros_like(value)], dim=1)[:, 0]
            tree.insert(InsertParams(key, value))
            # a second insert of the same key: every page a duplicate, all freed
            again = alloc.alloc(len(key))
            assert again is not None
            tree.insert(InsertParams(key, again))
        results.append(_snapshot(tree))
        tree.check()
        # bad slots past prev_prefix_len: a free page, a page named twice, foreign
        key = keys[0][: 32 * p] + tuple(range(90_000, 90_000 + 32 * p))
        m = tree.match_prefix(key)
        fresh = alloc.alloc(len(key) - m.prefix_len)
        assert fresh is not None
        before = _snapshot(tree)
        for spoil in ("free", "twice", "foreign"):
            bad = fresh.clone()
            if spoil == "free":
                alloc.free(fresh[-p:])
                bad[-p:] = fresh[-p:]
            elif spoil == "twice":
                bad[-p:] = bad[:p]
            else:
                bad[-p:] = torch.arange(p) + 10**9 * p
            value = torch.cat([m.device_indices, bad])
            if form == "negative bit":
                value = (-value)._neg_view()
            with pytest.raises(PoolError):
                tree.insert(InsertParams(key, value, prev_prefix_len=m.prefix_len))
            if spoil == "free":
                taken = alloc.alloc(p)  # take the freed page back for the next case
                assert taken is not None and taken.tolist() == fresh[-p:].tolist()
            assert _snapshot(tree) == before
        alloc.free(fresh)
        tree.check()
    assert results[0] == results[1]


@settings(max_examples=100, deadline=None)
@given(
    tokens=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200),
    as_token_key=st.booleans(),
)
def test_int64_packing_is_native_int64s(tokens: list[int], as_token_key: bool) -> None:
    """A hashing-off tree packs keys as native int64 (`pack_key(key, "q")`), one
    `struct` call: the bytes of an int64 array of the tokens, for a tuple or a
    `TokenKey` alike."""
    key = TokenKey(tokens) if as_token_key else tuple(tokens)
    assert pack_key(key, "q") == array("q", tokens).tobytes()


@pytest.mark.parametrize(
    ("key", "index"), [((1, 2**63), 1), ((-(2**63) - 1,), 0), ((3, 1.5), 1), ((None,), 0)]
)
def test_int64_packing_names_the_token_that_does_not_fit(key: tuple[int, ...], index: int) -> None:
    with pytest.raises(InvalidTokenError) as info:
        pack_key(key, "q")
    assert info.value.index == index


def test_an_insert_takes_a_numpy_integer_prev_prefix_len() -> None:
    """The slot check past the prefix reads ``prev_prefix_len`` by its value, whatever
    its integer type (a NumPy integer was refused as a start "outside" the slots)."""
    tree = RadixTree(PagedAllocator(64, 4))
    a, b = tree.allocator.alloc(4), tree.allocator.alloc(4)
    assert a is not None and b is not None
    tree.insert(InsertParams(key=[0, 1, 2, 3], value=a))
    got = tree.insert(
        InsertParams(key=list(range(8)), value=torch.cat([a, b]), prev_prefix_len=np.int64(4))
    )
    assert got.prefix_len == 4
    assert tree.match_prefix(list(range(8))).prefix_len == 8
