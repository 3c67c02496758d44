"""The project's tree beside SGLang 0.5.23's own `UnifiedRadixCache`, in one process.

Run by ``python benchmarks/bench_tree.py --vs-sglang`` under a python that imports
SGLang 0.5.23 (the differential suite's venv, ``scripts/sglang_env.sh``) and this
checkout (``PYTHONPATH=.``). Three sides run the same operation sequences:

- ``project`` — `RadixTree` at its default config (slot ownership check on), over a
  `PagedAllocator`;
- ``sglang-py`` — SGLang's cache with ``tree_core_backend="python"``;
- ``sglang-rs`` — the same with ``tree_core_backend="rust"`` (SGLang's bundled
  extension; the side is left out, and the reason printed, when it does not load).

SGLang's caches are built as its scheduler builds them on CPU (global server args, a
token-to-KV pool, the token allocator at P = 1, the paged one above). Hashing is the
same on every side and stated: on, the project hashes pages (`TreeConfig.hash_pages`)
and SGLang's tree core gets ``enable_storage = True`` (what makes it hash every new
node); off, neither hashes.

Workload: ``requests`` keys, each one of ``prompts`` shared prompts of
``prompt_len`` tokens followed by 64 tokens of its own. Two shapes, per request:

- ``scheduler`` — match; read the matched prefix's slots (the project:
  `MatchResult.device_indices`; SGLang: ``path_device_indices(last_node)[:n]``, as its
  ``prefix_device_indices`` does); allocate the tail; insert with
  ``prev_prefix_len`` = the match;
- ``duplicate`` — allocate slots for the whole key; insert it with
  ``prev_prefix_len = 0`` (the cache frees the duplicates); then match (its length).

Timed: the tree calls (match, reading the prefix slots, insert), not the allocation
nor building the value tensor (each side's own allocator, outside the clock), nor
building each request's key once (SGLang: a ``RadixKey`` over an array; the project:
a `TokenKey`, which packs and checks its tokens when built). Rounds
interleave the sides (the order rotates each round) on fresh caches; a round's ratio
is SGLang's time over the project's, so above 1 means the project is faster. Printed:
the median ratio and its spread (min - max over rounds). The tree calls are timed by
wall time, or by this process's CPU time (`CLOCK`; ``bench_tree.py --cpu-time``).
"""

from __future__ import annotations

import functools
import gc
import logging
import random
import statistics
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from unicache_fsm.pools import PagedAllocator
from unicache_fsm.tree import InsertParams, RadixTree, TokenKey, TreeConfig

__all__ = ["SglangUnavailableError", "compare", "load_sglang", "make_keys"]

SGLANG_VERSION = "0.5.23"
#: the clock every side times its tree calls with: wall time (`time.perf_counter`) by
#: default, or this process's CPU time (`time.process_time`; on shared cores the
#: steadier one: time other processes hold the cores is not counted)
CLOCK: list[Callable[[], float]] = [time.perf_counter]
UNIQUE_LEN = 64
SHAPES = ("scheduler", "duplicate")


class SglangUnavailableError(RuntimeError):
    """SGLang 0.5.23 is not importable in this python."""


def load_sglang() -> dict[str, Any]:
    """SGLang's pieces, or `SglangUnavailableError` saying why not."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError as exc:
        msg = "sglang is not installed in this python (use the oracle venv)"
        raise SglangUnavailableError(msg) from exc
    if version != SGLANG_VERSION:
        msg = f"sglang {version} is installed; the comparison is against {SGLANG_VERSION}"
        raise SglangUnavailableError(msg)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams as SgInsert
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
    except Exception as exc:
        msg = f"importing SGLang {SGLANG_VERSION}'s unified radix cache failed: {exc!r}"
        raise SglangUnavailableError(msg) from exc
    finally:
        logging.disable(previous)
    return {
        "TokenToKVPoolAllocator": TokenToKVPoolAllocator,
        "PagedTokenToKVPoolAllocator": PagedTokenToKVPoolAllocator,
        "SgInsert": SgInsert,
        "MatchPrefixParams": MatchPrefixParams,
        "CacheInitParams": CacheInitParams,
        "MHATokenToKVPool": MHATokenToKVPool,
        "ReqToTokenPool": ReqToTokenPool,
        "RadixKey": RadixKey,
        "ComponentType": ComponentType,
        "UnifiedRadixCache": UnifiedRadixCache,
        "ServerArgs": ServerArgs,
        "set_global_server_args_for_scheduler": set_global_server_args_for_scheduler,
    }


def make_keys(requests: int, prompts: int, prompt_len: int, seed: int = 0) -> list[tuple[int, ...]]:
    """`requests` keys: one of `prompts` shared prompts, then 64 unique tokens."""
    rng = random.Random(seed)
    heads = [tuple(rng.randrange(1, 50_000) for _ in range(prompt_len)) for _ in range(prompts)]
    keys = []
    nxt = 100_000
    for _ in range(requests):
        keys.append(rng.choice(heads) + tuple(range(nxt, nxt + UNIQUE_LEN)))
        nxt += UNIQUE_LEN
    return keys


# -- the sides -------------------------------------------------------------------------
class ProjectSide:
    name = "project"

    def __init__(self, page_size: int, pool_tokens: int, hashing: bool) -> None:
        self.alloc = PagedAllocator(pool_tokens, page_size)
        self.tree = RadixTree(self.alloc, TreeConfig(hash_pages=hashing))

    def prepare(self, keys: Sequence[tuple[int, ...]]) -> list[Any]:
        # each request's key built once, as SGLang's side builds its RadixKey (an
        # array) once: a TokenKey packs (and checks) its tokens when built
        return [TokenKey(k) for k in keys]

    def scheduler(self, key: Any) -> float:
        clock = CLOCK[0]
        t0 = clock()
        m = self.tree.match_prefix(key)
        n = m.prefix_len
        prefix = m.device_indices if n else None
        t1 = clock()
        fresh = self.alloc.alloc(len(key) - n)
        assert fresh is not None, "the benchmark's pool must hold everything"
        value = fresh if prefix is None else torch.cat([prefix, fresh])
        t2 = clock()
        self.tree.insert(InsertParams(key, value, prev_prefix_len=n))
        return t1 - t0 + clock() - t2

    def duplicate(self, key: Any) -> float:
        value = self.alloc.alloc(len(key))
        assert value is not None, "the benchmark's pool must hold everything"
        clock = CLOCK[0]
        t0 = clock()
        self.tree.insert(InsertParams(key, value))
        self.tree.match_prefix(key).prefix_len  # noqa: B018 - the match's length is used
        return clock() - t0


class SglangSide:
    def __init__(
        self, sg: dict[str, Any], backend: str, page_size: int, pool_tokens: int, hashing: bool
    ) -> None:
        self.sg = sg
        self.name = "sglang-py" if backend == "python" else "sglang-rs"
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            args = sg["ServerArgs"](model_path="dummy", page_size=page_size)
            sg["set_global_server_args_for_scheduler"](args)
            req_pool = sg["ReqToTokenPool"](
                size=4, max_context_len=512, device="cpu", enable_memory_saver=False
            )
            kv = sg["MHATokenToKVPool"](
                size=pool_tokens,
                page_size=page_size,
                dtype=torch.bfloat16,
                head_num=1,
                head_dim=4,
                layer_num=1,
                device="cpu",
                enable_memory_saver=False,
            )
            if page_size == 1:
                self.alloc = sg["TokenToKVPoolAllocator"](
                    size=pool_tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv,
                    need_sort=False,
                )  # fmt: skip
            else:
                self.alloc = sg["PagedTokenToKVPoolAllocator"](
                    size=pool_tokens, page_size=page_size, dtype=torch.bfloat16,
                    device="cpu", kvcache=kv, need_sort=False,
                )  # fmt: skip
            params = sg["CacheInitParams"](
                disable=False,
                req_to_token_pool=req_pool,
                token_to_kv_pool_allocator=self.alloc,
                page_size=page_size,
                tree_components=(sg["ComponentType"].FULL,),
                eviction_policy="lru",
                tree_core_backend=backend,
            )
            self.cache = sg["UnifiedRadixCache"](params)
        finally:
            logging.disable(previous)
        got = type(self.cache.tree_core).__name__
        want = "UnifiedTreeCore" if backend == "python" else "RustUnifiedTreeCore"
        if got != want:
            msg = f"SGLang built a {got} for tree_core_backend={backend!r}"
            raise SglangUnavailableError(msg)
        self.cache.tree_core.enable_storage = hashing  # what makes its tree core hash

    def prepare(self, keys: Sequence[tuple[int, ...]]) -> list[Any]:
        radix_key = self.sg["RadixKey"]
        return [radix_key(array("q", k)) for k in keys]

    def scheduler(self, key: Any) -> float:
        sg, cache = self.sg, self.cache
        clock = CLOCK[0]
        t0 = clock()
        r = cache.match_prefix(sg["MatchPrefixParams"](key=key))
        n = int(r.device_prefix_len)
        prefix = cache.path_device_indices(r.last_device_node)[:n] if n else None
        t1 = clock()
        fresh = self.alloc.alloc(len(key) - n)
        assert fresh is not None, "the benchmark's pool must hold everything"
        value = fresh if prefix is None else torch.cat([prefix, fresh])
        t2 = clock()
        cache.insert(sg["SgInsert"](key=key, value=value, prev_prefix_len=n))
        return t1 - t0 + clock() - t2

    def duplicate(self, key: Any) -> float:
        sg, cache = self.sg, self.cache
        value = self.alloc.alloc(len(key))
        assert value is not None, "the benchmark's pool must hold everything"
        clock = CLOCK[0]
        t0 = clock()
        cache.insert(sg["SgInsert"](key=key, value=value, prev_prefix_len=0))
        int(cache.match_prefix(sg["MatchPrefixParams"](key=key)).device_prefix_len)
        return clock() - t0


def hashes_agree(sg: dict[str, Any], page_size: int) -> str | None:
    """Check that hashing is really on for every side; None, or what is wrong."""
    key = tuple(range(1, 4 * page_size + 1))
    out = []
    for backend in ("python", "rust"):
        try:
            side = SglangSide(sg, backend, page_size, 64 * page_size, True)
        except Exception:  # a missing Rust core is reported elsewhere
            continue
        sk = side.prepare([key])[0]
        side.duplicate(sk)
        node = side.cache.match_prefix(sg["MatchPrefixParams"](key=sk)).last_device_node
        out.append(list(side.cache.tree_core.get_hash_values(node)))
    ours = ProjectSide(page_size, 64 * page_size, True)
    ours.duplicate(key)
    node = ours.tree.match_prefix(key).last_device_node
    mine = list(node.hashes or [])
    for got in out:
        if got != mine:
            return f"SGLang's page hashes {got[:1]}... differ from the project's {mine[:1]}..."
    return None if out else "no SGLang side hashed"


# -- the comparison ---------------------------------------------------------------------
@attrs.frozen
class Case:
    shape: str
    page_size: int
    prompt_len: int
    prompts: int
    requests: int


def run_side(side: Any, shape: str, keys: Sequence[Any]) -> float:
    """Seconds per request spent in the tree calls of `shape` over `keys`."""
    step: Callable[[Any], float] = getattr(side, shape)
    gc.collect()
    total = 0.0
    for key in keys:
        total += step(key)
    return total / len(keys)


def compare(
    sg: dict[str, Any],
    cases: Sequence[Case],
    rounds: int,
    hashing: bool,
    backends: Sequence[str],
) -> list[tuple[Case, dict[str, list[float]]]]:
    """Per case, each side's seconds per request in every round."""
    out = []
    for case in cases:
        keys = make_keys(case.requests, case.prompts, case.prompt_len)
        p = case.page_size
        need = case.prompts * case.prompt_len + case.requests * (case.prompt_len + UNIQUE_LEN)
        pool = -(-need // p) * p + 4 * p
        makers: list[Callable[[], Any]] = [functools.partial(ProjectSide, p, pool, hashing)]
        for b in backends:
            makers.append(functools.partial(SglangSide, sg, b, p, pool, hashing))
        times: dict[str, list[float]] = {}
        # warm-up: a short run of each side (dispatches, lazy imports)
        for make in makers:
            side = make()
            run_side(side, case.shape, side.prepare(keys[:50]))
        for r in range(rounds):
            order = makers[r % len(makers) :] + makers[: r % len(makers)]
            for make in order:
                side = make()
                prepared = side.prepare(keys)
                times.setdefault(side.name, []).append(run_side(side, case.shape, prepared))
                del side, prepared
        out.append((case, times))
    return out


def ratio_cells(times: dict[str, list[float]], other: str) -> str:
    """'median (min-max)' of other/project per round, or '-' when `other` did not run."""
    if other not in times:
        return "-"
    ratios = [o / m for o, m in zip(times[other], times["project"], strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def us(times: dict[str, list[float]], side: str) -> str:
    return "-" if side not in times else f"{statistics.median(times[side]) * 1e6:.1f}"
