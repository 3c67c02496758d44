"""Offload tickets: the external store's side of node residency, as the tree sees it.

- `offload_chain(node)` — `node` (unless stored or offloading) and its ancestors up
  to the first one that is stored, offloading or backed up, root first: what
  write-through offloads. A backed-up node whose offload failed is in its own chain:
  a failure leaves it eligible again.
- `begin_offload(chain) -> OffloadTicket` — every node of the chain moves to
  ``external.offloading`` and points at the ticket; the deepest node (the lock
  anchor) is locked, which pins the whole chain. As in SGLang 0.5.23 the linker
  offloads a write-through chain one node per ticket (``begin_offload([node])``:
  one store call, one lock, one verdict per node); a longer chain is one ticket.
- `finish_offload(ticket, success)` — every node of `publish` moves to stored
  (success) or back to unstored (eligible again), and the lock is released exactly
  once. A split while in flight puts both halves in `publish` in place of the old
  node, so the verdict reaches every fragment.
- `mark_stored_path(endpoint, anchor)` — a committed load published the path: its
  nodes are stored (those with an offload in flight keep waiting for its verdict).
- `demote(node)` — a stored node whose pages the store lost becomes unstored.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from unicache_fsm.tree.errors import NodeStateError, TreeError
from unicache_fsm.tree.locks import LockReceipt, Locks
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.residency import ResidencyTrigger

__all__ = ["OffloadTicket", "Offloads"]

T = ResidencyTrigger


@attrs.define(slots=True, eq=False)
class OffloadTicket:
    """One offload in flight: `anchor` holds its lock (`receipt`), `publish` gets its
    verdict."""

    id: int
    anchor: TreeNode
    publish: list[TreeNode]
    receipt: LockReceipt | None = None
    finished: bool = False

    def __repr__(self) -> str:
        return f"OffloadTicket(id={self.id}, nodes={[n.id for n in self.publish]})"


def _is_ancestor(anc: TreeNode, node: TreeNode) -> bool:
    n = node.parent
    while n is not None:
        if n is anc:
            return True
        n = n.parent
    return False


class Offloads(Locks):
    """The offload-ticket primitives of `RadixTree` (see the module docstring)."""

    ticket_ids: int = 0

    def offload_chain(self, node: TreeNode) -> list[TreeNode]:
        """`node` and its ancestors up to the first stored/offloading/backed-up one, root
        first (`node` itself counts whether backed up or not)."""
        if node.parent is None or node.external_cache_stored or node.offloading:
            return []
        chain: list[TreeNode] = [node]
        n = node.parent
        while n is not None and n.parent is not None:
            if n.external_cache_stored or n.offloading or n.backuped:
                break
            chain.append(n)
            n = n.parent
        chain.reverse()
        return chain

    def begin_offload(self, chain: Sequence[TreeNode]) -> OffloadTicket:
        """Move a root-first chain to offloading and lock it; see the module docstring."""
        if not chain:
            msg = "cannot offload an empty chain"
            raise TreeError(msg)
        for i, node in enumerate(chain):
            problem = None
            if not node.device_resident:
                problem = "it is not device-resident"
            elif node.digest_bytes is None:
                problem = "it has no page hashes (the tree was built with hash_pages=False)"
            elif node.external_cache_stored or node.offloading:
                problem = "it is already stored or offloading"
            elif i and not _is_ancestor(chain[i - 1], node):
                problem = f"it is not below node {chain[i - 1].id} (chains go root first)"
            if problem:
                msg = f"cannot offload node {node.id}: {problem}"
                raise NodeStateError(msg, node_id=node.id, state=node.residency)
        self.ticket_ids += 1
        ticket = OffloadTicket(id=self.ticket_ids, anchor=chain[-1], publish=list(chain))
        for node in chain:
            self.residency.fire(node, T.START_OFFLOAD)
            node.pending_offload = ticket
        ticket.receipt = self.lock_path(ticket.anchor)
        return ticket

    def finish_offload(self, ticket: OffloadTicket, success: bool) -> None:
        """Publish (success) or roll back (failure) every node of the ticket; unlock once."""
        if ticket.finished:
            msg = f"offload ticket {ticket.id} is already finished"
            raise TreeError(msg)
        trigger = T.OFFLOAD_SUCCEEDED if success else T.OFFLOAD_FAILED
        for node in ticket.publish:
            self.residency.fire(node, trigger)
            node.pending_offload = None
        assert ticket.receipt is not None
        self.unlock_path(ticket.receipt)
        ticket.finished = True

    def mark_stored_path(self, endpoint: TreeNode, anchor: TreeNode) -> list[TreeNode]:
        """Mark every node from `endpoint` up to (excluding) `anchor` stored.

        Nodes already stored, or with an offload in flight (whose verdict decides), are
        left as they are. Returns the nodes marked.
        """
        path: list[TreeNode] = []
        n: TreeNode | None = endpoint
        while n is not anchor:
            if n is None or n.parent is None:
                msg = f"node {anchor.id} is not an ancestor of node {endpoint.id}"
                raise NodeStateError(msg, node_id=anchor.id, state=anchor.residency)
            path.append(n)
            n = n.parent
        marked = []
        for node in path:
            if node.device_resident and not node.external_cache_stored and not node.offloading:
                self.residency.fire(node, T.MARK_STORED)
                marked.append(node)
        return marked

    def demote(self, node: TreeNode) -> bool:
        """A stored node whose pages the store lost becomes unstored (eligible again)."""
        if not node.external_cache_stored:
            return False
        self.residency.fire(node, T.DEMOTE)
        return True
