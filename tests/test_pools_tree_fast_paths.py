"""The fast paths of the pools and the tree keep their contracts.

- `PagedAllocator.alloc` on CPU pops page ids off its NumPy stack and builds their slots
  in NumPy (from a shared slot table up to `SLOT_TABLE_SLOTS`, by a broadcast past it):
  the same slots, in the same order, as the page-tensor path, in fresh memory.
- `free_page_list` still refuses ids that are not plain ints (bools, NumPy ints, floats)
  with a typed error, nothing changed.
- Unlocking walks the path twice from the node up: an underflow still names the node
  nearest the root that holds no lock, and changes nothing.
- `hashing.pack_tokens` packs a tuple or list of plain ints in one native loop
  (``_pagechain.pack_u32``): the same bytes, and the same typed errors for anything
  else, as its `struct` / `array` paths.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm import hashing
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


# -- hashing.pack_tokens: the native loop and the struct / array paths --------------------
_TOKENS = st.one_of(
    st.integers(0, 2**32 - 1),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.integers(0, 2**32 - 1).map(np.uint32),
    st.integers(-5, 2**33).map(np.int64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.just("7"),
)


def _pack_outcome(tokens: object) -> object:
    try:
        return hashing.pack_tokens(tokens)  # type: ignore[arg-type]
    except hashing.InvalidTokenError as exc:
        return type(exc), str(exc), exc.index
    except TypeError as exc:  # (a str token has no __index__: named as a bad token)
        return type(exc), str(exc)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=200) | st.lists(_TOKENS, max_size=80),
    as_tuple=st.booleans(),
)
def test_pack_tokens_answers_the_same_with_the_native_loop_on_and_off(
    tokens: list[object], as_tuple: bool
) -> None:
    seq: object = tuple(tokens) if as_tuple else tokens
    outcomes = []
    for native in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(hashing, "NATIVE_PACK", native)
            outcomes.append(_pack_outcome(seq))
    assert outcomes[0] == outcomes[1]
    if all(type(t) is int and 0 <= t < 2**32 for t in tokens):
        assert outcomes[0] == struct.pack(f"<{len(tokens)}I", *tokens)


@pytest.mark.skipif(not hashing.NATIVE_PACK, reason="built without the C extension")
def test_native_pack_refuses_what_it_does_not_take() -> None:
    from unicache_fsm._pagechain import pack_u32

    assert pack_u32((1, 2**32 - 1)) == struct.pack("<2I", 1, 2**32 - 1)
    assert pack_u32([]) == b""
    for bad in ((-1,), (2**32,), (2**80,), (True,), (np.int64(3),), (1.0,), "ab", range(3)):
        assert pack_u32(bad) is None, bad
