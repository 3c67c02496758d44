"""Issue 11's behaviours 1-9: SGLang 0.5.23's tree semantics, one worked example each.

Each example was replayed against SGLang 0.5.23's own `UnifiedRadixCache` (through the
differential harness of `tests/conformance/`), which agrees with every number below;
the tree of the project before these behaviours failed each one. Page size 4 and an
SWA window of 8 tokens unless a test says otherwise. Behaviour 8 (per-node offload
records) is a linker behaviour: `tests/test_linker_offload.py`.
"""

from __future__ import annotations

import torch

from tree_strategies import key_of, request_slots, serve
from unicache_fsm.pools import PagedAllocator, SWAAllocator
from unicache_fsm.tree import (
    ComponentType,
    EvictParams,
    EvictResult,
    InsertParams,
    RadixTree,
    TreeConfig,
    TreeNode,
)

FULL, SWA = ComponentType.FULL, ComponentType.SWA
P = 4
W = 8


def full_tree() -> RadixTree:
    return RadixTree(PagedAllocator(64 * P, P))


def swa_tree(window: int = W, page_size: int = P) -> RadixTree:
    alloc = SWAAllocator(64 * page_size, 64 * page_size, page_size)
    return RadixTree(alloc, TreeConfig(sliding_window_size=window))


def spans(tree: RadixTree) -> dict[tuple[int, int, int], bool]:
    """(first token, start, end) of every node -> whether its SWA is live."""
    return {(n.key[0], n.start, n.end): n.slots(SWA) is not None for n in tree.nodes()}


def alive(node: TreeNode) -> bool:
    return node.device_resident


def test_1_a_split_gives_the_unmatched_suffix_a_fresh_access_time() -> None:
    tree = full_tree()
    a = serve(tree, key_of(8)).last_device_node  # [0, 8), the oldest
    b = serve(tree, key_of(4, base=100)).last_device_node  # another branch, newer
    assert tree.match_prefix(key_of(4)).prefix_len == 4  # splits A at 4
    assert a is not None and b is not None and a.start == 4  # `a` is the suffix now
    # The split stamped the suffix newer than B: B is the least recently used leaf.
    assert tree.evict(EvictParams(num_tokens=1)) == EvictResult(4, 0)
    assert not alive(b) and alive(a)
    tree.check()


def test_2_a_fresh_window_leaf_longer_than_a_window_is_split_at_the_last_window() -> None:
    tree = swa_tree()
    fresh, fresh_swa = request_slots(tree.allocator, 0, 16)
    result = tree.insert(InsertParams(key_of(16), fresh, track_adopted_ranges=True))
    assert result.adopted_ranges == {FULL: [(0, 16)], SWA: [(0, 16)]}
    older, leaf = sorted(tree.nodes(), key=lambda n: n.start)
    assert (older.start, older.end, leaf.start, leaf.end) == (0, 8, 8, 16)
    assert result.last_device_node is leaf
    assert older.slots(SWA) is not None and older.slots(SWA).tolist() == fresh_swa[:8].tolist()
    assert leaf.slots(SWA) is not None and leaf.slots(SWA).tolist() == fresh_swa[8:].tolist()
    # Extended by a page, the tree's SWA LRU puts the older part last: SWA pressure
    # tombstones those 8 tokens only.
    serve(tree, key_of(20))
    assert tree.evict(EvictParams(swa_num_tokens=1)) == EvictResult(0, 8)
    assert spans(tree) == {(1, 0, 8): False, (9, 8, 16): True, (17, 16, 20): True}
    tree.check()


def test_3_swa_pressure_deletes_an_evictable_leaf_outright() -> None:
    tree = swa_tree()
    alloc = tree.allocator
    assert isinstance(alloc, SWAAllocator)
    free_full, free_swa = alloc.available_size(), alloc.available_swa_size()
    serve(tree, key_of(4))
    # The leaf goes, FULL too: 4 FULL and 4 SWA tokens freed and reported.
    assert tree.evict(EvictParams(swa_num_tokens=1)) == EvictResult(4, 4)
    assert list(tree.nodes()) == []
    assert (alloc.available_size(), alloc.available_swa_size()) == (free_full, free_swa)
    tree.check()


def test_4_the_swa_lock_covers_the_trailing_window_only() -> None:
    tree = swa_tree()
    leaf = serve(tree, key_of(16)).last_device_node  # [0, 8) and [8, 16)
    assert leaf is not None and leaf.parent is not None
    older = leaf.parent
    tree.inc_lock_ref(leaf)  # FULL locks the whole path; SWA only [8, 16)
    assert (older.lock_ref, leaf.lock_ref) == (1, 1)
    assert tree.evict(EvictParams(swa_num_tokens=1)) == EvictResult(0, 8)
    assert older.slots(SWA) is None and older.slots(FULL) is not None
    assert leaf.slots(SWA) is not None
    assert tree.evict(EvictParams(num_tokens=100)) == EvictResult(0, 0)  # FULL is locked
    tree.dec_lock_ref(leaf)
    tree.check()


def test_5_swa_eviction_order_is_its_own_lru_refreshed_within_window_plus_a_page() -> None:
    tree = swa_tree()
    a_key, b_key = key_of(24), key_of(24, base=100)
    for key in (a_key, b_key):
        serve(tree, key[:8])  # X = [0, 8)
        serve(tree, key)  # [8, 24) is split: Y = [8, 16), Z = [16, 24)
    assert spans(tree) == {
        (1, 0, 8): True,
        (9, 8, 16): True,
        (17, 16, 24): True,
        (100, 0, 8): True,
        (108, 8, 16): True,
        (116, 16, 24): True,
    }
    # The match refreshes Z and Y (within 8 + 4 tokens of its end), not A's X: X is
    # now the least recent SWA node, behind all of B.
    assert tree.match_prefix(a_key).prefix_len == 24
    assert tree.evict(EvictParams(swa_num_tokens=8)) == EvictResult(0, 8)
    assert spans(tree)[(1, 0, 8)] is False
    assert spans(tree)[(100, 0, 8)] is True
    tree.check()


def test_6_a_match_refreshes_access_times_only_up_to_the_window_cut() -> None:
    tree = swa_tree()
    key = key_of(16)
    serve(tree, key[:8])  # [0, 8), SWA live
    serve(tree, key, swa_bound=16)  # [8, 16): the request's SWA is gone: a tombstone
    other = serve(tree, key_of(4, base=100)).last_device_node  # newer than [8, 16)
    assert tree.match_prefix(key).prefix_len == 8  # cut where the window ends
    # [8, 16) was walked but not refreshed: it is the least recent leaf.
    assert tree.evict(EvictParams(num_tokens=4)) == EvictResult(8, 0)
    assert other is not None and alive(other)
    assert spans(tree) == {(1, 0, 8): True, (100, 0, 4): True}
    tree.check()


def test_7_swa_freed_by_a_full_eviction_counts_toward_swa_num_tokens() -> None:
    tree = swa_tree()
    serve(tree, key_of(4))
    assert tree.evict(EvictParams(num_tokens=4, swa_num_tokens=4)) == EvictResult(4, 4)
    assert list(tree.nodes()) == []
    tree.check()


def test_9_prev_prefix_len_inside_a_tombstone_adopts_the_callers_part_only() -> None:
    """Deviation D5: 0.5.23 would also re-adopt (and then free) the tree's own slots
    below prev_prefix_len."""
    tree = swa_tree()
    key = key_of(20)
    serve(tree, key[:16], swa_bound=8)  # [0, 8) tombstone, [8, 16) live
    tomb = min(tree.nodes(), key=lambda n: n.start)
    tree_full = tomb.slots(FULL)
    assert tree_full is not None and tomb.slots(SWA) is None
    m = tree.match_prefix(key)
    assert m.prefix_len == 16
    # The request reuses the tree's slots for [0, 4) only and brings its own for [4, 20).
    fresh, fresh_swa = request_slots(tree.allocator, 4, 20)
    value = torch.cat([m.device_indices[:4], fresh])
    result = tree.insert(InsertParams(key, value, prev_prefix_len=4, track_adopted_ranges=True))
    assert result.prefix_len == 16
    assert result.adopted_ranges == {FULL: [(4, 8), (16, 20)], SWA: [(4, 8), (16, 20)]}
    lower, upper = sorted((n for n in tree.nodes() if n.start < 8), key=lambda n: n.start)
    assert (lower.start, lower.end, upper.start, upper.end) == (0, 4, 4, 8)
    assert lower.slots(SWA) is None and lower.slots(FULL) is not None
    assert lower.slots(FULL).tolist() == tree_full[:4].tolist()
    assert upper.slots(FULL) is not None and upper.slots(FULL).tolist() == fresh[:4].tolist()
    assert upper.slots(SWA) is not None and upper.slots(SWA).tolist() == fresh_swa[:4].tolist()
    tree.check()
