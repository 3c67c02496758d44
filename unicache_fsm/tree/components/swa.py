"""SWA: the sliding-window component. A node's SWA slots hold the window KV of its
tokens, mapped from its FULL slots (``mapping[full] == swa``); a node without them is
an SWA tombstone. Which of the two a node is lives in the ``swa`` region of the node
residency (live / tombstone), fired only here.

Configuration: `TreeConfig.sliding_window_size` (tokens) together with an
`SWAAllocator`; ``window = ceil(sliding_window_size / P) * P``.

Tree hooks:

- `adopt` — a node that took caller FULL slots gets SWA live at or above the
  request's boundary (`swa_evicted_seqlen`), splitting there; below it the node
  stays a tombstone and any caller SWA still mapped there is freed.
- `overlap` — a tombstone walked by an insert whose window reaches it (boundary
  below its end, `prev_prefix_len` at or below its start) takes the caller's SWA:
  the part below the boundary stays a tombstone (split off, the caller's FULL slots
  for it freed); unlocked, the node also takes the caller's FULL slots (its own are
  freed); locked, it keeps its FULL slots, re-mapped to the caller's SWA.
- `cut_match` — the prefix ends at the last node end that has a live run of at least
  `sliding_window_size` tokens behind it (or live SWA from the root).
- `evict` — tombstone the SWA of unlocked nodes with nothing in flight, LRU first,
  until `swa_num_tokens` are freed.
- `release` — free the node's SWA slots (a tombstone before its device copy goes).

Linker hooks: LOOKUP asks for the last `window_pages` keys, TRAILING_PAGES; LOAD
allocates the window's SWA pages (evicting SWA first); PREPARE maps the trailing FULL
slots to them and raises the request's SWA boundary; COMMIT keeps the adopted pages,
re-mapped to the tree's canonical FULL slots; ABORT frees the window's SWA pages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.pools.transfer import (
    ComponentType,
    ExternalLinkerLoadPhase,
    LinkerTransferPhase,
    PoolHitPolicy,
    PoolTransfer,
)
from unicache_fsm.tree.audit import check_conservation, page_ids
from unicache_fsm.tree.components.base import (
    InsertContext,
    LoadContext,
    TreeComponent,
    select_adopted_pages,
)
from unicache_fsm.tree.errors import TreeConfigError, TreeError
from unicache_fsm.tree.params import EvictParams
from unicache_fsm.tree.residency import ResidencyTrigger, configs_where

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode
    from unicache_fsm.tree.tree import RadixTree, TreeConfig

__all__ = ["SWA_LIVE", "SwaComponent"]

FULL, SWA = ComponentType.FULL, ComponentType.SWA
T = ResidencyTrigger
TRAILING = PoolHitPolicy.TRAILING_PAGES

#: the residency configurations in which a node's SWA window is live
SWA_LIVE = configs_where("swa.live")


class SwaComponent(TreeComponent):
    """The sliding window: see the module docstring."""

    component_type = SWA
    evict_field = "swa_num_tokens"

    @classmethod
    def enabled(cls, allocator: PagedAllocator | SWAAllocator, config: TreeConfig) -> bool:
        has_allocator = isinstance(allocator, SWAAllocator)
        size = config.sliding_window_size
        if size is not None and (type(size) is not int or size <= 0):
            msg = (
                f"sliding_window_size = {size!r} is not a positive number of tokens; the "
                "SWA window needs at least one token (0 would mean every page)"
            )
            raise TreeConfigError(msg, what="sliding_window_size", value=size)
        if has_allocator != (size is not None):
            msg = (
                "the SWA component needs both an SWAAllocator and sliding_window_size; got "
                f"{type(allocator).__name__} and sliding_window_size="
                f"{config.sliding_window_size!r}"
            )
            raise TreeError(msg)
        return has_allocator

    def __init__(self, tree: RadixTree) -> None:
        super().__init__(tree)
        assert isinstance(tree.allocator, SWAAllocator)
        sliding = tree.config.sliding_window_size
        assert sliding is not None
        self.allocator: SWAAllocator = tree.allocator
        self.sliding_window_size = sliding
        self.window_pages = math.ceil(sliding / self.page_size)
        self.window = self.window_pages * self.page_size

    @staticmethod
    def live(node: TreeNode) -> bool:
        """Whether `node`'s SWA window is live (read off its residency)."""
        return node.residency in SWA_LIVE

    # -- tree hooks ----------------------------------------------------------------------
    def _go_live(self, node: TreeNode, swa_slots: torch.Tensor, ctx: InsertContext) -> None:
        self.take_slots(node, swa_slots)
        self.tree.residency.fire(node, T.ADOPT_SWA)
        ctx.result.record_adopted_range(SWA, node.start, node.end)

    def adopt(self, node: TreeNode, ctx: InsertContext) -> TreeNode:
        """Caller SWA slots still mapped below the boundary are freed here, so a
        tombstone never keeps a mapping (the contract leaves that case open)."""
        bound = ctx.params.swa_evicted_seqlen
        alloc = self.allocator
        if bound >= node.end:
            alloc.free_mapped_swa(node.data[FULL])
            return node
        if bound > node.start:
            lower = self.tree.split(node, bound - node.start)
            alloc.free_mapped_swa(lower.data[FULL])
        self._go_live(node, alloc.translate(node.data[FULL]), ctx)
        return node

    def overlap(self, node: TreeNode, ctx: InsertContext) -> TreeNode:
        bound, prev = ctx.params.swa_evicted_seqlen, ctx.params.prev_prefix_len
        start, end = node.start, node.end
        if self.live(node) or bound >= end or prev > start:
            return node
        value = ctx.value
        if bound > start:  # the part below the request's window stays a tombstone
            ctx.to_free.append(value[start:bound])
            self.tree.split(node, bound - start)
        seg = value[node.start : end]
        swa_slots = self.allocator.translate(seg)
        tree_full = node.data[FULL]
        if node.lock_ref == 0:
            backbone = self.tree.backbone
            ctx.to_free.append(backbone.drop_slots(node))  # a tombstone's FULL maps to no SWA
            backbone.take_slots(node, seg.clone())
            ctx.result.record_adopted_range(FULL, node.start, end)
        else:  # locked: keep its FULL, pair the caller's SWA with it
            self.allocator.set_full_to_swa_mapping(tree_full, swa_slots)
            ctx.to_free.append(seg)  # re-mapping above left it without SWA
        self._go_live(node, swa_slots, ctx)
        ctx.settled = True
        return node

    def cut_match(self, path: Sequence[TreeNode]) -> int:
        run_start = 0  # start of the current run of live SWA
        best = 0
        for i, node in enumerate(path):
            if not self.live(node):
                run_start = node.end
                continue
            if run_start == 0 or node.end - run_start >= self.sliding_window_size:
                best = i + 1
        return best

    def evict(self, params: EvictParams, tally: dict[ComponentType, int]) -> None:
        want = params.swa_num_tokens
        if want <= 0:
            return
        live = self.live
        candidates = sorted(
            (n for n in self.tree.nodes() if live(n) and n.lock_ref == 0 and not n.offloading),
            key=lambda n: (n.last_access, n.id),
        )
        freed = 0
        for node in candidates:
            if freed >= want:
                break
            freed += self._tombstone(node)
        tally[SWA] = tally.get(SWA, 0) + freed

    def _tombstone(self, node: TreeNode) -> int:
        self.allocator.free_mapped_swa(node.data[FULL])
        swa = self.drop_slots(node)
        self.tree.residency.fire(node, T.TOMBSTONE_SWA)
        return int(swa.numel())

    def release(self, node: TreeNode) -> int:
        if not self.live(node):
            return 0
        return self._tombstone(node)

    def audit_node(self, node: TreeNode, findings: list[str]) -> None:
        nid = f"node {node.id}"
        swa, full = node.data.get(SWA), node.data.get(FULL)
        if self.live(node) != (swa is not None):
            findings.append(f"{nid}: SWA region {node.residency!r} disagrees with its SWA slots")
        if swa is not None:
            if full is None or swa.numel() != len(node.key):
                findings.append(f"{nid}: SWA data without matching FULL data")
            elif not torch.equal(self.allocator.translate(full), swa):
                findings.append(f"{nid}: mapping[full] != swa")
        elif full is not None and bool((self.allocator.translate(full) != 0).any()):
            findings.append(f"{nid}: SWA tombstone whose FULL slots still map to SWA")

    def audit_pool(
        self, nodes: Sequence[TreeNode], outside: Sequence[torch.Tensor], findings: list[str]
    ) -> None:
        owned = [s for n in nodes if (s := n.data.get(SWA)) is not None]
        check_conservation(
            "SWA",
            page_ids([*owned, *outside], self.page_size),
            self.allocator.swa_allocated_page_ids(),
            findings,
        )

    # -- linker hooks --------------------------------------------------------------------
    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: Sequence[str]
    ) -> PoolTransfer | None:
        if phase is LinkerTransferPhase.LOOKUP:
            return PoolTransfer(
                self.pool, keys=tuple(keys[-self.window_pages :]), hit_policy=TRAILING
            )
        if phase is LinkerTransferPhase.LOAD:
            window_keys = tuple(keys[-self.window_pages :])
            need = len(window_keys) * self.page_size
            short = need - self.allocator.available_swa_size()
            if short > 0:
                self.tree.evict(EvictParams(swa_num_tokens=short))
            slots = self.allocator.alloc_swa(need)
            if slots is None:
                return None
            return PoolTransfer(self.pool, slots, window_keys, TRAILING)
        assert node is not None
        swa = node.data.get(SWA)
        if node.hashes is None or swa is None or swa.numel() < self.page_size:
            return None
        return PoolTransfer(self.pool, swa, tuple(node.hashes), TRAILING)

    def update_external_linker_load(
        self, phase: ExternalLinkerLoadPhase, transfer: PoolTransfer, ctx: LoadContext
    ) -> PoolTransfer | None:
        assert transfer.device_indices is not None
        swa_slots = transfer.device_indices
        if phase is ExternalLinkerLoadPhase.PREPARE:
            full = ctx.full_transfer
            assert full is not None and full.device_indices is not None
            self.allocator.set_full_to_swa_mapping(
                full.device_indices[-swa_slots.numel() :], swa_slots
            )
            boundary = max(0, ctx.prefix_len - self.window)
            ctx.swa_evicted_seqlen = max(ctx.swa_evicted_seqlen, boundary)
            return transfer
        if phase is ExternalLinkerLoadPhase.COMMIT:
            ranges = ctx.adopted_ranges.get(SWA, [])
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
