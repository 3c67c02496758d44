"""The project's stores (memory, file, Redis) as a vLLM 0.33.0 out-of-tree `OffloadingSpec`.

Selected by the offloading connector's extra config::

    {"spec_name": "StoreOffloadingSpec",
     "spec_module_path": "unicache_fsm.integrations.vllm.spec",
     "store": "memory" | "file:DIR" | "redis://HOST:PORT",   # `open_store`'s forms
     "num_blocks": 4096,                                      # blocks the manager tracks
     "eviction_policy": "lru" | "arc"}                        # default lru

- `get_manager()` — a `StoreManager`: the project's model of vLLM's CPU manager
  (`ModelManager`: the same answers, LRU or ARC) whose load/store specs name the blocks'
  store keys (`KeysSpec`), and which evicts from the store what it evicts from its books.
- `get_worker(kv_caches)` — a `StoreWorker` over vLLM's canonical KV tensors (one row
  of int8 bytes per block per tensor). `submit_store(job, gpu_spec, keys_spec)` copies
  each block's rows (every tensor, in order) into a mirror `KVPool` (one slot per GPU
  block, page size 1) and queues the store's offload of those slots under the blocks'
  keys; `submit_load(job, keys_spec, gpu_spec)` queues the store's load into the mirror;
  `get_finished()` drives the store and reports each job once as a `TransferResult`,
  copying a landed load's rows back into the KV tensors first. `wait(job_ids)` drives
  the store until those jobs are reported by the next `get_finished`.

A block's store key is the SHA-256 of its `OffloadKey` (hex: the stores' page-key
form). Every store call's failure is the job's failure (reported, never raised to vLLM),
so a faulty store costs a miss, never a wrong byte: loads are checksummed by the stores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig

from unicache_fsm.integrations.vllm.model import POLICIES, KeysSpec, ModelManager
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.transfer import PoolHitPolicy, PoolName, PoolTransfer
from unicache_fsm.store.errors import StoreConfigError
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.store.spec import open_store

__all__ = ["StoreManager", "StoreOffloadingSpec", "StoreWorker", "store_key"]


def store_key(key: bytes) -> str:
    """The store's page key of a vLLM `OffloadKey`."""
    return hashlib.sha256(bytes(key)).hexdigest()


class StoreManager(ModelManager):
    """The model manager whose evictions also leave the store (module docstring)."""

    def __init__(self, store: ExternalStore, num_chunks: int, policy: str = "lru") -> None:
        super().__init__(num_chunks, policy)
        self.store = store

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        out = super().prepare_store(keys, req_context)
        if out is not None and out.evicted_keys:
            self.store.evict([store_key(k) for k in out.evicted_keys], PoolName.KV)
        return out

    def shutdown(self) -> None:
        self.store.close()


class StoreWorker(OffloadingWorker):  # type: ignore[misc]
    """vLLM's worker interface over an `ExternalStore` (module docstring)."""

    def __init__(self, store: ExternalStore, kv_caches: CanonicalKVCaches) -> None:
        self.tensors = [t.tensor for t in kv_caches.tensors]
        blocks = {int(t.shape[0]) for t in self.tensors}
        if len(blocks) != 1:
            msg = f"every KV tensor must hold the same number of blocks, got {sorted(blocks)}"
            raise StoreConfigError(msg, argument="kv_caches", value=sorted(blocks))
        self.widths = [t[0].numel() * t.element_size() for t in self.tensors]
        # slot 0 is the pools' padding sink: GPU block b lives in mirror slot b + 1
        self.mirror = KVPool(blocks.pop() + 1, 1, 1, sum(self.widths), dtype=torch.uint8)
        self.store = store
        store.attach({PoolName.KV: self.mirror})
        self.offloads: list[int] = []  # store offloads, oldest first: their job ids
        self.loads: dict[int, tuple[int, torch.Tensor]] = {}  # store batch -> job, slots
        self.results: list[TransferResult] = []

    def _rows(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(tensor.shape[0], -1).view(torch.uint8)

    def _slots(self, spec: GPULoadStoreSpec) -> torch.Tensor:
        return torch.as_tensor(spec.block_ids, dtype=torch.int64) + 1

    def _transfer(self, slots: torch.Tensor, keys: KeysSpec) -> list[PoolTransfer]:
        hashes = tuple(store_key(k) for k in keys.keys)
        return [PoolTransfer(PoolName.KV, slots, hashes, PoolHitPolicy.ALL_PAGES)]

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        slots = self._slots(src_spec)
        ids = slots - 1
        rows = torch.cat([self._rows(t).index_select(0, ids) for t in self.tensors], dim=1)
        self.mirror.data.view(self.mirror.data.shape[0], -1).index_copy_(0, slots, rows)
        try:
            queued = bool(self.store.offload(self._transfer(slots, dst_spec)))
        except Exception:
            queued = False
        if queued:
            self.offloads.append(job_id)
        return queued

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        expedited: bool = False,
    ) -> bool:
        slots = self._slots(dst_spec)
        rid = f"vllm-job-{job_id}"
        try:
            if not self.store.load(rid, self._transfer(slots, src_spec)):
                return False
            batch = self.store.start_loading()
        except Exception:
            return False
        self.loads[batch] = (job_id, slots)
        return True

    def _drain(self) -> None:
        try:
            self.store.progress()
            while self.store.num_completed_offloads() > 0 and self.offloads:
                ok = bool(self.store.pop_completed_offload())
                self.results.append(TransferResult(self.offloads.pop(0), ok))
            while self.store.num_completed_loads() > 0:
                done = self.store.pop_completed_load()
                job_id, slots = self.loads.pop(done.batch)
                if done.success:
                    self._land(slots)
                self.results.append(TransferResult(job_id, bool(done.success)))
        except Exception:  # a store that fails to report fails everything in flight
            self.results.extend(TransferResult(j, False) for j in self.offloads)
            self.results.extend(TransferResult(j, False) for j, _ in self.loads.values())
            self.offloads.clear()
            self.loads.clear()

    def _land(self, slots: torch.Tensor) -> None:
        rows = self.mirror.data.view(self.mirror.data.shape[0], -1).index_select(0, slots)
        ids = slots - 1
        start = 0
        for tensor, width in zip(self.tensors, self.widths, strict=True):
            self._rows(tensor).index_copy_(0, ids, rows[:, start : start + width])
            start += width

    def get_finished(self) -> list[TransferResult]:
        self._drain()
        out, self.results = self.results, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        self._drain()

    def shutdown(self) -> None:
        self.store.close()


class StoreOffloadingSpec(OffloadingSpec):  # type: ignore[misc]
    """The project's stores behind vLLM's offloading connector (module docstring)."""

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        extra: dict[str, Any] = dict(self.extra_config)
        self.store_spec = extra.get("store", "memory")
        self.num_blocks = extra.get("num_blocks", 4096)
        self.policy = extra.get("eviction_policy", "lru")
        if (
            isinstance(self.num_blocks, bool)
            or not isinstance(self.num_blocks, int)
            or self.num_blocks < 1
        ):
            msg = f"num_blocks must be an int >= 1, got {self.num_blocks!r}"
            raise StoreConfigError(msg, argument="num_blocks", value=self.num_blocks)
        if self.policy not in POLICIES:
            msg = f"eviction_policy must be one of {', '.join(POLICIES)}, got {self.policy!r}"
            raise StoreConfigError(msg, argument="eviction_policy", value=self.policy)
        self._manager: StoreManager | None = None
        self._worker: StoreWorker | None = None

    def _open(self) -> ExternalStore:
        return open_store(self.store_spec, namespace=f"vllm-{self.config.engine_id}")

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = StoreManager(self._open(), self.num_blocks, self.policy)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            store = self._manager.store if self._manager is not None else self._open()
            self._worker = StoreWorker(store, kv_caches)
        return self._worker
