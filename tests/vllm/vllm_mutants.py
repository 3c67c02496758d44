"""Planted bugs in offloading managers the project did not write, for the monitor and kit.

Each mutant is a realistic slip in one of two places a vLLM 0.33.0 deployment plugs in
code of its own:

- an out-of-tree eviction policy (``eviction_policy`` + ``cache_policy_module_path``,
  loaded by vLLM's `CachePolicyFactory` into vLLM's own `CPUOffloadingManager`):
  `FifoPolicy` is a correct first-in-first-out policy written here from the
  `CachePolicy` contract; its mutants evict what they must not;
- an out-of-tree spec (``spec_name`` + ``spec_module_path``, loaded by vLLM's
  `OffloadingSpecFactory`): subclasses of vLLM's `CPUOffloadingSpec` whose manager
  (vLLM's `CPUOffloadingManager`, subclassed through its public methods only) gets one
  answer or one bookkeeping step wrong, and one of the project's `StoreOffloadingSpec`
  whose worker lands a load one block off.

``MUTANT_CONFIGS`` maps each mutant's name to the connector extra config that selects
it; ``CORRECT_CONFIGS`` the configs that must pass.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import Any

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from unicache_fsm.integrations.vllm.spec import StoreOffloadingSpec, StoreWorker

MODULE = __name__
CPU_BYTES = {"cpu_bytes_to_use": 4096 * 5}  # five chunks of one 4 KiB block


# -- out-of-tree eviction policies ---------------------------------------------------------


class FifoPolicy(CachePolicy):
    """Evicts the oldest-inserted idle blocks; touches change nothing (correct)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()

    def evictable(self, chunk: ChunkStatus) -> bool:
        return bool(chunk.ref_cnt == 0)

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.chunks[key] = chunk

    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        return

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        chosen = [
            (k, c) for k, c in self.chunks.items() if k not in protected and self.evictable(c)
        ][:n]
        if len(chosen) < n:
            return None
        for key, _ in chosen:
            del self.chunks[key]
        return chosen

    def clear(self) -> None:
        self.chunks.clear()


class EvictsLoadingPolicy(FifoPolicy):
    """Bug: counts a block that loads hold as evictable (checks "ready" only)."""

    def evictable(self, chunk: ChunkStatus) -> bool:
        return bool(chunk.ref_cnt >= 0)


class EvictsStoringPolicy(FifoPolicy):
    """Bug: counts a block whose store is in flight as evictable (checks "no load")."""

    def evictable(self, chunk: ChunkStatus) -> bool:
        return bool(chunk.ref_cnt <= 0)


# -- out-of-tree specs over vLLM's manager ---------------------------------------------------


class _MutantSpec(CPUOffloadingSpec):
    manager_cls: type[CPUOffloadingManager] = CPUOffloadingManager

    def get_manager(self) -> OffloadingManager:
        if not getattr(self, "_mutant", None):
            self._mutant = self.manager_cls(num_chunks=self.num_chunks)
        return self._mutant


class EarlyHitManager(CPUOffloadingManager):
    """Bug: answers HIT while the block's store is still in flight."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = super().lookup(key, req_context)
        return LookupResult.HIT if found is LookupResult.HIT_PENDING else found


class KeepsFailedManager(CPUOffloadingManager):
    """Bug: a failed store is completed as if it succeeded (the block stays loadable)."""

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        super().complete_store(keys, req_context, True)


class NameAnswerManager(CPUOffloadingManager):
    """Bug: a lookup answers the result's name (a str) instead of the `LookupResult`."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> Any:
        return super().lookup(key, req_context).name


class RestoresStoredManager(CPUOffloadingManager):
    """Bug: `keys_to_store` lists every offered key, even blocks already stored."""

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        out = super().prepare_store(keys, req_context)
        if out is not None and out.keys_to_store:
            out.keys_to_store = list(keys)
        return out


class DropsAfterLoadManager(CPUOffloadingManager):
    """Bug: frees every block once a load completes (the cache silently empties)."""

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        super().complete_load(keys, req_context)
        self.reset_cache()


class EarlyHitSpec(_MutantSpec):
    manager_cls = EarlyHitManager


class KeepsFailedSpec(_MutantSpec):
    manager_cls = KeepsFailedManager


class NameAnswerSpec(_MutantSpec):
    manager_cls = NameAnswerManager


class RestoresStoredSpec(_MutantSpec):
    manager_cls = RestoresStoredManager


class DropsAfterLoadSpec(_MutantSpec):
    manager_cls = DropsAfterLoadManager


class OffByOneWorker(StoreWorker):
    """Bug: a load lands each block one GPU block further than its spec says."""

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: GPULoadStoreSpec, expedited: bool = False
    ) -> bool:
        shifted = [(int(b) + 1) % len(self.tensors[0]) for b in dst_spec.block_ids]
        spec = GPULoadStoreSpec(shifted, dst_spec.group_sizes, dst_spec.block_indices)
        return super().submit_load(job_id, src_spec, spec, expedited)


class OffByOneWorkerSpec(StoreOffloadingSpec):
    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if not getattr(self, "_off_by_one", None):
            self._off_by_one = OffByOneWorker(self.get_manager().store, kv_caches)
        return self._off_by_one


def _policy(name: str) -> dict[str, Any]:
    return {**CPU_BYTES, "eviction_policy": name, "cache_policy_module_path": MODULE}


def _spec(name: str) -> dict[str, Any]:
    return {**CPU_BYTES, "spec_name": name, "spec_module_path": MODULE}


MUTANT_CONFIGS: dict[str, dict[str, Any]] = {
    "evicts a block a load holds": _policy("EvictsLoadingPolicy"),
    "evicts a block whose store is in flight": _policy("EvictsStoringPolicy"),
    "HIT before the store completed": _spec("EarlyHitSpec"),
    "a failed store stays loadable": _spec("KeepsFailedSpec"),
    "lookup answers a str": _spec("NameAnswerSpec"),
    "stores a block already stored": _spec("RestoresStoredSpec"),
    "drops blocks without reporting them": _spec("DropsAfterLoadSpec"),
    "a worker lands bytes in the wrong block": {
        "spec_name": "OffByOneWorkerSpec",
        "spec_module_path": MODULE,
        "num_blocks": 5,
    },
}

CORRECT_CONFIGS: dict[str, dict[str, Any]] = {
    "vLLM's CPU spec, LRU": {**CPU_BYTES, "eviction_policy": "lru"},
    "vLLM's CPU spec, ARC": {**CPU_BYTES, "eviction_policy": "arc"},
    "an out-of-tree FIFO policy": _policy("FifoPolicy"),
}
