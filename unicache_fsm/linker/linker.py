"""The external linker: the contract between a radix tree and an external KV store.

A serving engine calls plain methods; each load and each offload is a machine
(`load_transaction`, `offload`) whose callbacks do the work.

Primitives, in the order a scheduler step uses them:

- `match(rid, key, namespace)` — the tree's device prefix, then LOOKUP of the whole
  pages past it: tail hashes chained from the last device page, one LOOKUP transfer
  per component, the store's restorable boundaries intersected across ranks (0/1
  mask, MIN). A hit creates an idle `ExternalLoad` held for the request.
- `load_back(load)` — LOAD + PREPARE (``idle → prepared``): reserve slots, map SWA,
  queue the store load; the outcome is agreed across ranks (MIN), so a load runs
  everywhere or nowhere. False when it aborted instead (the request recomputes).
- `start_loading()` — start every queued store load as one batch.
- `finish_loads()` — take completed batches (count MIN across ranks), agree on each
  verdict (MIN), COMMIT the landed loads and ABORT the rest; returns the loads that
  ended. A committed load hands the caller one lock on `load.endpoint` (the end of
  the loaded path), which the caller releases with ``tree.dec_lock_ref``.
- `offload_nodes(chain)` — hand a root-first chain of nodes (a write-through result)
  to the store, one offload per node, acceptance agreed across ranks;
  `poll_offloads()` completes them FIFO with verdicts agreed across ranks.
- `verify_stored(node)` — LOOKUP a stored path and demote the nodes whose pages the
  store lost.
- `release_request(rid)` — abort a request's load (deferred while its batch runs).
- `reset()` / `close()` — quiesce the store first, then abort every load and fail
  every offload, releasing their locks.

Every reserved slot ends exactly one way: adopted by the tree at COMMIT, freed as a
duplicate at COMMIT, or freed by ABORT. Nothing is published before the verdict, so no
node claims KV that never landed.

Collective calls: with several ranks, every rank calls `match`, `load_back`,
`finish_loads`, `offload_nodes`, `poll_offloads` and `verify_stored` in the same order
with the same arguments (their trees stay identical because every decision that
could differ — restorable prefixes, PREPARE, store acceptance, verdicts, completion
counts — is agreed by a MIN all-reduce before the tree changes).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from unicache_fsm import hashing
from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.reference import ReferenceExecutor
from unicache_fsm.linker.load import AbortReason, ExternalLoad, LoadState, LoadTrigger
from unicache_fsm.linker.offload import OffloadTrigger, PendingOffload
from unicache_fsm.linker.ranks import RankGroup, SingleRank, agree, intersect_restorable
from unicache_fsm.pools.transfer import (
    ExternalLinkerLoadPhase,
    LinkerTransferPhase,
    PoolName,
    PoolTransfer,
)
from unicache_fsm.store.errors import StoreFaultError
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.tree.components import LoadContext, components_for
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.params import InsertParams, MatchResult, _as_key
from unicache_fsm.tree.residency import ExecutorKind
from unicache_fsm.tree.tree import RadixTree

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


class _LoadRefused(Exception):
    """Internal: PREPARE could not go ahead; carries the reason for the ABORT."""

    def __init__(self, reason: AbortReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


@attrs.frozen
class LinkerConfig:
    """`executor` picks the executor that drives the load and offload machines."""

    executor: ExecutorKind = ExecutorKind.COMPILED


@attrs.define(slots=True)
class LinkerStats:
    """Counters of what the linker did (all monotonic)."""

    lookups: int = 0
    lookup_faults: int = 0
    hit_pages: int = 0
    loads_prepared: int = 0
    loads_committed: int = 0
    loads_aborted: dict[str, int] = attrs.field(factory=dict)
    pages_loaded: int = 0  # pages whose loaded bytes the tree adopted
    pages_duplicate: int = 0  # loaded pages freed at COMMIT (the tree had them)
    offloads_submitted: int = 0
    offloads_published: int = 0
    offloads_failed: int = 0
    pages_offloaded: int = 0
    nodes_demoted: int = 0


@attrs.frozen
class LinkerMatch:
    """The device prefix, and the external load when the store can restore more."""

    device: MatchResult
    load: ExternalLoad | None = None

    @property
    def external_hit_len(self) -> int:
        return 0 if self.load is None else self.load.prefix_len - self.load.device_hit_len


class ExternalLinker:
    """See the module docstring. The caller attaches the store to the KV pools."""

    def __init__(
        self,
        tree: RadixTree,
        store: ExternalStore,
        *,
        group: RankGroup | None = None,
        config: LinkerConfig | None = None,
    ) -> None:
        self.tree = tree
        self.store = store
        self.group: RankGroup = group if group is not None else SingleRank()
        self.config = config or LinkerConfig()
        self.components = components_for(tree)
        self.page_size = tree.page_size
        kind: type[Executor] = (
            CompiledExecutor if self.config.executor is ExecutorKind.COMPILED else ReferenceExecutor
        )
        self.load_machine = kind("load_transaction", ExternalLoad, triggers=LoadTrigger)
        self.offload_machine = kind("offload", PendingOffload, triggers=OffloadTrigger)
        self.loads: dict[str, ExternalLoad] = {}  # every load not yet final, by rid
        # loads released while their batch runs: they still own slots and a lock
        self.draining: list[ExternalLoad] = []
        self.batches: dict[int, list[ExternalLoad]] = {}
        # accepted offloads not completed, FIFO; None marks a store offload this rank
        # queued but the group refused: its completion is popped and dropped locally
        self.offloads: deque[PendingOffload | None] = deque()
        self.stats = LinkerStats()
        self._offload_ids = 0

    # -- LOOKUP ------------------------------------------------------------------------
    def match(
        self, rid: str, key: Sequence[int] | torch.Tensor, namespace: str | None = None
    ) -> LinkerMatch:
        """Device prefix plus, when the store can restore more, an idle load for `rid`."""
        if rid in self.loads:
            self.release_request(rid)
        key = _as_key(key)
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
        try:
            restorable = self.store.lookup(rid, [t for t in transfers if t is not None])
        except StoreFaultError:
            restorable = []  # a failing store is a miss, never an error for the request
            self.stats.lookup_faults += 1
        hit_pages = intersect_restorable(self.group, restorable, tail_pages)
        if hit_pages == 0:
            return LinkerMatch(device)
        self.stats.hit_pages += hit_pages
        load = ExternalLoad(
            rid=rid,
            linker=self,
            key=key[: hit + hit_pages * p],
            namespace=namespace,
            anchor=device.last_device_node,
            device_prefix=device.device_indices,
            tail_hashes=tuple(hashes[:hit_pages]),
        )
        self.load_machine.initialize(load)
        self.loads[rid] = load
        return LinkerMatch(device, load)

    # -- LOAD + PREPARE ----------------------------------------------------------------
    def load_back(self, load: ExternalLoad) -> bool:
        """Reserve, prepare and queue `load` on every rank, or on none; False when it was
        aborted instead (a collective call: the outcome is agreed across ranks)."""
        refusal: AbortReason | None = None
        try:
            self.load_machine.fire(load, L.PREPARE)
        except _LoadRefused as refused:
            refusal = refused.reason
        if not agree(self.group, refusal is None):
            self._abort(load, refusal or AbortReason.PEER_ABORTED)
            return False
        self.stats.loads_prepared += 1
        return True

    def _reserve(self, load: ExternalLoad) -> None:
        anchor = load.anchor
        if anchor is not self.tree.root and not anchor.device_resident:
            raise _LoadRefused(AbortReason.NO_SLOTS)  # the matched prefix is gone
        self.tree.inc_lock_ref(anchor)  # before allocating: eviction must spare the prefix
        built: list[PoolTransfer] = []
        ctx = LoadContext(prefix_len=load.prefix_len)
        try:
            for c in self.components:
                t = c.build_external_linker_transfer(LOAD, None, load.tail_hashes)
                if t is None:
                    raise _LoadRefused(AbortReason.NO_SLOTS)
                built.append(t)
            ctx.full_transfer = built[0]
            for c, t in zip(self.components, built, strict=True):
                c.update_external_linker_load(PREPARE, t, ctx)
        except BaseException:
            for c, t in reversed(list(zip(self.components, built, strict=False))):
                c.update_external_linker_load(ABORT, t, ctx)
            self.tree.dec_lock_ref(anchor)
            raise
        load.transfers, load.ctx = built, ctx

    def _queue(self, load: ExternalLoad) -> None:
        try:
            queued = self.store.load(load.rid, load.transfers)
        except StoreFaultError:
            queued = False
        if not queued:
            raise _LoadRefused(AbortReason.STORE_REFUSED)

    # -- landing -----------------------------------------------------------------------
    def start_loading(self) -> int:
        """Start every queued store load as one batch; the batch id, or -1 if none."""
        batch = self.store.start_loading()
        if batch < 0:
            return batch
        queued = [ld for ld in self.loads.values() if ld.state == LoadState.QUEUED]
        for load in queued:
            self.load_machine.fire(load, L.START)
            load.batch = batch
        self.batches[batch] = queued
        return batch

    def finish_loads(self) -> list[ExternalLoad]:
        """Complete the batches every rank has finished: COMMIT or ABORT each load."""
        count = self.group.all_reduce_min([self.store.num_completed_loads()])[0]
        ended: list[ExternalLoad] = []
        for _ in range(count):
            result = self.store.pop_completed_load()
            verdict = agree(self.group, result.success)
            for load in self.batches.pop(result.batch, []):
                if load.state != LoadState.LOADING:
                    continue
                load.verdict = verdict
                if verdict and not load.abort_pending:
                    self.load_machine.fire(load, L.LAND)
                    self.load_machine.fire(load, L.COMMIT)
                    if self.loads.get(load.rid) is load:
                        del self.loads[load.rid]
                    self.stats.loads_committed += 1
                else:
                    reason = AbortReason.RELEASED if verdict else AbortReason.LOAD_FAILED
                    self._abort(load, reason)
                ended.append(load)
        return ended

    # -- COMMIT ------------------------------------------------------------------------
    def _publish(self, load: ExternalLoad) -> None:
        ctx, tree, p = load.ctx, self.tree, self.page_size
        assert ctx is not None and ctx.full_transfer is not None
        loaded_full = ctx.full_transfer.device_indices
        assert loaded_full is not None
        result = tree.insert(
            InsertParams(
                key=load.key,
                value=torch.cat([load.device_prefix, loaded_full]),
                prev_prefix_len=load.device_hit_len,
                swa_evicted_seqlen=ctx.swa_evicted_seqlen,
                chunked=True,
                track_adopted_ranges=True,
                namespace=load.namespace,
            )
        )
        endpoint = result.last_device_node
        assert endpoint is not None and result.adopted_ranges is not None
        canonical = tree.path_slots(endpoint, load.anchor)
        assert canonical.numel() == len(load.tail_hashes) * p, "canonical tail length"
        ctx.adopted_ranges = result.adopted_ranges
        ctx.canonical_full = canonical
        committed: list[PoolTransfer] = []
        for c, t in zip(self.components, load.transfers, strict=True):
            cut = c.update_external_linker_load(COMMIT, t, ctx)
            if cut is not None:
                committed.append(cut)
        kv = [t for t in committed if t.name is PoolName.KV]
        adopted = kv[0].num_pages if kv else 0
        self.stats.pages_loaded += adopted
        self.stats.pages_duplicate += len(load.tail_hashes) - adopted
        load.committed, load.endpoint = committed, endpoint
        load.slots = torch.cat([load.device_prefix, canonical])
        tree.mark_stored_path(endpoint, load.anchor)
        tree.inc_lock_ref(endpoint)  # the caller's, from now on: the loaded path stays put
        tree.dec_lock_ref(load.anchor)
        load.transfers = []

    # -- ABORT -------------------------------------------------------------------------
    def _abort(self, load: ExternalLoad, reason: AbortReason) -> None:
        load.abort_reason = reason
        self.load_machine.fire(load, L.ABORT)
        if self.loads.get(load.rid) is load:
            del self.loads[load.rid]
        elif load in self.draining:
            self.draining.remove(load)
        self.stats.loads_aborted[reason.value] = self.stats.loads_aborted.get(reason.value, 0) + 1

    def _release(self, load: ExternalLoad) -> None:
        if load.state == LoadState.IDLE:
            return  # nothing was reserved (or PREPARE undid its own work)
        if load.state == LoadState.QUEUED:
            self.store.cancel_queued_load(load.rid)
        assert load.ctx is not None
        for c, t in reversed(list(zip(self.components, load.transfers, strict=True))):
            c.update_external_linker_load(ABORT, t, load.ctx)
        load.transfers = []
        self.tree.dec_lock_ref(load.anchor)

    def release_request(self, rid: str) -> None:
        """The request is gone: abort its load now, or when its running batch ends."""
        load = self.loads.get(rid)
        if load is None:
            return
        if load.state == LoadState.LOADING:
            # the store may still write into its slots: abort when the batch ends
            load.abort_pending = True
            del self.loads[rid]
            self.draining.append(load)
            return
        self._abort(load, AbortReason.RELEASED)

    # -- OFFLOAD -----------------------------------------------------------------------
    def offload_nodes(self, chain: Sequence[TreeNode]) -> PendingOffload | None:
        """Offload a root-first chain (e.g. `InsertResult.write_through`) as SGLang
        0.5.23 does: one store call, one lock and one pending record per node, each
        settled by its own verdict. Returns the last node's record (None: empty chain)."""
        record = None
        for node in chain:
            record = self._offload_one([node])
        return record

    def _offload_one(self, chain: Sequence[TreeNode]) -> PendingOffload | None:
        if not chain:
            return None
        transfers = self._offload_transfers(chain)
        ticket = self.tree.begin_offload(chain)
        self._offload_ids += 1
        record = PendingOffload(
            id=self._offload_ids, linker=self, ticket=ticket, transfers=transfers
        )
        self.offload_machine.initialize(record)
        try:
            queued = self.store.offload(transfers)
        except StoreFaultError:
            queued = False
        record.accepted = agree(self.group, queued)
        if queued and not record.accepted:
            self.offloads.append(None)  # drop its completion when it comes
        self.stats.offloads_submitted += 1
        self.offload_machine.fire(record, OFF.SUBMIT)
        if record.accepted:
            self.offloads.append(record)
        return record

    def _offload_transfers(self, chain: Sequence[TreeNode]) -> list[PoolTransfer]:
        merged: list[PoolTransfer] = []
        for c in self.components:
            parts = [c.build_external_linker_transfer(OFFLOAD, n, ()) for n in chain]
            present = [t for t in parts if t is not None and t.device_indices is not None]
            if not present:
                continue
            slots = torch.cat([t.device_indices for t in present if t.device_indices is not None])
            keys = tuple(k for t in present for k in t.keys)
            merged.append(PoolTransfer(c.pool, slots, keys, present[0].hit_policy))
        return merged

    def poll_offloads(self) -> list[PendingOffload]:
        """Complete the offloads every rank has finished, FIFO, with agreed verdicts
        (a collective call: one count all-reduce, then one verdict per offload)."""
        while self.offloads and self.offloads[0] is None and self.store.num_completed_offloads():
            self.store.pop_completed_offload()  # this rank's offload the group refused
            self.offloads.popleft()
        run = 0
        for record in self.offloads:
            if record is None:
                break
            run += 1
        local = min(self.store.num_completed_offloads(), run)
        count = self.group.all_reduce_min([local])[0]
        done = []
        for _ in range(count):
            record = self.offloads.popleft()
            assert record is not None
            record.success = agree(self.group, self.store.pop_completed_offload())
            self.offload_machine.fire(record, OFF.COMPLETE)
            done.append(record)
        return done

    def _finish_offload(self, record: PendingOffload) -> None:
        published = record.state == "published"
        self.tree.finish_offload(record.ticket, published)
        if published:
            self.stats.offloads_published += 1
            self.stats.pages_offloaded += sum(
                t.num_pages for t in record.transfers if t.name is PoolName.KV
            )
        else:
            self.stats.offloads_failed += 1

    # -- store-side eviction -----------------------------------------------------------
    def verify_stored(self, node: TreeNode) -> int:
        """LOOKUP the stored path root→`node`; demote nodes whose pages are gone.

        Returns how many nodes were demoted (they become eligible for offload again).
        `stored` is about FULL (KV) pages: a lost SWA window only narrows what LOOKUP
        restores, and re-offloading a node whose SWA is tombstoned could not bring it
        back, so SWA losses demote nothing.
        """
        path = node.path_from_root()
        if not path or any(n.hashes is None for n in path):
            return 0
        keys = [k for n in path for k in (n.hashes or ())]
        transfer = self.components[0].build_external_linker_transfer(LOOKUP, None, keys)
        assert transfer is not None
        try:
            restorable = self.store.lookup(f"verify-{node.id}", [transfer])
        except StoreFaultError:  # cannot tell: no evidence of loss, but stay in the collective
            restorable = list(range(1, len(keys) + 1))
        present = intersect_restorable(self.group, restorable, len(keys)) * self.page_size
        demoted = 0
        for n in path:
            if n.end > present and self.tree.demote(n):
                demoted += 1
        self.stats.nodes_demoted += demoted
        return demoted

    # -- lifecycle ---------------------------------------------------------------------
    def reset(self) -> None:
        """Quiesce the store, then abort every load and fail every pending offload.

        The store's own results of what it quiesced are drained and dropped: the
        records they belong to end here, failed.
        """
        self.store.reset()
        while self.store.num_completed_loads():
            self.store.pop_completed_load()
        while self.store.num_completed_offloads():
            self.store.pop_completed_offload()
        for load in [*self.loads.values(), *self.draining]:
            self._abort(load, AbortReason.RESET)
        self.batches.clear()
        while self.offloads:
            record = self.offloads.popleft()
            if record is None:
                continue
            record.success = False
            self.offload_machine.fire(record, OFF.COMPLETE)

    def close(self) -> None:
        self.reset()
        self.store.close()

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

    def locks_held(self) -> list[TreeNode]:
        """The node each of the linker's outstanding locks is anchored on."""
        held = [ld.anchor for ld in [*self.loads.values(), *self.draining] if ld.transfers]
        held += [rec.ticket.anchor for rec in self.offloads if rec is not None]
        return held

    def describe(self) -> dict[str, Any]:
        return attrs.asdict(self.stats)
