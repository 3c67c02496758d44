"""`RadixTree.check()`: a full consistency audit for tests and fuzzers.

Findings (each reported with the node id, all at once):

- structure: every child is filed under its first page (and namespace at the root),
  starts where its parent ends, holds whole pages, shares its parent's namespace;
- residency agrees with data: resident ⇔ FULL slots of the key's length; evicted ⇒
  no device slots and a host copy; backed up ⇔ host slots; a device child has a
  device parent; a backed-up child a backed-up parent;
- offloads: offloading ⇔ a pending, unfinished ticket that lists the node;
- locks: never negative; a parent holds at least its children's locks together;
- SWA: SWA data only with FULL data; ``mapping[full] == swa`` for live SWA, 0 for a
  tombstone;
- hashes: one per page, equal to the chain seeded by the parent's last hash (or the
  namespace at the root);
- slot conservation: tree-owned ⊎ outside ⊎ free = capacity, per pool (FULL, SWA,
  host), with no slot owned twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from unicache_fsm import hashing
from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.tree.errors import TreeConsistencyError

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode
    from unicache_fsm.tree.tree import RadixTree

__all__ = ["audit"]


def _pages(slots: Sequence[torch.Tensor], page_size: int) -> torch.Tensor:
    parts = [s for s in slots if s is not None and s.numel()]
    if not parts:
        return torch.empty(0, dtype=torch.int64)
    return torch.cat(parts).cpu()[::page_size] // page_size


def _conservation(
    what: str, owned: torch.Tensor, allocated: torch.Tensor, findings: list[str]
) -> None:
    uniq, counts = torch.unique(owned, return_counts=True)
    twice = uniq[counts > 1].tolist()
    if twice:
        findings.append(f"{what}: pages owned twice: {twice[:10]}")
    alloc = set(allocated.cpu().tolist())
    own = set(uniq.tolist())
    if own - alloc:
        findings.append(f"{what}: owned pages the allocator calls free: {sorted(own - alloc)[:10]}")
    if alloc - own:
        findings.append(f"{what}: allocated pages nobody owns (leaked): {sorted(alloc - own)[:10]}")


def _check_node(tree: RadixTree, node: TreeNode, findings: list[str]) -> None:
    p = tree.page_size
    parent = node.parent
    nid = f"node {node.id}"
    if parent is None:
        findings.append(f"{nid}: no parent but reachable")
        return
    if not node.key or len(node.key) % p:
        findings.append(f"{nid}: key of {len(node.key)} tokens is not whole pages")
    expected_key = tree._child_key(parent, node.key, 0, node.namespace)
    if parent.children.get(expected_key) is not node:
        findings.append(f"{nid}: not filed under its first page in node {parent.id}")
    if node.start != parent.end:
        findings.append(f"{nid}: starts at {node.start}, parent ends at {parent.end}")
    if parent.parent is not None and parent.namespace != node.namespace:
        findings.append(f"{nid}: namespace differs from its parent's")
    n = len(node.key)
    if node.device_resident:
        if node.full is None or node.full.numel() != n:
            findings.append(f"{nid}: resident without {n} FULL slots")
        if parent.parent is not None and not parent.device_resident:
            findings.append(f"{nid}: device child of non-device parent {parent.id}")
    elif node.evicted:
        if node.full is not None or node.swa is not None:
            findings.append(f"{nid}: evicted but holds device slots")
        if not node.backuped:
            findings.append(f"{nid}: evicted without a host copy")
    else:
        findings.append(f"{nid}: in the tree in residency {node.residency!r}")
    if node.backuped != (node.host is not None):
        findings.append(f"{nid}: backed-up state disagrees with host slots")
    if node.host is not None and node.host.numel() != n:
        findings.append(f"{nid}: {node.host.numel()} host slots for {n} tokens")
    if node.backuped and parent.parent is not None and not parent.backuped:
        findings.append(f"{nid}: backed up under un-backed parent {parent.id}")
    ticket = node.pending_offload
    if node.offloading != (ticket is not None and not ticket.finished and node in ticket.publish):
        findings.append(f"{nid}: offloading state disagrees with its ticket {ticket!r}")
    if node.lock_ref < 0:
        findings.append(f"{nid}: negative lock_ref {node.lock_ref}")
    child_locks = sum(c.lock_ref for c in node.children.values())
    if node.lock_ref < child_locks:
        findings.append(f"{nid}: lock_ref {node.lock_ref} < its children's {child_locks}")
    if node.swa is not None:
        if not tree.swa_enabled:
            findings.append(f"{nid}: SWA slots without an SWA component")
        elif node.full is None or node.swa.numel() != n:
            findings.append(f"{nid}: SWA data without matching FULL data")
        else:
            assert isinstance(tree.allocator, SWAAllocator)
            if not torch.equal(tree.allocator.translate(node.full), node.swa):
                findings.append(f"{nid}: mapping[full] != swa")
    elif tree.swa_enabled and node.full is not None:
        assert isinstance(tree.allocator, SWAAllocator)
        if bool((tree.allocator.translate(node.full) != 0).any()):
            findings.append(f"{nid}: SWA tombstone whose FULL slots still map to SWA")
    if node.hashes is not None:
        prior = node.namespace if parent.parent is None else parent.last_hash()
        if parent.parent is not None and parent.hashes is None:
            findings.append(f"{nid}: hashed under an unhashed parent")
        elif node.hashes != hashing.page_hashes(node.key, p, prior):
            findings.append(f"{nid}: page hashes do not chain from its parent")


def audit(
    tree: RadixTree,
    *,
    outside_full: Sequence[torch.Tensor] = (),
    outside_swa: Sequence[torch.Tensor] = (),
) -> None:
    findings: list[str] = []
    full: list[torch.Tensor] = list(outside_full)
    swa: list[torch.Tensor] = list(outside_swa)
    host: list[torch.Tensor] = []
    for node in tree.nodes():
        _check_node(tree, node, findings)
        if node.full is not None:
            full.append(node.full)
        if node.swa is not None:
            swa.append(node.swa)
        if node.host is not None:
            host.append(node.host)
    p = tree.page_size
    alloc = tree.allocator
    _conservation("FULL", _pages(full, p), alloc.allocated_page_ids(), findings)
    if isinstance(alloc, SWAAllocator):
        _conservation("SWA", _pages(swa, p), alloc.swa_allocated_page_ids(), findings)
    if tree.host_allocator is not None:
        _conservation("host", _pages(host, p), tree.host_allocator.allocated_page_ids(), findings)
    if findings:
        raise TreeConsistencyError(findings)
