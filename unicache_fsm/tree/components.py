"""Tree components and their external-linker hooks.

A component is one kind of per-node data (FULL, the backbone; SWA, the sliding-window
KV; MAMBA, recurrent state). The external linker never touches slots itself: it asks
each participating component, in order (FULL first), through two hooks:

- `build_external_linker_transfer(phase, node, keys)` — LOOKUP: the keys a store must
  check (no slots); LOAD: reserve device slots for the keys (evicting the shortfall
  first), or None when the pool stays short; OFFLOAD: a node's slots and page hashes,
  or None when the node has nothing to offload for this component.
- `update_external_linker_load(phase, transfer, ctx)` — PREPARE (after every LOAD
  transfer exists), COMMIT (after the tail was inserted; returns the transfer cut to
  the pages the tree adopted, or None when none remain) and ABORT (frees exactly the
  slots LOAD reserved; runs in reverse component order).

FULL and SWA take part; MAMBA raises `UnsupportedComponentError` (SGLang 0.5.23 keeps
Mamba out of the external linker too).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import torch

from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.pools.transfer import (
    ExternalLinkerLoadPhase,
    LinkerTransferPhase,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from unicache_fsm.tree.errors import UnsupportedComponentError
from unicache_fsm.tree.params import ComponentType, EvictParams

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode
    from unicache_fsm.tree.tree import RadixTree

__all__ = [
    "FullComponent",
    "LoadContext",
    "MambaComponent",
    "SwaComponent",
    "TreeComponent",
    "components_for",
    "select_adopted_pages",
]

LOOKUP, LOAD, OFFLOAD = (
    LinkerTransferPhase.LOOKUP,
    LinkerTransferPhase.LOAD,
    LinkerTransferPhase.OFFLOAD,
)
PREPARE, COMMIT, ABORT = (
    ExternalLinkerLoadPhase.PREPARE,
    ExternalLinkerLoadPhase.COMMIT,
    ExternalLinkerLoadPhase.ABORT,
)


@attrs.define(slots=True)
class LoadContext:
    """What the load hooks share about one load.

    `prefix_len` is the absolute end of the loaded tail; `full_transfer` the FULL
    LOAD transfer. COMMIT reads `adopted_ranges` (absolute token ranges per component)
    and `canonical_full` (the tree's FULL slots for the whole tail, after insert).
    PREPARE writes `swa_evicted_seqlen` (the request's SWA boundary).
    """

    prefix_len: int
    full_transfer: PoolTransfer | None = None
    adopted_ranges: dict[ComponentType, list[tuple[int, int]]] = attrs.field(factory=dict)
    canonical_full: torch.Tensor | None = None
    swa_evicted_seqlen: int = 0


def select_adopted_pages(
    transfer: PoolTransfer,
    ranges: Sequence[tuple[int, int]],
    prefix_len: int,
    page_size: int,
    extra: torch.Tensor | None = None,
) -> tuple[PoolTransfer | None, torch.Tensor | None]:
    """Cut a LOAD transfer (a trailing span ending at `prefix_len`) to the adopted pages.

    Returns the cut transfer (None when no page is adopted) and `extra` (a tensor
    aligned with the transfer's slots, e.g. the canonical FULL slots) cut the same way.
    """
    assert transfer.device_indices is not None
    n_pages = transfer.num_pages
    coverage_start = prefix_len - n_pages * page_size
    keep = torch.zeros(n_pages, dtype=torch.bool)
    for start, end in ranges:
        lo, hi = max(start, coverage_start), min(end, prefix_len)
        if lo >= hi:
            continue
        assert (lo - coverage_start) % page_size == 0 and (hi - coverage_start) % page_size == 0
        keep[(lo - coverage_start) // page_size : (hi - coverage_start) // page_size] = True
    if not bool(keep.any()):
        return None, None
    pages = keep.nonzero().flatten().tolist()
    slot_mask = keep.repeat_interleave(page_size).to(transfer.device_indices.device)
    cut = PoolTransfer(
        transfer.name,
        transfer.device_indices[slot_mask],
        tuple(transfer.keys[i] for i in pages),
        transfer.hit_policy,
    )
    return cut, None if extra is None else extra[slot_mask.to(extra.device)]


class TreeComponent(abc.ABC):
    """One kind of per-node data and its external-linker hooks (see the module docstring)."""

    component_type: ComponentType
    pool: PoolName

    def __init__(self, tree: RadixTree) -> None:
        self.tree = tree
        self.page_size = tree.page_size

    @abc.abstractmethod
    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: Sequence[str]
    ) -> PoolTransfer | None: ...

    @abc.abstractmethod
    def update_external_linker_load(
        self, phase: ExternalLinkerLoadPhase, transfer: PoolTransfer, ctx: LoadContext
    ) -> PoolTransfer | None: ...


class FullComponent(TreeComponent):
    """The backbone: every page of the tail, ALL_PAGES."""

    component_type = ComponentType.FULL
    pool = PoolName.KV

    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: Sequence[str]
    ) -> PoolTransfer | None:
        if phase is LOOKUP:
            return PoolTransfer(self.pool, keys=tuple(keys))
        if phase is LOAD:
            need = len(keys) * self.page_size
            alloc = self.tree.allocator
            short = need - alloc.available_size()
            if short > 0:
                self.tree.evict(EvictParams(num_tokens=short))
            slots = alloc.alloc(need)
            if slots is None:
                return None
            return PoolTransfer(self.pool, slots, tuple(keys))
        assert node is not None
        if node.hashes is None or node.full is None:
            return None
        return PoolTransfer(self.pool, node.full, tuple(node.hashes))

    def update_external_linker_load(
        self, phase: ExternalLinkerLoadPhase, transfer: PoolTransfer, ctx: LoadContext
    ) -> PoolTransfer | None:
        if phase is PREPARE:
            return transfer
        if phase is COMMIT:
            ranges = ctx.adopted_ranges.get(ComponentType.FULL, [])
            cut, _ = select_adopted_pages(transfer, ranges, ctx.prefix_len, self.page_size)
            return cut
        assert transfer.device_indices is not None
        self.tree.allocator.free(transfer.device_indices)
        return None


class SwaComponent(TreeComponent):
    """The sliding window: only the last `window_pages` pages, TRAILING_PAGES."""

    component_type = ComponentType.SWA
    pool = PoolName.SWA

    def __init__(self, tree: RadixTree) -> None:
        super().__init__(tree)
        assert isinstance(tree.allocator, SWAAllocator)
        self.allocator: SWAAllocator = tree.allocator
        self.window_pages = math.ceil(tree.sliding_window_size / self.page_size)
        self.window = self.window_pages * self.page_size

    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: Sequence[str]
    ) -> PoolTransfer | None:
        trailing = PoolHitPolicy.TRAILING_PAGES
        if phase is LOOKUP:
            return PoolTransfer(
                self.pool, keys=tuple(keys[-self.window_pages :]), hit_policy=trailing
            )
        if phase is LOAD:
            window_keys = tuple(keys[-self.window_pages :])
            need = len(window_keys) * self.page_size
            short = need - self.allocator.available_swa_size()
            if short > 0:
                self.tree.evict(EvictParams(swa_num_tokens=short))
            slots = self.allocator.alloc_swa(need)
            if slots is None:
                return None
            return PoolTransfer(self.pool, slots, window_keys, trailing)
        assert node is not None
        if node.hashes is None or node.swa is None or node.swa.numel() < self.page_size:
            return None
        return PoolTransfer(self.pool, node.swa, tuple(node.hashes), trailing)

    def update_external_linker_load(
        self, phase: ExternalLinkerLoadPhase, transfer: PoolTransfer, ctx: LoadContext
    ) -> PoolTransfer | None:
        assert transfer.device_indices is not None
        swa_slots = transfer.device_indices
        if phase is PREPARE:
            full = ctx.full_transfer
            assert full is not None and full.device_indices is not None
            self.allocator.set_full_to_swa_mapping(
                full.device_indices[-swa_slots.numel() :], swa_slots
            )
            boundary = max(0, ctx.prefix_len - self.window)
            ctx.swa_evicted_seqlen = max(ctx.swa_evicted_seqlen, boundary)
            return transfer
        if phase is COMMIT:
            ranges = ctx.adopted_ranges.get(ComponentType.SWA, [])
            canonical = ctx.canonical_full
            assert canonical is not None
            aligned = canonical[-swa_slots.numel() :]
            cut, full_cut = select_adopted_pages(
                transfer, ranges, ctx.prefix_len, self.page_size, aligned
            )
            if cut is not None:
                assert full_cut is not None and cut.device_indices is not None
                self.allocator.set_full_to_swa_mapping(full_cut, cut.device_indices)
            return cut
        # ABORT: free the window's SWA pages (their FULL partners become unmapped)
        self.allocator.free_swa(swa_slots)
        return None


class MambaComponent(TreeComponent):
    """Recurrent state: kept out of the external linker."""

    component_type = ComponentType.MAMBA
    pool = PoolName.MAMBA

    def _refuse(self) -> UnsupportedComponentError:
        msg = (
            "the MAMBA component does not take part in the external linker (as in SGLang "
            "0.5.23); run the linker with FULL and SWA components only"
        )
        return UnsupportedComponentError(msg, component="MAMBA")

    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: Sequence[str]
    ) -> PoolTransfer | None:
        raise self._refuse()

    def update_external_linker_load(
        self, phase: ExternalLinkerLoadPhase, transfer: PoolTransfer, ctx: LoadContext
    ) -> PoolTransfer | None:
        raise self._refuse()


def components_for(tree: RadixTree) -> tuple[TreeComponent, ...]:
    """The components that take part in the external linker for `tree`, FULL first."""
    if tree.swa_enabled:
        return (FullComponent(tree), SwaComponent(tree))
    return (FullComponent(tree),)
