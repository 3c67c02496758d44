"""SGLang 0.5.23's own `UnifiedRadixCache`, on CPU, backed by this project's Redis store:
two "instances" (two caches with their own KV pools) share one Redis server. The first
computes a prompt, which SGLang writes through to Redis; the second has never seen it,
matches it with a request, loads it back from Redis and reads the first one's KV bytes.
Both linkers are watched by a `ContractMonitor`; the second writes a JSONL trace.

Needs SGLang 0.5.23 (run it with the SGLang venv's python: bash scripts/sglang_env.sh)
and redis-server (started here on a free port, or pass --redis redis://HOST:PORT).

    python examples/sglang_external_cache.py [--redis URL] [--trace FILE.jsonl]

Without SGLang it exits at once with one line, ``SglangUnavailableError: ...``, saying
what is missing (status 1).
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid
from array import array
from contextlib import ExitStack
from typing import Any

import torch

logging.disable(logging.WARNING)  # SGLang logs at INFO on import and per cache build

try:  # first: without SGLang this raises SglangUnavailableError, which names what is missing
    from unicache_fsm.integrations.sglang import ContractMonitor, StoreLinker
except ImportError as missing:
    sys.exit(f"{type(missing).__name__}: {missing}")

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    InitLoadBackParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import (  # noqa: E402
    ServerArgs,
    set_global_server_args_for_scheduler,
)

from unicache_fsm import RedisStore  # noqa: E402
from unicache_fsm.testing import RedisServer  # noqa: E402

PAGE = 4


def instance(redis_url: str, namespace: str, trace: str | None = None) -> tuple[Any, Any]:
    """One serving instance: SGLang's KV pool and cache, served from Redis."""
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=PAGE))
    kv = MHATokenToKVPool(
        size=256, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8,
        layer_num=2, device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    allocator = PagedTokenToKVPoolAllocator(
        size=256, page_size=PAGE, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
    )
    cache = UnifiedRadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=ReqToTokenPool(
                size=8, max_context_len=1024, device="cpu", enable_memory_saver=False
            ),
            token_to_kv_pool_allocator=allocator,
            page_size=PAGE,
            tree_components=(ComponentType.FULL,),
            eviction_policy="lru",
            tree_core_backend="python",
        )
    )
    # the five lines the README shows: a Redis-backed StoreLinker in SGLang's cache
    store = RedisStore(redis_url, namespace=namespace)
    linker = StoreLinker.from_store(store, {PoolName.KV: kv})
    cache.init_cache_linker(ContractMonitor.around(linker, trace=trace))
    return cache, kv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", help="a running server (default: start one here)")
    parser.add_argument("--trace", help="the second instance's protocol trace (JSONL)")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        url = args.redis
        if url is None:
            url = stack.enter_context(RedisServer()).url
        namespace = f"example-{uuid.uuid4().hex[:8]}"
        prompt = list(range(1000, 1032))  # 8 pages

        first, first_kv = instance(url, namespace)
        slots = first.token_to_kv_pool_allocator.alloc(len(prompt))
        for layer in range(first_kv.layer_num):  # "the forward": KV for every token
            first_kv.k_buffer[layer][slots] = torch.randn(len(prompt), 2, 8).to(torch.bfloat16)
            first_kv.v_buffer[layer][slots] = torch.randn(len(prompt), 2, 8).to(torch.bfloat16)
        first.insert(InsertParams(key=RadixKey(prompt), value=slots))  # write-through
        while first.linker.pending_offloads:
            first.check_hicache_events()  # a scheduler step: offload completions
        print(f"instance 1 computed {len(prompt)} tokens and stored them in Redis ({url})")

        second, second_kv = instance(url, namespace, trace=args.trace)
        req = Req("req-2", "", array("i", [*prompt, 7]), SamplingParams())
        match = second.match_prefix(MatchPrefixParams(key=RadixKey([*prompt, 7]), req=req))
        req.last_node = match.last_device_node
        loaded, req.last_node = second.init_load_back(
            InitLoadBackParams(match.best_match_node, match.host_hit_length, req=req)
        )
        private = second.linker.private_load_indices[req.rid]
        second.ready_to_load_host_cache()
        failed = second.finish_external_linker_loads([req])
        same = all(
            torch.equal(second_kv.k_buffer[layer][private], first_kv.k_buffer[layer][slots])
            and torch.equal(second_kv.v_buffer[layer][private], first_kv.v_buffer[layer][slots])
            for layer in range(second_kv.layer_num)
        )
        print(
            f"instance 2 matched {match.device_prefix_len} on device, "
            f"{match.host_hit_length} in Redis; loaded {loaded}; failed {len(failed)}; "
            f"KV bytes equal to instance 1's: {same}"
        )
        second.insert(InsertParams(key=RadixKey(prompt), value=private))  # like computed KV
        first.linker.close()
        second.linker.close()
        if args.trace:
            print(f"protocol trace: {args.trace} (unicache-fsm check-trace {args.trace})")
        return 0 if same and loaded == len(prompt) and not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
