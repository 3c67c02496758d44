"""The project's tree behind the `Side` protocol -- the ONE module to update when the
tree's public API changes.

Driven only through public names: `RadixTree`, `TreeConfig`, `InsertParams`,
`EvictParams`, `match_prefix`, `insert`, `evict`, `inc_lock_ref` / `dec_lock_ref`,
`nodes()`-style walks over `root.children`, `check()`, the allocators' public calls,
and the `ExternalLinker`'s offload path (`offload_nodes(result.write_through)`,
`poll_offloads()`) over a scripted `ExternalStore`. A fresh tree and fresh pools per
program (building them costs well under a millisecond).

Per-node reads (`rows`): `key`, `slots(ComponentType.FULL)`, `slots(ComponentType.SWA)`
(None: SWA tombstone), `lock_ref`, `external_cache_stored`, `offloading`, `children`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from conformance.model import Config, Pool
from conformance.script import OffloadScript
from conformance.sides import InsertOut, MatchOut, TokenRow
from unicache_fsm.linker.linker import ExternalLinker
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.protocol import LoadBatchResult
from unicache_fsm.tree import (
    ComponentType,
    EvictParams,
    InsertParams,
    RadixTree,
    TreeConfig,
    TreeConsistencyError,
)

__all__ = ["ProjectSide", "ScriptedStore"]


class ScriptedStore:
    """An `ExternalStore` whose offload acceptance and completions come from an
    `OffloadScript`; it stores nothing, so lookups miss and loads are refused."""

    def __init__(self, script: OffloadScript) -> None:
        self.script = script

    def attach(self, pools: Mapping[PoolName, KVPool]) -> None:
        return None

    def lookup(self, rid: str, transfers: Sequence[PoolTransfer]) -> list[int]:
        return []

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        return False

    def start_loading(self) -> int:
        return -1

    def num_completed_loads(self) -> int:
        return 0

    def pop_completed_load(self) -> LoadBatchResult:
        msg = "the scripted store runs no loads"
        raise IndexError(msg)

    def cancel_queued_load(self, rid: str) -> bool:
        return False

    def offload(self, transfers: Sequence[PoolTransfer]) -> bool:
        return self.script.submit()

    def num_completed_offloads(self) -> int:
        return self.script.num_completed()

    def pop_completed_offload(self) -> bool:
        return self.script.pop()

    def progress(self) -> int:
        return 0

    def evict(self, keys: Sequence[str], pool: PoolName | None = None) -> int:
        return 0

    def contains(self, pool: PoolName, key: str) -> bool:
        return False

    def reset(self) -> None:
        self.script.reset()

    def close(self) -> None:
        self.script.reset()


class ProjectSide:
    """The project's `RadixTree` (and `ExternalLinker` with offload cycles)."""

    name = "project"

    def __init__(self, config: Config) -> None:
        self.config = config
        self.page_size = config.page_size
        self.start()

    def start(self) -> None:
        c = self.config
        self.allocator: PagedAllocator | SWAAllocator
        if c.swa_window is None:
            self.allocator = PagedAllocator(c.full_tokens, c.page_size)
        else:
            self.allocator = SWAAllocator(c.full_tokens, c.swa_tokens, c.page_size)
        self.tree = RadixTree(
            self.allocator,
            TreeConfig(
                sliding_window_size=c.swa_window,
                write_through_threshold=1 if c.offload else None,
            ),
        )
        self.script = OffloadScript()
        self.linker = ExternalLinker(self.tree, ScriptedStore(self.script)) if c.offload else None

    # -- pools -------------------------------------------------------------------------
    def available(self, pool: Pool) -> int:
        if pool is Pool.FULL:
            return self.allocator.available_size()
        assert isinstance(self.allocator, SWAAllocator)
        return self.allocator.available_swa_size()

    def alloc(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        a = self.allocator
        if isinstance(a, PagedAllocator):
            full = a.alloc(n)
            return None if full is None else (full, None)
        if a.available_size() < n or a.available_swa_size() < n:
            return None
        full, swa = a.alloc(n), a.alloc_swa(n)
        assert full is not None and swa is not None
        a.set_full_to_swa_mapping(full, swa)
        return full, swa

    def release_swa(self, full_slots: torch.Tensor) -> None:
        if full_slots.numel():
            assert isinstance(self.allocator, SWAAllocator)
            self.allocator.free_mapped_swa(full_slots)

    # -- operations --------------------------------------------------------------------
    def match(self, tokens: list[int]) -> MatchOut:
        r = self.tree.match_prefix(tokens)
        return MatchOut(r.prefix_len, tuple(r.device_indices.tolist()), r.last_device_node)

    def insert(
        self, tokens: list[int], value: torch.Tensor, prev: int, swa_evicted: int
    ) -> InsertOut:
        r = self.tree.insert(
            InsertParams(
                key=tuple(tokens),
                value=value,
                prev_prefix_len=prev,
                swa_evicted_seqlen=swa_evicted,
                track_adopted_ranges=True,
            )
        )
        if self.linker is not None and r.write_through:
            self.linker.offload_nodes(r.write_through)
        adopted = {}
        for ct, ranges in (r.adopted_ranges or {}).items():
            pool = Pool.FULL if ct is ComponentType.FULL else Pool.SWA
            adopted[pool] = tuple((int(s), int(e)) for s, e in ranges)
        return InsertOut(r.prefix_len, adopted)

    def lock(self, handle: Any) -> Any:
        self.tree.inc_lock_ref(handle)
        return handle

    def unlock(self, receipt: Any) -> None:
        self.tree.dec_lock_ref(receipt)

    def evict(self, full: int, swa: int) -> tuple[int, int]:
        r = self.tree.evict(EvictParams(num_tokens=full, swa_num_tokens=swa))
        return r.num_tokens, r.swa_num_tokens

    def set_accept(self, accept: bool) -> None:
        self.script.accept = accept

    def complete(self, verdicts: tuple[bool, ...]) -> None:
        self.script.complete(verdicts)
        if self.linker is not None:
            self.linker.poll_offloads()

    def pending_records(self) -> int:
        if self.linker is None:
            return 0
        return sum(1 for record in self.linker.offloads if record is not None)

    # -- observation -------------------------------------------------------------------
    def rows(self) -> list[TokenRow]:
        p = self.page_size
        out: list[TokenRow] = []
        stack = [(child, 0) for child in reversed(self._children(self.tree.root, p))]
        while stack:
            node, depth = stack.pop()
            full_slots = node.slots(ComponentType.FULL)
            swa_slots = node.slots(ComponentType.SWA)
            full = None if full_slots is None else full_slots.tolist()
            swa = None if swa_slots is None else swa_slots.tolist()
            for i, tok in enumerate(node.key):
                out.append(
                    TokenRow(
                        depth + i,
                        int(tok),
                        None if full is None else int(full[i]),
                        None if swa is None or swa[i] <= 0 else int(swa[i]),
                        int(node.lock_ref),
                        bool(node.external_cache_stored),
                        bool(node.offloading),
                    )
                )
            stack.extend(
                (child, depth + len(node.key)) for child in reversed(self._children(node, p))
            )
        return out

    @staticmethod
    def _children(node: Any, p: int) -> list[Any]:
        return sorted(node.children.values(), key=lambda c: tuple(c.key[:p]))

    def audit(self) -> str | None:
        try:
            self.tree.check()
        except TreeConsistencyError as exc:
            return str(exc)
        return None
