"""Eviction: freeing device slots under pool pressure.

- `evict(EvictParams) -> EvictResult` — each component, backbone first, frees its
  share under its own pressure (`TreeComponent.evict`: FULL deletes or evicts LRU
  leaves, SWA tombstones windows); the amounts freed are tallied per component.
- `evictable_leaf(node)` — a device node that may lose its device copy now: in the
  tree, unlocked, nothing in flight over it (no offload, no host backup being made),
  and no device-resident child.
- `note_evictable(node)` — `node` may have become an evictable leaf, or its access
  stamp changed: file it in the eviction heap if it is one. The tree calls it
  wherever a stamp, a lock, a residency or a child changes (the residency executor
  calls it after every trigger), so the heap always holds an entry
  ``(last_access, id, node)`` for every evictable leaf; entries that no longer match
  (a newer stamp, a node no longer evictable) are dropped when they surface, and the
  heap is rebuilt once it holds more than ``2 * nodes + 1024`` entries. One eviction costs
  O(log heap), not a pass over the tree (`check` audits the invariant).
- `remove_device_copy(node)` — the node's device copy goes: every component frees
  its slots on it (last component first, so a window goes before its backbone), then
  a backed-up node is evicted (kept with its host copy) and any other node deleted
  from the tree. Returns the tokens freed per component.

Only leaves lose their device copy, so a device node's parent is always on the
device; a locked node or one with an offload or backup in flight never does.
"""

from __future__ import annotations

import heapq

from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.params import EvictParams, EvictResult
from unicache_fsm.tree.residency import (
    BACKED_UP,
    BACKING_UP,
    OFFLOADING,
    RESIDENT,
    ResidencyTrigger,
)
from unicache_fsm.tree.state import TreeState

__all__ = ["Eviction"]

T = ResidencyTrigger

#: the residencies in which a node may lose its device copy, locks and children aside:
#: on the device, no offload in flight, no host backup being made (one set lookup)
_MAY_LOSE_DEVICE_COPY = RESIDENT - OFFLOADING - BACKING_UP


class Eviction(TreeState):
    """The eviction primitives of `RadixTree` (see the module docstring)."""

    def note_evictable(self, node: TreeNode) -> None:
        for child in node.children.values():  # a device-resident child: no leaf, and no
            if child.residency in RESIDENT:  # call of `evictable_leaf` to find it out
                return
        if self.evictable_leaf(node):
            heap = self.evict_heap
            heapq.heappush(heap, (node.last_access, node.id, node))
            if len(heap) > 2 * self.node_count + 1024:
                self.rebuild_evict_heap()

    def rebuild_evict_heap(self) -> None:
        """Drop the stale entries: one entry per evictable leaf (also counts the nodes)."""
        heap = []
        count = 0
        for n in self.nodes():
            count += 1
            if self.evictable_leaf(n):
                heap.append((n.last_access, n.id, n))
        heapq.heapify(heap)
        self.evict_heap[:] = heap
        self.node_count = count

    def pop_evictable(self) -> TreeNode | None:
        """The least recently used evictable leaf (by stamp, then id), out of the heap."""
        heap = self.evict_heap
        evictable = self.evictable_leaf
        while heap:
            stamp, _, node = heapq.heappop(heap)
            if stamp == node.last_access and evictable(node):
                return node
        return None

    def evictable_leaf(self, node: TreeNode) -> bool:
        if node.residency not in _MAY_LOSE_DEVICE_COPY or node.lock_ref or node.parent is None:
            return False
        for child in node.children.values():  # noqa: SIM110 - a loop: no generator per call
            if child.residency in RESIDENT:  # (a matched prefix's first child ends it)
                return False
        return True

    def evict(self, params: EvictParams) -> EvictResult:
        """Free at least the requested tokens per component, where the tree can."""
        tally: dict[ComponentType, int] = {}
        for c in self.components:
            c.evict(params, tally)
        return EvictResult(
            **{
                c.evict_field: tally.get(c.component_type, 0)
                for c in self.components
                if c.evict_field is not None
            }
        )

    def remove_device_copy(self, node: TreeNode) -> dict[ComponentType, int]:
        """Free `node`'s device slots in every component; evict or delete it."""
        assert node.parent is not None and node.residency in RESIDENT
        components = self.components
        if len(components) == 1:  # (FULL alone: no dict comprehension's frame)
            c = components[0]
            freed = {c.component_type: c.release(node)}
        else:
            freed = {c.component_type: c.release(node) for c in reversed(components)}
        if node.residency in BACKED_UP:
            self.residency.fire(node, T.EVICT)
        else:
            assert not node.children, "a node with host-backed children is backed up"
            self.residency.fire(node, T.DELETE)
            self.unlink(node)
        self.note_evictable(node.parent)  # it may have become a leaf
        return freed
