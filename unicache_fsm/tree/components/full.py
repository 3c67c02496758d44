"""FULL: the backbone component. Every node on the device has FULL slots for its whole
key; an insert's value and a match's result are FULL slots.

Tree hooks:

- `check_insert` — with `TreeConfig.check_slots`, refuse caller slots (at or past
  `prev_prefix_len`) whose pages the tree already owns (`OwnedSlotsError`): adopted
  under another key, two nodes would share them; freed as duplicates, the tree would
  lose them. The component keeps a flag per page it owns for it (`PageFlags`;
  `take_slots` / `drop_slots`).
- `adopt` — the node takes the caller's FULL slots for its span (a copy, never a view
  of the caller's tensor); the range is recorded as adopted.
- `overlap` — the node keeps its slots; unless another component settled the node,
  the caller's duplicates at or past `prev_prefix_len` are freed after the walk.
- `evict` — LRU over evictable leaves (`RadixTree.pop_evictable`: the tree's
  incrementally kept heap, by access stamp), least recently used first, until
  `num_tokens` are freed; a parent that becomes an evictable leaf joins the queue in
  the same call. What the other components free
  with a leaf counts for them too (SWA freed here counts toward `swa_num_tokens`).
- `release` — free the node's FULL slots.

Linker hooks: LOOKUP asks for every page of the tail, ALL_PAGES; LOAD allocates one
FULL page per key (evicting the shortfall first); COMMIT keeps the adopted pages;
ABORT frees what LOAD reserved; OFFLOAD hands the node's slots and page hashes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.pageflags import PageFlags
from unicache_fsm.pools.room import alloc_making_room
from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.pools.transfer import (
    ComponentType,
    ExternalLinkerLoadPhase,
    LinkerTransferPhase,
    PoolTransfer,
)
from unicache_fsm.tree.audit import check_conservation, page_ids
from unicache_fsm.tree.components.base import (
    InsertContext,
    LoadContext,
    TreeComponent,
    select_adopted_pages,
)
from unicache_fsm.tree.errors import OwnedSlotsError
from unicache_fsm.tree.params import EvictParams, InsertParams

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode
    from unicache_fsm.tree.tree import RadixTree, TreeConfig

__all__ = ["FullComponent"]

FULL = ComponentType.FULL


class FullComponent(TreeComponent):
    """The backbone: see the module docstring."""

    component_type = FULL
    evict_field = "num_tokens"

    @classmethod
    def enabled(cls, allocator: PagedAllocator | SWAAllocator, config: TreeConfig) -> bool:
        return True

    def __init__(self, tree: RadixTree) -> None:
        super().__init__(tree)
        # the FULL pages the tree holds (on some node); None without checks. One flag
        # byte per page id (`PageFlags`): an insert reads and marks a few pages by one
        # call each, and a growing tree never rehashes its books as a set would
        self.owned: PageFlags | None = None
        if tree.config.check_slots:
            alloc = tree.allocator
            size = alloc.full_size if isinstance(alloc, SWAAllocator) else alloc.size
            self.owned = PageFlags(size // alloc.page_size)
        # the page ids of the last checked insert's caller slots (params, from, ids),
        # reused when that insert adopts them: one conversion per insert, not two
        self._checked: tuple[InsertParams, int, Sequence[int]] | None = None

    # -- tree hooks ----------------------------------------------------------------------
    def _page_ids(self, slots: torch.Tensor) -> list[int]:
        """The page id of each page of `slots` (whole pages): each page's first slot
        over `page_size`. Past a few pages only those first slots are read out of the
        tensor (one strided view), not every slot of every page."""
        p = self.page_size
        if p == 1:
            values: list[int] = slots.tolist()
            return values
        firsts: list[int] = slots[::p].tolist() if len(slots) > 4 * p else slots.tolist()[::p]
        return [s // p for s in firsts]

    def check_insert(self, params: InsertParams, tail_pages: Sequence[int] | None = None) -> None:
        owned = self.owned
        if owned is None:
            self._checked = None
            return
        prev = params.prev_prefix_len
        pages = self._page_ids(params.value[prev:]) if tail_pages is None else tail_pages
        self._checked = (params, prev, pages)
        if not owned.any_of(pages):
            return
        bad = owned.marked_of(pages)
        holders = [
            n.id
            for n in self.tree.nodes()
            if (s := n.data.get(FULL)) is not None and not set(self._page_ids(s)).isdisjoint(bad)
        ]
        msg = (
            f"insert value names FULL pages {bad[:10]} at or past prev_prefix_len = "
            f"{prev}, which the tree already owns (nodes {holders[:10]}); pass the slots "
            "you matched below prev_prefix_len and fresh slots past it"
        )
        raise OwnedSlotsError(msg, pages=bad, node_ids=holders)

    def take_slots(
        self, node: TreeNode, slots: torch.Tensor, page_ids: list[int] | None = None
    ) -> None:
        node.data[FULL] = slots
        if self.owned is not None:
            self.owned.mark(self._page_ids(slots) if page_ids is None else page_ids)

    def drop_slots(self, node: TreeNode) -> torch.Tensor:
        return self._drop(node)[0]

    def _drop(self, node: TreeNode) -> tuple[torch.Tensor, list[int] | None]:
        """`drop_slots`, also returning the dropped pages' ids (None without the books)."""
        slots = node.data.pop(FULL)
        if self.owned is None:
            return slots, None
        ids = self._page_ids(slots)
        self.owned.clear(ids)
        return slots, ids

    def adopt(self, node: TreeNode, ctx: InsertContext, *, new_leaf: bool) -> TreeNode:
        start = node.start
        end = start + len(node.key)
        # one copy of the span, no view of it first (a slice and a clone are two calls)
        slots = ctx.value.narrow_copy(0, start, end - start)
        node.data[FULL] = slots
        owned, checked = self.owned, self._checked
        if owned is not None:
            if checked is not None and checked[0] is ctx.params and start >= checked[1]:
                p, first = self.page_size, checked[1]
                owned.mark(checked[2][(start - first) // p : (end - first) // p])
            else:
                owned.mark(self._page_ids(slots))
        result = ctx.result
        if result.adopted_ranges is not None:  # (tracked only when the caller asked)
            result.record_adopted_range(FULL, start, end)
        return node

    def overlap(self, node: TreeNode, ctx: InsertContext) -> TreeNode:
        if not ctx.settled:
            start, end = node.start, node.start + len(node.key)
            dup_start = max(start, ctx.params.prev_prefix_len)
            if dup_start < end:
                ctx.to_free.append((dup_start, end))  # a span: sliced only if needed
        return node

    def evict(self, params: EvictParams, tally: dict[ComponentType, int]) -> None:
        want = params.num_tokens
        if want <= 0:
            return
        tree = self.tree
        while tally.get(FULL, 0) < want:
            node = tree.pop_evictable()  # its parent, once a leaf, is filed again
            if node is None:
                break
            for kind, n in tree.remove_device_copy(node).items():
                tally[kind] = tally.get(kind, 0) + n

    def release(self, node: TreeNode) -> int:
        slots, ids = self._drop(node)
        allocator = self.tree.allocator
        if ids is not None and type(allocator) is PagedAllocator:
            # the ids the ownership books needed anyway: freed by id, checked there
            # (allocated, named once), without decoding the slot tensor a second time
            allocator.free_page_list(ids, "a node's FULL pages")
        else:
            allocator.free(slots)  # (an SWA allocator frees the mapped SWA pages too)
        return int(slots.numel())

    def audit_pool(
        self, nodes: Sequence[TreeNode], outside: Sequence[torch.Tensor], findings: list[str]
    ) -> None:
        owned = [s for n in nodes if (s := n.data.get(FULL)) is not None]
        in_tree = page_ids(owned, self.page_size)
        check_conservation(
            "FULL",
            in_tree + page_ids(outside, self.page_size),
            self.tree.allocator.allocated_page_list(),
            findings,
        )
        if self.owned is not None:
            held = set(in_tree)
            books = held if self.owned.marks_exactly(held) else set(self.owned.marked())
            if books != held:
                wrong = sorted(books ^ held)[:10]
                findings.append(f"FULL: the ownership map disagrees with the nodes on {wrong}")

    # -- linker hooks --------------------------------------------------------------------
    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: Sequence[str]
    ) -> PoolTransfer | None:
        if phase is LinkerTransferPhase.LOOKUP:
            return PoolTransfer(self.pool, keys=tuple(keys))
        if phase is LinkerTransferPhase.LOAD:
            need = len(keys) * self.page_size
            alloc = self.tree.allocator
            room = lambda short: self.tree.evict(EvictParams(num_tokens=short))  # noqa: E731
            slots = alloc_making_room(need, alloc.available_size, alloc.alloc, room)
            if slots is None:
                return None
            return PoolTransfer(self.pool, slots, tuple(keys))
        assert node is not None
        slots = node.data.get(FULL)
        hashes = node.hashes  # (a fresh hex list: spelled out once)
        if hashes is None or slots is None:
            return None
        return PoolTransfer(self.pool, slots, tuple(hashes))

    def build_external_linker_offload(
        self, chain: Sequence[TreeNode], link: tuple[torch.Tensor, str] | None = None
    ) -> PoolTransfer | None:
        """One node: its slots and hashes (after the link page) as one transfer, built
        once (the default builds the node's own transfer first, then merges it). A
        subclass that overrides `build_external_linker_transfer` gets the default, so
        its per-node hook is asked for every chain, one node long or not."""
        if len(chain) != 1 or type(self).build_external_linker_transfer is not _OWN_TRANSFER:
            return super().build_external_linker_offload(chain, link)
        node = chain[0]
        slots = node.data.get(FULL)
        hashes = node.hashes
        if hashes is None or slots is None:
            return None
        if link is None:
            return PoolTransfer(self.pool, slots, tuple(hashes))
        return PoolTransfer(self.pool, torch.cat((link[0], slots)), (link[1], *hashes))

    def update_external_linker_load(
        self, phase: ExternalLinkerLoadPhase, transfer: PoolTransfer, ctx: LoadContext
    ) -> PoolTransfer | None:
        if phase is ExternalLinkerLoadPhase.PREPARE:
            return transfer
        if phase is ExternalLinkerLoadPhase.COMMIT:
            ranges = ctx.adopted_ranges.get(FULL, [])
            cut, _ = select_adopted_pages(transfer, ranges, ctx.prefix_len, self.page_size)
            return cut
        assert transfer.device_indices is not None
        self.tree.allocator.free(transfer.device_indices)
        return None


#: the per-node hook `build_external_linker_offload`'s one-node shortcut stands in for
_OWN_TRANSFER = FullComponent.build_external_linker_transfer
