"""The host tier in the scheduler loop: back up what is inserted, load back what is hit.

`HostPolicy(tree)` drives the optional host tier of a `RadixTree` built with a host
pool (``simulate --host-tokens H``) the way a HiCache-style server does:

- `backup(node)` after an insert — copy the request's path to the host. When the host
  pool is short it first deletes LRU evicted leaves (`evict_host`), then drops the
  host copies of LRU resident nodes that still have their device copy
  (`drop_backup`), never one on the path it backs up; if the pool stays short the
  backup fails (``backup_failed``): the copies dropped on the way stay dropped.
- `load_back(key, namespace)` before admission — when the key's device prefix
  continues into evicted nodes with host copies, copy them back to the device
  (``load_back``). Returns the device prefix length before, so the caller counts as
  host hits only the tokens its own match gained (a load-back short of slots stops
  part-way; with SWA a node back without its window extends nothing).

Every host move is a transition of the tree's residency machine, so ``--coverage``
shows the host-backup region taken.
"""

from __future__ import annotations

from collections.abc import Sequence

from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.residency import BACKING_UP
from unicache_fsm.tree.tree import RadixTree

__all__ = ["HostPolicy"]


class HostPolicy:
    """The host tier's policy in the scheduler loop: `backup` a request's path after its
    insert (making room LRU-first, never on the path it backs up) and `load_back` a
    hit's host-backed nodes before admission. `tree` must have a host pool (`TreeError`
    otherwise); every move is a residency transition of the tree."""

    def __init__(self, tree: RadixTree) -> None:
        tree.host_parts()  # raises TreeError without a host tier
        self.tree = tree

    def _make_room(self, need: int, keep: set[int]) -> None:
        """Free `need` host tokens: evict host-only leaves, then drop the host copies of
        LRU resident leaves of the backed-up forest, never a node whose id is in `keep`
        (the path being backed up: dropping its copy would only make the backup longer)."""
        _, _, host_alloc = self.tree.host_parts()
        short = need - host_alloc.available_size()
        if short > 0:
            self.tree.evict_host(short)
            short = need - host_alloc.available_size()
        if short <= 0:
            return
        backed = [
            n
            for n in self.tree.nodes()
            if n.device_resident
            and n.backuped
            and n.residency not in BACKING_UP
            and n.id not in keep
            and not any(c.backuped for c in n.children.values())
        ]
        for n in sorted(backed, key=lambda n: (n.last_access, n.id)):
            if short <= 0:
                break
            if any(c.backuped for c in n.children.values()):
                continue
            assert n.host is not None
            short -= int(n.host.numel())
            self.tree.drop_backup(n)

    def backup(self, node: TreeNode) -> bool:
        """Back up `node`'s path to the host; False when the host pool stayed short."""
        chain = [n for n in node.path_from_root() if n.parent is not None and not n.backuped]
        if not chain:
            return True
        if any(not n.device_resident or n.residency in BACKING_UP for n in chain):
            return False  # not on the device now: nothing to copy
        self._make_room(sum(len(n.key) for n in chain), {n.id for n in node.path_from_root()})
        return self.tree.backup(node)

    def load_back(self, key: Sequence[int], namespace: str | None) -> int:
        """Bring the host-backed continuation of `key`'s device prefix back; returns the
        device prefix length before (the caller's match after it tells how many tokens
        the host really added: a partial load-back adds some, and with SWA a node loaded
        back without a live window may add none)."""
        m = self.tree.match_prefix(key, namespace)
        if m.host_hit_length and m.last_host_node is not None:
            self.tree.load_back(m.last_host_node)  # False: short of slots part-way
        return m.prefix_len
