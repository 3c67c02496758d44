"""The external linker: the contract between a radix tree and an external KV store.

A serving engine calls plain methods; each load and each offload is a machine
(`load_transaction`, `offload`). The records (`ExternalLoad`, `PendingOffload`) are plain
data; the linker is the handler their executors are bound to, so the spec callbacks are
the linker's methods (listed under "Spec callbacks" below; called by the executors only).

Primitives, in the order a scheduler step uses them:

- `match(rid, key, namespace)` — the tree's device prefix, then LOOKUP of the whole
  pages past it: tail hashes chained from the last device page, one LOOKUP transfer
  per component, the store's restorable boundaries intersected across ranks (0/1
  mask, MIN). A hit creates an idle `ExternalLoad` held for the request.
- `load_back(load)` — LOAD + PREPARE (``idle → prepared``): first re-check that the
  matched device prefix is still the tree's (same slots, a live SWA window: the
  scheduler need not pin it between `match` and `load_back`; if another request
  evicted, reloaded or replaced it, the load aborts with ``stale_prefix`` and the
  request recomputes), then reserve slots, map SWA, queue the store load; the outcome
  is agreed across ranks (MIN), so a load runs everywhere or nowhere. False when it
  aborted instead (the request recomputes).
- `start_loading()` — start every queued store load as one batch.
- `finish_loads()` — take this rank's completed batches (at most those in flight; each
  completion ends the batch it names; a batch left without one for a few calls asks
  the store to start loads again, in case it answered an id it never started), then
  agree per prepared load (one MIN all-reduce) on whether every rank's store is done
  with it and every page landed; LAND and COMMIT
  those (LAND then ABORT where the request gave the load up meanwhile), ABORT the ones
  done but failed, keep waiting for the rest. Returns the loads that
  ended (not those whose `load_back` answered False: the request already recomputes).
  A committed load hands the caller one lock on `load.endpoint` (the end of the loaded
  path), which the caller releases with ``tree.dec_lock_ref``.
- `offload_nodes(chain)` — hand a root-first chain of nodes (a write-through result)
  to the store, one offload per node, acceptance agreed across ranks;
  `poll_offloads()` completes them FIFO with verdicts agreed across ranks. Each KV
  transfer starts with the last page of the node's parent when that parent is on the
  device (stored, offloading or backed up): the store usually holds that page already
  and links the node to it (else it stores it too), so its capacity eviction shrinks
  the whole path from its end.
- `verify_stored(node)` — LOOKUP a stored path and demote the nodes whose pages the
  store lost.
- `release_request(rid)` — abort a request's load now if every rank's store gave it
  back, else when its store is done with it (a running batch ends, or a lost
  `cancel_queued_load` answer is settled).
- `reset()` / `close()` — quiesce the store first, then abort every load and fail
  every offload, releasing their locks; a store reset that returned also releases the
  quarantine (below).

Store faults: the linker talks to its store through a `CheckedStore`. Any exception or
malformed answer from any store call is a fault of that call (counted in
`stats.store_faults`, the last one kept in `last_store_fault`, a `StoreProtocolError`
for an ill-typed answer), never an error for the caller: a failed LOOKUP is a miss, a
failed `load` a refusal (the load aborts, the request recomputes), a refused `offload` a
refusal (its nodes return to unstored, unlocked) — but a lost `offload` answer (it
raised or was no bool; the store may have queued it) holds it in the quarantine, nodes
locked — and a verdict that is not a real ``True`` a failure. Slots are freed only when
the store acknowledged it will write no more into them (a confirmed cancel, the batch's
own well-formed completion, a reset that returned). When the store breaks the protocol
instead — a completion count it cannot back, a faulty pop, a completion naming an
unknown batch, skipping an older one or naming other loads, a lost `start_loading`
answer — the loads involved abort (their requests recompute) and their slots go to the
quarantine (`linker.quarantine`, the fourth term of slot conservation), released only by
that batch's own completion or a reset; after a faulty offload pop, every offload in
flight is held (nodes locked), published never, released one per later completion (see
`poll_offloads`). A faulty load completion ends the oldest batch holding loads, never an
empty one (which may never complete), so no load waits forever. After a reset the
completions its drain did not find are owed and dropped when they come (see `reset`).
Completion loops pop at most what can be in flight, so every call returns in bounded
time. With `LinkerConfig.reset_when_idle` a linker holding a quarantine and nothing in
flight resets its store to release it.

Every reserved slot ends exactly one way: adopted by the tree at COMMIT, freed as a
duplicate at COMMIT, or freed by ABORT. Nothing is published before the verdict, so no
node claims KV that never landed.

Spec callbacks (``callback(record, *trigger_args)``; never call them directly):
`reserve_slots`, `queue_store_load`, `landed_everywhere`, `publish`,
`withdraw_store_load`, `free_reservation`, `record_abort` (load_transaction);
`store_accepted`, `succeeded`, `publish_nodes`, `roll_back_nodes` (offload).

Collective calls: with several ranks, every rank calls `match`, `load_back`,
`finish_loads`, `release_request`, `offload_nodes`, `poll_offloads`, `verify_stored`
and `reset` in the same order with the same arguments (their trees stay identical
because every decision that could differ — restorable prefixes, PREPARE, store
acceptance, whether a store gave a load back, verdicts, completion counts, faults
included — is agreed by a MIN all-reduce before the tree changes). `start_loading`
is per rank: a rank whose store failed to start a batch keeps its loads queued and
starts them later; agreement per load makes the ranks end them together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch

from unicache_fsm import hashing
from unicache_fsm.linker.aborting import (
    Aborting,
)
from unicache_fsm.linker.landing import Landing
from unicache_fsm.linker.lifecycle import Lifecycle
from unicache_fsm.linker.load import ExternalLoad, LoadTrigger
from unicache_fsm.linker.loading import Loading
from unicache_fsm.linker.offload import OffloadTrigger
from unicache_fsm.linker.offloading import Offloading
from unicache_fsm.linker.ranks import intersect_restorable
from unicache_fsm.linker.state import (
    LinkerConfig,
    LinkerStats,
)
from unicache_fsm.pools.transfer import (
    ExternalLinkerLoadPhase,
    LinkerTransferPhase,
    PoolName,
)
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.params import MatchResult

__all__ = ["ExternalLinker", "LinkerConfig", "LinkerMatch", "LinkerStats"]

L, OFF = LoadTrigger, OffloadTrigger
LOOKUP, LOAD, OFFLOAD = (
    LinkerTransferPhase.LOOKUP,
    LinkerTransferPhase.LOAD,
    LinkerTransferPhase.OFFLOAD,
)
PREPARE, COMMIT, ABORT = (
    ExternalLinkerLoadPhase.PREPARE,
    ExternalLinkerLoadPhase.COMMIT,
    ExternalLinkerLoadPhase.ABORT,
)


def _token_key(key: Sequence[int] | torch.Tensor) -> tuple[int, ...]:
    """A request key as a tuple of tokens (what `ExternalLoad.key` holds)."""
    if isinstance(key, tuple):
        return key
    if isinstance(key, torch.Tensor):
        return tuple(key.tolist())
    return tuple(key)


@attrs.frozen
class LinkerMatch:
    """The device prefix, and the external load when the store can restore more."""

    device: MatchResult
    load: ExternalLoad | None = None

    @property
    def external_hit_len(self) -> int:
        return 0 if self.load is None else self.load.prefix_len - self.load.device_hit_len


class ExternalLinker(Aborting, Loading, Landing, Offloading, Lifecycle):
    """One rank's linker between a `RadixTree` and an `ExternalStore`: LOOKUP at
    `match`, LOAD + PREPARE at `load_back`, LAND and COMMIT or ABORT at `finish_loads`,
    OFFLOAD at `offload_nodes` / `poll_offloads` (the primitives, in the order a
    scheduler step calls them, are in the module docstring).

    Contract: no request reads KV that is not its prefix's; every store fault is
    contained (the request recomputes, the slots the store may still write are
    quarantined until the store proves it done); every slot it reserves is freed or
    handed to the tree exactly once. The caller attaches the store to the KV pools
    before building the linker; with several ranks, `group` agrees every verdict.
    """

    # -- LOOKUP ------------------------------------------------------------------------
    def match(
        self, rid: str, key: Sequence[int] | torch.Tensor, namespace: str | None = None
    ) -> LinkerMatch:
        """Device prefix plus, when the store can restore more, an idle load for `rid`."""
        if rid in self.loads:
            self.release_request(rid)
        key = _token_key(key)
        device = self.tree.match_prefix(key, namespace)
        p = self.page_size
        hit = device.prefix_len
        tail_pages = (len(key) - hit) // p
        if tail_pages == 0:
            return LinkerMatch(device)
        if hit > 0:
            prior = device.last_device_node.last_hash()
            if prior is None:  # a tail hashed without its anchor would hash as a head
                return LinkerMatch(device)
        else:
            prior = namespace
        hashes = hashing.page_hashes(key[hit : hit + tail_pages * p], p, prior)
        transfers = [
            c.build_external_linker_transfer(LOOKUP, None, hashes) for c in self.components
        ]
        assert all(t is not None for t in transfers)
        self.stats.lookups += 1
        found = self.calls.lookup(rid, [t for t in transfers if t is not None], tail_pages)
        # a failing store is a miss, never an error for the request (on this rank; the
        # intersection makes it a miss on every rank)
        hit_pages = intersect_restorable(self.group, found or [], tail_pages)
        if hit_pages == 0:
            return LinkerMatch(device)
        self.stats.hit_pages += hit_pages
        load = ExternalLoad(
            rid=rid,
            key=key[: hit + hit_pages * p],
            namespace=namespace,
            anchor=device.last_device_node,
            device_prefix=device.device_indices,
            tail_hashes=tuple(hashes[:hit_pages]),
        )
        self.load_machine.initialize(load)
        self.loads[rid] = load
        return LinkerMatch(device, load)

    # -- store-side eviction -----------------------------------------------------------
    def verify_stored(self, node: TreeNode) -> int:
        """LOOKUP the stored path root→`node`; demote nodes whose pages are gone.

        Returns how many nodes were demoted (they become eligible for offload again).
        `stored` is about FULL (KV) pages: a lost SWA window only narrows what LOOKUP
        restores, and re-offloading a node whose SWA is tombstoned could not bring it
        back, so SWA losses demote nothing. A failed LOOKUP is no evidence of loss.
        """
        path = node.path_from_root()
        if not path or any(n.hashes is None for n in path):
            return 0
        keys = [k for n in path for k in (n.hashes or ())]
        transfer = self.components[0].build_external_linker_transfer(LOOKUP, None, keys)
        assert transfer is not None
        found = self.calls.lookup(f"verify-{node.id}", [transfer], len(keys))
        if found is None:  # cannot tell: no evidence of loss, but stay in the collective
            found = list(range(1, len(keys) + 1))
        present = intersect_restorable(self.group, found, len(keys)) * self.page_size
        demoted = 0
        for n in path:
            if n.end > present and self.tree.demote(n):
                demoted += 1
        self.stats.nodes_demoted += demoted
        return demoted

    # -- audit helpers -----------------------------------------------------------------
    def reserved_slots(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(FULL, SWA) slots reserved by prepared loads: held outside the tree."""
        full: list[torch.Tensor] = []
        swa: list[torch.Tensor] = []
        for load in [*self.loads.values(), *self.draining]:
            for t in load.transfers:
                assert t.device_indices is not None
                (swa if t.name is PoolName.SWA else full).append(t.device_indices)
        return full, swa

    def quarantined_slots(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(FULL, SWA) slots in the quarantine: held outside the tree, neither free nor
        any live load's (the fourth term of slot conservation)."""
        return self.quarantine.slots()

    def locks_held(self) -> list[TreeNode]:
        """The node each of the linker's outstanding locks is anchored on (the
        quarantined offloads' included)."""
        held = [ld.anchor for ld in [*self.loads.values(), *self.draining] if ld.transfers]
        held += [
            rec.ticket.anchor
            for rec in [*self.offloads, *self.quarantine.offloads]
            if rec is not None
        ]
        return held

    def busy(self) -> bool:
        """Whether any load or offload is still in flight (prepared, or pending); what
        the quarantine holds is not: only the store's own signal releases it."""
        return bool(self.held or any(b.loads for b in self.batches) or self.offloads)

    def describe(self) -> dict[str, Any]:
        return attrs.asdict(self.stats)
