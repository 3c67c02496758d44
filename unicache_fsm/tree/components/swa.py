"""SWA: the sliding-window component, with SGLang 0.5.23's semantics.

A node's SWA slots hold the window KV of its tokens, mapped from its FULL slots
(``mapping[full] == swa``); a node without them is an SWA tombstone. Which of the
two a node is lives in the ``swa`` region of the node residency (live / tombstone),
fired only here.

Configuration: `TreeConfig.sliding_window_size` = W tokens (a positive int) together
with an `SWAAllocator`; ``window = ceil(W / P) * P``.

State the component keeps besides each node's slots:

- its own LRU list of live nodes (`lru`), refreshed only near the end of a match or
  an insert, not by every node a walk passes;
- its own lock counts (`lock_count`): a lock on a path pins only the path's trailing
  window of SWA, not the whole path like the FULL lock.

Tree hooks:

- `adopt` — a node that took caller FULL slots gets SWA live at or above the
  request's boundary (`swa_evicted_seqlen`), splitting there; below it the node
  stays a tombstone (any caller SWA still mapped there is freed), except inside the
  insert's `swa_kept_ranges` (SWA checkpoint windows, `tree.swa_checkpoints`): split at
  their edges, those go live with the caller's mapped SWA. A *new leaf* whose
  live part is longer than one window is split again, into an older part and the
  last window, so that a lock pins one window of SWA. Live parts join the LRU list
  oldest first.
- `overlap` — a tombstone walked by an insert takes the caller's SWA from
  ``max(its start, swa_evicted_seqlen, prev_prefix_len)`` on, splitting there (the
  caller's slots between its start and that point are duplicates, freed; the tree's
  own below `prev_prefix_len` are not touched). Unlocked, the node also takes the
  caller's FULL slots (its own are freed); locked, it keeps its FULL slots,
  re-mapped to the caller's SWA.
- `split` — both halves keep the SWA slots and lock count of their span; a live new
  parent goes right behind its child in the LRU list.
- `cut_match` — the prefix ends at the last node with a live run of at least W tokens
  behind it (or live SWA from the root).
- `after_match` / `after_insert` — the end node and its ancestors within W + P
  tokens of it move to the MRU end of the LRU list.
- `lock` — +1 / -1 on every node from the locked node up to the one that reaches W
  tokens back (tombstones included); the release stops where its acquire did, even
  after splits (the lock's receipt remembers where its window began).
- `evict` — walk the LRU list from its least recent unlocked node: an evictable leaf
  is deleted outright (its FULL freed too); any other node is tombstoned. SWA freed
  by FULL eviction in the same call counts toward the amount.
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
from unicache_fsm.pools.room import alloc_making_room
from unicache_fsm.pools.slots import numpy_view
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
from unicache_fsm.tree.errors import InsertParamsError, TreeConfigError, TreeError
from unicache_fsm.tree.lru import LRUList
from unicache_fsm.tree.params import EvictParams, InsertParams
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


def _plain_ints(t: torch.Tensor) -> bool:
    """Whether `t` is a dense 1-D CPU int64 tensor (the slots `_mapping_holds` reads)."""
    return (
        type(t) is torch.Tensor
        and t.dtype == torch.int64
        and t.dim() == 1
        and t.is_cpu
        and t.layout == torch.strided
    )


def _cpu_int_bytes(tensors: Sequence[torch.Tensor]) -> bytes | None:
    """The int64 bytes of 1-D CPU int64 `tensors`, concatenated; None for any other."""
    if not all(_plain_ints(t) for t in tensors):
        return None
    return b"".join(numpy_view(t).tobytes() for t in tensors)


def _cpu_int_list(tensors: Sequence[torch.Tensor]) -> list[int] | None:
    """The values of 1-D CPU int64 `tensors` (at least one value), concatenated; None
    for any other tensor or none at all."""
    if not all(_plain_ints(t) for t in tensors):
        return None
    out: list[int] = []
    for t in tensors:
        out += t.tolist()
    return out or None


def _live(node: TreeNode) -> bool:
    return node.residency in SWA_LIVE


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
                f"{type(allocator).__name__} and sliding_window_size={size!r}"
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
        # the live nodes, MRU first: the order SWA eviction takes them in (reversed)
        self.lru = LRUList()
        # SWA lock count per node (absent: 0)
        self.lock_count: dict[TreeNode, int] = {}

    @staticmethod
    def live(node: TreeNode) -> bool:
        """Whether `node`'s SWA window is live (read off its residency)."""
        return _live(node)

    def locked(self, node: TreeNode) -> bool:
        return node in self.lock_count

    # -- going live / tombstone -------------------------------------------------------
    def _go_live(self, node: TreeNode, swa_slots: torch.Tensor) -> None:
        self.take_slots(node, swa_slots)
        self.tree.residency.fire(node, T.ADOPT_SWA)
        self.lru.insert_mru(node)

    def _tombstone(self, node: TreeNode) -> int:
        self.allocator.free_mapped_swa(node.data[FULL])
        swa = self.drop_slots(node)
        self.lru.remove(node)
        self.tree.residency.fire(node, T.TOMBSTONE_SWA)
        return int(swa.numel())

    # -- insert ---------------------------------------------------------------------------
    def check_insert(self, params: InsertParams, tail_pages: Sequence[int] | None = None) -> None:
        """The caller must hold the SWA it says it keeps: every FULL slot of a kept range
        past `prev_prefix_len` (where the tree may take it) maps to an SWA slot."""
        prev = params.prev_prefix_len
        for a, b in params.swa_kept_ranges:
            if b > prev and not bool(
                self.allocator.translate(params.value[max(a, prev) : b]).all()
            ):
                msg = (
                    f"swa_kept_ranges has ({a}, {b}) but the insert value's FULL slots there "
                    "map to no SWA slot; map them (set_full_to_swa_mapping) or leave the "
                    "range out"
                )
                raise InsertParamsError(msg, what="swa_kept_ranges", value=a)

    def adopt(self, node: TreeNode, ctx: InsertContext, *, new_leaf: bool) -> TreeNode:
        """Caller SWA slots still mapped below the boundary are freed here, so a
        tombstone never keeps a mapping (the contract leaves that case open)."""
        params = ctx.params
        bound = params.swa_evicted_seqlen
        alloc = self.allocator
        kept = [
            (max(a, node.start), min(b, node.end))
            for a, b in params.swa_kept_ranges
            if a < node.end and b > node.start
        ]
        if kept:  # checkpoint windows below the boundary: their own live nodes
            node = self._adopt_kept(node, kept, ctx)
            if _live(node):  # the last window ended the node
                return node
        if bound >= node.end:
            alloc.free_mapped_swa(node.data[FULL])
            return node
        if bound > node.start:
            lower = self.tree.split(node, bound - node.start)
            alloc.free_mapped_swa(lower.data[FULL])
        live_start = node.start
        if new_leaf and len(node.key) > self.window and not self.locked(node):
            older = self.tree.split(node, len(node.key) - self.window)
            self._go_live(older, alloc.translate(older.data[FULL]))  # older first: less recent
        self._go_live(node, alloc.translate(node.data[FULL]))
        ctx.result.record_adopted_range(SWA, live_start, node.end)
        return node

    def _adopt_kept(
        self, node: TreeNode, kept: Sequence[tuple[int, int]], ctx: InsertContext
    ) -> TreeNode:
        """Split off, oldest first, each stretch of `node` up to the end of the last
        kept range inside it: the kept ranges go live (the caller's mapped SWA), the
        stretches between them stay tombstones (their mapped SWA freed). Returns the
        rest of `node` (what `adopt` goes on with, at the last range's end), or `node`
        itself, live, when the last range ends it."""
        alloc, split = self.allocator, self.tree.split
        for a, b in kept:
            if a > node.start:
                gap = split(node, a - node.start)
                alloc.free_mapped_swa(gap.data[FULL])
            piece = split(node, b - node.start) if b < node.end else node
            self._go_live(piece, alloc.translate(piece.data[FULL]))
            ctx.result.record_adopted_range(SWA, a, b)
            if piece is node:
                break
        return node

    def overlap(self, node: TreeNode, ctx: InsertContext) -> TreeNode:
        bound, prev = ctx.params.swa_evicted_seqlen, ctx.params.prev_prefix_len
        start, end = node.start, node.end
        live_start = max(start, bound, prev)
        if _live(node) or live_start >= end:
            return node
        value = ctx.value
        if live_start > start:  # the part below stays a tombstone
            dup_start = max(start, prev)  # the tree's own slots below prev stay as they are
            if dup_start < live_start:
                ctx.to_free.append(value[dup_start:live_start])
            self.tree.split(node, live_start - start)
        seg = value[live_start:end]
        swa_slots = self.allocator.translate(seg)
        if node.lock_ref == 0:
            backbone = self.tree.backbone
            ctx.to_free.append(backbone.drop_slots(node))  # a tombstone's FULL maps to no SWA
            backbone.take_slots(node, seg.clone())
            ctx.result.record_adopted_range(FULL, live_start, end)
        else:  # locked: keep its FULL, pair the caller's SWA with it
            self.allocator.set_full_to_swa_mapping(node.data[FULL], swa_slots)
            ctx.to_free.append(seg)  # re-mapping above left it without SWA
        self._go_live(node, swa_slots)
        ctx.result.record_adopted_range(SWA, live_start, end)
        ctx.settled = True
        return node

    def split(self, top: TreeNode, node: TreeNode, k: int) -> None:
        super().split(top, node, k)
        count = self.lock_count.get(node)
        if count:
            self.lock_count[top] = count
        if _live(node):
            self.lru.insert_after(node, top)

    def after_insert(self, node: TreeNode) -> None:
        self._refresh(node)

    # -- match ----------------------------------------------------------------------------
    def cut_match(self, path: Sequence[TreeNode]) -> int:
        run_start = 0  # start of the current run of live SWA
        best = 0
        for i, node in enumerate(path):
            if not _live(node):
                run_start = node.end
                continue
            if run_start == 0 or node.end - run_start >= self.sliding_window_size:
                best = i + 1
        return best

    def after_match(self, node: TreeNode) -> None:
        self._refresh(node)

    def _refresh(self, node: TreeNode) -> None:
        if node.parent is not None:
            self.lru.refresh_path(node, self.sliding_window_size + self.page_size, _live)

    # -- locks ----------------------------------------------------------------------------
    def lock(self, node: TreeNode) -> object:
        """Count the lock on the nodes of `node`'s trailing window; the token is the
        window's start (splits keep it a node boundary, so the release finds it)."""
        counts = self.lock_count
        covered = start = 0
        cur: TreeNode | None = node
        while cur is not None and cur.parent is not None and covered < self.sliding_window_size:
            counts[cur] = counts.get(cur, 0) + 1
            covered += len(cur.key)
            start = cur.start
            cur = cur.parent
        return start

    def unlock(self, node: TreeNode, token: object) -> None:
        assert isinstance(token, int)
        counts = self.lock_count
        cur: TreeNode | None = node
        while cur is not None and cur.parent is not None:
            left = counts[cur] - 1
            if left:
                counts[cur] = left
            else:
                del counts[cur]
            if cur.start <= token:
                break
            cur = cur.parent

    # -- eviction -------------------------------------------------------------------------
    def evict(self, params: EvictParams, tally: dict[ComponentType, int]) -> None:
        want = params.swa_num_tokens
        if want <= 0 or tally.get(SWA, 0) >= want:
            return
        tree, lru, locked = self.tree, self.lru, self.locked
        cursor = lru.least_recent(locked)
        while cursor is not None and tally.get(SWA, 0) < want:
            node = cursor
            cursor = lru.more_recent(node, locked)
            if tree.evictable_leaf(node):
                for kind, n in tree.remove_device_copy(node).items():
                    tally[kind] = tally.get(kind, 0) + n
            elif not node.offloading:
                tally[SWA] = tally.get(SWA, 0) + self._tombstone(node)

    def release(self, node: TreeNode) -> int:
        if not _live(node):
            return 0
        return self._tombstone(node)

    # -- audit ----------------------------------------------------------------------------
    def audit_node(self, node: TreeNode, findings: list[str]) -> None:
        swa, full = node.data.get(SWA), node.data.get(FULL)
        live = _live(node)
        if live != (swa is not None):
            detail = f"SWA region {node.residency!r} disagrees with its SWA slots"
            findings.append(f"node {node.id}: {detail}")
        if live != (node in self.lru):
            findings.append(f"node {node.id}: SWA LRU membership disagrees with its region")
        if self.lock_count.get(node, 0) > node.lock_ref:
            findings.append(f"node {node.id}: SWA lock count above its lock_ref {node.lock_ref}")
        if swa is not None and (full is None or swa.numel() != len(node.key)):
            findings.append(f"node {node.id}: SWA data without matching FULL data")
        # the mapping of its FULL slots is audited with every node's at once (audit_pool)

    def _audit_mapping(self, nodes: Sequence[TreeNode], findings: list[str]) -> None:
        """``mapping[full] == swa`` on every node with live SWA (and matching FULL data),
        0 on every tombstone's FULL slots: one translation for all nodes, node by node
        only when that finds a difference (to name the culprits)."""
        live: list[tuple[TreeNode, torch.Tensor, torch.Tensor]] = []
        dead: list[tuple[TreeNode, torch.Tensor]] = []
        for n in nodes:
            swa, full = n.data.get(SWA), n.data.get(FULL)
            if full is None:
                continue
            if swa is None:
                dead.append((n, full))
            elif swa.numel() == len(n.key) == full.numel():
                live.append((n, full, swa))
            elif swa.numel() == len(n.key):  # FULL slots of another length cannot map
                findings.append(f"node {n.id}: mapping[full] != swa")
        if not live and not dead:
            return
        translate = self.allocator.translate
        live_ok, dead_ok = self._mapping_holds(live, dead)
        if not live_ok:
            for n, full, swa in live:
                if not torch.equal(translate(full), swa):
                    findings.append(f"node {n.id}: mapping[full] != swa")
        if not dead_ok:
            for n, full in dead:
                if bool(translate(full).any()):
                    findings.append(f"node {n.id}: SWA tombstone whose FULL slots still map to SWA")

    def _mapping_holds(
        self,
        live: list[tuple[TreeNode, torch.Tensor, torch.Tensor]],
        dead: list[tuple[TreeNode, torch.Tensor]],
    ) -> tuple[bool, bool]:
        """(``mapping[full] == swa`` over every live node at once, no tombstone's FULL
        slot maps): exactly ``torch.equal(translate(cat(fulls)), cat(swas))`` and
        ``not translate(cat(dead fulls)).any()``. On CPU, with 1-D int64 slots inside the
        FULL pool, one NumPy gather of every FULL slot, live then dead, from the live
        mapping (`SWAAllocator.full_to_swa_mapping`) and one comparison of bytes; else
        (a device, other slots, or a slot the translation refuses, which then raises as
        it always did) the translations themselves."""
        alloc = self.allocator
        fulls = [f for _, f, _ in live] + [f for _, f in dead]
        swas = [s for _, _, s in live]
        mapping = alloc.full_to_swa_mapping
        want = _cpu_int_bytes(swas) if mapping.is_cpu and mapping.dtype == torch.int64 else None
        ids = _cpu_int_list(fulls) if want is not None else None
        top = alloc.full_num_slots
        if want is not None and ids is not None and min(ids) >= 0 and max(ids) < top:
            got = numpy_view(mapping)[ids]
            n_live = len(want) // 8
            return got[:n_live].tobytes() == want, not got[n_live:].any()
        translate = alloc.translate
        live_ok = not live or torch.equal(
            translate(torch.cat([f for _, f, _ in live])), torch.cat(swas)
        )
        dead_ok = not dead or not bool(translate(torch.cat([f for _, f in dead])).any())
        return live_ok, dead_ok

    def audit_pool(
        self, nodes: Sequence[TreeNode], outside: Sequence[torch.Tensor], findings: list[str]
    ) -> None:
        self._audit_mapping(nodes, findings)
        owned = [s for n in nodes if (s := n.data.get(SWA)) is not None]
        check_conservation(
            "SWA",
            page_ids([*owned, *outside], self.page_size),
            self.allocator.swa_allocated_page_list(),
            findings,
        )
        in_tree = set(nodes)
        stray = [n.id for n in self.lru if n not in in_tree]
        stray += [n.id for n in self.lock_count if n not in in_tree]
        if stray:
            findings.append(f"SWA: LRU or lock books name nodes gone from the tree: {stray[:10]}")

    # -- linker hooks ---------------------------------------------------------------------
    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: Sequence[str]
    ) -> PoolTransfer | None:
        if phase is LinkerTransferPhase.LOOKUP:
            window_keys = tuple(keys[-self.window_pages :])
            return PoolTransfer(self.pool, keys=window_keys, hit_policy=TRAILING)
        if phase is LinkerTransferPhase.LOAD:
            window_keys = tuple(keys[-self.window_pages :])
            need = len(window_keys) * self.page_size
            alloc = self.allocator
            room = lambda short: self.tree.evict(EvictParams(swa_num_tokens=short))  # noqa: E731
            slots = alloc_making_room(need, alloc.available_swa_size, alloc.alloc_swa, room)
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
