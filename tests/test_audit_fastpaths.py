"""The audit's shortcuts find exactly what the formulations they replace find.

- SWA mapping: one gather of every FULL slot from the live mapping against the
  translations node by node (`SWAAllocator.translate`), on corrupted mappings;
- FULL ownership: `PageFlags.marks_exactly` against ``set(marked()) == ids``;
- `pool_holds`: the small path (Python ints) against `read_pages` + `same_kv`, with
  more slots than it takes too, rows given as tensors or as their bytes;
- `System.audit` still sees KV corrupted after earlier audits remembered the rows.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unicache_fsm.pools import KVPool, SWAAllocator
from unicache_fsm.pools.pageflags import PageFlags
from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.serving import invariants as inv
from unicache_fsm.serving.kv import pool_holds, row_bytes, same_kv
from unicache_fsm.serving.system import System
from unicache_fsm.tree import EvictParams
from unicache_fsm.tree.errors import TreeConsistencyError

FULL, SWA = ComponentType.FULL, ComponentType.SWA

_MAPPING = ("mapping[full] != swa", "still map to SWA")


def _reference_mapping_findings(s: System) -> list[str]:
    """The SWA mapping findings as translating node by node finds them."""
    alloc = s.allocator
    assert isinstance(alloc, SWAAllocator)
    findings: list[str] = []
    for n in s.tree.nodes():
        swa, full = n.slots(SWA), n.slots(FULL)
        if full is None:
            continue
        if swa is None:
            if bool(alloc.translate(full).any()):
                findings.append(f"node {n.id}: SWA tombstone whose FULL slots still map to SWA")
        elif swa.numel() == len(n.key) == full.numel():
            if not torch.equal(alloc.translate(full), swa):
                findings.append(f"node {n.id}: mapping[full] != swa")
        elif swa.numel() == len(n.key):
            findings.append(f"node {n.id}: mapping[full] != swa")
    return findings


def _mapping_findings(s: System) -> list[str]:
    try:
        s.tree.check({FULL: [], SWA: []})
    except TreeConsistencyError as exc:
        return [f for f in exc.findings if any(m in f for m in _MAPPING)]
    return []


def _sorted_by_node(findings: list[str]) -> list[str]:
    # the audit lists live nodes' findings before tombstones'; the reference walks the tree
    return sorted(findings)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    p=st.sampled_from([1, 4]),
    keys=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    tombstones=st.integers(0, 8),
    writes=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=3),
)
def test_mapping_audit_finds_what_translating_node_by_node_finds(
    p: int, keys: list[int], tombstones: int, writes: list[tuple[int, int]]
) -> None:
    s = System.build(p, swa=True, full_pages=64, swa_pages=64)
    for i, pages in enumerate(keys):
        key = tuple(range(100 * i, 100 * i + pages * p))
        s.compute(f"c{i}", key)
        s.compute(f"d{i}", (*key[:p], 7, 7, 7, 7)[: (1 + 4 // p) * p])  # splits: more nodes
    if tombstones:
        s.tree.evict(EvictParams(swa_num_tokens=tombstones * p))
    assert _mapping_findings(s) == [] == _reference_mapping_findings(s)
    alloc = s.allocator
    assert isinstance(alloc, SWAAllocator)
    mapping = alloc.full_to_swa_mapping
    fulls = [int(v) for n in s.tree.nodes() if (f := n.slots(FULL)) is not None for v in f]
    for at, value in writes:  # corrupt: a node's FULL slot maps elsewhere, or to nothing
        slot = fulls[at % len(fulls)]
        mapping[slot] = value % alloc.swa_num_slots
    assert _sorted_by_node(_mapping_findings(s)) == _sorted_by_node(_reference_mapping_findings(s))


def test_mapping_audit_names_a_wrong_mapping_and_a_mapped_tombstone() -> None:
    s = System.build(4, swa=True, full_pages=64, swa_pages=64, window_pages=1)
    s.compute("a", tuple(range(24)))
    alloc = s.allocator
    assert isinstance(alloc, SWAAllocator)
    live = next(n for n in s.tree.nodes() if n.slots(SWA) is not None)
    dead = next(n for n in s.tree.nodes() if n.slots(SWA) is None and n.slots(FULL) is not None)
    live_full, dead_full = live.slots(FULL), dead.slots(FULL)
    assert live_full is not None and dead_full is not None
    alloc.full_to_swa_mapping[int(live_full[0])] += 1
    alloc.full_to_swa_mapping[int(dead_full[-1])] = 5
    assert _mapping_findings(s) == [
        f"node {live.id}: mapping[full] != swa",
        f"node {dead.id}: SWA tombstone whose FULL slots still map to SWA",
    ]


@given(
    marked=st.sets(st.integers(0, 20)),
    ids=st.sets(st.integers(-3, 25)),
    same=st.booleans(),
)
def test_marks_exactly_is_set_equality(marked: set[int], ids: set[int], same: bool) -> None:
    for native in (True, False):
        flags = PageFlags(20, native=native)
        flags.mark(sorted(marked))
        asked = set(marked) if same else ids
        assert flags.marks_exactly(asked) == (set(flags.marked()) == asked)


def test_ownership_audit_still_names_the_pages() -> None:
    s = System.build(4, full_pages=32)
    s.compute("a", tuple(range(16)))
    full = s.tree.components[0]
    owned = getattr(full, "owned", None)
    assert isinstance(owned, PageFlags)
    extra = max(owned.marked()) + 1
    owned.mark([extra])
    with pytest.raises(TreeConsistencyError) as err:
        s.tree.check()
    assert f"FULL: the ownership map disagrees with the nodes on [{extra}]" in err.value.findings
    owned.clear([extra])
    s.tree.check()


@settings(max_examples=60, deadline=None)
@given(
    p=st.sampled_from([1, 2, 4]),
    pages=st.lists(st.integers(0, 90), min_size=1, max_size=80),
    parts=st.integers(1, 5),
    shift=st.sampled_from([0, 0, 0, 1, -1]),
    flip=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_pool_holds_small_and_large_agree_with_read_pages(
    p: int, pages: list[int], parts: int, shift: int, flip: int | None
) -> None:
    """Slots on both sides of the small path's bound, some unaligned, outside the pool
    or on page 0, some bytes flipped: `pool_holds` answers (or raises) as `read_pages`
    + `same_kv` does."""
    pool = KVPool(80 * p, p, 2, 4, dtype=torch.float32)
    pool.data.copy_(torch.arange(pool.data.numel(), dtype=torch.float32).view_as(pool.data))
    ids = torch.tensor([k * p + i + shift for k in pages for i in range(p)], dtype=torch.int64)
    slots = list(torch.tensor_split(ids, parts))
    try:
        want = pool.read_pages(ids).clone()
    except Exception as exc:  # the reference refuses: so does pool_holds, with that type
        with pytest.raises(type(exc)):
            pool_holds(pool, slots, [torch.zeros(ids.numel(), 2, 4)])
        return
    if flip is not None:
        raw = want.view(-1).view(torch.uint8)
        raw[flip % raw.numel()] ^= 1
    rows = list(torch.tensor_split(want, parts + 1))
    assert pool_holds(pool, slots, rows) == same_kv(pool.read_pages(ids), want)
    assert pool_holds(pool, slots, row_bytes(want)) == same_kv(pool.read_pages(ids), want)
    assert not pool_holds(pool, slots, row_bytes(want[1:]) or b"?")  # fewer rows


def test_pool_holds_refuses_bad_slots_given_bytes_as_given_rows() -> None:
    pool = KVPool(16, 4, 2, 4, dtype=torch.float32)
    want = row_bytes(torch.zeros(4, 2, 4))
    for bad in ([1, 2, 3, 4], [64, 65, 66, 67]):  # unaligned; outside the pool
        slots = [torch.tensor(bad, dtype=torch.int64)]
        with pytest.raises(Exception) as by_rows:
            pool_holds(pool, slots, [torch.zeros(4, 2, 4)])
        with pytest.raises(type(by_rows.value)):
            pool_holds(pool, slots, want)


@pytest.mark.parametrize("swa", [False, True])
def test_system_audit_sees_kv_corrupted_after_audits(swa: bool) -> None:
    s = System.build(4, swa=swa, full_pages=64, swa_pages=64)
    s.compute("a", tuple(range(32)))
    s.audit()
    s.audit()  # the expected rows are remembered now
    pools = [(FULL, s.kv)] + ([(SWA, s.swa_kv)] if swa else [])
    for component, pool in pools:
        node = next(n for n in s.tree.nodes() if n.slots(component) is not None)
        slots = node.slots(component)
        assert slots is not None and pool is not None
        kept = pool.data[slots[:1]].clone()
        pool.data[slots[:1]] = 1999.0
        with pytest.raises(inv.InvariantViolation, match="KV bytes"):
            s.audit()
        pool.data[slots[:1]] = kept
        s.audit()


def test_an_idle_store_check_still_sees_stray_pins() -> None:
    """With nothing queued or started, `check_invariants` answers from the pin books
    alone: a stray pin, or offload pins without a queued offload, are still found."""
    s = System.build(4)
    s.compute("a", tuple(range(16)))
    store = s.memory
    store.check_invariants()
    assert not store._queued and not store._jobs  # idle: the test tampers with the books
    ident = next(iter(store._pages))
    store._pins[ident] = 1
    with pytest.raises(AssertionError, match="pins drifted"):
        store.check_invariants()
    store._pins[ident] = 0  # a zero count is no pin
    store.check_invariants()
    del store._pins[ident]
    store._offload_pins[7] = [ident]
    with pytest.raises(AssertionError, match="offload pins drifted"):
        store.check_invariants()
    del store._offload_pins[7]
    store._busy = True  # a job being performed holds pins outside the books
    store._pins[ident] = 1
    store.check_invariants()
    store._busy = False
    del store._pins[ident]
    store.check_invariants()


def test_pool_holds_answers_no_rows_given_as_bytes_as_given_as_a_tensor() -> None:
    """Zero rows, as `row_bytes` of an empty row tensor (b""), are an answer like the
    tensor itself: held by no slots, not held by some; never "give at least one"."""
    pool = KVPool(16, 4, 2, 4, dtype=torch.float32)
    none = torch.zeros(0, 2, 4)
    for slots in ([torch.empty(0, dtype=torch.int64)], [torch.arange(4, 8)]):
        assert pool_holds(pool, slots, row_bytes(none)) == pool_holds(pool, slots, [none])
    with pytest.raises(ValueError, match="at least one"):
        pool_holds(pool, [], b"")
