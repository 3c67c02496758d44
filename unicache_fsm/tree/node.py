"""The radix-tree node: a slotted record whose residency is one explicit state.

Who may touch what: `RadixTree` owns every field. `residency` is written only by the
residency executor (`tree.residency`); `external_cache_stored`, `backuped` and
`evicted` are read-only views of it, never stored flags. `pending_offload` points at
the one offload in flight over this node (set exactly while the node is offloading).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

from unicache_fsm.tree.residency import BACKED_UP, EVICTED, OFFLOADING, RESIDENT, STORED

if TYPE_CHECKING:
    from unicache_fsm.tree.offload import OffloadTicket

__all__ = ["TreeNode"]


@attrs.define(slots=True, eq=False, repr=False)
class TreeNode:
    """One node: a page-aligned key span and the slots that hold its KV.

    `start` is the absolute token position of `key[0]` (0 for children of the root).
    `full` holds the FULL device slots (None when evicted, and at the root); `swa`
    holds the SWA slots (None: no SWA data — a tombstone, or no SWA component);
    `host` the host-pool slots of the backup tier. `hashes` has one page hash per page
    (None when the tree does not hash). `lock_ref` counts the locks on paths through
    this node.
    """

    id: int
    key: tuple[int, ...]
    start: int
    parent: TreeNode | None
    namespace: str | None = None
    children: dict[Any, TreeNode] = attrs.field(factory=dict)
    full: torch.Tensor | None = None
    swa: torch.Tensor | None = None
    host: torch.Tensor | None = None
    hashes: list[str] | None = None
    lock_ref: int = 0
    hit_count: int = 0
    last_access: int = 0
    residency: str = ""
    pending_offload: OffloadTicket | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.key)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def evicted(self) -> bool:
        return self.residency in EVICTED

    @property
    def device_resident(self) -> bool:
        return self.residency in RESIDENT

    @property
    def external_cache_stored(self) -> bool:
        return self.residency in STORED

    @property
    def offloading(self) -> bool:
        return self.residency in OFFLOADING

    @property
    def backuped(self) -> bool:
        return self.residency in BACKED_UP

    def last_hash(self) -> str | None:
        """The hash of this node's last page (the anchor for the next page), or None."""
        if not self.hashes:
            return None
        return self.hashes[-1]

    def path_from_root(self) -> list[TreeNode]:
        """This node and its ancestors below the root, root-first."""
        out: list[TreeNode] = []
        node: TreeNode | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        out.reverse()
        return out

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, start={self.start}, end={self.end}, "
            f"residency={self.residency!r}, lock_ref={self.lock_ref})"
        )
