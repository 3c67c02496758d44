"""How a load ends without COMMIT, and what its reserved slots become.

A load ABORTs now when every rank's store is done with it (it never left idle, the
store gave it back, or its batch settled), else later: `end_now_or_later` parks it in
`draining` with the reason, and `finish_loads` aborts it once every store is done. On
ABORT its slots are freed (`free_reservation`), unless the store broke the protocol
about it (`suspect`): then they go to the quarantine until the store proves it done, and
`release_load` frees them when it does. A store's answer to a cancel settles the load
(`settle_cancel`); a cancel the store does not confirm leaves its slots untouched.

`Aborting` holds `ExternalLinker.release_request` and the ABORT-side spec callbacks of
``load_transaction`` (`withdraw_store_load`, `free_reservation`, `record_abort`); the
functions are shared with the modules that end loads (landing, lifecycle, loading).
"""

from __future__ import annotations

from unicache_fsm.linker.load import AbortReason, ExternalLoad, LoadState, LoadTrigger
from unicache_fsm.linker.ranks import agree
from unicache_fsm.linker.state import Batch, LinkerState
from unicache_fsm.pools.transfer import ExternalLinkerLoadPhase

__all__ = [
    "Aborting",
    "abort_load",
    "end_now_or_later",
    "forget",
    "release_load",
    "settle_cancel",
    "suspect",
    "suspect_batch",
]

ABORT = ExternalLinkerLoadPhase.ABORT


class _StoreHoldsLoad(Exception):
    """Internal: the store did not confirm that it gave a queued load back."""


def abort_load(linker: LinkerState, load: ExternalLoad, reason: AbortReason) -> None:
    """Fire ABORT on `load` with `reason` (its spec callbacks do the work)."""
    linker.load_machine.fire(load, LoadTrigger.ABORT, reason)


def forget(linker: LinkerState, load: ExternalLoad) -> None:
    """The load ended: it is no longer the request's, held, or draining."""
    if linker.loads.get(load.rid) is load:
        del linker.loads[load.rid]
    if load in linker.draining:
        linker.draining.remove(load)
    linker.held.pop(load.seq, None)


def suspect(load: ExternalLoad, held_for: int | None) -> None:
    """The store broke the protocol about `load`: it ends (agreed in `finish_loads`)
    as failed, and its slots go to the quarantine, released by `held_for`'s own
    completion (None: only by a reset or close of the store that returned)."""
    load.settled = False
    load.suspect = True
    load.held_for = held_for


def suspect_batch(linker: LinkerState, batch: Batch, held_for: int | None) -> None:
    """Every load of `batch` the store may still write: see `suspect`; `held_for`, when
    given, is owed its own completion (`unconfirmed`)."""
    if held_for is not None:
        linker.unconfirmed.append(held_for)
    for load in batch.loads:
        if load.state == LoadState.LOADING and load.settled is None:
            suspect(load, held_for)


def settle_cancel(load: ExternalLoad, cancelled: bool | None) -> None:
    """The store's answer to cancelling a queued load (None: lost; the store may or
    may not hold it still)."""
    if cancelled is None:
        load.maybe_withdrawn = True
        return
    if cancelled or not load.maybe_started:
        load.settled = False  # the store holds the load no more
    else:  # not queued: perhaps in the batch whose `start_loading` answer was lost
        suspect(load, None)


def release_load(linker: LinkerState, load: ExternalLoad) -> None:
    """The store's job for a quarantined load ended: free what it reserved."""
    assert load.ctx is not None
    for c, t in reversed(list(zip(linker.components, load.transfers, strict=True))):
        c.update_external_linker_load(ABORT, t, load.ctx)
    load.transfers = []
    linker.stats.quarantine_released += 1


def end_now_or_later(linker: LinkerState, load: ExternalLoad, reason: AbortReason) -> None:
    """Abort `load` now if every rank's store is done with it, else when it is.

    A collective call (one MIN): a load still queued is withdrawn from this rank's
    store first; one in a running batch is not done until the batch completes.
    """
    if load.state == LoadState.QUEUED and load.settled is None:
        settle_cancel(load, linker.calls.cancel_queued_load(load.rid))
    done = load.state == LoadState.IDLE or load.settled is not None
    if agree(linker.group, done):
        abort_load(linker, load, reason)
        return
    load.abort_pending = reason  # ends in finish_loads once every store is done
    if linker.loads.get(load.rid) is load:
        del linker.loads[load.rid]
    if load not in linker.draining:
        linker.draining.append(load)


class Aborting(LinkerState):
    """`release_request` and the ABORT-side spec callbacks of ``load_transaction``
    (``callback(load, reason)``; called by `load_machine` only).

    Contract: a slot is freed only when the store cannot write into it any more; a load
    the store may still write ends with its slots quarantined; every ABORT releases the
    anchor lock its PREPARE took and counts its reason.
    """

    def release_request(self, rid: str) -> None:
        """The request is gone: abort its load now, or once every rank's store is done
        with it (a collective call for a prepared load)."""
        load = self.loads.get(rid)
        if load is None:
            return
        if load.state == LoadState.IDLE:
            abort_load(self, load, AbortReason.RELEASED)
            return
        end_now_or_later(self, load, AbortReason.RELEASED)

    def withdraw_store_load(self, load: ExternalLoad, reason: AbortReason) -> None:
        """Before ``abort`` from queued: the store gives the load back (skipped when it
        already did, or holds nothing: `settled`). Raise when it does not confirm: the
        slots must not be freed while the store may still write into them."""
        if load.settled is not None:
            return
        settle_cancel(load, self.calls.cancel_queued_load(load.rid))
        if load.settled is None:
            raise _StoreHoldsLoad(load.rid)

    def free_reservation(self, load: ExternalLoad, reason: AbortReason) -> None:
        """Before ``abort`` from prepared: free exactly what LOAD reserved (reverse
        component order), unmap SWA, release the anchor lock; publish nothing."""
        assert load.ctx is not None
        if load.suspect:  # the store may still write them: held, not freed
            self.quarantine.hold_load(load, load.held_for)
            self.stats.loads_quarantined += 1
        else:
            for c, t in reversed(list(zip(self.components, load.transfers, strict=True))):
                c.update_external_linker_load(ABORT, t, load.ctx)
            load.transfers = []
        self.tree.dec_lock_ref(load.anchor)

    def record_abort(self, load: ExternalLoad, reason: AbortReason) -> None:
        """On entering ``aborted``: keep the reason, forget the load, count it."""
        load.abort_reason = reason
        forget(self, load)
        self.stats.loads_aborted[reason.value] = self.stats.loads_aborted.get(reason.value, 0) + 1
