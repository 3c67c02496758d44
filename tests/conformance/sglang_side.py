"""The oracle: SGLang 0.5.23's own `UnifiedRadixCache` (Python tree core) on CPU.

`load_sglang()` imports it (or raises `SglangUnavailable` saying why); `SglangSide`
drives one cache per configuration through the `Side` protocol. Caches are built once
per configuration and process (building one costs ~0.1-0.3 s, a program ~10 ms) and
reset between programs: `UnifiedRadixCache.reset()` rebuilds the tree and resets the
linker, `clear()` resets the allocators.

Built as the scheduler builds it on CPU: the global server args first (components read
them), a `ReqToTokenPool`, then for Full only an `MHATokenToKVPool` with the token
allocator (P = 1) or the paged allocator (P > 1, which frees by page as the tree
expects), for Full + SWA an `SWAKVPool` with `SWATokenToKVPoolAllocator` (its FULL and
SWA pages are allocated separately and mapped, as its own tests do for P > 1). With
offload cycles, a scripted `UnifiedCacheLinker` subclass is attached: it answers
`offload()` from the `OffloadScript` and refuses lookups and loads.
"""

from __future__ import annotations

import importlib.metadata
import logging
import types
from array import array
from typing import Any

import torch

from conformance.model import Config, Pool
from conformance.script import OffloadScript
from conformance.sides import InsertOut, MatchOut, TokenRow

__all__ = ["SGLANG_VERSION", "SglangSide", "SglangUnavailable", "load_sglang"]

SGLANG_VERSION = "0.5.23"
DTYPE = torch.bfloat16


class SglangUnavailable(RuntimeError):
    """SGLang 0.5.23 cannot be imported here (the reason says why)."""


_SG: types.SimpleNamespace | None = None


def load_sglang() -> types.SimpleNamespace:
    """Import the pieces of SGLang 0.5.23 the oracle uses (once per process)."""
    global _SG
    if _SG is not None:
        return _SG
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError as exc:
        msg = (
            "sglang is not importable in this Python "
            "(build the oracle venv with scripts/sglang_env.sh and run the suite with its "
            "python)"
        )
        raise SglangUnavailable(msg) from exc
    if version != SGLANG_VERSION:
        msg = f"sglang {version} is installed; the oracle is SGLang {SGLANG_VERSION}"
        raise SglangUnavailable(msg)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # SGLang logs at INFO on import and on every build
    try:
        _SG = _import_pieces(version)
    except Exception as exc:  # any import failure means: no oracle here
        msg = f"importing SGLang {SGLANG_VERSION}'s unified radix cache failed: {exc!r}"
        raise SglangUnavailable(msg) from exc
    finally:
        logging.disable(previous)
    _SG.ScriptedLinker = _scripted_linker_class(_SG)
    return _SG


def _import_pieces(version: str) -> types.SimpleNamespace:
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InsertParams,
        InsertResult,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.components.base import (
        ComponentType,
        ExternalLinkerLoadPhase,
    )
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (
        LayerWiseLoadCounter,
        UnifiedCacheLinker,
    )
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    return types.SimpleNamespace(
        version=version,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator,
        SWATokenToKVPoolAllocator=SWATokenToKVPoolAllocator,
        EvictParams=EvictParams,
        InsertParams=InsertParams,
        InsertResult=InsertResult,
        MatchPrefixParams=MatchPrefixParams,
        CacheInitParams=CacheInitParams,
        PoolName=PoolName,
        MHATokenToKVPool=MHATokenToKVPool,
        ReqToTokenPool=ReqToTokenPool,
        RadixKey=RadixKey,
        SWAKVPool=SWAKVPool,
        ComponentType=ComponentType,
        ExternalLinkerLoadPhase=ExternalLinkerLoadPhase,
        LayerWiseLoadCounter=LayerWiseLoadCounter,
        UnifiedCacheLinker=UnifiedCacheLinker,
        UnifiedRadixCache=UnifiedRadixCache,
        ServerArgs=ServerArgs,
        set_global_server_args_for_scheduler=set_global_server_args_for_scheduler,
    )


def _scripted_linker_class(sg: types.SimpleNamespace) -> type:
    """A `UnifiedCacheLinker` that offloads through an `OffloadScript` and loads nothing."""

    class ScriptedLinker(sg.UnifiedCacheLinker):  # type: ignore[misc,name-defined]
        def __init__(self, script: OffloadScript, pools: dict[Any, object]) -> None:
            self.script = script
            self.pools = pools
            self.layer_done_counter = sg.LayerWiseLoadCounter(num_layers=1)

        def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
            return []

        def load(self, rid: str, transfers: list[Any]) -> bool:
            return False

        def start_layer_wise_loading(self) -> int:
            return -1

        def finish_layer_wise_loading(self, counter_index: int) -> bool:
            return True

        def cancel_queued_load(self, rid: str) -> bool:
            return False

        def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
            return self.script.submit()

        def num_completed_offloads(self) -> int:
            return self.script.num_completed()

        def pop_completed_offload(self) -> bool:
            return self.script.pop()

        def reset(self) -> None:
            self.script.reset()

        def close(self) -> None:
            self.script.reset()

    return ScriptedLinker


class _Bundle:
    """One configuration's cache, allocator and linker, built once per process."""

    def __init__(self, sg: types.SimpleNamespace, config: Config) -> None:
        p = config.page_size
        self.server_args = sg.ServerArgs(model_path="dummy", page_size=p)
        sg.set_global_server_args_for_scheduler(self.server_args)
        _CURRENT[:] = [self]
        req_pool = sg.ReqToTokenPool(
            size=4, max_context_len=512, device="cpu", enable_memory_saver=False
        )
        n = config.full_tokens
        self.swa = config.swa_window is not None
        if self.swa:
            kv = sg.SWAKVPool(
                size=n,
                size_swa=config.swa_tokens,
                page_size=p,
                dtype=DTYPE,
                head_num=1,
                head_dim=4,
                swa_attention_layer_ids=[0],
                full_attention_layer_ids=[1],
                device="cpu",
            )
            self.allocator = sg.SWATokenToKVPoolAllocator(
                size=n,
                size_swa=config.swa_tokens,
                page_size=p,
                dtype=DTYPE,
                device="cpu",
                kvcache=kv,
                need_sort=False,
            )
            self.full_alloc = self.allocator.full_attn_allocator
            self.swa_alloc = self.allocator.swa_attn_allocator
            components = (sg.ComponentType.FULL, sg.ComponentType.SWA)
            pools = {sg.PoolName.KV: kv, sg.PoolName.SWA: kv}
        else:
            kv = sg.MHATokenToKVPool(
                size=n,
                page_size=p,
                dtype=DTYPE,
                head_num=1,
                head_dim=4,
                layer_num=1,
                device="cpu",
                enable_memory_saver=False,
            )
            if p == 1:
                self.allocator = sg.TokenToKVPoolAllocator(
                    size=n, dtype=DTYPE, device="cpu", kvcache=kv, need_sort=False
                )
            else:
                self.allocator = sg.PagedTokenToKVPoolAllocator(
                    size=n, page_size=p, dtype=DTYPE, device="cpu", kvcache=kv, need_sort=False
                )
            self.full_alloc = self.allocator
            self.swa_alloc = None
            components = (sg.ComponentType.FULL,)
            pools = {sg.PoolName.KV: kv}
        params = sg.CacheInitParams(
            disable=False,
            req_to_token_pool=req_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=p,
            sliding_window_size=config.swa_window,
            tree_components=components,
            eviction_policy="lru",
            tree_core_backend="python",
        )
        self.cache = sg.UnifiedRadixCache(params)
        self.script = OffloadScript()
        if config.offload:
            self.cache.init_cache_linker(sg.ScriptedLinker(self.script, pools))


_BUNDLES: dict[Config, _Bundle] = {}
_CURRENT: list[_Bundle] = []  # the bundle whose server args are the global ones


class SglangSide:
    """SGLang 0.5.23's cache behind the `Side` protocol (see the module docstring)."""

    name = f"sglang {SGLANG_VERSION}"

    def __init__(self, config: Config) -> None:
        self.sg = load_sglang()
        self.config = config
        self.page_size = config.page_size
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            if config not in _BUNDLES:
                _BUNDLES[config] = _Bundle(self.sg, config)
        finally:
            logging.disable(previous)
        self.b = _BUNDLES[config]
        self.FULL = self.sg.ComponentType.FULL
        self.SWA = self.sg.ComponentType.SWA

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        b = self.b
        if [b] != _CURRENT:  # ~17 ms, so only when the configuration changes
            self.sg.set_global_server_args_for_scheduler(b.server_args)
            _CURRENT[:] = [b]
        b.cache.reset()  # resets the linker (its pending offloads fail) and the tree
        b.allocator.clear()
        b.script.__init__()  # type: ignore[misc]
        assert not b.cache.tree_core.root_node.children

    # -- pools -------------------------------------------------------------------------
    def available(self, pool: Pool) -> int:
        if pool is Pool.FULL:
            return int(self.b.full_alloc.available_size())
        assert self.b.swa_alloc is not None
        return int(self.b.swa_alloc.available_size())

    def alloc(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        b = self.b
        if b.full_alloc.available_size() < n:
            return None
        if b.swa_alloc is None:
            full = b.full_alloc.alloc(n)
            return None if full is None else (full, None)
        if b.swa_alloc.available_size() < n:
            return None
        full = b.full_alloc.alloc(n)
        swa = b.swa_alloc.alloc(n)
        assert full is not None and swa is not None
        b.allocator.set_full_to_swa_mapping(full, swa)
        return full, swa

    def release_swa(self, full_slots: torch.Tensor) -> None:
        if full_slots.numel():
            self.b.allocator.free_swa(full_slots)

    def free_full_slots(self) -> set[int]:
        """Every FULL slot on the allocator's free lists (for the double-owner check)."""
        a = self.b.full_alloc
        p = self.page_size
        if p == 1:
            free = torch.cat([a.free_pages, a.release_pages]).tolist()
            return set(free)
        pages = torch.cat([a.free_pages, *a.staged_pages]).tolist()
        return {page * p + j for page in pages for j in range(p)}

    # -- operations --------------------------------------------------------------------
    def _key(self, tokens: list[int]) -> Any:
        return self.sg.RadixKey(array("q", tokens))

    def match(self, tokens: list[int]) -> MatchOut:
        cache = self.b.cache
        r = cache.match_prefix(self.sg.MatchPrefixParams(key=self._key(tokens)))
        n = int(r.device_prefix_len)
        path = cache.path_device_indices(r.last_device_node)
        assert path.numel() >= n, (path.numel(), n)
        return MatchOut(n, tuple(path[:n].tolist()), r.last_device_node)

    def insert(
        self, tokens: list[int], value: torch.Tensor, prev: int, swa_evicted: int
    ) -> InsertOut:
        seqlens = {self.SWA: swa_evicted} if self.b.swa else {}
        params = self.sg.InsertParams(
            key=self._key(tokens),
            value=value,
            prev_prefix_len=prev,
            component_evicted_seqlens=seqlens,
            track_adopted_ranges=True,
        )
        r = self.b.cache.insert(params)
        adopted = {}
        for ct, ranges in (r.adopted_ranges or {}).items():
            pool = Pool.FULL if ct == self.FULL else Pool.SWA
            adopted[pool] = tuple((int(s), int(e)) for s, e in ranges)
        return InsertOut(int(r.prefix_len), adopted)

    def lock(self, handle: Any) -> Any:
        receipt = self.b.cache.inc_lock_ref(handle).to_dec_params()
        return handle, receipt

    def unlock(self, receipt: Any) -> None:
        node_id, params = receipt
        self.b.cache.dec_lock_ref(node_id, params)

    def evict(self, full: int, swa: int) -> tuple[int, int]:
        r = self.b.cache.evict(self.sg.EvictParams(num_tokens=full, swa_num_tokens=swa))
        return int(r.num_tokens_evicted), int(r.swa_num_tokens_evicted)

    def set_accept(self, accept: bool) -> None:
        self.b.script.accept = accept

    def complete(self, verdicts: tuple[bool, ...]) -> None:
        self.b.script.complete(verdicts)
        self.b.cache.check_hicache_events()

    def pending_records(self) -> int:
        linker = self.b.cache.linker
        return 0 if linker is None else len(linker.pending_offloads)

    # -- observation -------------------------------------------------------------------
    def rows(self) -> list[TokenRow]:
        p = self.page_size
        out: list[TokenRow] = []
        root = self.b.cache.tree_core.root_node
        stack = [(child, 0) for child in reversed(self._children(root, p))]
        while stack:
            node, depth = stack.pop()
            tokens = list(node.key.token_ids)
            full_v = node.component(self.FULL).value
            full = None if full_v is None else full_v.tolist()
            swa: list[int | None] = [None] * len(tokens)
            if self.b.swa:
                swa_v = node.component(self.SWA).value
                if swa_v is not None:
                    swa = [s if s > 0 else None for s in swa_v.tolist()]
            lock = int(node.component(self.FULL).lock_ref)
            stored = bool(node.external_cache_stored)
            pending = node.write_through_pending_id is not None
            for i, tok in enumerate(tokens):
                out.append(
                    TokenRow(
                        depth + i,
                        int(tok),
                        None if full is None else int(full[i]),
                        swa[i],
                        lock,
                        stored,
                        pending,
                    )
                )
            stack.extend(
                (child, depth + len(tokens)) for child in reversed(self._children(node, p))
            )
        return out

    @staticmethod
    def _children(node: Any, p: int) -> list[Any]:
        return sorted(node.children.values(), key=lambda c: tuple(c.key.token_ids[:p]))

    def audit(self) -> str | None:
        """None: 0.5.23's own `sanity_check` asserts that an idle tree holds no locks,
        which programs that hold locks across operations break on purpose."""
        return None
