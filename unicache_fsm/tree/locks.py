"""Locks: a lock pins the path root→node against eviction.

- `check_in_tree(node, what)` — `NodeStateError` unless `node` is the root or in the
  tree (device-resident or evicted with a host copy).
- `inc_lock_ref(node)` — one lock on every node of the path root→`node` (the root is
  never locked), then each component's own lock hook (`TreeComponent.lock`).
- `dec_lock_ref(node)` — release one such lock; `LockUnderflowError` (nothing
  changed) when a node on the path holds none.

Unlock exactly once per lock, on the same node.
"""

from __future__ import annotations

from unicache_fsm.tree.errors import LockUnderflowError, NodeStateError
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.state import TreeState

__all__ = ["Locks"]


class Locks(TreeState):
    """The lock primitives of `RadixTree` (see the module docstring)."""

    def check_in_tree(self, node: TreeNode, what: str) -> None:
        if node is not self.root and not (node.device_resident or node.evicted):
            msg = f"cannot {what} node {node.id}: it is not in the tree ({node.residency})"
            raise NodeStateError(msg, node_id=node.id, state=node.residency)

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock every node on the path root→`node` (the root is never locked)."""
        self.check_in_tree(node, "lock")
        target = node
        while node.parent is not None:
            node.lock_ref += 1
            node = node.parent
        for c in self.lock_hooks:
            c.lock(target, 1)

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Release one lock on the path root→`node`; raises if it holds none."""
        self.check_in_tree(node, "unlock")
        path = node.path_from_root()
        for n in path:
            if n.lock_ref <= 0:
                msg = (
                    f"cannot unlock node {node.id}: node {n.id} on its path holds no lock "
                    "(unlock exactly once per inc_lock_ref, on the same node)"
                )
                raise LockUnderflowError(msg, node_id=n.id)
        for n in path:
            n.lock_ref -= 1
        for c in self.lock_hooks:
            c.lock(node, -1)
