"""The optional host tier (HiCache-style): a host copy of the backbone's KV.

Needs a device `KVPool`, a `HostKVPool` and a host `PagedAllocator` (`RadixTree`'s
keyword arguments); without them each call raises `TreeError` and changes nothing.

- `backup(node)` — copy `node` and its un-backed ancestors to the host, root first;
  False (that node's backup failed, nothing else changed for it) when the host pool
  is short.
- `load_back(node)` — copy the host backups of the evicted nodes on the path to
  `node` back into fresh device slots (evicting the shortfall first, never the path
  itself); False when the device pool stays short. Only the backbone comes back:
  every other component of a loaded-back node stays gone (an SWA tombstone).
- `drop_backup(node)` — free a resident node's host copy (its children hold none).
- `evict_host(num_tokens)` — delete LRU evicted leaves (host copy only) to free host
  slots.
"""

from __future__ import annotations

import heapq

from unicache_fsm.pools.host import HostKVPool
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.room import alloc_making_room
from unicache_fsm.tree.errors import NodeStateError, TreeError
from unicache_fsm.tree.eviction import Eviction
from unicache_fsm.tree.locks import Locks
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.params import EvictParams
from unicache_fsm.tree.residency import BACKING_UP, ResidencyTrigger

__all__ = ["HostTier"]

T = ResidencyTrigger


class HostTier(Locks, Eviction):
    """The host-tier primitives of `RadixTree` (see the module docstring)."""

    def host_parts(self) -> tuple[KVPool, HostKVPool, PagedAllocator]:
        if self.kv_pool is None or self.host_pool is None or self.host_allocator is None:
            msg = "the host tier needs kv_pool, host_pool and host_allocator"
            raise TreeError(msg)
        return self.kv_pool, self.host_pool, self.host_allocator

    def backup(self, node: TreeNode) -> bool:
        """Back up `node` and its un-backed ancestors to the host, root first.

        Returns False (that node's backup failed, nothing else changed for it) when the
        host pool is short.
        """
        kv, host, host_alloc = self.host_parts()
        chain = [n for n in node.path_from_root() if not n.backuped]
        for n in chain:
            if not n.device_resident or n.residency in BACKING_UP:
                msg = f"cannot back up node {n.id} now"
                raise NodeStateError(msg, node_id=n.id, state=n.residency)
        bk = self.backbone_type
        for n in chain:
            self.residency.fire(n, T.START_BACKUP)
            slots = host_alloc.alloc(len(n.key))
            if slots is None:
                self.residency.fire(n, T.BACKUP_FAILED)
                return False
            host.backup_from(kv, n.data[bk], slots)
            n.host = slots
            self.residency.fire(n, T.BACKUP_SUCCEEDED)
        return True

    def load_back(self, node: TreeNode) -> bool:
        """Copy the host backups of the evicted nodes on the path to `node` back to the
        device (evicting the shortfall first). False if the device pool stays short."""
        kv, host, _ = self.host_parts()
        receipt = self.lock_path(node)  # making room must not evict what this loads back
        try:
            for n in node.path_from_root():
                if not n.evicted:
                    continue
                need = len(n.key)
                alloc = self.allocator
                room = lambda short: self.evict(EvictParams(num_tokens=short))  # noqa: E731
                slots = alloc_making_room(need, alloc.available_size, alloc.alloc, room)
                if slots is None:
                    return False
                assert n.host is not None
                host.restore_to(kv, n.host, slots)
                self.backbone.take_slots(n, slots)
                n.last_access = self.tick()
                self.residency.fire(n, T.LOAD_BACK)
        finally:
            self.unlock_path(receipt)
        return True

    def drop_backup(self, node: TreeNode) -> None:
        """Free a resident node's host copy (its children must hold none)."""
        _, _, host_alloc = self.host_parts()
        if any(c.backuped for c in node.children.values()):
            msg = f"cannot drop the backup of node {node.id}: its children are backed up"
            raise NodeStateError(msg, node_id=node.id, state=node.residency)
        self.residency.fire(node, T.DROP_BACKUP)
        assert node.host is not None
        host_alloc.free(node.host)
        node.host = None

    def evict_host(self, num_tokens: int) -> int:
        """Delete LRU evicted leaves (host copy only) to free host slots."""
        _, _, host_alloc = self.host_parts()

        def leaf(n: TreeNode) -> bool:
            return n.evicted and n.lock_ref == 0 and not n.children

        heap = [(n.last_access, n.id, n) for n in self.nodes() if leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, n = heapq.heappop(heap)
            parent = n.parent
            assert parent is not None and n.host is not None
            self.residency.fire(n, T.DELETE)
            self.unlink(n)
            host_alloc.free(n.host)
            freed += int(n.host.numel())
            if parent.parent is not None and leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed
