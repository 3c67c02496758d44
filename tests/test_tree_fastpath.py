"""The tree's fast paths keep their contracts: the match handle, packed keys, raw page
digests, the duplicate release and the incrementally kept eviction heap.

Behaviour only (no timing): each test would fail if the fast path returned something
else than the plain definition it replaces.
"""

from __future__ import annotations

import random
from array import array

import pytest
import torch

from unicache_fsm.hashing import (
    InvalidTokenError,
    pack_tokens,
    page_digests,
    page_hashes,
    prior_digest,
)
from unicache_fsm.pools import PagedAllocator
from unicache_fsm.tree import EvictParams, InsertParams, RadixTree, TreeConfig, TreeError
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.walk import packed_common_len


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
