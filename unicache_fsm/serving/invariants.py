"""The contract's invariants as functions: the one set that `serving.System.audit` (and
so `simulate`'s audits and the fuzzing kit's) runs, and that tests and users call.

Each function checks one invariant of ``docs/contract.md`` and raises `InvariantViolation`
(an `AssertionError`) naming the invariant and the culprit; it changes nothing. Those
that look at every node take a keyword `nodes`: the tree's nodes as the caller listed
them (``list(tree.nodes())``) in the same audit, with nothing changed since, so that
one audit walks the tree once (`System.audit` lists them once per audit; default: each
function lists them itself).

- `slot_conservation(tree, outside_full, outside_swa, quarantined_full=...,
  quarantined_swa=...)` — free ⊎ tree-owned ⊎ held outside (load-reserved, a live
  request's) ⊎ quarantined (what a misbehaving store may still touch,
  `ExternalLinker.quarantined_slots()`) = capacity, per pool, no slot owned twice;
  includes the tree's own audit (`RadixTree.check`: structure, residency vs data,
  mapping consistency, hash chain).
- `mapping_consistency(tree)` — ``mapping[FULL slot] == SWA slot`` for every node with
  SWA data, 0 for tombstones (also part of `slot_conservation`).
- `hash_chain(tree)` — every node's page hashes chain from its parent's.
- `lock_balance(tree, holders)` — each node's lock_ref equals the locks whose anchor is
  the node or below it: every lock taken is accounted for, none is stranded.
- `nothing_in_flight_evicted(tree, linker)` — the anchors of live loads and the nodes
  of pending offloads (quarantined ones included) are still in the tree, on the device.
- `no_concurrent_offloads(tree)` — a node is in at most one pending offload, and is
  ``offloading`` exactly while it is.
- `stored_pages_landed(tree, landed)` — every page of every node marked stored was
  acknowledged by the store at some time (`StoreLedger.landed`, or the set
  `StoreLedger.acknowledged`): no node claims KV that never landed. Holds whatever
  the store dropped since, so it runs with capacity-limited stores and needs no
  LOOKUP to demote stale flags first.
- `stored_pages_present(tree, store, kv_keys=...)` — no node marked stored lacks a page
  in the store now (only where the store loses nothing on its own); `kv_keys` is an
  optional snapshot of the store's KV keys taken for this audit, asked instead of
  `store.contains`.
- `store_chains_whole(tree, held, stale, restored)` — where a stored node hangs below
  a stored parent, the store does not hold the child's first KV page without the
  parent's last one: capacity eviction shrinks chains from their end, not at the seam
  between two offloads. `held(pool, key)` is one consistent view of the store (a
  snapshot, where a worker thread may evict between two questions). Only where
  nothing but capacity and corruption removes pages; `stale` lists pages seen gone
  earlier, after which the child's page may have been stored again, `restored` link
  pages offloaded again over a prefix the store had lost.
- `loads_landed(committed, landed)` — no load committed unless a successful batch
  completion of the store named it (counts per rid: `StoreLedger.landed_loads`).
- `adopted_ranges_shape(ranges, page_size, start, end)` — sorted, disjoint, not
  touching, page-aligned, within ``[start, end)``.
- `committed_load_sound(tree, load)` — after COMMIT, every kept KV page is owned by
  the tree at its position, the request's slots are the tree's canonical ones, and
  (SWA) its last window has live SWA on every page.
- `restorable_intersection(per_rank, num_pages, result)` — the agreed boundary is in
  every rank's set and is the largest such (0 when there is none).
- `resident_kv_matches(tree, kv, expected)` — every resident node's KV bytes are the bytes
  its tokens should have (a load that landed garbage or in the wrong slots shows here).

A helper the checks share: `all_members(values, within)` — whether every id of one 1-D
int64 tensor occurs in another (`torch.isin(...).all()`, by a NumPy mark table on CPU).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np
import torch

from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.linker.linker import ExternalLinker
from unicache_fsm.linker.load import ExternalLoad, LoadState
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.pools.transfer import ComponentType, PoolName
from unicache_fsm.serving.kv import pool_holds, same_kv
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.tree.errors import TreeConsistencyError
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.tree import RadixTree

FULL, SWA = ComponentType.FULL, ComponentType.SWA

__all__ = [
    "InvariantViolation",
    "adopted_ranges_shape",
    "all_members",
    "committed_load_sound",
    "hash_chain",
    "loads_landed",
    "lock_balance",
    "mapping_consistency",
    "no_concurrent_offloads",
    "nothing_in_flight_evicted",
    "resident_kv_matches",
    "restorable_intersection",
    "slot_conservation",
    "store_chains_whole",
    "stored_pages_landed",
    "stored_pages_present",
]


class InvariantViolation(UnicacheFsmError, AssertionError):
    """An invariant of the contract does not hold; `invariant` names it."""

    def __init__(self, invariant: str, detail: str) -> None:
        self.invariant = invariant
        self.detail = detail
        super().__init__(f"invariant {invariant!r} violated: {detail}")


def _tree_findings(
    tree: RadixTree,
    outside: dict[ComponentType, Sequence[torch.Tensor]] | None = None,
    nodes: Sequence[TreeNode] | None = None,
) -> tuple[str, ...]:
    try:
        tree.check(outside, nodes=nodes)
    except TreeConsistencyError as exc:
        return exc.findings
    return ()


def _listed(tree: RadixTree, nodes: Sequence[TreeNode] | None) -> Sequence[TreeNode]:
    """`nodes` when the caller listed the tree's nodes already, else a fresh listing."""
    return list(tree.nodes()) if nodes is None else nodes


def slot_conservation(
    tree: RadixTree,
    outside_full: Sequence[torch.Tensor] = (),
    outside_swa: Sequence[torch.Tensor] = (),
    *,
    quarantined_full: Sequence[torch.Tensor] = (),
    quarantined_swa: Sequence[torch.Tensor] = (),
    nodes: Sequence[TreeNode] | None = None,
) -> None:
    nodes = _listed(tree, nodes)
    every_full = [*outside_full, *quarantined_full]
    every_swa = [*outside_swa, *quarantined_swa]
    findings = _tree_findings(tree, {FULL: every_full, SWA: every_swa}, nodes)
    if findings:
        raise InvariantViolation("slot conservation", "; ".join(findings[:8]))
    alloc = tree.allocator
    owned = sum(int(f.numel()) for n in nodes if (f := n.slots(FULL)) is not None)
    held = sum(int(t.numel()) for t in outside_full)
    fenced = sum(int(t.numel()) for t in quarantined_full)
    size = alloc.full_size if isinstance(alloc, SWAAllocator) else alloc.size
    if alloc.available_size() + owned + held + fenced != size:
        detail = (
            f"FULL: {alloc.available_size()} free + {owned} tree + {held} held + "
            f"{fenced} quarantined != {size}"
        )
        raise InvariantViolation("slot conservation", detail)
    if isinstance(alloc, SWAAllocator):
        owned_swa = sum(int(s.numel()) for n in nodes if (s := n.slots(SWA)) is not None)
        held_swa = sum(int(t.numel()) for t in outside_swa)
        fenced_swa = sum(int(t.numel()) for t in quarantined_swa)
        free = alloc.available_swa_size()
        if free + owned_swa + held_swa + fenced_swa != alloc.swa_size:
            detail = (
                f"SWA: {free} free + {owned_swa} tree + {held_swa} held + "
                f"{fenced_swa} quarantined != {alloc.swa_size}"
            )
            raise InvariantViolation("slot conservation", detail)


def mapping_consistency(tree: RadixTree, *, nodes: Sequence[TreeNode] | None = None) -> None:
    alloc = tree.allocator
    if not isinstance(alloc, SWAAllocator):
        return
    for n in _listed(tree, nodes):
        full, swa = n.slots(FULL), n.slots(SWA)
        if full is None:
            continue
        mapped = alloc.translate(full)
        if swa is not None and not torch.equal(mapped, swa):
            raise InvariantViolation("mapping consistency", f"node {n.id}: mapping[full] != swa")
        if swa is None and bool((mapped != 0).any()):
            raise InvariantViolation("mapping consistency", f"tombstone {n.id} still maps")


def hash_chain(tree: RadixTree) -> None:
    bad = [f for f in _tree_findings(tree) if "hash" in f]
    if bad:
        raise InvariantViolation("hash chain", "; ".join(bad[:8]))


def lock_balance(
    tree: RadixTree, holders: Iterable[TreeNode], *, nodes: Sequence[TreeNode] | None = None
) -> None:
    expected: dict[int, int] = {}  # (a plain dict: a Counter's miss is a Python call)
    get = expected.get
    for anchor in holders:
        for n in anchor.path_from_root():
            expected[n.id] = get(n.id, 0) + 1
    wrong = {
        n.id: (n.lock_ref, get(n.id, 0)) for n in _listed(tree, nodes) if n.lock_ref != get(n.id, 0)
    }
    if wrong:
        raise InvariantViolation("lock balance", f"lock_ref (actual, accounted) by node: {wrong}")


def nothing_in_flight_evicted(tree: RadixTree, linker: ExternalLinker) -> None:
    live = [ld.anchor for ld in [*linker.loads.values(), *linker.draining] if ld.transfers]
    records = [*linker.offloads, *linker.quarantine.offloads]
    pending = [n for rec in records if rec is not None for n in rec.ticket.publish]
    for node in [*live, *pending]:
        if node is not tree.root and not node.device_resident:
            detail = f"node {node.id} is in flight but {node.residency}"
            raise InvariantViolation("nothing in flight evicted", detail)


def no_concurrent_offloads(tree: RadixTree, *, nodes: Sequence[TreeNode] | None = None) -> None:
    for n in _listed(tree, nodes):
        ticket = n.pending_offload
        listed = ticket is not None and not ticket.finished and n in ticket.publish
        if n.offloading != listed:
            detail = f"node {n.id} offloading={n.offloading} but its ticket is {ticket!r}"
            raise InvariantViolation("no concurrent offloads", detail)


def stored_pages_present(
    tree: RadixTree,
    store: ExternalStore,
    *,
    kv_keys: frozenset[str] | set[str] | None = None,
    nodes: Sequence[TreeNode] | None = None,
) -> None:
    """No node marked stored lacks a page in `store` now. `kv_keys`, where given, is
    the set of KV page keys the store holds now (one snapshot of its books taken for
    this check, where they answer `contains` exactly: e.g. a `MemoryStore`'s), asked
    instead of `store.contains` (one C-level set inclusion per node, not a call per
    page through every layer around the store)."""
    kv = PoolName.KV
    asked = False
    for n in _listed(tree, nodes):
        hashes = n.hashes if n.external_cache_stored else None
        if hashes is not None:
            if kv_keys is not None:
                if not asked and hashes:  # one page asked of the store itself: a store
                    asked = True  # that cannot answer (closed) raises as it always did
                    store.contains(kv, hashes[0])
                if kv_keys.issuperset(hashes):
                    continue
                missing = [h for h in hashes if h not in kv_keys]
            else:
                missing = [h for h in hashes if not store.contains(kv, h)]
            if missing:
                detail = f"node {n.id} is stored but the store lacks {len(missing)} of its pages"
                raise InvariantViolation("stored pages present", detail)


def stored_pages_landed(
    tree: RadixTree,
    landed: Callable[[PoolName, str], bool]
    | set[tuple[PoolName, str]]
    | frozenset[tuple[PoolName, str]],
    *,
    nodes: Sequence[TreeNode] | None = None,
) -> None:
    """No node marked stored has a page the store never acknowledged. `landed` answers
    whether it acknowledged ``(pool, key)`` (`StoreLedger.landed`), or is the set of
    those pairs (`StoreLedger.acknowledged`: one C-level inclusion per node)."""
    kv = PoolName.KV
    for n in _listed(tree, nodes):
        hashes = n.hashes if n.external_cache_stored else None
        if hashes is not None:
            if isinstance(landed, (set, frozenset)):
                if landed.issuperset(zip(itertools.repeat(kv), hashes)):
                    continue
                never = [h for h in hashes if (kv, h) not in landed]
            else:
                never = [h for h in hashes if not landed(kv, h)]
            if never:
                detail = (
                    f"node {n.id} is stored, but the store never acknowledged {len(never)} "
                    "of its pages (no successful offload or load named them)"
                )
                raise InvariantViolation("stored pages landed", detail)


def loads_landed(committed: Mapping[str, int], landed: Mapping[str, int]) -> None:
    over = {rid: (n, landed.get(rid, 0)) for rid, n in committed.items() if n > landed.get(rid, 0)}
    if over:
        detail = (
            f"loads committed more often than a successful batch named them "
            f"(rid: (commits, landings)): {over}"
        )
        raise InvariantViolation("loads landed", detail)


def store_chains_whole(
    tree: RadixTree,
    held: Callable[[PoolName, str], bool],
    stale: Collection[str] = frozenset(),
    restored: Collection[str] = frozenset(),
    *,
    nodes: Sequence[TreeNode] | None = None,
) -> None:
    for n in _listed(tree, nodes):
        parent = n.parent
        if (
            parent is None
            or parent.parent is None
            or not (n.external_cache_stored and parent.external_cache_stored)
            or not n.digest_bytes
            or not parent.digest_bytes
        ):
            continue
        # (the two hashes read: the child's first page and the parent's last one)
        first, last = n.digest_bytes[:32].hex(), parent.digest_bytes[-32:].hex()
        if last in stale or first in restored:
            # gone before: the child's page came back later; or stored again as a link
            # page over a missing prefix
            continue
        # two stored nodes offloaded apart: the child's first page is linked to the
        # parent's last page, so capacity eviction cannot take the parent's end first
        if held(PoolName.KV, first) and not held(PoolName.KV, last):
            detail = (
                f"node {parent.id}'s last page is gone but its stored child {n.id}'s first "
                "page is still held: a hole in the middle of a chain, not a shorter chain"
            )
            raise InvariantViolation("store chains whole", detail)


def adopted_ranges_shape(
    ranges: Sequence[tuple[int, int]], page_size: int, start: int, end: int
) -> None:
    prev_end = -1
    for lo, hi in ranges:
        if not start <= lo < hi <= end or lo % page_size or hi % page_size:
            detail = f"range {(lo, hi)} not page-aligned inside [{start}, {end})"
            raise InvariantViolation("adopted ranges shape", detail)
        if lo <= prev_end:
            raise InvariantViolation("adopted ranges shape", f"{list(ranges)} overlap or touch")
        prev_end = hi


def committed_load_sound(tree: RadixTree, load: ExternalLoad) -> None:
    if load.state != LoadState.COMMITTED:
        return
    assert load.endpoint is not None and load.slots is not None
    tree_slots = tree.path_slots(load.endpoint)
    if not torch.equal(tree_slots[: load.prefix_len], load.slots):
        raise InvariantViolation("COMMIT soundness", f"{load.rid}: slots are not the tree's")
    alloc = tree.allocator
    size = tree.config.sliding_window_size
    if isinstance(alloc, SWAAllocator) and size is not None:
        window = load.slots[-size:]
        if bool((alloc.translate(window) == 0).any()):
            detail = f"{load.rid}: its last window has FULL slots with no live SWA"
            raise InvariantViolation("COMMIT soundness", detail)
    for t in load.committed:
        if t.name is PoolName.KV and t.device_indices is not None:
            if all_members(t.device_indices, tree_slots):
                continue
            stray = set(t.device_indices.tolist()) - set(tree_slots.tolist())
            detail = f"{load.rid}: kept {len(stray)} loaded slots the tree does not own"
            raise InvariantViolation("COMMIT soundness", detail)


def all_members(values: torch.Tensor, within: torch.Tensor) -> bool:
    """Whether every element of `values` occurs in `within` (1-D int64 tensors).

    On CPU, for non-negative ids (slots), by one NumPy mark table: `within` marks its
    ids, `values` reads theirs (a few vectorised passes; `torch.isin` compares every
    pair at these sizes). Otherwise, and for any other input, `torch.isin`.
    """
    if values.numel() == 0:
        return True
    if within.numel() == 0:
        return False
    if values.device.type != "cpu" or within.device.type != "cpu":
        return bool(torch.isin(values, within).all())
    v, w = values.numpy(), within.numpy()
    lo, hi = min(int(v.min()), int(w.min())), int(w.max())
    if lo < 0 or hi > _MARK_LIMIT:
        return bool(torch.isin(values, within).all())
    if int(v.max()) > hi:
        return False
    marks = np.zeros(hi + 1, dtype=np.bool_)
    marks[w] = True
    return bool(marks[v].all())


#: ids up to this bound are checked by a mark table (at most this many bytes)
_MARK_LIMIT = 1 << 24


def restorable_intersection(per_rank: Sequence[Sequence[int]], num_pages: int, result: int) -> None:
    common = set(range(1, num_pages + 1))
    for s in per_rank:
        common &= set(s)
    best = max(common, default=0)
    if result != best:
        detail = f"agreed {result}, but the largest boundary every rank can restore is {best}"
        raise InvariantViolation("restorable intersection", detail)


def resident_kv_matches(
    tree: RadixTree,
    kv: KVPool,
    expected: Callable[[tuple[int, ...], int], torch.Tensor],
    *,
    swa_kv: KVPool | None = None,
    expected_swa: Callable[[tuple[int, ...], int], torch.Tensor] | None = None,
    nodes: Sequence[TreeNode] | None = None,
    expected_bytes: Callable[[tuple[int, ...], int, bool], bytes | None] | None = None,
) -> None:
    """Every device-resident node's FULL (and live SWA) bytes are `expected` of its key.

    All nodes are compared in one read and one comparison per pool; only when that
    finds a difference (or a node's slots do not match its key's length) are the nodes
    compared one by one, to name the first culprit. `expected_bytes(key, start, swa)`,
    where given, is ``row_bytes(expected(key, start))`` (``expected_swa`` with `swa`)
    for rows of the pool's dtype and row shape, or None where the caller does not keep
    them: the batched comparison reads those bytes instead of converting the rows.
    """
    full_nodes: list[tuple[TreeNode, torch.Tensor]] = []
    swa_nodes: list[tuple[TreeNode, torch.Tensor]] = []
    for n in _listed(tree, nodes):
        full = n.slots(FULL)
        if not n.device_resident or full is None:
            continue
        full_nodes.append((n, full))
        swa = n.slots(SWA)
        if swa is not None:
            swa_nodes.append((n, swa))
    check_swa = swa_kv is not None and expected_swa is not None
    if _all_match(full_nodes, kv, expected, expected_bytes, False) and (
        not check_swa or _all_match(swa_nodes, swa_kv, expected_swa, expected_bytes, True)
    ):
        return
    swa_of = {n.id: swa for n, swa in swa_nodes}
    for n, full in full_nodes:  # node by node, to name the first culprit
        want = expected(n.key, n.start)
        got = kv.read_pages(full)
        if not same_kv(got, want):
            rows = min(got.shape[0], want.shape[0])
            diff = (got[:rows] != want[:rows]).flatten(1).any(1).nonzero()
            bad = int(diff[0, 0]) if diff.numel() else rows
            detail = f"node {n.id} [{n.start}, {n.end}): FULL bytes wrong from token {bad}"
            raise InvariantViolation("KV bytes", detail)
        swa = swa_of.get(n.id)
        if (
            swa is not None
            and swa_kv is not None
            and expected_swa is not None
            and not same_kv(swa_kv.read_pages(swa), expected_swa(n.key, n.start))
        ):
            detail = f"node {n.id} [{n.start}, {n.end}): SWA bytes wrong"
            raise InvariantViolation("KV bytes", detail)


def _all_match(
    nodes: list[tuple[TreeNode, torch.Tensor]],
    pool: KVPool | None,
    expected: Callable[[tuple[int, ...], int], torch.Tensor] | None,
    expected_bytes: Callable[[tuple[int, ...], int, bool], bytes | None] | None,
    swa: bool,
) -> bool:
    """Whether the pool holds `expected` of every node's key in its slots (one read, one
    comparison); False also when some node's slot count is not its key's length."""
    assert pool is not None and expected is not None
    if not nodes:
        return True
    if any(int(slots.numel()) != len(n.key) for n, slots in nodes):
        return False
    slots = [slots for _, slots in nodes]
    if expected_bytes is not None:
        kept = [expected_bytes(n.key, n.start, swa) for n, _ in nodes]
        joined = b"".join(kept) if None not in kept else b""  # type: ignore[arg-type]
        if joined:
            return pool_holds(pool, slots, joined)
    return pool_holds(pool, slots, [expected(n.key, n.start) for n, _ in nodes])
