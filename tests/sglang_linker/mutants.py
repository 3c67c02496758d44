"""Mutants of the third-party `DirLinker`: each plants one realistic bug.

`MUTANTS` maps each class name to the obligation ``check-linker`` must report broken;
tests/sglang_linker/test_check_linker.py runs every one. The first eight are the bugs a
reviewer found by hand in a real filesystem linker (issue 32); the rest are the classic
ways a completion or a cancel goes wrong.
"""

from __future__ import annotations

from abc import ABCMeta
from collections import deque
from typing import Any

import torch
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

from sglang_linker.thirdparty.dirlinker import DirLinker, PageError
from unicache_fsm.integrations.linker_kit.obligations import Obligation


class NoChecksum(DirLinker):
    """Never verifies the checksum: a flipped bit is served as KV."""

    def checksum_ok(self, digest: bytes, payload: bytes) -> bool:
        return True


class TruncatedPageIsAHit(DirLinker):
    """Any page file counts as a hit, and a short one raises out of the batch start
    (the worker dies) and stays on disk."""

    def page_usable(self, pool: Any, key: str) -> bool:
        return self.path(pool, key).exists()

    def read_page(self, pool: Any, key: str) -> bytes:
        data = self.path(pool, key).read_bytes()
        payload = data[32:]
        if len(payload) != self.payload_size(pool) or not self.checksum_ok(data[:32], payload):
            raise PageError(f"{key}: damaged page")  # and the file stays
        return payload

    def start_layer_wise_loading(self) -> int:
        index = self.layer_done_counter.update_producer()
        self.layer_done_counter.set_consumer(index)
        batch, self.queued = list(self.queued.values()), {}
        self.run_batch(batch)
        for layer in range(self.layer_done_counter.num_layers):
            self.layer_done_counter.complete(index, layer)
        return index


class DeletedPageEscapes(DirLinker):
    """A page deleted between ``load`` and the batch start raises into the scheduler."""

    def start_layer_wise_loading(self) -> int:
        index = self.layer_done_counter.update_producer()
        self.layer_done_counter.set_consumer(index)
        batch, self.queued = list(self.queued.values()), {}
        self.run_batch(batch)
        for layer in range(self.layer_done_counter.num_layers):
            self.layer_done_counter.complete(index, layer)
        return index


class FailedStartStaysQueued(DirLinker):
    """A batch that fails keeps its loads queued: every later batch fails too."""

    def start_layer_wise_loading(self) -> int:
        index = self.layer_done_counter.update_producer()
        self.layer_done_counter.set_consumer(index)
        batch = list(self.queued.values())
        try:
            self.run_batch(batch)
        except Exception as exc:
            self.layer_done_counter.fail(index, exc)
            return index
        self.queued = {}
        for layer in range(self.layer_done_counter.num_layers):
            self.layer_done_counter.complete(index, layer)
        return index


class NamespaceIgnoresModel(DirLinker):
    """Pages are filed by namespace only: two models load each other's pages."""

    def model_dir(self, server_args: Any) -> str:
        return "shared"


def _without(name: str, **changes: Any) -> type:
    body = {k: v for k, v in vars(DirLinker).items() if k not in ("__dict__", "__weakref__")}
    body.pop(name, None)
    body.update(changes)
    return ABCMeta(name, (UnifiedCacheLinker,), body)


#: written for another revision: completions through its own list, no finish_layer_wise_loading
NoFinishLayerWiseLoading = _without("finish_layer_wise_loading")
NoFinishLayerWiseLoading.__name__ = NoFinishLayerWiseLoading.__qualname__ = (
    "NoFinishLayerWiseLoading"
)


class NoForwardStream(DirLinker):
    """Its constructor predates ``forward_stream``."""

    def __init__(self, server_args, params, *, components, extra_config):  # type: ignore[no-untyped-def]
        super().__init__(server_args, params, components=components, extra_config=extra_config)


class NoSessionId(DirLinker):
    """Its ``offload`` predates ``session_id``."""

    def offload(self, transfers: list[Any]) -> bool:  # type: ignore[override]
        return super().offload(transfers)


class CompletionBeforeCopy(DirLinker):
    """Announces an offload complete at once and copies its pages at the next offload
    (a pipelined copy): by then the tree may have freed and reused the slots."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deferred: list[Any] = []

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        for earlier in self.deferred:
            DirLinker.offload(self, earlier)
            self.completed.pop()  # its completion was announced already
        self.deferred = [list(transfers)]
        self.completed.append(True)
        return True


class LookupOverclaims(DirLinker):
    """Offers one page more than it holds (an off-by-one in the scan)."""

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        found = super().lookup(rid, transfers)
        keys = next(t for t in transfers if t.name.value == "kv").keys or ()
        last = found[-1] if found else 0
        if 0 < last < len(keys):
            found.append(last + 1)
        return found


class LookupAnswersItsMaximum(DirLinker):
    """Answers the longest restorable prefix as one int (another revision's interface)."""

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        found = super().lookup(rid, transfers)
        return max(found) if found else 0  # type: ignore[return-value]


class CancelLies(DirLinker):
    """Answers True to a cancel but leaves the load queued."""

    def cancel_queued_load(self, rid: str) -> bool:
        return rid in self.queued


class LostCompletion(DirLinker):
    """Keeps only the latest completion: two offloads between polls lose one."""

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        super().offload(transfers, session_id)
        self.completed = deque([self.completed[-1]])
        return True


class PopsOutOfOrder(DirLinker):
    """Pops the newest completion first."""

    def pop_completed_offload(self) -> bool:
        return self.completed.pop()


class CountsPagesNotOffloads(DirLinker):
    """Counts completed pages instead of completed offloads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pages: deque[int] = deque()

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        self.pages.append(sum(len(t.keys or ()) for t in transfers if t.name.value == "kv"))
        return super().offload(transfers, session_id)

    def num_completed_offloads(self) -> int:
        return sum(self.pages)

    def pop_completed_offload(self) -> bool:
        self.pages.popleft()
        return super().pop_completed_offload()


class ResetKeepsCompletions(DirLinker):
    """Reset drops the queued loads but keeps the completions."""

    def reset(self) -> None:
        self.queued.clear()
        self.layer_done_counter.reset()


class CloseTwiceRaises(DirLinker):
    """Close releases a handle; a second close raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handle: list[int] | None = [1]

    def close(self) -> None:
        assert self.handle is not None, "closed twice"
        self.handle = None
        super().close()


class FailedWriteRaises(DirLinker):
    """A failed page write raises out of ``offload`` instead of reporting False."""

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        for t in transfers:
            if t.name in self.buffers and t.device_indices is not None:
                slots = t.device_indices.to(torch.int64)
                for i, key in enumerate(t.keys or ()):
                    self.write_page(t.name, key, slots[i * self.page : (i + 1) * self.page])
        self.completed.append(True)
        return True


#: mutant class name -> the obligation check-linker reports broken
MUTANTS: dict[str, Obligation] = {
    "NoChecksum": Obligation.LANDED_BYTES,
    "TruncatedPageIsAHit": Obligation.NO_ESCAPE,
    "DeletedPageEscapes": Obligation.NO_ESCAPE,
    "FailedStartStaysQueued": Obligation.NOTHING_QUEUED,
    "NamespaceIgnoresModel": Obligation.MODEL_ISOLATION,
    "NoFinishLayerWiseLoading": Obligation.SIGNATURES,
    "NoForwardStream": Obligation.SIGNATURES,
    "NoSessionId": Obligation.SIGNATURES,
    "CompletionBeforeCopy": Obligation.LANDED_BYTES,
    "LookupOverclaims": Obligation.LOOKUP_TRUTHFUL,
    "LookupAnswersItsMaximum": Obligation.ANSWERS,
    "CancelLies": Obligation.NOTHING_QUEUED,
    "LostCompletion": Obligation.COMPLETIONS_ARRIVE,
    "PopsOutOfOrder": Obligation.COMPLETIONS_ORDERED,
    "CountsPagesNotOffloads": Obligation.COMPLETIONS_BOUNDED,
    "ResetKeepsCompletions": Obligation.BOUNDED_LIFECYCLE,
    "CloseTwiceRaises": Obligation.NO_ESCAPE,
    "FailedWriteRaises": Obligation.NO_ESCAPE,
}
