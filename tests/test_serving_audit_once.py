"""One `System.audit` lists the tree once and reads its store and ledger as sets: what
it remembers or shares must never hide a change made between two audits.

`System.audit` hands one node listing to every node-level invariant, asks one snapshot
of a `MemoryStore`'s KV keys (stored pages present, chains whole) and the ledger's
acknowledged set (stored pages landed), and the tree audit packs each key once per key
object. Each test here lets an audit pass, breaks one thing behind the system's back,
and checks that the very next audit names the broken invariant (and passes again once
the thing is put back): nothing is carried from one audit to the next.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import pytest

from unicache_fsm.pools import PagedAllocator, SWAAllocator
from unicache_fsm.pools.transfer import ComponentType, PoolName
from unicache_fsm.serving import invariants as inv
from unicache_fsm.serving.system import System
from unicache_fsm.store.errors import StoreClosedError
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.tree.errors import TreeError
from unicache_fsm.tree.node import TreeNode


def _served(swa: bool) -> System:
    """A system with stored, resident nodes below a split (more than one node)."""
    s = System.build(4, swa=swa, full_pages=64, swa_pages=64)
    for i, pages in enumerate((3, 5, 4)):
        key = tuple(range(100 * i, 100 * i + pages * 4))
        s.serve(f"a{i}", key)
        s.serve(f"b{i}", (*key[:8], 7, 7, 7, 7))  # shares two pages: a split
    s.audit()
    return s


def _stored(s: System) -> TreeNode:
    nodes = [n for n in s.tree.nodes() if n.external_cache_stored and n.hashes]
    assert nodes, "the fixture stores nothing"
    return nodes[-1]


def _count_lock(node: TreeNode, by: int) -> None:
    """A lock counted on `node`'s path that nobody holds (the tree's own audit still
    agrees: every parent counts at least its children's locks)."""
    for n in node.path_from_root():
        n.lock_ref += by


def _violated(s: System) -> str:
    with pytest.raises(inv.InvariantViolation) as info:
        s.audit()
    return info.value.invariant


@pytest.mark.parametrize("swa", [False, True])
def test_a_lock_taken_behind_the_audits_back_is_seen(swa: bool) -> None:
    s = _served(swa)
    leaf = next(n for n in s.tree.nodes() if not n.children)
    _count_lock(leaf, +1)
    assert _violated(s) == "lock balance"
    _count_lock(leaf, -1)
    s.audit()


@pytest.mark.parametrize("swa", [False, True])
def test_a_page_gone_from_the_store_since_the_last_audit_is_seen(swa: bool) -> None:
    s = _served(swa)
    node = _stored(s)
    assert isinstance(s.backend, MemoryStore)
    assert s.backend.evict([node.hashes[-1]], PoolName.KV) == 1
    assert _violated(s) == "stored pages present"


@pytest.mark.parametrize("swa", [False, True])
def test_an_acknowledgement_lost_since_the_last_audit_is_seen(swa: bool) -> None:
    s = _served(swa)
    node = _stored(s)
    assert node.hashes is not None
    pair = (PoolName.KV, node.hashes[0])
    s.ledger.acknowledged.discard(pair)
    assert _violated(s) == "stored pages landed"
    s.ledger.acknowledged.add(pair)
    s.audit()


@pytest.mark.parametrize("swa", [False, True])
def test_a_key_replaced_after_an_audit_packed_it_is_seen(swa: bool) -> None:
    """The tree audit remembers each key tuple's packing: a node given another key of
    the same length (a new tuple) is checked against that key, not the old packing."""
    s = _served(swa)
    node = next(n for n in s.tree.nodes() if n.parent is not s.tree.root)
    old = node.key
    node.key = tuple(t + 1 for t in old)
    with pytest.raises(inv.InvariantViolation, match="packed key disagrees"):
        s.audit()
    node.key = old
    s.audit()


@pytest.mark.parametrize("swa", [False, True])
def test_kv_bytes_changed_since_the_last_audit_are_seen(swa: bool) -> None:
    s = _served(swa)
    node = next(n for n in s.tree.nodes() if n.device_resident)
    row = node.data[next(iter(node.data))][:1]
    kept = s.kv.data[row].clone()
    s.kv.data[row] = 1999.0
    assert _violated(s) == "KV bytes"
    s.kv.data[row] = kept
    s.audit()


@pytest.mark.parametrize("swa", [False, True])
def test_a_node_added_between_two_audits_is_listed_by_the_next(swa: bool) -> None:
    """The listing is taken per audit: a node inserted after one audit, then broken,
    fails the next one."""
    s = _served(swa)
    s.serve("late", tuple(range(900, 900 + 12)))
    late = next(n for n in s.tree.nodes() if n.key[:1] == (900,))
    _count_lock(late, +1)
    assert _violated(s) == "lock balance"


@pytest.mark.parametrize("swa", [False, True])
def test_shared_views_answer_as_the_per_page_calls(swa: bool) -> None:
    """`stored_pages_present` with a snapshot of the store's keys, and
    `stored_pages_landed` with the acknowledged set, fail exactly where asking the
    store and the ledger page by page fails, with the same detail."""
    s = _served(swa)
    node = _stored(s)
    assert node.hashes is not None and isinstance(s.backend, MemoryStore)
    nodes = list(s.tree.nodes())

    def outcome(check: Callable[[], None]) -> str | None:
        try:
            check()
        except inv.InvariantViolation as exc:
            return str(exc)
        return None

    def present_both() -> tuple[str | None, str | None]:
        keys = frozenset(s.memory.stored_keys(PoolName.KV))
        return (
            outcome(lambda: inv.stored_pages_present(s.tree, s.store)),
            outcome(lambda: inv.stored_pages_present(s.tree, s.store, kv_keys=keys, nodes=nodes)),
        )

    def landed_both() -> tuple[str | None, str | None]:
        return (
            outcome(lambda: inv.stored_pages_landed(s.tree, s.ledger.landed)),
            outcome(lambda: inv.stored_pages_landed(s.tree, s.ledger.acknowledged, nodes=nodes)),
        )

    assert present_both() == (None, None) and landed_both() == (None, None)
    s.ledger.acknowledged.discard((PoolName.KV, node.hashes[1 % len(node.hashes)]))
    by_call, by_set = landed_both()
    assert by_call is not None and by_call == by_set
    s.backend.evict(node.hashes[:1], PoolName.KV)
    by_call, by_set = present_both()
    assert by_call is not None and by_call == by_set


@pytest.mark.parametrize("pages", [8, 300])  # the Python flag scan and the NumPy one
def test_allocated_page_list_is_allocated_page_ids(pages: int) -> None:
    alloc = PagedAllocator(pages * 2, 2)
    assert alloc.allocated_page_list() == alloc.allocated_page_ids().tolist() == []
    taken = [alloc.alloc(6), alloc.alloc(4), alloc.alloc(2)]
    assert all(t is not None for t in taken)
    alloc.free(taken[1])
    want = alloc.allocated_page_ids().tolist()
    assert alloc.allocated_page_list() == want and len(want) == 4
    assert all(type(k) is int for k in alloc.allocated_page_list())
    swa = SWAAllocator(pages * 2, pages * 2, 2)
    full = swa.alloc(4)
    sw = swa.alloc_swa(2)
    assert full is not None and sw is not None
    assert swa.allocated_page_list() == swa.allocated_page_ids().tolist()
    assert swa.swa_allocated_page_list() == swa.swa_allocated_page_ids().tolist() == [1]


def test_the_store_books_check_still_sees_drift() -> None:
    """`check_invariants` compares the chain books it counts in C with the ones kept:
    a parent count or a leaf that drifted is still found."""
    s = _served(False)
    store = s.memory
    store.check_invariants()
    children: collections.Counter = store._children  # the test tampers with the books
    parent = next(iter(children))
    children[parent] += 1
    with pytest.raises(AssertionError, match="children counts drifted"):
        store.check_invariants()
    children[parent] -= 1
    children[("kv", "0" * 64)] = 0  # a zero count is no drift
    store.check_invariants()
    del children[("kv", "0" * 64)]
    leaves = store._leaves
    leaf, _ = leaves.popitem(last=False)
    with pytest.raises(AssertionError, match="leaf set drifted"):
        store.check_invariants()
    leaves[leaf] = None
    store.check_invariants()


def test_the_tree_audit_still_names_lock_and_component_findings() -> None:
    """The tree audit's lock and foreign-component findings (checked only where a node
    has children, or data of a kind the tree lacks) still fire."""
    s = _served(False)
    parent = next(n for n in s.tree.nodes() if n.children)
    child = next(iter(parent.children.values()))
    child.lock_ref += 1
    with pytest.raises(TreeError, match="< its children's"):
        s.tree.check()
    child.lock_ref -= 1
    leaf = next(n for n in s.tree.nodes() if not n.children)
    leaf.data[ComponentType.SWA] = leaf.data[ComponentType.FULL]
    with pytest.raises(TreeError, match=r"slots of \['SWA'\] without that component"):
        s.tree.check()
    del leaf.data[ComponentType.SWA]
    s.tree.check()


def test_an_audit_of_a_closed_store_still_raises_the_stores_error() -> None:
    """The snapshot path still asks the store one page itself: a closed store answers
    with its own error, as it did when every page was asked."""
    s = _served(False)
    _stored(s)
    s.store.close()
    with pytest.raises(StoreClosedError):
        s.audit()
