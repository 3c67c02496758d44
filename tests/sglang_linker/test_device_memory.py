"""On a GPU: `StoreLinker` allocates no KV-sized device memory. SGLang's pool is built on
CUDA, then the linker is built over it and a node is offloaded, evicted and loaded
back; `torch.cuda.memory_allocated()` (and its peak, a move's transient included) grows
by far less than one pool (main's linker kept a mirror as large as each pool). Skipped
without CUDA."""

from __future__ import annotations

import logging

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_the_linker_allocates_no_kv_sized_device_memory() -> None:
    logging.disable(logging.WARNING)
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from unicache_fsm.integrations.sglang import StoreLinker
    from unicache_fsm.store import MemoryStore

    page, tokens = 16, 8192
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page))
    kv = MHATokenToKVPool(
        size=tokens,
        page_size=page,
        dtype=torch.bfloat16,
        head_num=8,
        head_dim=128,
        layer_num=8,
        device="cuda",
        enable_memory_saver=False,
    )
    for buf in [*kv.k_buffer, *kv.v_buffer]:
        buf.normal_()
    pool_bytes = sum(b.nbytes for b in [*kv.k_buffer, *kv.v_buffer])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    linker = StoreLinker.from_store(MemoryStore(), {PoolName.KV: kv})
    src = torch.arange(page, 17 * page, device="cuda")
    dst = torch.arange(17 * page, 33 * page, device="cuda")
    keys = [f"{i:064x}" for i in range(1, 17)]
    assert linker.offload([PoolTransfer(name=PoolName.KV, device_indices=src, keys=keys)])
    assert linker.num_completed_offloads() == 1 and linker.pop_completed_offload()
    assert linker.load("r1", [PoolTransfer(name=PoolName.KV, device_indices=dst, keys=keys)])
    assert linker.finish_layer_wise_loading(linker.start_layer_wise_loading())
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    peak = torch.cuda.max_memory_allocated() - before  # a move's transient gather too
    assert all(torch.equal(kv.k_buffer[i][dst], kv.k_buffer[i][src]) for i in range(8))
    assert grown < pool_bytes // 8 and peak < pool_bytes // 8, (grown, peak, pool_bytes)
    linker.close()
