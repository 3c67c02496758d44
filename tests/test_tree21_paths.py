"""The tree21 pass's fast paths keep their contracts.

- `PagedAllocator.alloc` on CPU pops page ids off its NumPy stack and builds their slots
  in NumPy (from a shared slot table up to `SLOT_TABLE_SLOTS`, by a broadcast past it):
  the same slots, in the same order, as the page-tensor path, in fresh memory.
- `free_page_list` still refuses ids that are not plain ints (bools, NumPy ints, floats)
  with a typed error, nothing changed.
- Unlocking walks the path twice from the node up: an underflow still names the node
  nearest the root that holds no lock, and changes nothing.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from unicache_fsm.pools import PagedAllocator, slots
from unicache_fsm.pools.errors import TensorTypeError
from unicache_fsm.tree import InsertParams, LockUnderflowError, RadixTree, TreeConfig


def _expected_slots(pages: list[int], p: int) -> list[int]:
    return [k * p + o for k in pages for o in range(p)]


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("table", [True, False])
def test_alloc_hands_out_the_stack_top_as_fresh_slots(
    page_size: int, table: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not table:  # past the table's size: the broadcast path
        monkeypatch.setattr(slots, "SLOT_TABLE_SLOTS", 0)
    p = page_size
    alloc = PagedAllocator(32 * p, p)
    first = alloc.alloc(3 * p)
    second = alloc.alloc(2 * p)
    assert first is not None and second is not None
    assert first.tolist() == _expected_slots([1, 2, 3], p)  # a fresh pool: 1, 2, 3, ...
    assert second.tolist() == _expected_slots([4, 5], p)
    assert first.dtype == torch.int64 and first.is_contiguous() and first.dim() == 1
    alloc.free(first)  # pushed 1, 2, 3: popped from the top, 3 first (LIFO)
    again = alloc.alloc(2 * p)
    assert again is not None
    assert again.tolist() == _expected_slots([3, 2], p)
    held = second.clone()
    alloc.free(again)
    more = alloc.alloc(5 * p)
    assert more is not None
    assert torch.equal(second, held)  # no later pop or push writes a handed-out tensor
    more[:] = 0  # nor does writing the caller's tensor touch the allocator's stack
    assert alloc.available_size() == (32 - 7) * p
    assert alloc.allocated_page_ids().tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert alloc.alloc(0) is not None and alloc.alloc(0).numel() == 0  # type: ignore[union-attr]
    assert alloc.alloc(26 * p) is None  # short: unchanged
    assert alloc.available_size() == 25 * p


def test_alloc_from_a_smaller_pool_after_a_larger_one_reads_the_shared_table() -> None:
    p = 8
    big = PagedAllocator(200 * p, p)
    small = PagedAllocator(10 * p, p)
    got_big = big.alloc(200 * p)
    got_small = small.alloc(10 * p)
    assert got_big is not None and got_small is not None
    assert got_big.tolist() == _expected_slots(list(range(1, 201)), p)
    assert got_small.tolist() == _expected_slots(list(range(1, 11)), p)


@pytest.mark.parametrize("bad", [np.int64(6), True, 6.0])
def test_free_page_list_refuses_ids_that_are_not_plain_ints(bad: object) -> None:
    p = 4
    alloc = PagedAllocator(16 * p, p)
    assert alloc.alloc(8 * p) is not None
    before = alloc.allocated_page_ids().tolist()
    with pytest.raises(TensorTypeError, match=re.escape(repr(bad))):
        alloc.free_page_list([2, bad, 3], "pages to free")  # type: ignore[list-item]
    assert alloc.allocated_page_ids().tolist() == before
    alloc.free_page_list([2, 3], "pages to free")
    assert alloc.allocated_page_ids().tolist() == [1, 4, 5, 6, 7, 8]


def test_unlock_underflow_names_the_node_nearest_the_root_and_changes_nothing() -> None:
    p = 2
    alloc = PagedAllocator(64 * p, p)
    tree = RadixTree(alloc, TreeConfig(hash_pages=False))
    key = tuple(range(1, 7))
    value = alloc.alloc(len(key))
    assert value is not None
    tree.insert(InsertParams(key, value))
    # split the path into three nodes: [1, 2] -> [3, 4] -> [5, 6]
    tree.match_prefix(key[:4])
    tree.match_prefix(key[:2])
    leaf = tree.match_prefix(key).last_device_node
    path = leaf.path_from_root()
    assert [len(n.key) for n in path] == [2, 2, 2]
    tree.inc_lock_ref(leaf)
    tree.inc_lock_ref(path[1])
    assert [n.lock_ref for n in path] == [2, 2, 1]
    tree.dec_lock_ref(leaf)
    assert [n.lock_ref for n in path] == [1, 1, 0]
    with pytest.raises(LockUnderflowError) as caught:
        tree.dec_lock_ref(leaf)
    assert caught.value.node_id == leaf.id
    assert [n.lock_ref for n in path] == [1, 1, 0]
    # a node deeper than the culprit holding a lock does not hide the culprit
    path[0].lock_ref, path[2].lock_ref = 0, 1
    with pytest.raises(LockUnderflowError) as caught:
        tree.dec_lock_ref(leaf)
    assert caught.value.node_id == path[0].id
    assert [n.lock_ref for n in path] == [0, 1, 1]
    path[0].lock_ref, path[2].lock_ref = 1, 0
    tree.dec_lock_ref(path[1])
    assert [n.lock_ref for n in path] == [0, 0, 0]
    tree.check()
    assert tree.pop_evictable() is leaf  # unlocked again: the one evictable leaf
