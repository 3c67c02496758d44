"""Unit tests of `RadixTree`: the worked examples of docs/contract.md and
reference/sglang_contract_notes.md §4, split preservation, write-through, eviction
(LRU, locks, offloads, the host tier), page hashes and tenant namespaces.

Every test ends with `tree.check()` (passing the slots a request still holds), so a
tree left inconsistent fails the test that built it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tree_strategies import (
    NS_A,
    NS_B,
    key_of,
    node_tokens,
    request_slots,
    serve,
    slots,
    tree_pages,
)
from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools import HostKVPool, KVPool, PagedAllocator, SWAAllocator
from unicache_fsm.tree import (
    ComponentType,
    EvictParams,
    InsertParams,
    InsertResult,
    LockUnderflowError,
    RadixTree,
    TreeConfig,
    TreeNode,
)

FULL, SWA = ComponentType.FULL, ComponentType.SWA


def full_tree(page_size: int, pages: int = 64, **config: Any) -> RadixTree:
    return RadixTree(PagedAllocator(pages * page_size, page_size), TreeConfig(**config))


def swa_tree(
    page_size: int, window: int, pages: int = 64, swa_pages: int = 64, **config: Any
) -> RadixTree:
    alloc = SWAAllocator(pages * page_size, swa_pages * page_size, page_size)
    return RadixTree(alloc, TreeConfig(sliding_window_size=window, **config))


def swa_of(tree: RadixTree) -> SWAAllocator:
    assert isinstance(tree.allocator, SWAAllocator)
    return tree.allocator


def free_pages(tree: RadixTree) -> set[int]:
    return set(tree.allocator.free_page_ids().tolist())


def swa_free_pages(tree: RadixTree) -> set[int]:
    return set(swa_of(tree).swa_free_page_ids().tolist())


def pages_of(values: torch.Tensor, page_size: int) -> set[int]:
    return {s // page_size for s in values.tolist()}


# -- record_adopted_range (notes §4) ------------------------------------------------------


def test_record_adopted_range_merges_touching_ranges() -> None:
    result = InsertResult(adopted_ranges={})
    for start, end in [(4, 8), (8, 12), (16, 20)]:
        result.record_adopted_range(FULL, start, end)
    assert result.adopted_ranges == {FULL: [(4, 12), (16, 20)]}


def test_record_adopted_range_ignores_empty_and_inverted_ranges() -> None:
    result = InsertResult(adopted_ranges={})
    result.record_adopted_range(FULL, 0, 4)
    result.record_adopted_range(FULL, 4, 4)
    result.record_adopted_range(FULL, 9, 6)
    result.record_adopted_range(SWA, 3, 3)
    assert result.adopted_ranges == {FULL: [(0, 4)]}


def test_record_adopted_range_out_of_order_stays_sorted_and_disjoint() -> None:
    # SGLang 0.5.23 over-merges this to [(2, 12)], claiming [4, 10) too.
    result = InsertResult(adopted_ranges={})
    result.record_adopted_range(FULL, 10, 12)
    result.record_adopted_range(FULL, 2, 4)
    assert result.adopted_ranges == {FULL: [(2, 4), (10, 12)]}
    result.record_adopted_range(FULL, 4, 10)
    assert result.adopted_ranges == {FULL: [(2, 12)]}


def test_record_adopted_range_is_a_no_op_without_tracking() -> None:
    result = InsertResult()
    result.record_adopted_range(FULL, 0, 8)
    assert result.adopted_ranges is None


def test_record_adopted_range_keeps_components_apart() -> None:
    result = InsertResult(adopted_ranges={})
    result.record_adopted_range(FULL, 0, 4)
    result.record_adopted_range(SWA, 4, 8)
    result.record_adopted_range(FULL, 4, 6)
    assert result.adopted_ranges == {FULL: [(0, 6)], SWA: [(4, 8)]}


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=12))
def test_record_adopted_range_is_the_union_of_the_ranges(calls: list[tuple[int, int]]) -> None:
    result = InsertResult(adopted_ranges={})
    covered: set[int] = set()
    for start, end in calls:
        result.record_adopted_range(FULL, start, end)
        covered |= set(range(start, end))
    expected: list[tuple[int, int]] = []
    for t in sorted(covered):
        if expected and expected[-1][1] == t:
            expected[-1] = (expected[-1][0], t + 1)
        else:
            expected.append((t, t + 1))
    assert result.adopted_ranges == ({FULL: expected} if expected else {})


# -- insert: the worked examples ------------------------------------------------------------


def three_nodes(tree: RadixTree, key: tuple[int, ...]) -> list[TreeNode]:
    """[0, 24) cached in three nodes [0, 8), [8, 16), [16, 24)."""
    for end in (8, 16, 24):
        serve(tree, key[:end])
    nodes = sorted(tree.nodes(), key=lambda n: n.start)
    assert [(n.start, n.end) for n in nodes] == [(0, 8), (8, 16), (16, 24)]
    return nodes


@pytest.mark.parametrize("page_size", [1, 2])
def test_insert_three_node_example_full_only(page_size: int) -> None:
    tree = full_tree(page_size)
    key = key_of(28)
    nodes = three_nodes(tree, key)
    tree_slots = torch.cat([n.slots(FULL) for n in nodes if n.slots(FULL) is not None])
    available = tree.allocator.available_size()
    fresh, _ = request_slots(tree.allocator, 6, 28)  # the caller matched 6 tokens
    value = torch.cat([tree_slots[:6], fresh])
    result = tree.insert(
        InsertParams(
            key, value, prev_prefix_len=6, swa_evicted_seqlen=18, track_adopted_ranges=True
        )
    )
    assert result.prefix_len == 24
    assert result.adopted_ranges == {FULL: [(24, 28)]}
    # The duplicates value[6:24] went back to the allocator; value[24:28] is the leaf's.
    assert tree.allocator.available_size() == available - 4
    assert pages_of(value[6:24], page_size) <= free_pages(tree)
    assert not pages_of(value[24:28], page_size) & free_pages(tree)
    leaf = result.last_device_node
    assert leaf is not None and (leaf.start, leaf.end) == (24, 28)
    assert leaf.slots(FULL) is not None and leaf.slots(FULL).tolist() == value[24:28].tolist()
    m = tree.match_prefix(key)
    assert m.device_indices.tolist() == tree_slots.tolist() + value[24:28].tolist()
    tree.check()


@pytest.mark.parametrize("page_size", [1, 2])
def test_insert_three_node_example_with_swa(page_size: int) -> None:
    """Duplicates below the request's SWA boundary are freed FULL only (their SWA is
    already gone), the others FULL + their SWA; the new leaf takes FULL and SWA."""
    tree = swa_tree(page_size, window=8)
    key = key_of(28)
    nodes = three_nodes(tree, key)
    tree_slots = torch.cat([n.slots(FULL) for n in nodes if n.slots(FULL) is not None])
    swa_available = swa_of(tree).available_swa_size()
    fresh, fresh_swa = request_slots(tree.allocator, 6, 28, swa_bound=18)
    assert fresh_swa.numel() == 10  # SWA for tokens [18, 28)
    value = torch.cat([tree_slots[:6], fresh])
    result = tree.insert(
        InsertParams(
            key, value, prev_prefix_len=6, swa_evicted_seqlen=18, track_adopted_ranges=True
        )
    )
    assert result.prefix_len == 24
    assert result.adopted_ranges == {FULL: [(24, 28)], SWA: [(24, 28)]}
    assert pages_of(value[6:24], page_size) <= free_pages(tree)
    # SWA of tokens [18, 24) freed with its FULL slots; [24, 28) adopted by the leaf.
    assert pages_of(fresh_swa[:6], page_size) <= swa_free_pages(tree)
    assert swa_of(tree).available_swa_size() == swa_available - 4
    leaf = result.last_device_node
    assert leaf is not None and leaf.slots(SWA) is not None
    assert leaf.slots(SWA).tolist() == fresh_swa[6:].tolist()
    # The cached nodes kept their FULL and SWA.
    assert [n.slots(SWA) is not None for n in nodes] == [True, True, True]
    tree.check()


def test_insert_branch_diverging_inside_a_node() -> None:
    p = 2
    tree = full_tree(p)
    old = key_of(16)
    serve(tree, old)
    (node,) = tree.nodes()
    old_slots = node.slots(FULL).tolist() if node.slots(FULL) is not None else []
    new = (*old[:11], 100, 101, 102, 103, 104)  # diverges at token 11: page boundary 10
    fresh, _ = request_slots(tree.allocator, 8, 16)
    value = torch.cat([slots(old_slots[:8]), fresh])
    result = tree.insert(InsertParams(new, value, prev_prefix_len=8, track_adopted_ranges=True))
    assert result.prefix_len == 10
    assert result.adopted_ranges == {FULL: [(10, 16)]}
    assert pages_of(value[8:10], p) <= free_pages(tree)  # the duplicate page of [8, 10)
    (top,) = tree.root.children.values()  # the shared head, split off at token 10
    assert (top.start, top.end) == (0, 10) and top.key == old[:10]
    assert {(c.start, c.end, c.key) for c in top.children.values()} == {
        (10, 16, new[10:]),
        (10, 16, old[10:]),
    }
    assert tree.match_prefix(old).device_indices.tolist() == old_slots
    assert tree.match_prefix(new).device_indices.tolist() == old_slots[:10] + value[10:].tolist()
    tree.check()


@pytest.mark.parametrize("with_swa", [False, True])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_prev_prefix_len_size_sequence(page_size: int, with_swa: bool) -> None:
    """SGLang's test_prev_prefix_len: available sizes P, 2P, 5P below the start."""
    p = page_size
    tree = swa_tree(p, window=4 * p) if with_swa else full_tree(p)
    alloc = tree.allocator
    key = key_of(3 * p)
    initial = alloc.available_size()

    def expect(r: tuple[int, int]) -> dict[ComponentType, list[tuple[int, int]]]:
        return {FULL: [r], SWA: [r]} if with_swa else {FULL: [r]}

    v1, _ = request_slots(alloc, 0, p)
    r1 = tree.insert(InsertParams(key[:p], v1, track_adopted_ranges=True))
    assert (r1.prefix_len, alloc.available_size()) == (0, initial - p)
    assert r1.adopted_ranges == expect((0, p))

    v2, _ = request_slots(alloc, 0, 2 * p)
    r2 = tree.insert(InsertParams(key[: 2 * p], v2, track_adopted_ranges=True))
    assert (r2.prefix_len, alloc.available_size()) == (p, initial - 2 * p)
    assert r2.adopted_ranges == expect((p, 2 * p))
    assert pages_of(v2[:p], p) <= free_pages(tree)

    # As in SGLang's test the caller passes fresh slots for the whole key but says the
    # first 2P came from the tree: the insert neither frees nor adopts them.
    v3, s3 = request_slots(alloc, 0, 3 * p)
    r3 = tree.insert(InsertParams(key, v3, prev_prefix_len=2 * p, track_adopted_ranges=True))
    assert (r3.prefix_len, alloc.available_size()) == (2 * p, initial - 5 * p)
    assert r3.adopted_ranges == expect((2 * p, 3 * p))
    expected = v1.tolist() + v2[p:].tolist() + v3[2 * p :].tolist()
    assert tree.match_prefix(key).device_indices.tolist() == expected
    # v3[:2P] (and its SWA) still belong to the caller.
    tree.check({FULL: [v3[: 2 * p]], SWA: [s3[: 2 * p]] if with_swa else []})


# -- SWA tombstones ---------------------------------------------------------------------


def tombstone_node(tree: RadixTree, key: tuple[int, ...]) -> TreeNode:
    """Insert `key` with the request's SWA boundary at its end: an SWA tombstone."""
    result = serve(tree, key, swa_bound=len(key))
    assert result.adopted_ranges == {FULL: [(0, len(key))]}
    node = result.last_device_node
    assert node is not None and node.slots(SWA) is None and node.slots(FULL) is not None
    return node


@pytest.mark.parametrize("page_size", [1, 4])
def test_swa_tombstone_over_unlocked_node_adopts_full_and_swa(page_size: int) -> None:
    p = page_size
    tree = swa_tree(p, window=2 * p)
    key = key_of(8 * p)
    node = tombstone_node(tree, key)
    assert node.slots(FULL) is not None
    old_full = node.slots(FULL).clone()
    # No live SWA window: the match is empty, so the request computes every token.
    assert tree.match_prefix(key).prefix_len == 0
    fresh, fresh_swa = request_slots(tree.allocator, 0, len(key))
    result = tree.insert(InsertParams(key, fresh, track_adopted_ranges=True))
    assert result.prefix_len == len(key)
    assert result.adopted_ranges == {FULL: [(0, 8 * p)], SWA: [(0, 8 * p)]}
    assert result.last_device_node is node
    assert node.slots(FULL) is not None and node.slots(FULL).tolist() == fresh.tolist()
    assert node.slots(SWA) is not None and node.slots(SWA).tolist() == fresh_swa.tolist()
    assert pages_of(old_full, p) <= free_pages(tree)  # the old FULL went back
    assert tree.match_prefix(key).device_indices.tolist() == fresh.tolist()
    tree.check()


@pytest.mark.parametrize("page_size", [1, 4])
def test_swa_tombstone_over_locked_node_adopts_swa_only(page_size: int) -> None:
    p = page_size
    tree = swa_tree(p, window=2 * p)
    alloc = tree.allocator
    assert isinstance(alloc, SWAAllocator)
    key = key_of(8 * p)
    node = tombstone_node(tree, key)
    assert node.slots(FULL) is not None
    kept_full = node.slots(FULL).clone()
    tree.inc_lock_ref(node)  # someone reads this node's FULL KV
    fresh, fresh_swa = request_slots(alloc, 0, len(key))
    result = tree.insert(InsertParams(key, fresh, track_adopted_ranges=True))
    assert result.adopted_ranges == {SWA: [(0, 8 * p)]}
    assert node.slots(FULL) is not None and node.slots(FULL).tolist() == kept_full.tolist()
    assert node.slots(SWA) is not None and node.slots(SWA).tolist() == fresh_swa.tolist()
    assert pages_of(fresh, p) <= free_pages(tree)  # the caller's FULL was freed
    assert not pages_of(fresh_swa, p) & swa_free_pages(tree)
    # The caller's SWA now pairs with the kept FULL slots.
    assert alloc.translate(kept_full).tolist() == fresh_swa.tolist()
    assert alloc.translate(fresh).tolist() == [0] * len(key)
    tree.dec_lock_ref(node)
    tree.check()


def test_swa_tombstone_split_at_the_request_boundary() -> None:
    """A tombstone straddling the boundary: below it stays a tombstone (caller's FULL
    freed), above it takes the caller's slots."""
    p = 2
    tree = swa_tree(p, window=4)
    key = key_of(12)
    node = tombstone_node(tree, key)
    assert node.slots(FULL) is not None
    old_full = node.slots(FULL).tolist()
    fresh, fresh_swa = request_slots(tree.allocator, 0, 12, swa_bound=6)
    result = tree.insert(InsertParams(key, fresh, swa_evicted_seqlen=6, track_adopted_ranges=True))
    assert result.adopted_ranges == {FULL: [(6, 12)], SWA: [(6, 12)]}
    lower, upper = sorted(tree.nodes(), key=lambda n: n.start)
    assert (lower.start, lower.end, upper.start, upper.end) == (0, 6, 6, 12)
    assert (
        lower.slots(SWA) is None
        and lower.slots(FULL) is not None
        and lower.slots(FULL).tolist() == old_full[:6]
    )
    assert upper.slots(FULL) is not None and upper.slots(FULL).tolist() == fresh[6:].tolist()
    assert upper.slots(SWA) is not None and upper.slots(SWA).tolist() == fresh_swa.tolist()
    assert pages_of(fresh[:6], p) | pages_of(slots(old_full[6:]), p) <= free_pages(tree)
    tree.check()


def test_swa_tombstone_adopts_only_the_callers_part_when_prefix_ends_inside_it() -> None:
    """Issue 11 behaviour 9 (deviation D5): `prev_prefix_len` strictly inside a
    tombstone. The caller's slots at or above it are adopted, FULL and SWA (the
    tombstone splits there); the tree's own slots below it stay the tree's. 0.5.23
    re-adopts those too and frees them, so its tree holds free slots."""
    p = 2
    tree = swa_tree(p, window=4)
    key = key_of(8)
    node = tombstone_node(tree, key)  # [0, 8): FULL live, SWA tombstone
    assert node.slots(FULL) is not None
    tree_full = node.slots(FULL).clone()
    fresh, fresh_swa = request_slots(tree.allocator, 4, 8)  # the caller's [4, 8)
    value = torch.cat([tree_full[:4], fresh])
    result = tree.insert(InsertParams(key, value, prev_prefix_len=4, track_adopted_ranges=True))
    assert result.adopted_ranges == {FULL: [(4, 8)], SWA: [(4, 8)]}
    lower, upper = sorted(tree.nodes(), key=lambda n: n.start)
    assert (lower.start, lower.end, upper.start, upper.end) == (0, 4, 4, 8)
    assert upper is node and result.last_device_node is node
    assert lower.slots(SWA) is None and lower.slots(FULL) is not None
    assert lower.slots(FULL).tolist() == tree_full[:4].tolist()  # the tree's own, kept
    assert node.slots(FULL) is not None and node.slots(FULL).tolist() == fresh.tolist()
    assert node.slots(SWA) is not None and node.slots(SWA).tolist() == fresh_swa.tolist()
    assert pages_of(tree_full[4:], p) <= free_pages(tree)  # replaced: freed
    assert not pages_of(tree_full[:4], p) & free_pages(tree)  # below prev: untouched
    tree.check()


@pytest.mark.parametrize(
    ("bound", "tomb", "live"),
    [(0, None, [(0, 8), (8, 12)]), (6, (0, 6), [(6, 8), (8, 12)]), (12, (0, 12), [])],
)
def test_swa_boundary_on_a_new_leaf(
    bound: int, tomb: tuple[int, int] | None, live: list[tuple[int, int]]
) -> None:
    """Below the request's boundary a new leaf is a tombstone; its live part longer
    than one window (4 tokens, P = 2) is split into an older part and the last window
    (issue 11 behaviour 2), so that a lock pins one window of SWA."""
    p = 2
    tree = swa_tree(p, window=4)
    key = key_of(12)
    fresh, fresh_swa = request_slots(tree.allocator, 0, 12, swa_bound=bound)
    result = tree.insert(
        InsertParams(key, fresh, swa_evicted_seqlen=bound, track_adopted_ranges=True)
    )
    expected = {FULL: [(0, 12)]}
    if live:
        expected[SWA] = [(live[0][0], 12)]
    assert result.adopted_ranges == expected
    spans = {(n.start, n.end): n for n in tree.nodes()}
    assert set(spans) == {s for s in (tomb, *live) if s is not None}
    if tomb is not None:
        assert spans[tomb].slots(SWA) is None
    if live:
        got = torch.cat([s for span in live if (s := spans[span].slots(SWA)) is not None])
        assert got.tolist() == fresh_swa.tolist()
        assert result.last_device_node is spans[live[-1]]
    assert swa_of(tree).translate(fresh[:bound]).tolist() == [0] * bound
    tree.check()


def test_swa_match_needs_a_live_window() -> None:
    """The match stops at the last node end with a live window behind it."""
    p = 2
    tree = swa_tree(p, window=4)
    key = key_of(16)
    serve(tree, key[:8])  # [0, 8) live
    serve(tree, key[:14], swa_bound=12)  # [8, 12) tombstone, [12, 14) live
    spans = {(n.start, n.end): n.slots(SWA) is not None for n in tree.nodes()}
    assert spans == {(0, 4): True, (4, 8): True, (8, 12): False, (12, 14): True}
    assert tree.match_prefix(key).prefix_len == 8  # 2 live tokens < the window
    serve(tree, key, swa_bound=12)  # [14, 16): 4 live tokens since the tombstone
    assert tree.match_prefix(key).prefix_len == 16
    tree.evict(EvictParams(swa_num_tokens=16))  # tombstone everything unlocked
    assert tree.match_prefix(key).prefix_len == 0
    tree.check()


# -- split --------------------------------------------------------------------------------


def offloadable(p: int = 4, **config: Any) -> tuple[RadixTree, TreeNode, tuple[int, ...]]:
    tree = full_tree(p, **config)
    key = key_of(4 * p)
    result = serve(tree, key)
    node = result.last_device_node
    assert node is not None
    return tree, node, key


@pytest.mark.parametrize("k_pages", [1, 2, 3])
def test_split_partitions_keys_slots_hashes_and_copies_state(k_pages: int) -> None:
    p = 4
    tree, node, key = offloadable(p)
    serve(tree, key)  # hit_count 2
    tree.inc_lock_ref(node)
    assert node.slots(FULL) is not None and node.hashes is not None
    full, hashes, residency = node.slots(FULL).tolist(), list(node.hashes), node.residency
    parent = node.parent
    top = tree.split(node, k_pages * p)
    k = k_pages * p
    assert top.parent is parent and node.parent is top
    assert list(top.children.values()) == [node]
    assert (top.key, node.key) == (key[:k], key[k:])
    assert (top.start, top.end, node.start, node.end) == (0, k, k, 4 * p)
    assert top.slots(FULL) is not None and node.slots(FULL) is not None
    assert (top.slots(FULL).tolist(), node.slots(FULL).tolist()) == (full[:k], full[k:])
    assert (top.hashes, node.hashes) == (hashes[:k_pages], hashes[k_pages:])
    assert top.residency == node.residency == residency
    assert top.hit_count == node.hit_count == 2
    assert top.lock_ref == node.lock_ref == 1
    assert top.id != node.id  # the node keeps its id and its end; the new parent is new
    tree.dec_lock_ref(node)
    assert top.lock_ref == node.lock_ref == 0
    tree.check()


def test_split_of_a_stored_node_keeps_both_halves_stored() -> None:
    tree, node, _ = offloadable()
    ticket = tree.begin_offload(tree.offload_chain(node))
    tree.finish_offload(ticket, True)
    top = tree.split(node, 8)
    assert top.external_cache_stored and node.external_cache_stored
    assert tree.offload_chain(node) == []
    tree.check()


@pytest.mark.parametrize("success", [True, False])
def test_split_while_offloading_publishes_both_halves(success: bool) -> None:
    tree, node, _ = offloadable()
    ticket = tree.begin_offload([node])
    assert ticket.anchor is node and node.lock_ref == 1
    top = tree.split(node, 4)
    assert top.offloading and top.pending_offload is ticket
    assert ticket.publish == [top, node]
    bottom = tree.split(node, 8)  # split the lower half again
    assert ticket.publish == [top, bottom, node]
    tree.check()
    tree.finish_offload(ticket, success)
    for n in (top, bottom, node):
        assert n.external_cache_stored is success
        assert not n.offloading and n.pending_offload is None
        assert n.lock_ref == 0  # the anchor's lock went exactly once
    with pytest.raises(LockUnderflowError):
        tree.dec_lock_ref(node)
    if not success:  # eligible again, as one chain over the fragments
        assert tree.offload_chain(node) == [top, bottom, node]
    tree.check()


# -- write-through ----------------------------------------------------------------------


def test_write_through_after_threshold_hits() -> None:
    tree = full_tree(4, write_through_threshold=2)
    key = key_of(8)
    r1 = serve(tree, key)
    node = r1.last_device_node
    assert node is not None and node.hit_count == 1 and r1.write_through == []
    r2 = serve(tree, key)
    assert node.hit_count == 2 and r2.write_through == [node]


def test_chunked_inserts_neither_count_nor_trigger() -> None:
    tree = full_tree(4, write_through_threshold=1)
    key = key_of(8)
    r1 = serve(tree, key, chunked=True)
    node = r1.last_device_node
    assert node is not None and node.hit_count == 0 and r1.write_through == []
    r2 = serve(tree, key, chunked=True)
    assert node.hit_count == 0 and r2.write_through == []
    r3 = serve(tree, key)
    assert node.hit_count == 1 and r3.write_through == [node]


def test_write_through_chain_stops_at_stored_or_offloading_ancestor() -> None:
    tree = full_tree(4, write_through_threshold=1)
    key = key_of(16)
    (a,) = serve(tree, key[:4]).write_through
    tree.finish_offload(tree.begin_offload([a]), True)
    rb = serve(tree, key[:8])
    b = rb.last_device_node
    assert rb.write_through == [b]  # A is stored
    rc = serve(tree, key[:12])
    c = rc.last_device_node
    assert rc.write_through == [b, c]  # root first, up to the stored A
    ticket = tree.begin_offload([b])
    rd = serve(tree, key)
    d = rd.last_device_node
    assert rd.write_through == [c, d]  # stops at the offloading B
    tree.finish_offload(ticket, False)
    tree.check()


def test_failed_offload_then_host_backup_is_offloaded_again() -> None:
    """Issue 12 item 7: a failed offload leaves the node unstored and eligible again,
    also after it was backed up to the host tier: the next insert that walks it puts
    it in the write-through chain (a backed-up ancestor still ends a chain)."""
    tree, _ = host_tree(4, write_through_threshold=1)
    key = key_of(8)
    (node,) = serve(tree, key).write_through
    tree.finish_offload(tree.begin_offload([node]), False)
    assert tree.backup(node) and node.backuped and not node.external_cache_stored
    again = serve(tree, key)
    assert again.write_through == [node]
    child = serve(tree, key_of(12)).last_device_node
    assert child is not None and tree.offload_chain(child) == [child]  # stops at the backup
    tree.finish_offload(tree.begin_offload(again.write_through), True)
    assert node.external_cache_stored and node.backuped
    assert serve(tree, key).write_through == []  # stored: never offloaded again
    tree.check()


def test_no_write_through_without_hashes() -> None:
    tree = full_tree(4, write_through_threshold=1, hash_pages=False)
    key = key_of(8)
    result = serve(tree, key)
    node = result.last_device_node
    assert node is not None and node.hashes is None and node.hit_count == 1
    assert result.write_through == []


def test_write_through_off_by_default() -> None:
    tree = full_tree(4)
    for _ in range(3):
        assert serve(tree, key_of(8)).write_through == []


# -- offload bookkeeping ------------------------------------------------------------------


def test_mark_stored_path_and_demote() -> None:
    tree = full_tree(4)
    key = key_of(12)
    serve(tree, key[:4])
    serve(tree, key[:8])
    c = serve(tree, key).last_device_node
    assert c is not None
    b = c.parent
    assert b is not None and b.parent is not None
    a = b.parent
    ticket = tree.begin_offload([a])
    assert tree.mark_stored_path(c, tree.root) == [c, b]  # A's offload decides for A
    assert tree.mark_stored_path(c, a) == []  # already stored
    tree.finish_offload(ticket, False)
    assert not a.external_cache_stored and b.external_cache_stored
    assert tree.demote(b) is True and not b.external_cache_stored
    assert tree.demote(b) is False
    assert tree.offload_chain(c) == []  # C is still stored
    assert tree.offload_chain(b) == [a, b]
    tree.check()


# -- eviction -----------------------------------------------------------------------------


def test_evict_lru_leaves_first() -> None:
    tree = full_tree(1)
    x, y, z = (1, 1), (2, 2), (3, 3)
    for key in (x, y, z):
        serve(tree, key)
    tree.match_prefix(x)  # x becomes the most recently used
    order = []
    for _ in range(3):
        assert tree.evict(EvictParams(num_tokens=2)).num_tokens == 2
        left = {n.key for n in tree.nodes()}
        order.append(({x, y, z} - left) - set(order))
        order[-1] = next(iter(order[-1]))
    assert order == [y, z, x]
    tree.check()


def test_evict_cascades_to_the_parent_in_lru_order() -> None:
    tree = full_tree(1)
    serve(tree, (1, 1))
    serve(tree, (1, 1, 2, 2))  # A [0,2) and B [2,4), both touched now
    serve(tree, (3, 3))  # C, newer
    assert tree.evict(EvictParams(num_tokens=2)).num_tokens == 2
    assert {n.key for n in tree.nodes()} == {(1, 1), (3, 3)}  # B went first
    assert tree.evict(EvictParams(num_tokens=2)).num_tokens == 2
    assert {n.key for n in tree.nodes()} == {(3, 3)}  # then A, older than C
    tree.check()


def test_evict_never_takes_locked_or_offloading_nodes() -> None:
    tree = full_tree(4)
    locked = serve(tree, key_of(8, base=10)).last_device_node
    shipping = serve(tree, key_of(8, base=50)).last_device_node
    serve(tree, key_of(8, base=90))
    assert locked is not None and shipping is not None
    tree.inc_lock_ref(locked)
    ticket = tree.begin_offload([shipping])
    result = tree.evict(EvictParams(num_tokens=1000))
    assert result.num_tokens == 8
    assert set(tree.nodes()) == {locked, shipping}
    tree.finish_offload(ticket, True)
    assert tree.evict(EvictParams(num_tokens=1000)).num_tokens == 8
    assert set(tree.nodes()) == {locked}
    tree.dec_lock_ref(locked)
    assert tree.evict(EvictParams(num_tokens=1000)).num_tokens == 8
    assert list(tree.nodes()) == []
    assert shipping.residency.startswith("device.deleted")
    tree.check()


def test_swa_eviction_deletes_leaves_and_tombstones_internal_nodes() -> None:
    """Issue 11 behaviours 3 and 4 (this replaces the old pin of the project's own rule,
    "tombstone unlocked nodes only, never free FULL"). P = 2, window 4: each 8-token
    request is two nodes, [0, 4) and its last window [4, 8). Path A is locked at its
    leaf, which SWA-locks only that trailing window: A's older half stays
    SWA-evictable. SWA pressure walks the SWA LRU list from its least recent end:
    internal nodes are tombstoned, an evictable leaf is deleted outright, its FULL
    slots freed (and counted) with its SWA."""
    p = 2
    tree = swa_tree(p, window=4)
    a = serve(tree, key_of(8, base=10)).last_device_node
    b = serve(tree, key_of(8, base=50)).last_device_node
    assert a is not None and b is not None and a.parent is not None and b.parent is not None
    a0, b0 = a.parent, b.parent
    assert [(n.start, n.end) for n in (a0, a, b0, b)] == [(0, 4), (4, 8)] * 2
    b_full = b.slots(FULL)
    assert b_full is not None
    tree.inc_lock_ref(a)
    swa_available = swa_of(tree).available_swa_size()
    result = tree.evict(EvictParams(swa_num_tokens=100))
    # least recent first: A0 (internal: tombstone), A (SWA-locked: skipped), B0
    # (internal: tombstone), B (a leaf: deleted, 4 FULL + 4 SWA)
    assert result == type(result)(4, 12)
    assert a.slots(SWA) is not None and a0.slots(SWA) is None and a0.slots(FULL) is not None
    assert b0.slots(SWA) is None and b0.slots(FULL) is not None  # FULL stays
    assert not b.device_resident and not b.evicted and b0.children == {}  # deleted
    assert pages_of(b_full, p) <= free_pages(tree)
    assert swa_of(tree).available_swa_size() == swa_available + 12
    tree.dec_lock_ref(a)
    tree.check()


def host_tree(p: int = 4, **config: Any) -> tuple[RadixTree, KVPool]:
    alloc = PagedAllocator(8 * p, p)
    kv = KVPool.for_allocator(alloc, num_layers=2, width=3, dtype=torch.float32)
    host = HostKVPool.for_device_pool(kv, 32 * p)
    tree = RadixTree(
        alloc,
        TreeConfig(**config),
        kv_pool=kv,
        host_pool=host,
        host_allocator=PagedAllocator(32 * p, p),
    )
    return tree, kv


def fill(kv: KVPool, where: torch.Tensor, seed: int) -> torch.Tensor:
    data = torch.arange(where.numel() * 6, dtype=torch.float32).view(-1, 2, 3) + seed
    kv.write_pages(where, data)
    return data


def test_backed_up_leaf_is_evicted_not_deleted_and_loads_back() -> None:
    p = 4
    tree, kv = host_tree(p)
    key = key_of(8)
    node = serve(tree, key).last_device_node
    assert node is not None and node.slots(FULL) is not None
    data = fill(kv, node.slots(FULL), seed=1000)
    assert tree.backup(node)
    assert node.backuped and node.host is not None
    tree.check()
    assert tree.evict(EvictParams(num_tokens=8)).num_tokens == 8
    assert node.evicted and node.slots(FULL) is None and node in set(tree.nodes())
    m = tree.match_prefix(key)
    assert m.prefix_len == 0 and m.host_hit_length == 8 and m.last_host_node is node
    other = serve(tree, key_of(8, base=100)).last_device_node  # reuses the freed pages
    assert other is not None and other.slots(FULL) is not None
    fill(kv, other.slots(FULL), seed=-5)
    tree.check()
    assert tree.load_back(node)  # evicts `other` to make room
    assert node.device_resident and node.slots(FULL) is not None
    assert torch.equal(kv.read_pages(node.slots(FULL)), data)
    assert tree.match_prefix(key).device_indices.tolist() == node.slots(FULL).tolist()
    tree.check()


def test_unbacked_leaf_is_deleted() -> None:
    tree, _ = host_tree()
    node = serve(tree, key_of(8)).last_device_node
    assert node is not None
    tree.evict(EvictParams(num_tokens=8))
    assert node.residency.startswith("device.deleted") and list(tree.nodes()) == []
    tree.check()


def test_insert_unevicts_a_backed_up_node_with_the_callers_slots() -> None:
    tree, _ = host_tree()
    key = key_of(8)
    node = serve(tree, key).last_device_node
    assert node is not None and tree.backup(node)
    tree.evict(EvictParams(num_tokens=8))
    result = serve(tree, key)
    assert result.adopted_ranges == {FULL: [(0, 8)]}
    assert result.last_device_node is node and node.device_resident and node.backuped
    tree.check()


def test_evict_host_deletes_evicted_leaves() -> None:
    tree, _ = host_tree()
    node = serve(tree, key_of(8)).last_device_node
    assert node is not None and tree.backup(node)
    tree.evict(EvictParams(num_tokens=8))
    assert tree.evict_host(8) == 8
    assert list(tree.nodes()) == [] and node.residency.startswith("device.deleted")
    tree.check()


def test_load_back_never_evicts_its_own_path() -> None:
    p = 1
    alloc = PagedAllocator(8, p)
    kv = KVPool.for_allocator(alloc, num_layers=1, width=2, dtype=torch.float32)
    tree = RadixTree(
        alloc,
        kv_pool=kv,
        host_pool=HostKVPool.for_device_pool(kv, 32),
        host_allocator=PagedAllocator(32, p),
    )
    key = key_of(8)
    serve(tree, key[:4])
    b = serve(tree, key).last_device_node  # A [0, 4) -> B [4, 8)
    assert b is not None and tree.backup(b)
    tree.evict(EvictParams(num_tokens=8))  # both evicted, host copies kept
    serve(tree, (9, 9, 9, 9))  # half the device pool in use
    assert tree.load_back(b)
    tree.check()  # fails: A was loaded, then evicted again to make room for B
    assert all(n.device_resident for n in b.path_from_root())


# -- hashes and namespaces ----------------------------------------------------------------


@pytest.mark.parametrize("namespace", [None, NS_A])
def test_hashes_chain_from_the_parent(namespace: str | None) -> None:
    p = 4
    tree = full_tree(p)
    key = key_of(20)
    serve(tree, key[:8], namespace=namespace)
    serve(tree, key, namespace=namespace)
    serve(tree, key[:12] + (77,) * 8, namespace=namespace)  # branches inside [8, 20)
    tree.match_prefix(key[:16], namespace)  # a split by a match
    assert len(list(tree.nodes())) == 5
    for node in tree.nodes():
        tokens = node_tokens(node)
        expected = page_hashes(tokens, p, namespace)
        got = [h for n in node.path_from_root() for h in (n.hashes or [])]
        assert got == expected, f"{node!r}"
    tree.check()


def test_namespaces_separate_tenants() -> None:
    p = 4
    tree = full_tree(p)
    key = key_of(8)
    ra = serve(tree, key, namespace=NS_A)
    rb = serve(tree, key, namespace=NS_B)
    assert ra.adopted_ranges == rb.adopted_ranges == {FULL: [(0, 8)]}  # no sharing
    a, b = ra.last_device_node, rb.last_device_node
    assert a is not None and b is not None and a is not b
    assert a.slots(FULL) is not None and b.slots(FULL) is not None
    assert set(a.slots(FULL).tolist()).isdisjoint(b.slots(FULL).tolist())
    assert a.hashes is not None and b.hashes is not None
    assert set(a.hashes).isdisjoint(b.hashes)
    assert tree.match_prefix(key, NS_A).device_indices.tolist() == a.slots(FULL).tolist()
    assert tree.match_prefix(key, NS_B).device_indices.tolist() == b.slots(FULL).tolist()
    assert tree.match_prefix(key).prefix_len == 0
    pages = tree_pages(tree)
    assert {ns for ns, _ in pages} == {NS_A, NS_B}
    tree.check()


# -- aliasing -----------------------------------------------------------------------------


def test_adopted_slots_do_not_alias_the_callers_value() -> None:
    tree = swa_tree(1, window=2)
    key = key_of(4)
    node = tombstone_node(tree, key)
    fresh, _ = request_slots(tree.allocator, 0, 4)
    value = fresh.clone()
    assert tree.insert(InsertParams(key, value)).last_device_node is node
    value.fill_(0)  # the scheduler reuses its request buffer
    assert node.slots(FULL) is not None and node.slots(FULL).tolist() == fresh.tolist()


def test_unevicted_slots_do_not_alias_the_callers_value() -> None:
    tree, _ = host_tree()
    key = key_of(8)
    node = serve(tree, key).last_device_node
    assert node is not None and tree.backup(node)
    tree.evict(EvictParams(num_tokens=8))
    fresh, _ = request_slots(tree.allocator, 0, 8)
    value = fresh.clone()
    assert tree.insert(InsertParams(key, value)).last_device_node is node
    value.fill_(0)
    assert node.slots(FULL) is not None and node.slots(FULL).tolist() == fresh.tolist()
