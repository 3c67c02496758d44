"""LOAD + PREPARE: a matched load reserves its slots and is queued in the store.

`load_back` moves a load ``idle → prepared`` on every rank or on none (the outcome is
agreed, MIN): it first re-checks that the matched device prefix is still the tree's (the
same nodes, the same FULL slots, a live SWA window; the scheduler need not pin it
between `match` and `load_back`, and a prefix evicted, reloaded or replaced meanwhile
aborts the load with ``stale_prefix``), then locks the anchor, reserves every
component's slots, maps SWA and queues the store load. Any refusal undoes exactly the
work done (the load stays idle) and aborts it; the request recomputes.

`Loading` holds `load_back` and the PREPARE-side spec callbacks of ``load_transaction``
(`reserve_slots`, `queue_store_load`).
"""

from __future__ import annotations

import torch

from unicache_fsm.linker.aborting import end_now_or_later
from unicache_fsm.linker.load import AbortReason, ExternalLoad, LoadTrigger
from unicache_fsm.linker.ranks import agree
from unicache_fsm.linker.state import LinkerState
from unicache_fsm.pools.transfer import ExternalLinkerLoadPhase, LinkerTransferPhase, PoolTransfer
from unicache_fsm.tree.components import LoadContext

__all__ = ["Loading"]

L = LoadTrigger
LOAD = LinkerTransferPhase.LOAD
PREPARE, ABORT = ExternalLinkerLoadPhase.PREPARE, ExternalLinkerLoadPhase.ABORT


class _LoadRefused(Exception):
    """Internal: PREPARE could not go ahead; carries the reason for the ABORT."""

    def __init__(self, reason: AbortReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


class Loading(LinkerState):
    """`load_back` (a collective call) and the PREPARE-side spec callbacks of
    ``load_transaction`` (called by `load_machine` only).

    Contract: a load is prepared on every rank or on none; a refused PREPARE leaves no
    slot reserved and no lock taken; a load never prepares over a device prefix that is
    no longer the one it matched.
    """

    def load_back(self, load: ExternalLoad) -> bool:
        """Reserve, prepare and queue `load` on every rank, or on none; False when it was
        aborted instead (a collective call: the outcome is agreed across ranks)."""
        refusal: AbortReason | None = None
        try:
            self.load_machine.fire(load, L.PREPARE)
        except _LoadRefused as refused:
            refusal = refused.reason
        self.prepared_seq += 1  # the same on every rank: load_back is collective
        load.seq = self.prepared_seq
        self.held[load.seq] = load
        if not agree(self.group, refusal is None):
            end_now_or_later(self, load, refusal or AbortReason.PEER_ABORTED)
            return False  # (if its end is deferred, `finish_loads` does not report it)
        load.awaited = True
        self.stats.loads_prepared += 1
        return True

    def _prefix_current(self, load: ExternalLoad) -> bool:
        """Whether the matched device prefix is still the tree's: the same nodes ending at
        the anchor, the same FULL slots, and (SWA) a live window behind its end."""
        hit = load.device_hit_len
        if hit == 0:
            return True
        now = self.tree.match_prefix(load.key[:hit], load.namespace)
        return (
            now.prefix_len == hit
            and now.last_device_node is load.anchor
            and torch.equal(now.device_indices, load.device_prefix)
        )

    # -- spec callbacks of load_transaction: PREPARE (called by `load_machine` only) ---
    def reserve_slots(self, load: ExternalLoad) -> None:
        """Before ``prepare``: check the prefix, lock the anchor, LOAD every component,
        PREPARE; on any failure undo exactly this work and raise (the load stays idle)."""
        anchor = load.anchor
        if anchor is not self.tree.root and not anchor.device_resident:
            raise _LoadRefused(AbortReason.NO_SLOTS)  # the matched prefix is gone
        if not self._prefix_current(load):
            raise _LoadRefused(AbortReason.STALE_PREFIX)
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

    def queue_store_load(self, load: ExternalLoad) -> None:
        """After ``prepare``: hand the transfers to the store; raise when it refused (or
        the call failed: the store may hold the load anyway, ABORT withdraws it)."""
        if not self.calls.load(load.rid, load.transfers):
            raise _LoadRefused(AbortReason.STORE_REFUSED)
