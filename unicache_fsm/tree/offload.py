"""An offload in flight over a chain of tree nodes, as the tree sees it.

`RadixTree.begin_offload(chain)` makes an `OffloadTicket`: every node of the chain is
moved to ``external.offloading`` and points at the ticket, and the deepest node (the
lock anchor) is locked, which pins the whole chain. `RadixTree.finish_offload(ticket,
success)` moves every node of `publish` to stored (success) or back to unstored, and
releases the lock exactly once. A split while in flight puts both halves in `publish`
in place of the old node, so the verdict reaches every fragment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode

__all__ = ["OffloadTicket"]


@attrs.define(slots=True, eq=False)
class OffloadTicket:
    id: int
    anchor: TreeNode
    publish: list[TreeNode]
    finished: bool = False

    def __repr__(self) -> str:
        return f"OffloadTicket(id={self.id}, nodes={[n.id for n in self.publish]})"
