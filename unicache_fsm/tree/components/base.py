"""The component protocol: what the tree core and the external linker ask of each kind
of per-node data.

A component owns one pool (`component_type` names both), its entry of every node's
`data`, its region of the node residency (if it can be evicted apart from the
backbone) and the hooks below. The tree core knows no component by name: it runs
the hooks of `RadixTree.components`, the backbone (FULL) first.

Tree hooks, in the order a tree uses them:

- `enabled(allocator, config)` (classmethod) — whether a tree built with these gets
  the component; `TreeError` for half a configuration.
- `check_insert(params, tail_pages)` — refuse an insert (typed error) before the
  tree changes; `tail_pages` are the page ids of the caller's slots from
  `prev_prefix_len` on (``params.value[params.prev_prefix_len:]``, the tail) once the
  tree checked them as whole, allocated pages (`TreeConfig.check_slots`; None
  without the check).
- `take_slots(node, slots)` / `drop_slots(node)` — set / remove this component's
  slots on a node, keeping the component's own books (FULL: which pages the tree
  owns). Every write of a node's `data` entry goes through them.
- `adopt(node, ctx, new_leaf=...)` — `node` just took the caller's slots (a new
  leaf, or an evicted node that an insert walked): take this component's share,
  recording what was adopted. Runs backbone first; may split `node` and returns the
  node that now ends at the old node's end.
- `overlap(node, ctx)` — an insert walked a device node: keep the tree's data or take
  the caller's. Runs from the last component to the backbone: a component that took
  or freed the caller's slots for this node sets `ctx.settled`, and otherwise the
  backbone frees the caller's duplicates past `prev_prefix_len`. May split.
- `split(top, node, k)` — partition this component's data: `top` gets the first `k`
  tokens, `node` keeps the rest.
- `cut_match(path)` — how many nodes of a matched device path (root first) this
  component can serve; the match keeps the shortest answer.
- `after_match(node)` / `after_insert(node)` — a match ended at `node` (after the
  cut) / an insert ended at `node`: refresh the component's own recency books.
  Only components that override them are called.
- `lock(node) -> token` / `unlock(node, token)` — a lock on the path root→`node` was
  taken / released (the tree counts it on every node of the path in `lock_ref`);
  `token` is what the component needs to release exactly that lock (it rides in the
  `LockReceipt`). Only components that override `lock` are called.
- `evict(params, tally)` — free this component's pool under its own pressure (its
  `evict_field` of `EvictParams`); add what it freed to `tally`.
- `release(node)` — the node's device copy goes (evicted or deleted): free this
  component's slots on it and leave its region as if evicted. Returns tokens freed.
- `audit_node(node, findings)` / `audit_pool(nodes, outside, findings)` — the
  component's share of `RadixTree.check`.

Linker hooks (the external linker never touches slots itself):

- `build_external_linker_transfer(phase, node, keys)` — LOOKUP: the keys a store
  must check (no slots); LOAD: reserve device slots for the keys (evicting the
  shortfall first), or None when the pool stays short; OFFLOAD: a node's slots and
  page hashes, or None when the node has nothing to offload for this component.
- `build_external_linker_offload(chain, link)` — OFFLOAD over a root-first chain: the
  OFFLOAD transfers of its nodes as one (None when no node has any), starting with
  the `link` page (its slots and its key) when given. The default merges
  `build_external_linker_transfer`'s; a component may build it directly.
- `update_external_linker_load(phase, transfer, ctx)` — PREPARE (after every LOAD
  transfer exists), COMMIT (after the tail was inserted; returns the transfer cut to
  the pages the tree adopted, or None when none remain) and ABORT (frees exactly the
  slots LOAD reserved; runs in reverse component order).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import attrs
import torch

from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.pools.transfer import (
    ComponentType,
    ExternalLinkerLoadPhase,
    LinkerTransferPhase,
    PoolTransfer,
)
from unicache_fsm.tree.params import EvictParams, InsertParams, InsertResult

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode
    from unicache_fsm.tree.tree import RadixTree, TreeConfig

__all__ = [
    "InsertContext",
    "LoadContext",
    "TreeComponent",
    "select_adopted_pages",
]


@attrs.define(slots=True, eq=False)
class InsertContext:
    """What the insert hooks share about one insert walk.

    `value` is the caller's backbone slots aligned with the key (token i's slot at
    index i); `tail_pages` the page ids of its tail, `value` from `prev_prefix_len` on
    (the slots the insert checked), when the insert checked them
    (`TreeConfig.check_slots`), else None. `to_free` collects the caller's slots
    the tree does not take, each a tensor or a token span ``(start, end)`` of `value`
    (a span costs no slice of `value` until it is freed), freed once, in order, after
    the walk, through the tree's allocator, which frees their mapped peers with them;
    `settled` says that a component already took or freed the
    caller's slots of the node being walked (the core clears it before each node).
    """

    params: InsertParams
    value: torch.Tensor
    result: InsertResult
    tail_pages: Sequence[int] | None = None
    to_free: list[torch.Tensor | tuple[int, int]] = attrs.field(factory=list)
    settled: bool = False


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
    The pages kept are worked out in Python from the (few) ranges; the slots are cut
    with one slice when the kept pages form one run (the usual case: the whole
    transfer, returned as it is), else with one gather.
    """
    assert transfer.device_indices is not None
    n_pages = transfer.num_pages
    coverage_start = prefix_len - n_pages * page_size
    keep = [False] * n_pages
    for start, end in ranges:
        lo, hi = max(start, coverage_start), min(end, prefix_len)
        if lo >= hi:
            continue
        assert (lo - coverage_start) % page_size == 0 and (hi - coverage_start) % page_size == 0
        first, stop = (lo - coverage_start) // page_size, (hi - coverage_start) // page_size
        keep[first:stop] = [True] * (stop - first)
    pages = [i for i, kept in enumerate(keep) if kept]
    if not pages:
        return None, None
    if len(pages) == n_pages:
        return transfer, extra
    slots = transfer.device_indices
    first, last = pages[0], pages[-1]
    if last - first + 1 == len(pages):  # one run of pages: a slice
        cut_slots = slots[first * page_size : (last + 1) * page_size]
        cut_extra = None if extra is None else extra[first * page_size : (last + 1) * page_size]
    else:
        index = [i * page_size + o for i in pages for o in range(page_size)]
        cut_slots = slots[torch.tensor(index, dtype=torch.int64, device=slots.device)]
        cut_extra = (
            None
            if extra is None
            else extra[torch.tensor(index, dtype=torch.int64, device=extra.device)]
        )
    cut = PoolTransfer(
        transfer.name, cut_slots, tuple(transfer.keys[i] for i in pages), transfer.hit_policy
    )
    return cut, cut_extra


class TreeComponent(abc.ABC):
    """One kind of per-node data, its pool and its hooks (see the module docstring).

    The defaults describe a component that holds nothing: every tree hook is a no-op.
    """

    component_type: ClassVar[ComponentType]
    #: the field of `EvictParams` / `EvictResult` that is this component's amount
    evict_field: ClassVar[str | None] = None

    def __init__(self, tree: RadixTree) -> None:
        self.tree = tree
        self.page_size = tree.page_size

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.component_type.name}>"

    @property
    def pool(self) -> ComponentType:
        """The logical pool of this component's slots (the same enum member)."""
        return self.component_type

    # -- configuration -------------------------------------------------------------------
    @classmethod
    def enabled(cls, allocator: PagedAllocator | SWAAllocator, config: TreeConfig) -> bool:
        """Whether a tree over `allocator` built with `config` gets this component."""
        return False

    # -- tree hooks ----------------------------------------------------------------------
    def check_insert(self, params: InsertParams, tail_pages: Sequence[int] | None = None) -> None:
        return None

    def take_slots(
        self, node: TreeNode, slots: torch.Tensor, page_ids: list[int] | None = None
    ) -> None:
        """Set this component's `slots` on `node` (`page_ids`: their page ids, when the
        caller has them already)."""
        node.data[self.component_type] = slots

    def drop_slots(self, node: TreeNode) -> torch.Tensor:
        return node.data.pop(self.component_type)

    def adopt(self, node: TreeNode, ctx: InsertContext, *, new_leaf: bool) -> TreeNode:
        return node

    def overlap(self, node: TreeNode, ctx: InsertContext) -> TreeNode:
        return node

    def split(self, top: TreeNode, node: TreeNode, k: int) -> None:
        kind = self.component_type
        slots = node.data.get(kind)
        if slots is not None:
            top.data[kind] = slots[:k]
            node.data[kind] = slots[k:]

    def cut_match(self, path: Sequence[TreeNode]) -> int:
        return len(path)

    def after_match(self, node: TreeNode) -> None:
        return None

    def after_insert(self, node: TreeNode) -> None:
        return None

    def lock(self, node: TreeNode) -> object:
        return None

    def unlock(self, node: TreeNode, token: object) -> None:
        return None

    def evict(self, params: EvictParams, tally: dict[ComponentType, int]) -> None:
        return None

    def release(self, node: TreeNode) -> int:
        return 0

    def audit_node(self, node: TreeNode, findings: list[str]) -> None:
        return None

    def audit_pool(
        self, nodes: Sequence[TreeNode], outside: Sequence[torch.Tensor], findings: list[str]
    ) -> None:
        return None

    # -- linker hooks --------------------------------------------------------------------
    @abc.abstractmethod
    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: Sequence[str]
    ) -> PoolTransfer | None: ...

    def build_external_linker_offload(
        self, chain: Sequence[TreeNode], link: tuple[torch.Tensor, str] | None = None
    ) -> PoolTransfer | None:
        """One OFFLOAD transfer over the root-first `chain` (see the module docstring)."""
        offload = LinkerTransferPhase.OFFLOAD
        present = [
            t
            for n in chain
            if (t := self.build_external_linker_transfer(offload, n, ())) is not None
            and t.device_indices is not None
        ]
        if not present:
            return None
        if len(present) == 1 and link is None:
            return present[0]  # one node's own transfer: nothing to merge
        slots = [t.device_indices for t in present if t.device_indices is not None]
        keys = tuple(k for t in present for k in t.keys)
        if link is not None:
            slots.insert(0, link[0])
            keys = (link[1], *keys)
        return PoolTransfer(self.pool, torch.cat(slots), keys, present[0].hit_policy)

    @abc.abstractmethod
    def update_external_linker_load(
        self, phase: ExternalLinkerLoadPhase, transfer: PoolTransfer, ctx: LoadContext
    ) -> PoolTransfer | None: ...
