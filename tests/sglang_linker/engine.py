"""SGLang 0.5.23's real `UnifiedRadixCache` on CPU, served by a `StoreLinker` and watched
by a `ContractMonitor`, with the steps of a scheduler spelled out.

`Engine(store, swa_window=None)` builds the cache as the scheduler builds it on CPU
(global server args first; Full only: `MHATokenToKVPool` with the paged allocator;
Full + SWA: `SWAKVPool` with `SWATokenToKVPoolAllocator`, FULL and SWA pages allocated
separately and mapped), with two Full layers and random KV bytes written into every
computed slot. `Engine.launched(config, ...)` builds the linker instead as a worker
launched with ``--unified-cache-external-linker-backend dynamic
--unified-cache-external-linker-config CONFIG`` does: SGLang's own
`UnifiedCacheLinkerConfig.from_dict` and `create_unified_cache_linker`, then the layer
counter registered on the KV pool (`kvcache.register_layer_transfer_counter`). Steps:

- `compute(tokens)` — a request computed `tokens`: fresh slots, random K/V, insert (the
  write-through offload is queued by the insert); returns the K/V it wrote (`Kv`).
- `poll()` — one scheduler step's `check_hicache_events` (offload completions).
- `evict_all()` — evict every unlocked node.
- `load(tokens, rid)` — match with a request, `init_load_back`, start the batch, run
  the forward (each layer's attention asks the KV pool for its buffer, which waits on
  the layer counter, and reads the layer: `layers_read`), finish it; returns a `Loaded`
  with what was promised and loaded, the request-private slots, the finish's failed
  requests and what the forward read.
- `insert_loaded(loaded)` — the request inserts the loaded tail like computed KV.
- `read(full_slots)` — the K/V SGLang holds in those slots.
"""

from __future__ import annotations

import logging
from array import array
from typing import Any

import attrs
import torch

logging.disable(logging.WARNING)  # SGLang logs at INFO on import and per build

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InitLoadBackParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_cache.linker_config import (  # noqa: E402
    UnifiedCacheLinkerConfig,
)
from sglang.srt.mem_cache.unified_cache.linker_factory import (  # noqa: E402
    create_unified_cache_linker,
)
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import (  # noqa: E402
    ServerArgs,
    set_global_server_args_for_scheduler,
)

from unicache_fsm.integrations.sglang import ContractMonitor, StoreLinker  # noqa: E402
from unicache_fsm.store.protocol import ExternalStore  # noqa: E402

DTYPE = torch.bfloat16
HEADS, HEAD_DIM = 2, 4

__all__ = ["Engine", "Kv", "Loaded", "PoolName"]


@attrs.frozen
class Kv:
    """K and V of some tokens: ``[layers, tokens, heads, head_dim]`` each."""

    k: torch.Tensor = attrs.field(eq=False)
    v: torch.Tensor = attrs.field(eq=False)

    def same(self, other: Kv) -> bool:
        return torch.equal(self.k, other.k) and torch.equal(self.v, other.v)


@attrs.frozen
class Loaded:
    rid: str
    tokens: tuple[int, ...]
    host_hit: int
    loaded: int
    slots: torch.Tensor | None = attrs.field(eq=False)
    failed: tuple[str, ...]
    req: Any = attrs.field(eq=False)
    #: the forward's reads: SGLang layer id -> (K, V) of the loaded slots right after
    #: that layer's wait returned
    layers_read: dict[int, tuple[torch.Tensor, torch.Tensor]] = attrs.field(eq=False, factory=dict)


class Engine:
    def __init__(
        self,
        store: ExternalStore | None,
        *,
        swa_window: int | None = None,
        page: int = 4,
        tokens: int = 256,
        trace: Any = None,
        mode: str = "raise",
        monitored: bool = True,
        store_trace: Any = None,
        config: dict[str, Any] | None = None,
        model: str = "dummy",
        load_timeout_s: float = 30.0,
    ) -> None:
        self.page = page
        self.model = model
        set_global_server_args_for_scheduler(ServerArgs(model_path=model, page_size=page))
        req_pool = ReqToTokenPool(
            size=8, max_context_len=1024, device="cpu", enable_memory_saver=False
        )
        self.swa = swa_window is not None
        #: the SWA tokens a load brings back: the window in whole pages
        self.window = -(-swa_window // page) * page if swa_window is not None else 0
        if self.swa:
            kv = SWAKVPool(
                size=tokens,
                size_swa=tokens,
                page_size=page,
                dtype=DTYPE,
                head_num=HEADS,
                head_dim=HEAD_DIM,
                swa_attention_layer_ids=[0],
                full_attention_layer_ids=[1, 2],
                device="cpu",
            )
            self.allocator = SWATokenToKVPoolAllocator(
                size=tokens,
                size_swa=tokens,
                page_size=page,
                dtype=DTYPE,
                device="cpu",
                kvcache=kv,
                need_sort=False,
            )
            self.full_kv = kv.full_kv_pool
            self.swa_kv = kv.swa_kv_pool
            components = (ComponentType.FULL, ComponentType.SWA)
            pools = {PoolName.KV: kv, PoolName.SWA: kv}
        else:
            kv = MHATokenToKVPool(
                size=tokens,
                page_size=page,
                dtype=DTYPE,
                head_num=HEADS,
                head_dim=HEAD_DIM,
                layer_num=2,
                device="cpu",
                enable_memory_saver=False,
            )
            self.allocator = PagedTokenToKVPoolAllocator(
                size=tokens, page_size=page, dtype=DTYPE, device="cpu", kvcache=kv, need_sort=False
            )
            self.full_kv = kv
            self.swa_kv = None
            components = (ComponentType.FULL,)
            pools = {PoolName.KV: kv}
        self.kvcache = kv
        self.params = CacheInitParams(
            disable=False,
            req_to_token_pool=req_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=page,
            sliding_window_size=swa_window,
            tree_components=components,
            eviction_policy="lru",
            tree_core_backend="python",
        )
        self.cache = UnifiedRadixCache(self.params)
        self.pools = pools
        self.monitor: ContractMonitor | None = None
        if config is not None:
            self.linker: Any = self._launch(config, model)
            if isinstance(self.linker, ContractMonitor):
                self.monitor = self.linker
                self.store_linker = self.linker.linker
            else:
                self.store_linker = self.linker
        else:
            assert store is not None
            self.store_linker = StoreLinker.from_store(
                store, pools, trace=store_trace, load_timeout_s=load_timeout_s
            )
            self.linker = self.store_linker
            if monitored:
                self.monitor = ContractMonitor.around(self.store_linker, mode=mode, trace=trace)
                self.linker = self.monitor
        self.cache.init_cache_linker(self.linker)
        kv.register_layer_transfer_counter(self.linker.layer_done_counter)
        self.gen = torch.Generator().manual_seed(1234)

    @classmethod
    def launched(cls, config: dict[str, Any], **options: Any) -> Engine:
        """The cache with its linker built from the launch JSON `config` (module docstring)."""
        return cls(None, config=config, **options)

    def _launch(self, config: dict[str, Any], model: str) -> Any:
        args = ServerArgs(
            model_path=model,
            page_size=self.page,
            enable_unified_cache_external_linker=True,
            unified_cache_external_linker_backend="dynamic",
            unified_cache_external_linker_config=config,
        )
        set_global_server_args_for_scheduler(args)
        UnifiedCacheLinkerConfig.from_dict(config)  # what SGLang's argument check runs
        return create_unified_cache_linker(
            args,
            self.params,
            backend="dynamic",
            config=config,
            components=set(self.cache.components),
            forward_stream=None,
        )

    # -- slots and bytes -------------------------------------------------------------------

    def _alloc(self, n: int) -> torch.Tensor:
        if not self.swa:
            slots = self.allocator.alloc(n)
            assert slots is not None, "the test pool is too small"
            return slots
        full = self.allocator.full_attn_allocator.alloc(n)
        swa = self.allocator.swa_attn_allocator.alloc(n)
        assert full is not None and swa is not None, "the test pool is too small"
        self.allocator.set_full_to_swa_mapping(full, swa)
        return full

    def swa_slots(self, full_slots: torch.Tensor) -> torch.Tensor:
        return self.allocator.full_to_swa_index_mapping[full_slots].to(torch.int64)

    def _random(self, n: int, layers: int) -> torch.Tensor:
        return torch.randn(layers, n, HEADS, HEAD_DIM, generator=self.gen).to(DTYPE)

    def read(self, full_slots: torch.Tensor) -> Kv:
        """The Full layers' K/V in `full_slots`."""
        kv = self.full_kv
        return Kv(
            torch.stack([kv.k_buffer[layer][full_slots] for layer in range(kv.layer_num)]),
            torch.stack([kv.v_buffer[layer][full_slots] for layer in range(kv.layer_num)]),
        )

    def read_swa(self, full_slots: torch.Tensor) -> Kv:
        assert self.swa_kv is not None
        slots = self.swa_slots(full_slots)
        kv = self.swa_kv
        return Kv(
            torch.stack([kv.k_buffer[layer][slots] for layer in range(kv.layer_num)]),
            torch.stack([kv.v_buffer[layer][slots] for layer in range(kv.layer_num)]),
        )

    def _write(self, full_slots: torch.Tensor) -> None:
        n = full_slots.numel()
        kv = self.full_kv
        k, v = self._random(n, kv.layer_num), self._random(n, kv.layer_num)
        for layer in range(kv.layer_num):
            kv.k_buffer[layer][full_slots] = k[layer]
            kv.v_buffer[layer][full_slots] = v[layer]
        if self.swa_kv is not None:
            swa = self.swa_slots(full_slots)
            kv = self.swa_kv
            k, v = self._random(n, kv.layer_num), self._random(n, kv.layer_num)
            for layer in range(kv.layer_num):
                kv.k_buffer[layer][swa] = k[layer]
                kv.v_buffer[layer][swa] = v[layer]

    # -- scheduler steps -------------------------------------------------------------------

    def compute(self, tokens: list[int]) -> tuple[Kv, Kv | None]:
        """A request computed `tokens` (whole pages) and inserts them."""
        slots = self._alloc(len(tokens))
        self.computed_slots = slots  # where the last computed request's KV went
        self._write(slots)
        wrote = self.read(slots), (self.read_swa(slots) if self.swa else None)
        self.cache.insert(InsertParams(key=RadixKey(list(tokens)), value=slots))
        return wrote

    def poll(self, rounds: int = 1) -> None:
        for _ in range(rounds):
            self.cache.check_hicache_events()

    def pending_offloads(self) -> int:
        return len(self.cache.linker.pending_offloads)

    def settle_offloads(self) -> None:
        for _ in range(20):
            if not self.pending_offloads():
                return
            self.poll()
        raise AssertionError(f"{self.pending_offloads()} offloads never completed")

    def evict_all(self) -> None:
        self.cache.evict(EvictParams(num_tokens=10**6, swa_num_tokens=10**6 if self.swa else 0))

    def match(self, tokens: list[int], rid: str) -> tuple[Any, Any]:
        req = Req(rid, "", array("i", tokens), SamplingParams())
        result = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(tokens)), req=req))
        req.last_node = result.last_device_node
        req.prefix_len = result.device_prefix_len
        return req, result

    def load_back(self, req: Any, result: Any) -> tuple[int, torch.Tensor | None]:
        loaded, req.last_node = self.cache.init_load_back(
            InitLoadBackParams(
                best_match_node=result.best_match_node,
                host_hit_length=result.host_hit_length,
                req=req,
            )
        )
        slots = self.cache.linker.private_load_indices.get(req.rid)
        return loaded, slots

    def load(self, tokens: list[int], rid: str) -> Loaded:
        req, result = self.match(tokens, rid)
        loaded, slots = self.load_back(req, result)
        if loaded:
            req.prefix_len = result.device_prefix_len + loaded
        self.cache.ready_to_load_host_cache()
        read = self.forward(slots)
        failed = self.cache.finish_external_linker_loads([req])
        return Loaded(
            rid,
            tuple(tokens),
            result.host_hit_length,
            loaded,
            slots,
            tuple(r.rid for r in failed),
            req,
            read,
        )

    def forward(self, slots: torch.Tensor | None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The batch's forward: each layer's attention asks the KV pool for its K buffer
        (the pool waits on the layer counter first) and reads the loaded slots' K and V."""
        read: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.linker.layer_done_counter.set_consumer(self.cache.linker.inflight_load_index)
        for layer in range(self.kvcache.layer_num):
            k = self.kvcache.get_key_buffer(layer)
            v = self.kvcache.get_value_buffer(layer)
            if slots is None:
                continue
            where = slots
            mapping = getattr(self.kvcache, "layers_mapping", None)
            if mapping is not None and mapping[layer][1]:
                where = self.swa_slots(slots)
            read[layer] = (k[where].clone(), v[where].clone())
        return read

    def insert_loaded(self, loaded: Loaded) -> Any:
        """The request inserts its loaded tail like computed KV (0.5.23 has no COMMIT)."""
        assert loaded.slots is not None
        n = loaded.loaded
        evicted = {}
        if self.swa and loaded.req.kv is not None:
            evicted[ComponentType.SWA] = loaded.req.kv.get_evicted_seqlen(ComponentType.SWA)
        params = InsertParams(
            key=RadixKey(list(loaded.tokens[:n])),
            value=loaded.slots,
            component_evicted_seqlens=evicted,
            track_adopted_ranges=True,
        )
        return self.cache.insert(params)

    def close(self) -> None:
        """Close the cache's linker (SGLang's wrapper), unless a test closed it already."""
        if self.monitor is not None and self.monitor.monitor.closed:
            return
        self.cache.linker.close()

    def free(self, slots: torch.Tensor) -> None:
        self.allocator.free(slots)
