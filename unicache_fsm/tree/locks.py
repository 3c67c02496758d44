"""Locks: a lock pins the path root→node against eviction.

- `check_in_tree(node, what)` — `NodeStateError` unless `node` is the root or in the
  tree (device-resident or evicted with a host copy).
- `inc_lock_ref(node) -> LockReceipt` — one lock on every node of the path
  root→`node` (the root is never locked: `lock_ref`, the backbone's lock), then each
  component's own lock (`TreeComponent.lock`; SWA pins only the path's trailing
  window). The receipt names that lock.
- `dec_lock_ref(node, receipt=None)` — release one lock on `node`: the one `receipt`
  names, or without it the most recent one still held there. `LockUnderflowError`
  (nothing changed) when a node on the path holds none, when `receipt` is not a lock
  held on `node`, or was already released.
- `lock_path(node)` / `unlock_path(receipt)` — the same lock, for a holder that keeps
  its receipt (an offload ticket, a load-back): such a lock is never the one a
  receipt-less `dec_lock_ref` releases.

Unlock exactly once per lock, on the same node. Locks taken on one node differ only
in what component locks remember (SWA: where the window began, which splits do not
move); passing receipts releases exactly the lock taken, as SGLang's receipts do.
"""

from __future__ import annotations

import attrs

from unicache_fsm.tree.errors import LockUnderflowError, NodeStateError
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.residency import EVICTED, RESIDENT
from unicache_fsm.tree.state import TreeState

__all__ = ["LockReceipt", "Locks"]

#: the residencies of a node in the tree: device-resident, or evicted with a host copy
_IN_TREE = RESIDENT | EVICTED


@attrs.frozen(eq=False)
class LockReceipt:
    """One lock taken by `inc_lock_ref`: its node and, per component lock hook (in
    `RadixTree.lock_hooks` order), what that hook needs to release exactly it."""

    node: TreeNode
    tokens: tuple[object, ...] = ()

    def __repr__(self) -> str:
        return f"LockReceipt(node={self.node.id}, tokens={self.tokens!r})"


class Locks(TreeState):
    """The lock primitives of `RadixTree` (see the module docstring)."""

    def check_in_tree(self, node: TreeNode, what: str) -> None:
        if node.residency not in _IN_TREE and node is not self.root:
            msg = f"cannot {what} node {node.id}: it is not in the tree ({node.residency})"
            raise NodeStateError(msg, node_id=node.id, state=node.residency)

    def lock_path(self, node: TreeNode) -> LockReceipt:
        """Lock the path root→`node`; only the receipt releases it (`unlock_path`)."""
        self.check_in_tree(node, "lock")
        target = node
        while node.parent is not None:
            node.lock_ref += 1
            node = node.parent
        hooks = self.lock_hooks
        return LockReceipt(target, tuple(c.lock(target) for c in hooks) if hooks else ())

    def unlock_path(self, receipt: LockReceipt) -> None:
        """Release the lock `receipt` names (taken by `lock_path`)."""
        node = receipt.node
        self.check_in_tree(node, "unlock")
        self._check_locked(node)
        self._release(node, receipt)

    def _release(self, node: TreeNode, receipt: LockReceipt | None) -> None:
        """Release `receipt`'s lock (None: a lock taken without component hooks) over the
        path root→`node`, which `_check_locked(node)` checked just before (every node on
        it holds a lock). Walked from `node` up: only the order in which nodes are noted
        evictable differs from root-first, and the eviction heap orders its entries by
        their stamps, not by when they were filed."""
        n = node
        while n.parent is not None:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self.note_evictable(n)
            n = n.parent
        if receipt is not None:
            for c, token in zip(self.lock_hooks, receipt.tokens, strict=True):
                c.unlock(node, token)

    def _check_locked(self, node: TreeNode) -> None:
        """`LockUnderflowError` naming the node nearest the root on the path root→`node`
        that holds no lock, if any (nothing changed)."""
        n = node
        while n.parent is not None:  # the common case: every node holds one
            if n.lock_ref <= 0:
                break
            n = n.parent
        else:
            return
        for n in node.path_from_root():  # name the culprit nearest the root
            if n.lock_ref <= 0:
                msg = (
                    f"cannot unlock node {node.id}: node {n.id} on its path holds no lock "
                    "(unlock exactly once per inc_lock_ref, on the same node)"
                )
                raise LockUnderflowError(msg, node_id=n.id)

    def inc_lock_ref(self, node: TreeNode) -> LockReceipt:
        """Lock every node on the path root→`node` (the root is never locked)."""
        if self.lock_hooks:
            receipt = self.lock_path(node)
            self.held_locks.setdefault(node, []).append(receipt)
            return receipt
        # no component lock to take: `lock_path`, inline (the scheduler locks and
        # unlocks a path per request step)
        if node.residency not in _IN_TREE and node is not self.root:
            self.check_in_tree(node, "lock")  # raises
        n = node
        while n.parent is not None:
            n.lock_ref += 1
            n = n.parent
        return LockReceipt(node)

    def dec_lock_ref(self, node: TreeNode, receipt: LockReceipt | None = None) -> None:
        """Release one lock on the path root→`node`; raises if it holds none."""
        if node.residency not in _IN_TREE and node is not self.root:
            self.check_in_tree(node, "unlock")  # raises
        if receipt is not None and receipt.node is not node:
            msg = f"cannot unlock node {node.id} with a receipt for node {receipt.node.id}"
            raise LockUnderflowError(msg, node_id=node.id)
        n = node  # (`_check_locked`, inline: every node on the path holds a lock, or it raises)
        while n.parent is not None:
            if n.lock_ref <= 0:
                self._check_locked(node)  # names the culprit nearest the root
                raise AssertionError("unreachable: a node on the path holds no lock")
            n = n.parent
        if not self.lock_hooks:  # a hook-less lock: no receipt books to settle
            self._release(node, None)
            return
        held = self.held_locks.get(node, [])
        if receipt is None and held:
            receipt = held[-1]
        if receipt is None or not any(r is receipt for r in held):
            msg = f"cannot unlock node {node.id}: that lock is not held (released twice?)"
            raise LockUnderflowError(msg, node_id=node.id)
        held.remove(receipt)
        if not held:
            del self.held_locks[node]
        self._release(node, receipt)
