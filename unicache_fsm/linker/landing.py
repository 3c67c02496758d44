"""How a prepared load lands: store batches, their completions, LAND and COMMIT.

`start_loading` starts every queued store load as one batch (per rank). `finish_loads`
takes this rank's completions — each ends the batch it names, FIFO; a completion that
names no batch in flight, skips an older one or names other loads is a protocol fault
that ends the oldest batch holding loads with its slots quarantined, and a batch left
without a completion for a few calls asks the store to start loads again, and ends
(slots quarantined) when the store answers it holds nothing queued and every load the
batch waits on may have been withdrawn (a lost cancel answer) — then agrees
per prepared load (one MIN all-reduce) whether every rank's store is done with it and
every page landed: LAND and COMMIT those (COMMIT inserts the loaded path, adopts the new
pages, frees the duplicates and hands the caller one lock on the endpoint), ABORT the
ones done but failed or given up, keep waiting for the rest. Completion loops pop at
most what can be in flight, so every call returns in bounded time.

`Landing` holds these two calls and the LAND/COMMIT spec callbacks of
``load_transaction`` (`landed_everywhere`, `publish`).
"""

from __future__ import annotations

import itertools

import torch

from unicache_fsm.fsm.errors import GuardRejectedError
from unicache_fsm.linker.aborting import (
    abort_load,
    forget,
    release_load,
    settle_cancel,
    suspect,
    suspect_batch,
)
from unicache_fsm.linker.lifecycle import reclaim
from unicache_fsm.linker.load import AbortReason, ExternalLoad, LoadState, LoadTrigger
from unicache_fsm.linker.state import COUNT_SLACK, Batch, LinkerState, protocol_fault
from unicache_fsm.pools.transfer import ExternalLinkerLoadPhase, PoolName, PoolTransfer
from unicache_fsm.store.protocol import LoadBatchResult
from unicache_fsm.tree.params import InsertParams

__all__ = ["Landing"]

L = LoadTrigger
COMMIT = ExternalLinkerLoadPhase.COMMIT

# per-load settlement values, agreed by MIN across ranks in `finish_loads`
_UNSETTLED, _FAILED, _LANDED = 0, 1, 2
# empty batches the store acknowledged (nothing of ours to load) kept for their completion
_EMPTY_KEPT = 8
# `finish_loads` calls without a completion after which the oldest batch holding loads
# asks the store to start loads again (a store that answered a batch id it never started
# still holds them queued; an honest one answers -1): see `Landing._nudge`
_NUDGE_AFTER = 4


class Landing(LinkerState):
    """`start_loading` (per rank) and `finish_loads` (a collective call), and the
    LAND/COMMIT spec callbacks of ``load_transaction``.

    Contract: a load commits only on a verdict every rank agreed is its own batch's
    success, with every page landed; a batch ends only on its own well-formed completion
    or on a fault that quarantines its slots; nothing is published before the verdict.
    """

    def start_loading(self) -> int:
        """Start every queued store load as one batch; the batch id, or -1 if none.

        A fault of the store's `start_loading` starts nothing here (the loads stay
        queued for the next call). A store that says nothing was queued holds none of
        this rank's queued loads: they are settled as failed.
        """
        return self._record_start(self.calls.start_loading())

    def _record_start(self, batch: int | None) -> int:
        """What `start_loading` does with the store's answer `batch` (None: a fault)."""
        queued = [ld for ld in self.held.values() if ld.state == LoadState.QUEUED]
        started = [ld for ld in queued if ld.settled is None]
        if batch is None:  # the store may have started them anyway: its answer is lost
            for load in started:
                load.maybe_started = True
            return -1
        if batch < 0:
            for load in started:
                if load.maybe_started:  # perhaps in the batch whose answer was lost
                    suspect(load, None)
                else:
                    load.settled = False  # the store holds nothing queued
            return -1
        known = {b.id for b in self.batches} | set(self.unconfirmed)
        if batch in known:
            msg = (
                f"start_loading: the store answered batch {batch}, which is already in "
                "flight or held; its loads cannot be told apart from that batch's"
            )
            protocol_fault(self, "start_loading", batch, msg)
            for load in started:
                suspect(load, None)
            return -1
        for load in started:
            self.load_machine.fire(load, L.START)
            load.batch = batch
        self.batches.append(Batch(batch, started))
        if not started:  # the store started nothing of ours: keep a few for their completion
            empty = [b for b in self.batches if not b.loads]
            if len(empty) > _EMPTY_KEPT:
                self.batches.remove(empty[0])
        return batch

    def finish_loads(self) -> list[ExternalLoad]:
        """Take this rank's completions, agree per load, COMMIT or ABORT the settled ones."""
        self._take_completions()
        held = list(self.held.values())
        if not held:
            reclaim(self)
            return []
        mine = [
            _FAILED
            if ld.state == LoadState.IDLE  # PREPARE was refused here: nothing to wait for
            else _UNSETTLED
            if ld.settled is None
            else _LANDED
            if ld.settled
            else _FAILED
            for ld in held
        ]
        agreed = self.group.all_reduce_min(mine)
        ended: list[ExternalLoad] = []
        for load, value in zip(held, agreed, strict=True):
            if value == _UNSETTLED:
                continue
            # the machine's guard judges the verdict (the LAND trigger's argument); a
            # veto leaves the load loading (fire puts the state back), as a `may_fire`
            # probe first would, without running the guard twice on the usual path
            landed = False
            if load.state == LoadState.LOADING:
                try:
                    self.load_machine.fire(load, L.LAND, value == _LANDED)
                    landed = True
                except GuardRejectedError:
                    pass
            if landed:
                if load.abort_pending is None:
                    self.load_machine.fire(load, L.COMMIT)
                    forget(self, load)
                    self.stats.loads_committed += 1
                else:  # every page landed, but the request gave the load up meanwhile
                    abort_load(self, load, load.abort_pending)
            elif load.state == LoadState.LOADING:
                abort_load(self, load, AbortReason.LOAD_FAILED)
            else:
                abort_load(self, load, load.abort_pending or AbortReason.LOAD_FAILED)
            if load.awaited:  # not a load whose load_back already answered False
                ended.append(load)
        reclaim(self)
        return ended

    def _take_completions(self) -> None:
        """Ask again for the loads being given up that the store may still hold queued
        (their cancel failed), then pop every completion this rank's store has; each
        ends the oldest batch in flight."""
        for load in self.held.values():
            if (
                load.state == LoadState.QUEUED
                and load.abort_pending is not None
                and load.settled is None
            ):
                settle_cancel(load, self.calls.cancel_queued_load(load.rid))
        calls = self.calls
        limit = len(self.batches) + len(self.unconfirmed) + COUNT_SLACK
        count = calls.bounded("num_completed_loads", calls.num_completed_loads(), limit)
        for _ in range(count):
            self._end_batch(calls.pop_completed_load())
        oldest = next((b for b in self.batches if b.loads), None)
        if count or oldest is None:
            return
        oldest.waited += 1
        queued = any(ld.state == LoadState.QUEUED for ld in self.held.values())
        if oldest.waited % _NUDGE_AFTER == 0 and not queued:
            self._nudge(oldest)

    def _nudge(self, oldest: Batch) -> None:
        """`oldest` holds loads and saw no completion for a while: ask the store to start
        loads again (nothing of ours is queued: the answer is only recorded). A store
        that answered an id it never started starts the loads it still holds queued; an
        answer of -1 says it holds none. Then a batch whose every unsettled load is one
        the store may have given back (`maybe_withdrawn`: its cancel's answer was lost)
        may be such an id with nothing behind it, which no completion will ever end: it
        ends now, its loads abort as failed and their slots are quarantined until its
        own completion (an honest store's, come late, releases them) or a reset. A
        batch holding a load the store never gave back waits on: the store runs it."""
        answer = self.calls.start_loading()
        self._record_start(answer)
        waiting = [ld for ld in oldest.loads if ld.settled is None]
        if answer == -1 and all(ld.maybe_withdrawn for ld in waiting):
            self.batches.remove(oldest)  # (an honest store answers so too: not a fault)
            suspect_batch(self, oldest, oldest.id)

    def _end_batch(self, result: LoadBatchResult | None) -> None:
        """One popped completion: it ends its own batch, or releases what the quarantine
        held for it. Anything else is a fault that ends the oldest batch in flight with
        its slots quarantined (its requests recompute; the store may still write)."""
        if result is None:  # a faulty pop: which batch, if any, ended is unknown
            self._suspect_oldest()
            return
        if result.batch in self.unconfirmed:  # the store's own completion, come late
            self.unconfirmed.remove(result.batch)
            for load in [*self.held.values(), *self.draining]:
                if load.suspect and load.held_for == result.batch:
                    load.suspect = False  # not ended yet: it is freed when it ends
            for load in self.quarantine.take_batch(result.batch):
                release_load(self, load)
            return
        position = next((i for i, b in enumerate(self.batches) if b.id == result.batch), None)
        if position is None:
            oldest = self.batches[0].id if self.batches else None
            msg = (
                f"pop_completed_load: the completion names batch {result.batch}, which is "
                f"neither in flight nor held (oldest in flight: {oldest})"
            )
            protocol_fault(self, "pop_completed_load", result, msg)
            self._suspect_oldest()
            return
        named = self.batches[position]
        if not named.loads and result.rids:  # an older batch's loads, started under this id?
            older = next(
                (
                    b
                    for b in itertools.islice(self.batches, position)
                    if sorted(ld.rid for ld in b.loads) == sorted(result.rids)
                ),
                None,
            )
            if older is not None:  # the store's own completion for exactly those loads
                self.batches.remove(named)
                self.batches.remove(older)
                self._settle_batch(older, result.success)
                return
        for _ in range(position):  # completions are FIFO: the store skipped these
            skipped = self.batches.popleft()
            msg = (
                f"pop_completed_load: batch {result.batch} completed before batch "
                f"{skipped.id}, which was started first"
            )
            protocol_fault(self, "pop_completed_load", result, msg)
            suspect_batch(self, skipped, skipped.id)
        batch = self.batches.popleft()
        mine = sorted(ld.rid for ld in batch.loads)
        if sorted(result.rids) != mine:
            msg = (
                f"pop_completed_load: the completion of batch {batch.id} names "
                f"{sorted(result.rids)}, the batch holds {mine}"
            )
            protocol_fault(self, "pop_completed_load", result, msg)
            suspect_batch(self, batch, None)  # its own completion came, and is wrong
            return
        self._settle_batch(batch, result.success)

    def _settle_batch(self, batch: Batch, success: bool) -> None:
        """The store's own well-formed completion for `batch`: its verdict settles it."""
        for load in batch.loads:
            if load.state == LoadState.LOADING and load.settled is None:
                load.settled = success

    def _suspect_oldest(self) -> None:
        """A completion that names no batch in flight: it may be the oldest batch holding
        loads of ours (not an empty one the store acknowledged, which may never complete),
        so that batch ends, its slots quarantined until its own completion or a reset:
        no load waits forever on a completion the store consumed."""
        batch = next((b for b in self.batches if b.loads), None)
        if batch is not None:
            self.batches.remove(batch)
            suspect_batch(self, batch, batch.id)

    # -- spec callbacks of load_transaction: LAND, COMMIT (called by `load_machine` only)
    def landed_everywhere(self, load: ExternalLoad, verdict: object = False) -> bool:
        """Guard of ``land``: the agreed batch verdict, passed as the trigger's argument."""
        return verdict is True

    def publish(self, load: ExternalLoad) -> None:
        """Before ``commit``: see `ExternalLoad` (insert, keep adopted, mark stored)."""
        ctx, tree, p = load.ctx, self.tree, self.page_size
        assert ctx is not None and ctx.full_transfer is not None
        loaded_full = ctx.full_transfer.device_indices
        assert loaded_full is not None
        value = torch.cat([load.device_prefix, loaded_full])
        result = tree.insert(
            InsertParams(
                key=load.key,
                value=value,
                prev_prefix_len=load.device_hit_len,
                swa_evicted_seqlen=ctx.swa_evicted_seqlen,
                chunked=True,
                track_adopted_ranges=True,
                namespace=load.namespace,
            )
        )
        endpoint = result.last_device_node
        assert endpoint is not None and result.adopted_ranges is not None
        backbone = self.components[0].component_type
        whole_tail = [(load.device_hit_len, load.prefix_len)]
        if result.adopted_ranges.get(backbone) == whole_tail:
            # the tree adopted every loaded page: its tail slots are the loaded ones
            # (an adopting node copies the insert's value), so neither the tail nor
            # the whole path needs reading back and joining again
            canonical, slots = loaded_full, value
        else:
            canonical, slots = tree.path_slots(endpoint, load.anchor), None
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
        load.slots = slots if slots is not None else torch.cat([load.device_prefix, canonical])
        tree.mark_stored_path(endpoint, load.anchor)
        tree.inc_lock_ref(endpoint)  # the caller's, from now on: the loaded path stays put
        tree.dec_lock_ref(load.anchor)
        load.transfers = []
