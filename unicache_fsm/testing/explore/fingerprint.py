"""State fingerprints: a state's canonical form, and its mirror images made one.

- `canonical(ns, scope, order=None)` — the state of the system in `ns`, free of ids,
  counters, clocks and slot numbers: the tree's shape and keys, each node's residency,
  locks, hash/backup/offload marks, the relative order of its last access, and its
  FULL / SWA / host slots renamed in order of first appearance (slots are opaque
  handles, so free-list order is not part of a state); every load's state, anchor, the
  device prefix it matched (in the same slot names: an anchor moved into other slots
  since is another state), reserved slots and batch, and what a lost answer left it
  unsure of (`maybe_started`, `maybe_withdrawn`); the offload records; the harness's
  requests and locks; the store's contents and its in-flight work
  (`FaultyStore.pending`); with a capacity store or corruption, the store's chain books
  (`BaseStore.chain_books`: parents, eviction order, remembered parents) and which
  pages are corrupt, and with a capacity store what the chain audit has learnt to
  exempt (`System.chain_exemptions`). `order` renames the requests.
- `fingerprint(ns, scope)` — 16 bytes (BLAKE2b) standing for that form; when every
  request asks for the same key (``Scope.symmetric``), the least over the orders of the
  requests (a state and its mirror image are one state).

Reductions, each exact for this system: hit counts are recorded only up to the
write-through threshold (1), past which they change nothing; mirror images are one
state (above).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import Any

import torch

from unicache_fsm.linker.load import ExternalLoad
from unicache_fsm.pools.transfer import ComponentType, PoolName
from unicache_fsm.serving.system import System
from unicache_fsm.store.checksum import page_checksum
from unicache_fsm.testing.explore.helpers import path_key
from unicache_fsm.testing.explore.operations import named_requests
from unicache_fsm.testing.explore.scope import Scope
from unicache_fsm.tree.node import TreeNode

FULL, SWA = ComponentType.FULL, ComponentType.SWA


class _Renamer:
    """Slot numbers renamed in order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[int, int] = {}

    def __call__(self, t: torch.Tensor | None) -> tuple[int, ...] | None:
        if t is None:
            return None
        names = self.names
        return tuple(names.setdefault(x, len(names)) for x in t.tolist())


def canonical(
    ns: dict[str, Any], scope: Scope, order: Sequence[int] | None = None
) -> tuple[Any, ...]:
    """The state of the system in `ns`, free of ids, counters, clocks and slot numbers.

    `order` renames the requests (request ``i`` is written as ``order[i]``); only a
    renaming of requests that ask for the same key gives an equivalent state.
    """
    s: System = ns["s"]
    names = {f"r{i}": f"r{j}" for i, j in enumerate(order or range(scope.requests))}

    def rn(rid: str) -> str:
        return names.get(rid, rid)

    lk = s.linker
    full, swa, host = _Renamer(), _Renamer(), _Renamer()
    index: dict[int, int] = {}
    nodes: list[TreeNode] = []

    def walk(node: TreeNode) -> None:
        index[id(node)] = len(nodes)
        nodes.append(node)
        for key in sorted(node.children, key=repr):
            walk(node.children[key])

    walk(s.tree.root)

    def ref(node: TreeNode | None) -> Any:
        if node is None:
            return None
        at = index.get(id(node))
        return at if at is not None else ("detached", path_key(node), node.residency)

    tickets = {id(rec.ticket): i for i, rec in enumerate(lk.offloads) if rec is not None}
    stamps = {v: i for i, v in enumerate(sorted({n.last_access for n in nodes}))}
    tree = tuple(
        (
            tuple(n.key),
            ref(n.parent),
            n.namespace,
            n.residency,
            n.lock_ref,
            min(n.hit_count, 1),  # the system's write-through threshold is 1
            stamps[n.last_access],
            n.hashes is not None,
            full(n.slots(FULL)),
            swa(n.slots(SWA)),
            host(n.host),
            None
            if n.pending_offload is None
            else (tickets.get(id(n.pending_offload), -1), n.pending_offload.finished),
        )
        for n in nodes
    )

    seqs = {ld.seq: i for i, ld in enumerate(sorted(lk.loads.values(), key=lambda x: x.seq))}

    def load_form(ld: ExternalLoad) -> Any:
        return (
            rn(ld.rid),
            ld.state,
            ref(ld.anchor),
            len(ld.key),
            len(ld.tail_hashes),
            ld.batch >= 0,
            seqs.get(ld.seq, -1),
            ld.settled,
            ld.abort_reason,
            ld.abort_pending,
            # what the linker cannot know after a lost answer, and acts on: whether its
            # batch may have started, whether its cancel may have reached the store
            ld.maybe_started,
            ld.maybe_withdrawn,
            ref(ld.endpoint),
            # the device prefix it matched, in the tree's slot names: an anchor moved into
            # other slots since (backed up, evicted, loaded back) is another state
            full(ld.device_prefix),
            tuple(
                (t.name, (swa if t.name is PoolName.SWA else full)(t.device_indices))
                for t in ld.transfers
            ),
            tuple((t.name, len(t.keys)) for t in ld.committed),
            full(ld.slots),
        )

    loads = tuple(load_form(lk.loads[r]) for r in sorted(lk.loads, key=rn))
    draining = tuple(load_form(ld) for ld in lk.draining)
    held = tuple(sorted(rn(ld.rid) for ld in lk.held.values()))
    batches = tuple(tuple(rn(ld.rid) for ld in b.loads) for b in lk.batches)
    offloads = tuple(
        None
        if rec is None
        else (
            rec.state,
            tuple(ref(n) for n in rec.ticket.publish),
            ref(rec.ticket.anchor),
            rec.chain_pages,
            len(rec.transfers),
        )
        for rec in lk.offloads
    )
    requests: list[Any] = [None] * scope.requests
    for i, req in named_requests(ns, scope):
        at = int(rn(f"r{i}")[1:])
        if req is None:
            requests[at] = None
        elif req.rid not in s.requests:
            requests[at] = "done"
        else:
            requests[at] = (
                ref(req.lock),
                req.prepared,
                None if req.load is None else load_form(req.load),
                req.match is not None and req.match.load is req.load,
            )
    locks = tuple(sorted(repr(ref(n)) for n in s.locks))
    pools = [PoolName.KV, PoolName.SWA] if scope.swa else [PoolName.KV]
    store = tuple(tuple(sorted(s.memory.stored_keys(pool))) for pool in pools)
    work: Any = s.faulty.pending()  # (queued rids, started batches, offloads)
    queued, batched, offloading = work
    pending = (
        tuple(rn(r) for r in queued),
        tuple((tuple(rn(r) for r in rids), *rest) for rids, *rest in batched),
        offloading,
    )
    form: tuple[Any, ...] = (
        tree,
        loads,
        draining,
        held,
        batches,
        offloads,
        tuple(requests),
        locks,
        store,
        pending,
        s.allocator.available_size(),
    )
    if scope.corrupt or scope.store_pages:  # what steers capacity eviction and drops
        form += (s.memory.chain_books(),)
    if scope.corrupt:
        bad = tuple(
            (pool, key)
            for pool in pools
            for key in sorted(s.memory.stored_keys(pool))
            if _corrupted(s, pool, key)
        )
        form += (bad,)
    if scope.store_pages:  # the audit's own history (what `check_chains` exempts)
        form += (s.check_chains, *(tuple(sorted(x)) for x in s.chain_exemptions()))
    return form


def _corrupted(s: System, pool: PoolName, key: str) -> bool:
    header = s.memory.header(pool, key)
    view = s.memory.stored_bytes(pool, key)
    assert header is not None and view is not None
    return page_checksum(view) != header.checksum


def fingerprint(ns: dict[str, Any], scope: Scope) -> bytes:
    """16 bytes that stand for the state's canonical form; when every request asks for
    the same key (``key_pages=1``), the least over both orders of the requests (a state
    and its mirror image, the requests' roles swapped, are one state)."""
    forms = [repr(canonical(ns, scope))]
    if scope.symmetric:
        for order in itertools.permutations(range(scope.requests)):
            if list(order) != sorted(order):
                forms.append(repr(canonical(ns, scope, order)))
    return hashlib.blake2b(min(forms).encode(), digest_size=16).digest()
