"""Mutants of the second third-party linker (`KvServiceLinker`): one realistic bug each.

Each is what an author of an asynchronous KV-service linker plausibly gets wrong; `MUTANTS`
maps each to the obligation `check-linker` must report. They differ from the `DirLinker`
mutants (tests/sglang_linker/mutants.py): most are races of a worker thread.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from sglang_linker.thirdparty.kvservice import KvServiceLinker
from unicache_fsm.integrations.linker_kit.obligations import Obligation


class LastLayerCompletedBeforeCopy(KvServiceLinker):
    """Publishes the last layer done, then copies it (the batch's finish races the copy)."""

    def _run_load(self, index: int, loads: list[Any]) -> None:
        last = len(self.layers) - 1
        real_complete = self.layer_done_counter.complete

        def complete(i: int, layer: int) -> None:
            if layer == last - 1:  # "the last copy is quick": announce it with its neighbour
                real_complete(i, layer)
                real_complete(i, last)
            elif layer != last:
                real_complete(i, layer)

        self.layer_done_counter.complete = complete  # type: ignore[method-assign]
        try:
            super()._run_load(index, loads)
        finally:
            del self.layer_done_counter.complete


class AllLayersDoneUpFront(KvServiceLinker):
    """Marks every layer done when the batch starts, then copies; finish still waits for
    the copies, so only a forward's per-layer wait sees the missing bytes."""

    def _run_load(self, index: int, loads: list[Any]) -> None:
        counter = self.layer_done_counter
        real_complete = counter.complete
        for layer in range(len(self.layers)):
            real_complete(index, layer)
        counter.complete = lambda i, layer: None  # type: ignore[method-assign]
        try:
            super()._run_load(index, loads)
        finally:
            del counter.complete


class LayersCompletedOutOfOrder(KvServiceLinker):
    """Copies the layers last to first but counts them first to last."""

    def _run_load(self, index: int, loads: list[Any]) -> None:
        real_copy = self._copy_layer
        n = len(self.layers)
        self._copy_layer = lambda layer, pages: real_copy(n - 1 - layer, pages)  # type: ignore[method-assign]
        try:
            super()._run_load(index, loads)
        finally:
            del self._copy_layer


class LookupAnswersTheLongestHitOnly(KvServiceLinker):
    """Answers ``[longest]`` instead of every restorable length (another rank that holds
    only a shorter prefix then intersects to nothing)."""

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        found = super().lookup(rid, transfers)
        return [max(found)] if found else []


class CountsTheOffloadInHand(KvServiceLinker):
    """Counts the offload the worker is writing as completed (the count runs ahead of
    the FIFO, and the extra pop answers False)."""

    def num_completed_offloads(self) -> int:
        return super().num_completed_offloads() + (0 if self._idle.is_set() else 1)


class CancelDropsTheNewestLoad(KvServiceLinker):
    """Cancels whichever load was queued last, whatever rid it is asked for."""

    def cancel_queued_load(self, rid: str) -> bool:
        with self._lock:
            if rid not in self._queued:
                return False
            self._queued.popitem()
            return True


class ResetLeavesTheWorkerWriting(KvServiceLinker):
    """Reset forgets the queues but neither waits for nor stops the batch in hand."""

    def reset(self) -> None:
        with self._lock:
            self._queued.clear()
            self._completed.clear()
        self._batch_done.clear()
        self.layer_done_counter.reset()


class LoadClearsTheNextPage(KvServiceLinker):
    """After each page it copies, zeroes the page that follows it in the pool (a guard
    page it believes it owns) unless the batch loads that page too."""

    def _copy_layer(self, layer: int, pages: list[Any]) -> None:
        super()._copy_layer(layer, pages)
        pool, local = self.layers[layer]
        buf = self.pools[pool]
        mine = {int(s) for p, slots, _ in pages if p == pool for s in slots}
        for p, slots, _ in pages:
            nxt = [int(slots[-1]) + 1 + i for i in range(self.page)]
            if p == pool and nxt[-1] < buf.k_buffer[local].shape[0] and not mine & set(nxt):
                where = torch.tensor(nxt)
                buf.k_buffer[local][where] = 0
                buf.v_buffer[local][where] = 0


class FinishHangsAfterAFailedBatch(KvServiceLinker):
    """After a failed batch, finish waits, with no bound, for a retry that never comes."""

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        done = self._batch_done.pop(counter_index, None)
        if done is not None:
            done.wait()
        futures = self.layer_done_counter.futures.get(counter_index, [])
        if any(f.done() and f.exception() is not None for f in futures):
            threading.Event().wait()  # "the service retries the batch": it never does
        return bool(self.layer_done_counter.finish(counter_index))


#: mutant -> the obligation check-linker must report
MUTANTS: dict[str, Obligation] = {
    "LastLayerCompletedBeforeCopy": Obligation.LANDED_BYTES,
    "AllLayersDoneUpFront": Obligation.LANDED_BYTES,
    "LayersCompletedOutOfOrder": Obligation.LANDED_BYTES,
    "LookupAnswersTheLongestHitOnly": Obligation.ANSWERS,
    "CountsTheOffloadInHand": Obligation.COMPLETIONS_ORDERED,
    "CancelDropsTheNewestLoad": Obligation.LANDED_BYTES,
    "ResetLeavesTheWorkerWriting": Obligation.BOUNDED_LIFECYCLE,
    "LoadClearsTheNextPage": Obligation.LANDED_BYTES,
    "FinishHangsAfterAFailedBatch": Obligation.BOUNDED_LIFECYCLE,
}


# -- linkers that attack the command line, not an obligation of the cache ----------------------


class LookupInterrupts(KvServiceLinker):
    """Its lookup raises KeyboardInterrupt (a stray signal handler's habit)."""

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        raise KeyboardInterrupt


class OffloadExits(KvServiceLinker):
    """Its offload calls sys.exit when the service refuses a write."""

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        raise SystemExit(3)


class ConstructorExits(KvServiceLinker):
    """Its constructor calls sys.exit when its service is not configured."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise SystemExit("no kv service configured")


class ConstructorHangs(KvServiceLinker):
    """Its constructor waits forever for a service that never answers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        threading.Event().wait()


class Chatty(KvServiceLinker):
    """Prints every lookup to stdout (a debugging leftover)."""

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        found = super().lookup(rid, transfers)
        print(f"lookup {rid}: {found}")
        return found
