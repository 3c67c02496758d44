"""What every part of `RadixTree` shares: its fields and the small structural helpers.

`RadixTree` is written one concept per module — `tree` (walk, match, insert, split),
`locks`, `eviction`, `host` (the host tier), `offload` (offload tickets) — each a
class in the chain of bases that ends in this one. `TreeState` declares the fields
those modules read (`RadixTree.__init__` sets them) and the helpers they share:

- `nodes()` — every node below the root, parents before children.
- `tick()` — advance the LRU clock; every access stamp is a fresh tick, so stamps are
  distinct and ordered like the events that made them.
- `link(node)` / `unlink(node)` — file a node under its parent / take it out.
- `component(kind)` — the tree's component of that kind, or None.

Who may touch what: only the tree's own modules and its components
(`tree.components`) write these fields; callers read them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from unicache_fsm.pools.host import HostKVPool
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.residency import Residency
from unicache_fsm.tree.walk import child_key

if TYPE_CHECKING:
    from unicache_fsm.tree.components.base import TreeComponent
    from unicache_fsm.tree.locks import LockReceipt
    from unicache_fsm.tree.tree import TreeConfig

__all__ = ["TreeState"]


class TreeState:
    """The fields and helpers shared by the modules of `RadixTree` (see the module docstring).

    `allocator` is the backbone's allocator (the tree's device pool); `components`
    are the tree's components, the backbone first; `backbone_type` is the backbone's
    `ComponentType` (whose slots a match returns and an insert's value holds).
    """

    config: TreeConfig
    allocator: PagedAllocator | SWAAllocator
    page_size: int
    device: torch.device
    kv_pool: KVPool | None
    host_pool: HostKVPool | None
    host_allocator: PagedAllocator | None
    residency: Residency
    root: TreeNode
    components: tuple[TreeComponent, ...]
    backbone: TreeComponent
    backbone_type: ComponentType
    lock_hooks: tuple[TreeComponent, ...]  # the components whose `lock` hook does work
    held_locks: dict[TreeNode, list[LockReceipt]]  # with lock hooks: the locks per node
    clock: int
    node_ids: itertools.count[int]
    key_width: int  # bytes per token of a packed key (`walk.pack_key`)
    # the eviction heap (`eviction`): (last_access, id, node) per evictable leaf, plus
    # stale entries; `node_count` is the number of nodes below the root
    evict_heap: list[tuple[float, int, TreeNode]]
    node_count: int

    def note_evictable(self, node: TreeNode) -> None:
        raise NotImplementedError  # `eviction.Eviction`

    def nodes(self) -> Iterator[TreeNode]:
        """Every node below the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def link(self, node: TreeNode) -> None:
        """File `node` under its parent (by its first page, and namespace at the root)."""
        parent = node.parent
        assert parent is not None
        page = node.packed[: self.page_size * self.key_width]  # (`walk.child_key`, inline)
        k = page if parent.parent is not None else (node.namespace, page)
        children = parent.children
        if k not in children:
            self.node_count += 1
        children[k] = node

    def unlink(self, node: TreeNode) -> None:
        """Take `node` out of its parent's children."""
        parent = node.parent
        assert parent is not None
        stride = self.page_size * self.key_width
        del parent.children[child_key(parent, node.packed, 0, node.namespace, stride)]
        self.node_count -= 1

    def component(self, kind: ComponentType) -> TreeComponent | None:
        for c in self.components:
            if c.component_type is kind:
                return c
        return None
