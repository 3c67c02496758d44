"""The radix-tree node: a slotted record whose residency is one explicit state.

Who may touch what: `RadixTree` owns the structure (key, parent, children) and the
node-wide bookkeeping (locks, hits, access time, hashes, host slots); each component
(`tree.components`) owns its own entry of `data`, and nothing else writes it.
`residency` is written only by the residency executor (`tree.residency`);
`external_cache_stored`, `backuped` and `evicted` are read-only views of it, never
stored flags, and so is a component's presence: whether `data` holds a component's
slots is read off its region of the residency (the audit checks they agree).
`pending_offload` points at the one offload in flight over this node (set exactly
while the node is offloading).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.tree.residency import BACKED_UP, EVICTED, OFFLOADING, RESIDENT, STORED

if TYPE_CHECKING:
    from unicache_fsm.tree.offload import OffloadTicket

__all__ = ["TreeNode"]


@attrs.define(slots=True, eq=False, repr=False)
class TreeNode:
    """One node: a page-aligned key span and, per component, the slots that hold its KV.

    `start` is the absolute token position of `key[0]` (0 for children of the root).
    `data` maps each component present on the node to its device slots, aligned with
    the key (the root holds none; an evicted node none; a component whose region says
    it is gone — an SWA tombstone — none). `host` holds the host-pool slots of the
    backup tier. `packed` is the key as the tree compares it (its tokens packed in one
    fixed-width format per tree, `walk.pack_key`). `digest_bytes` holds one raw 32-byte
    page digest per page, end to end in one bytes object (None when the tree does not
    hash): one object per node that the garbage collector never visits, where a list
    would hold one object per page for it to visit on every collection. `digests` is
    them as a fresh list of 32-byte digests, `hashes` as hex (the page keys a store
    files), `last_digest()` the last one. `lock_ref` counts the locks on paths through
    this node; `last_access` is its stamp on the tree's LRU clock.
    """

    id: int
    key: tuple[int, ...]
    start: int
    parent: TreeNode | None
    namespace: str | None = None
    children: dict[Any, TreeNode] = attrs.field(factory=dict)
    data: dict[ComponentType, torch.Tensor] = attrs.field(factory=dict)
    host: torch.Tensor | None = None
    digest_bytes: bytes | None = None
    packed: bytes = b""
    lock_ref: int = 0
    hit_count: int = 0
    last_access: float = 0.0
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

    def slots(self, component: ComponentType) -> torch.Tensor | None:
        """`component`'s device slots on this node (None when it holds none here)."""
        return self.data.get(component)

    @property
    def digests(self) -> list[bytes] | None:
        """One raw 32-byte digest per page (None when the tree does not hash); a fresh
        list cut from `digest_bytes`."""
        blob = self.digest_bytes
        if blob is None:
            return None
        return [blob[i : i + 32] for i in range(0, len(blob), 32)]

    @property
    def hashes(self) -> list[str] | None:
        """One hex page key per page (None when the tree does not hash); a fresh list."""
        blob = self.digest_bytes
        if blob is None:
            return None
        text = blob.hex()
        return [text[i : i + 64] for i in range(0, len(text), 64)]

    def last_digest(self) -> bytes | None:
        """The raw digest of this node's last page (the prior of the next page), or None
        when the node has no digests (the tree does not hash, or no pages)."""
        blob = self.digest_bytes
        return blob[-32:] if blob else None

    def last_hash(self) -> str | None:
        """The hash of this node's last page (the anchor for the next page), or None."""
        blob = self.digest_bytes  # (`last_digest`, inline)
        return blob[-32:].hex() if blob else None

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
