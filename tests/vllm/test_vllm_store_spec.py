"""The project's stores as vLLM's out-of-tree `OffloadingSpec`: chosen by `spec_name` /
`spec_module_path` through vLLM 0.33.0's own factory, its manager inside the monitor,
and bytes round-tripping exactly through vLLM's worker interface on CPU tensors, on the
memory store, a real directory and a real redis-server on loopback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from unicache_fsm.integrations.vllm import MonitoredManager, MonitoredWorker, OffloadingProtocol
from unicache_fsm.integrations.vllm.driver import offload_keys
from unicache_fsm.integrations.vllm.kit import check_offloading_spec, offloading_config
from unicache_fsm.integrations.vllm.model import KeysSpec
from unicache_fsm.integrations.vllm.spec import StoreOffloadingSpec, StoreWorker, store_key
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store import FaultPolicy, FaultyStore, MemoryStore
from unicache_fsm.store.errors import StoreConfigError
from unicache_fsm.testing.redis_server import available

BLOCKS = 8
SPEC = {
    "spec_name": "StoreOffloadingSpec",
    "spec_module_path": "unicache_fsm.integrations.vllm.spec",
}


def _store(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory"
    if kind == "file":
        return f"file:{tmp_path / 'store'}"
    if not available() and not os.environ.get("CI"):
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    from redis_helpers import shared_server

    return shared_server().url


def _kv_caches() -> CanonicalKVCaches:
    gen = torch.Generator().manual_seed(36)
    tensors = [
        CanonicalKVCacheTensor(
            torch.randint(-128, 128, (BLOCKS, size), dtype=torch.int8, generator=gen), size
        )
        for size in (96, 160)
    ]
    refs = [[CanonicalKVCacheRef(0, 96)], [CanonicalKVCacheRef(1, 160)]]
    return CanonicalKVCaches(tensors=tensors, group_data_refs=refs)


def _gpu(block_ids: list[int]) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(block_ids, group_sizes=[len(block_ids)], block_indices=[0])


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
def test_bytes_round_trip_through_vllms_worker_interface(kind: str, tmp_path: Path) -> None:
    extra: dict[str, Any] = {**SPEC, "store": _store(kind, tmp_path), "num_blocks": 4}
    cls = OffloadingSpecFactory.get_spec_cls(extra)
    assert cls is StoreOffloadingSpec
    spec = cls(offloading_config(extra))
    manager = MonitoredManager(spec.get_manager())
    caches = _kv_caches()
    worker = MonitoredWorker(spec.get_worker(caches), protocol=manager.protocol)
    original = [t.tensor.clone() for t in caches.tensors]
    keys = offload_keys(3)
    ctx = ReqContext("r")

    with manager.lock:
        manager.on_new_request(ctx)
        out = manager.prepare_store(keys, ctx)
    assert out is not None and out.keys_to_store == keys
    assert worker.submit_store(1, _gpu([5, 2, 7]), out.store_spec)
    worker.wait({1})
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(1, True)]
    with manager.lock:
        manager.complete_store(keys, ctx)
        assert [manager.lookup(k, ctx) for k in keys] == [LookupResult.HIT] * 3
        load = manager.prepare_load(keys[:2], ctx)

    for t in caches.tensors:
        t.tensor.zero_()
    assert worker.submit_load(2, load, _gpu([0, 4]))
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(2, True)]
    with manager.lock:
        manager.complete_load(keys[:2], ctx)
        manager.on_request_finished(ctx)
    for now, before in zip(caches.tensors, original, strict=True):
        assert torch.equal(now.tensor[0], before[5])  # block 5's bytes landed in block 0
        assert torch.equal(now.tensor[4], before[2])
        assert not now.tensor[[1, 2, 3, 5, 6, 7]].any()  # nothing else was written
    manager.shutdown()
    assert manager.protocol.violations == []


def test_a_block_evicted_from_the_books_leaves_the_store(tmp_path: Path) -> None:
    extra: dict[str, Any] = {**SPEC, "store": "memory", "num_blocks": 1}
    spec = StoreOffloadingSpec(offloading_config(extra))
    manager = MonitoredManager(spec.get_manager())
    worker = spec.get_worker(_kv_caches())
    k0, k1 = offload_keys(2)
    ctx = ReqContext("r")
    with manager.lock:
        manager.on_new_request(ctx)
        out = manager.prepare_store([k0], ctx)
    assert worker.submit_store(1, _gpu([0]), out.store_spec)
    worker.get_finished()
    with manager.lock:
        manager.complete_store([k0], ctx)
        out = manager.prepare_store([k1], ctx)
        assert out is not None and out.evicted_keys == [k0]
    assert not worker.store.contains(PoolName.KV, store_key(k0))  # gone from the store too
    assert not worker.submit_load(2, KeysSpec([k0]), _gpu([3]))


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_the_store_spec_passes_the_kit(policy: str) -> None:
    report = check_offloading_spec(
        {**SPEC, "store": "memory", "num_blocks": 5, "eviction_policy": policy},
        seeds=range(3),
        steps=150,
    )
    assert report.ok and report.notes == (), str(report)  # the worker's bytes checked too


@pytest.mark.parametrize(
    ("extra", "argument"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"num_blocks": "8"}, "num_blocks"),
        ({"eviction_policy": "mru"}, "eviction_policy"),
    ],
)
def test_a_bad_extra_config_is_a_typed_error(extra: dict[str, Any], argument: str) -> None:
    with pytest.raises(StoreConfigError) as info:
        StoreOffloadingSpec(offloading_config({**SPEC, **extra}))
    assert info.value.argument == argument


@pytest.mark.parametrize(
    "faults",
    ["raise_error=1.0,seed=3", "garbage_answer=1.0,seed=3", "fail_batch_midway=1.0"],
)
def test_a_faulty_store_fails_jobs_and_never_lands_wrong_bytes(faults: str) -> None:
    inner = MemoryStore()
    caches = _kv_caches()
    protocol = OffloadingProtocol()
    worker = MonitoredWorker(StoreWorker(inner, caches), protocol=protocol)
    keys = KeysSpec(offload_keys(2))
    assert worker.submit_store(1, _gpu([1, 2]), keys)  # stored by a healthy store first
    assert [r.success for r in worker.get_finished()] == [True]
    store = FaultyStore(inner, FaultPolicy.parse(faults))
    faulty = MonitoredWorker(StoreWorker(store, caches), protocol=protocol)
    before = [t.tensor.clone() for t in caches.tensors]
    submitted = [j for j, ok in ((2, faulty.submit_store(2, _gpu([3]), keys)),) if ok]
    submitted += [j for j, ok in ((3, faulty.submit_load(3, keys, _gpu([5, 6]))),) if ok]
    reported = faulty.get_finished() + faulty.get_finished()
    assert sorted(r.job_id for r in reported) == sorted(submitted)  # each once, none raised
    assert not any(r.success and r.job_id == 3 for r in reported)
    assert sum(store.policy.injected.values()) > 0
    for now, then in zip(caches.tensors, before, strict=True):
        assert torch.equal(now.tensor, then)  # a failed load wrote nothing into vLLM's KV
    assert protocol.violations == []
