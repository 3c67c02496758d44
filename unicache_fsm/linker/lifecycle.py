"""Reset, close and drain: the linker's end of the store's trusted signal.

A reset (or close) of the store that returned is the one signal that the store touches
nothing of the linker's any more. `Lifecycle.reset` quiesces the store, ends every load
(ABORT, reason ``reset``) and fails every pending offload; when the store's reset
returned it also drops the completions the store still holds (bounded: at most what can
be in flight), releases the quarantine, and owes the completions the drain did not find
(dropped when they come, never taken for a later job's). When it failed, what the store
may still touch is quarantined instead. `reclaim` (`LinkerConfig.reset_when_idle`)
resets an idle store, at the end of `finish_loads` / `poll_offloads`, to release the
quarantine when nothing else is in flight.
"""

from __future__ import annotations

from unicache_fsm.linker.aborting import abort_load, release_load, suspect, suspect_batch
from unicache_fsm.linker.load import AbortReason
from unicache_fsm.linker.offload import OffloadTrigger
from unicache_fsm.linker.ranks import agree
from unicache_fsm.linker.state import COUNT_SLACK, LinkerState, store_fault

__all__ = ["Lifecycle", "reclaim"]


class Lifecycle(LinkerState):
    """`reset` and `close` (collective calls: every rank calls them in the same order).

    Contract: after either, no load and no offload of the linker is in flight; what the
    store may still touch stays held (slots unfreed, nodes locked) until a reset or close
    of the store returns; a failing store reset or close is a fault, never an error.
    """

    def reset(self) -> None:
        """Quiesce the store, then abort every load and fail every pending offload.

        The store's own results of what it quiesced are drained and dropped (at most
        what can be in flight, asked a bounded number of times): the records they
        belong to end here, failed. A reset of the store that returned is the trusted
        signal that it touches nothing any more: the quarantine is released too; the
        completions the drain did not find (a store that undercounts) are still owed,
        and dropped when they come (`_owe`). When the store's reset fails, the records
        end all the same (loads abort, their requests recompute), but what the store
        may still touch is quarantined — a load's slots, an offload's locked nodes —
        until a later reset or `close` returns.
        """
        held = self.quarantine
        quiet = agree(self.group, self.calls.reset())  # (the ranks' trees stay alike)
        owed: tuple[list[int], int] = ([], 0)
        if quiet:
            owed = _drain_completions(self)
        else:  # their own completions, when they come, release them
            for batch in self.batches:
                suspect_batch(self, batch, batch.id)
        for load in [*self.loads.values(), *self.draining]:
            if load.in_flight and load.settled is None:
                if quiet:
                    load.settled = False  # quiesced: the store writes no more into it
                else:
                    suspect(load, None)
            abort_load(self, load, AbortReason.RESET)
        self.batches.clear()
        while self.offloads:
            record = self.offloads.popleft()
            if quiet and record is not None:
                self.offload_machine.fire(record, OffloadTrigger.COMPLETE, False)
            elif record is not None:
                held.offloads.append(record)
                self.stats.offloads_quarantined += 1
        if quiet:
            _release_quarantine(self)
            _owe(self, *owed)

    def close(self) -> None:
        """`reset()`, then close the store (a failing close is a fault, not an error);
        a close that returned releases the quarantine."""
        self.reset()
        try:
            self.store.close()
        except Exception as exc:
            store_fault(self, "close", exc)
            return
        _release_quarantine(self)


def reclaim(linker: LinkerState) -> None:
    """`LinkerConfig.reset_when_idle`: reset an idle store to release the quarantine.

    Collective where the tree would change (held offloads unlock nodes: every rank
    holds the same ones, and all reset or none); held load slots are per rank."""
    held = linker.quarantine
    offloads = any(r is not None for r in held.offloads)
    if not linker.config.reset_when_idle or not (held.loads or offloads):
        return
    idle = not linker.held and not linker.offloads and not any(b.loads for b in linker.batches)
    if offloads:
        idle = agree(linker.group, idle)
    if not idle:
        return
    linker.stats.idle_resets += 1
    quiet = linker.calls.reset()
    if offloads:
        quiet = agree(linker.group, quiet)
    if not quiet:
        return  # held as before (a later call tries again)
    owed = _drain_completions(linker)
    linker.batches.clear()  # (empty ones only: nothing of ours was in flight)
    _release_quarantine(linker)
    _owe(linker, *owed)


def _drain_completions(linker: LinkerState) -> tuple[list[int], int]:
    """After a reset of the store returned: drop the completions it still holds (a
    stale one would be taken for a later batch's or offload's), at most what can
    be in flight. Returns what the drain did not find but the store still owes (a
    reset completes every job; a store that undercounts hides some): the ids of
    the batches not drained, and how many offload completions."""
    calls, held = linker.calls, linker.quarantine
    ids = [b.id for b in linker.batches] + list(linker.unconfirmed)
    popped = calls.drain(
        calls.num_completed_loads, calls.pop_completed_load, len(ids) + COUNT_SLACK
    )
    if None in popped:  # which batch a faulty pop ended is unknown: owe them all
        popped = []
    drained = {r.batch for r in popped if r is not None}
    in_flight = len(linker.offloads) + len(held.offloads)
    offloads = calls.drain(calls.num_completed_offloads, calls.pop_completed_offload, in_flight)
    return [i for i in ids if i not in drained], in_flight - len(offloads)


def _owe(linker: LinkerState, batches: list[int], offloads: int) -> None:
    """After the quarantine's release: completions the store still owes for jobs
    before its reset are dropped when they come, before any later one is taken.
    A stale batch id ends nothing (it is `unconfirmed`); stale offload completions
    are placeholders in the quarantine, and offloads queued behind them are held
    (never published on a verdict that may be a stale one)."""
    linker.unconfirmed.extend(batches)
    linker.quarantine.offloads.extend([None] * offloads)


def _release_quarantine(linker: LinkerState) -> None:
    """The store quiesced (a reset or close returned): free and unlock what it held."""
    held = linker.quarantine
    linker.unconfirmed.clear()
    loads, held.loads = held.loads, []
    for _, load in loads:
        release_load(linker, load)
    while held.offloads:
        record = held.offloads.popleft()
        if record is not None:
            linker.offload_machine.fire(record, OffloadTrigger.COMPLETE, False)
            linker.stats.quarantine_released += 1
