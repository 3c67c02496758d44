"""Offloads through the linker: a split while offloading, and store-side eviction.

- A node of an offloading chain is split (by an insert or a match): the verdict reaches
  both halves (success: both stored; failure: both unstored) and the chain's lock is
  released exactly once.
- The store evicts pages of a stored node: `verify_stored` demotes the nodes past the
  last restorable page, and the next insert walk offloads them again.
"""

from __future__ import annotations

import pytest

from unicache_fsm.pools.transfer import ComponentType, PoolName
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule
from unicache_fsm.testing.system import System
from unicache_fsm.tree import TreeNode

SWA = ComponentType.SWA

P = 4


def key_of(pages: int, p: int = P, base: int = 100) -> tuple[int, ...]:
    return tuple(range(base, base + pages * p))


def node_at(s: System, start: int) -> TreeNode:
    return next(n for n in s.tree.nodes() if n.start == start)


# -- split while offloading ------------------------------------------------------------
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.parametrize("verdict", ["success", "failure"])
@pytest.mark.parametrize("splitter", ["insert", "match", "two-inserts"])
def test_split_while_offloading_reaches_both_halves(swa: bool, verdict: str, splitter: str) -> None:
    s = System.build(P, swa=swa, faults=FaultPolicy())
    x = key_of(8)
    if verdict == "failure":
        s.faulty.policy = FaultPolicy({FaultKind.FAIL_OFFLOAD: FaultRule(every=1)})
    a = s.compute("A", x, settle=False)
    s.faulty.policy = FaultPolicy()
    # one record per chain node (with SWA the leaf is an older part + its last window)
    records = [r for r in s.linker.offloads if r is not None]
    assert a.offload is not None and records[-1] is a.offload
    assert all(r.state == "pending" for r in records)
    before = [n for r in records for n in r.ticket.publish]
    anchors = [r.ticket.anchor for r in records]
    s.audit()
    if splitter == "insert":
        s.compute("C", (*x[: 3 * P], *key_of(2, base=700)), settle=False)
    elif splitter == "match":
        m = s.tree.match_prefix((*x[: 3 * P], *key_of(1, base=700)))
        # with SWA the device prefix is cut back to a live window, but the walk split
        assert m.prefix_len == (0 if swa else 3 * P)
    else:
        s.compute("C", (*x[: 3 * P], *key_of(2, base=700)), settle=False)
        s.compute("D", (*x[: 5 * P], *key_of(2, base=800)), settle=False)
    s.audit()
    publish = [n for r in records for n in r.ticket.publish]
    assert len(publish) > len(before), "the split did not reach the ticket"
    starts = [n.start for n in publish]
    assert starts == sorted(starts) and publish[0].start == 0 and publish[-1].end == len(x)
    assert all(n.offloading and n.lock_ref >= 1 for n in publish)
    assert [r.ticket.anchor for r in records] == anchors
    s.drive()
    assert all(r.state == ("published" if verdict == "success" else "failed") for r in records)
    for n in publish:
        assert n.external_cache_stored is (verdict == "success")
        assert not n.offloading and n.pending_offload is None
    assert all(n.lock_ref == 0 for n in publish), "the chain's lock was not released once"
    s.assert_quiet()
    if verdict == "failure":  # eligible again
        again = s.compute("A2", x)
        assert again.offload is not None and again.offload.state == "published"
        assert all(n.external_cache_stored for n in publish)
        s.assert_quiet()
    s.evict_all()
    assert s.serve("B", x).outcome == "committed"
    s.assert_quiet()


# -- one record per chain node (issue 11 behaviour 8) --------------------------------
def test_a_chain_is_offloaded_node_by_node_each_with_its_own_verdict() -> None:
    """As in SGLang 0.5.23: a write-through chain is one store call, one lock and one
    pending record per node, each settled by its own verdict, so a stored node can sit
    under (or over) one whose offload failed."""
    s = System.build(P, faults=FaultPolicy())
    x = key_of(2)
    s.faulty.policy = FaultPolicy({FaultKind.REFUSE_OFFLOAD: FaultRule(every=1)})
    a = s.compute("A", x[:P])  # refused: A stays unstored
    parent = a.last_node
    assert parent is not None and not parent.external_cache_stored
    s.faulty.policy = FaultPolicy({FaultKind.FAIL_OFFLOAD: FaultRule(every=2)})
    submitted = s.linker.stats.offloads_submitted
    b = s.compute("B", x, settle=False)  # the chain [A, leaf]
    leaf = b.last_node
    assert leaf is not None and leaf.parent is parent
    records = [r for r in s.linker.offloads if r is not None]
    assert s.linker.stats.offloads_submitted - submitted == 2
    assert [r.ticket.publish for r in records] == [[parent], [leaf]]
    assert (parent.lock_ref, leaf.lock_ref) == (2, 1)  # each record locks its own path
    s.drive()
    assert [r.state for r in records] == ["published", "failed"]
    assert parent.external_cache_stored and not leaf.external_cache_stored
    assert (parent.lock_ref, leaf.lock_ref) == (0, 0)
    s.faulty.policy = FaultPolicy()
    again = s.compute("B2", x)  # the failed leaf is eligible again, alone
    assert again.offload is not None and again.offload.ticket.publish == [leaf]
    assert leaf.external_cache_stored
    s.assert_quiet()


# -- store-side eviction ---------------------------------------------------------------
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.parametrize("lost_page", [1, 6], ids=["lost-in-first-node", "lost-in-second"])
def test_verify_stored_demotes_and_offloads_again(swa: bool, lost_page: int) -> None:
    s = System.build(P, swa=swa)
    x = key_of(8)
    s.compute("A1", x[: 4 * P])
    a = s.compute("A2", x)
    assert a.last_node is not None
    path = a.last_node.path_from_root()
    assert all(n.external_cache_stored for n in path)
    hashes = [h for n in path for h in (n.hashes or ())]
    assert s.linker.verify_stored(a.last_node) == 0, "nothing is missing yet"
    s.check_stored = False
    assert s.store.evict([hashes[lost_page]]) >= 1
    demoted = s.linker.verify_stored(a.last_node)
    s.check_stored = True
    s.audit()
    expected = [n for n in path if n.end > lost_page * P]
    assert demoted == len(expected) == s.linker.stats.nodes_demoted
    for n in path:
        assert n.external_cache_stored is (n not in expected)
    # eligible for write-through again: the next insert walk offloads exactly them,
    # one record per node (SGLang 0.5.23), the last one returned
    records = len(s.linker.offloads)
    submitted = s.linker.stats.offloads_submitted
    again = s.compute("A3", x)
    assert again.offload is not None
    assert again.offload.ticket.publish == expected[-1:]
    assert s.linker.stats.offloads_submitted - submitted == len(expected)
    assert again.offload.state == "published" and len(s.linker.offloads) == records
    assert s.store.contains(PoolName.KV, hashes[lost_page])
    assert all(n.external_cache_stored for n in path)
    s.evict_all()
    assert s.serve("B", x).outcome == "committed"
    s.assert_quiet()


def test_verify_stored_keeps_nodes_when_the_lookup_fails() -> None:
    s = System.build(P, faults=FaultPolicy())
    x = key_of(4)
    a = s.compute("A", x)
    assert a.last_node is not None
    hashes = list(a.last_node.hashes or ())
    s.check_stored = False
    s.store.evict(hashes[-1:])
    s.faulty.policy = FaultPolicy({FaultKind.FAIL_LOOKUP: FaultRule(every=1)})
    assert s.linker.verify_stored(a.last_node) == 0
    assert a.last_node.external_cache_stored, "cannot tell: the node stays as it is"
    s.faulty.policy = FaultPolicy()
    assert s.linker.verify_stored(a.last_node) == 1
    s.check_stored = True
    s.assert_quiet()


def test_store_capacity_eviction_then_verify() -> None:
    """A bounded store drops the oldest chain's end to make room; verify finds it."""
    s = System.build(P, capacity_pages=6)
    x, y = key_of(4), key_of(4, base=500)
    a = s.compute("A", x)
    s.check_stored = False
    s.compute("Y", y)  # needs 4 pages: the store evicts the end of A's chain
    assert a.last_node is not None
    assert s.linker.verify_stored(a.last_node) == 1
    s.check_stored = True
    assert not a.last_node.external_cache_stored
    s.assert_quiet()


def test_verify_stored_judges_full_pages_only() -> None:
    """`stored` means the node's FULL pages are in the store. A lost SWA window only
    narrows what LOOKUP can restore (it skips that boundary); demoting the node would
    not bring the window back once the node's SWA is tombstoned, only churn offloads."""
    s = System.build(P, swa=True)
    x = key_of(8)
    a = s.compute("A", x)
    assert a.last_node is not None and a.last_node.slots(SWA) is not None
    window = a.last_node
    assert window.hashes is not None
    assert all(s.store.contains(PoolName.SWA, h) for h in window.hashes)
    s.store.evict(window.hashes, pool=PoolName.SWA)
    # the store cannot restore the prefix at that boundary any more ...
    lookup = s.linker.match("probe", (*x, 1))
    assert lookup.load is None
    # ... but the node's FULL pages are all there: it stays stored
    assert s.linker.verify_stored(window) == 0
    assert window.external_cache_stored
    s.store.evict(window.hashes[-1:], pool=PoolName.KV)  # a FULL page goes: demoted
    assert s.linker.verify_stored(window) == 1
    assert not window.external_cache_stored
