"""`RadixTree.check()`: a full consistency audit for tests and fuzzers.

Findings (each reported with the node id, all at once):

- structure: every child is filed under its first page (and namespace at the root),
  starts where its parent ends, holds whole pages, shares its parent's namespace;
- residency agrees with data: resident ⇔ FULL slots of the key's length; evicted ⇒
  no device slots and a host copy; backed up ⇔ host slots; a device child has a
  device parent; a backed-up child a backed-up parent;
- offloads: offloading ⇔ a pending, unfinished ticket that lists the node;
- locks: never negative; a parent holds at least its children's locks together;
- components: data only for the tree's components; each component audits its own
  data on every node (`TreeComponent.audit_node`: e.g. SWA's region agrees with its
  slots, ``mapping[full] == swa`` for live SWA, 0 for a tombstone);
- eviction order: every evictable leaf has an entry with its stamp in the eviction
  heap; the node count is the number of nodes; the packed key matches the key;
- hashes: one per page, equal to the chain seeded by the parent's last hash (or the
  namespace at the root);
- slot conservation: tree-owned ⊎ outside (load-reserved, a live request's, or
  quarantined by the linker) ⊎ free = capacity, per pool (each component's,
  `TreeComponent.audit_pool`, and the host's), with no slot owned twice.

`page_ids` and `check_conservation` are the helpers components audit their pools with.

Cost: one pass over the nodes (a caller that listed them for its own checks passes the
list: `RadixTree.check(nodes=...)`), each node's key packed once per key object (a
bounded memo by the tuple's identity: an audit after every step packs only new keys)
and its hash chain recomputed only for keys not seen before (`_chain`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from unicache_fsm import hashing
from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.tree.errors import TreeConsistencyError
from unicache_fsm.tree.walk import child_key, pack_key

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode
    from unicache_fsm.tree.tree import RadixTree

__all__ = ["audit", "check_conservation", "page_ids"]


def page_ids(slots: Sequence[torch.Tensor], page_size: int) -> list[int]:
    """The page id of every page of `slots` (whole pages), concatenated, as Python ints
    (one `tolist()` per tensor: an audit's pools are read whole, so no tensor op per
    node pays its fixed cost)."""
    out: list[int] = []
    for s in slots:
        if s is not None and s.numel():
            out += [v // page_size for v in s.tolist()[::page_size]]
    return out


def check_conservation(
    what: str,
    owned: Sequence[int],
    allocated: torch.Tensor | Sequence[int],
    findings: list[str],
) -> None:
    """Pages owned (tree + outside) against the allocator's allocated pages (a tensor,
    or Python ints: `allocated_page_list`)."""
    own = set(owned)
    if len(own) != len(owned):
        twice = sorted(k for k, c in Counter(owned).items() if c > 1)
        findings.append(f"{what}: pages owned twice: {twice[:10]}")
    alloc = set(allocated.cpu().tolist() if isinstance(allocated, torch.Tensor) else allocated)
    if own - alloc:
        findings.append(f"{what}: owned pages the allocator calls free: {sorted(own - alloc)[:10]}")
    if alloc - own:
        findings.append(f"{what}: allocated pages nobody owns (leaked): {sorted(alloc - own)[:10]}")


#: page digests of (prior digest, u32-packed key, page size): a pure function of its
#: arguments, remembered so an audit after every step re-hashes only new keys; cleared
#: when it holds `_CHAINS_MAX` chains or `_CHAINS_BYTES` of keys and digests (a key is a
#: node's whole packed key, so long keys would otherwise grow it without bound)
_CHAINS: dict[tuple[bytes, bytes, int], bytes] = {}
_CHAINS_MAX = 1 << 16
_CHAINS_BYTES = 32 << 20
_chains_bytes = 0


def _chain(prior: bytes, packed: bytes, page_size: int) -> bytes:
    """`hashing.page_digest_bytes(packed, page_size, prior)`, memoized (bounded)."""
    global _chains_bytes
    key = (prior, packed, page_size)
    got = _CHAINS.get(key)
    if got is None:
        got = hashing.page_digest_bytes(packed, page_size, prior)
        size = len(prior) + len(packed) + len(got)
        if len(_CHAINS) >= _CHAINS_MAX or _chains_bytes + size > _CHAINS_BYTES:
            _CHAINS.clear()
            _chains_bytes = 0
        if size <= _CHAINS_BYTES:
            _CHAINS[key] = got
            _chains_bytes += size
    return got


#: a key's packed forms by the key tuple's identity: id(key) -> (key, format, packed in
#: the tree's format, u32-packed once asked). A tuple cannot change, and the entry
#: holds the tuple itself, so its id cannot be reused while the entry lives: an audit
#: after every step packs only keys it has not seen. Cleared when it holds
#: `_PACKED_MAX` keys or `_PACKED_TOKENS` tokens (it keeps keys of dead nodes alive).
_PACKED: dict[int, tuple[tuple[int, ...], str, bytes, list[bytes]]] = {}
_PACKED_MAX = 1 << 14
_PACKED_TOKENS = 1 << 21
_packed_tokens = 0


def _packed(key: tuple[int, ...], fmt: str) -> tuple[bytes, Callable[[], bytes]]:
    """`walk.pack_key(key, fmt)`, and a getter of ``hashing.pack_tokens(key)`` (the
    same bytes when `fmt` is ``"I"``), remembered by the key's identity."""
    global _packed_tokens
    entry = _PACKED.get(id(key))
    if entry is None or entry[0] is not key or entry[1] != fmt:
        packed = pack_key(key, fmt)
        entry = (key, fmt, packed, [packed] if fmt == "I" else [])
        if type(key) is tuple:  # (anything else might change in place: not remembered)
            if len(_PACKED) >= _PACKED_MAX or _packed_tokens + len(key) > _PACKED_TOKENS:
                _PACKED.clear()
                _packed_tokens = 0
            _PACKED[id(key)] = entry
            _packed_tokens += len(key)
    u32s = entry[3]

    def u32() -> bytes:
        if not u32s:
            u32s.append(hashing.pack_tokens(key))
        return u32s[0]

    return entry[2], u32


def _check_node(
    tree: RadixTree,
    node: TreeNode,
    filed: set[tuple[float, int]],
    findings: list[str],
    kinds: frozenset[ComponentType],
) -> None:
    p = tree.page_size
    parent = node.parent
    if parent is None:
        findings.append(f"node {node.id}: no parent but reachable")
        return
    if not node.key or len(node.key) % p:
        findings.append(f"node {node.id}: key of {len(node.key)} tokens is not whole pages")
    expected_key = child_key(parent, node.packed, 0, node.namespace, p * tree.key_width)
    if parent.children.get(expected_key) is not node:
        findings.append(f"node {node.id}: not filed under its first page in node {parent.id}")
    if node.start != parent.end:
        findings.append(f"node {node.id}: starts at {node.start}, parent ends at {parent.end}")
    if parent.parent is not None and parent.namespace != node.namespace:
        findings.append(f"node {node.id}: namespace differs from its parent's")
    n = len(node.key)
    backbone = node.data.get(tree.backbone_type)
    if node.device_resident:
        if backbone is None or backbone.numel() != n:
            findings.append(f"node {node.id}: resident without {n} backbone slots")
        if parent.parent is not None and not parent.device_resident:
            findings.append(f"node {node.id}: device child of non-device parent {parent.id}")
    elif node.evicted:
        if node.data:
            findings.append(f"node {node.id}: evicted but holds device slots")
        if not node.backuped:
            findings.append(f"node {node.id}: evicted without a host copy")
    else:
        findings.append(f"node {node.id}: in the tree in residency {node.residency!r}")
    if node.backuped != (node.host is not None):
        findings.append(f"node {node.id}: backed-up state disagrees with host slots")
    if node.host is not None and node.host.numel() != n:
        findings.append(f"node {node.id}: {node.host.numel()} host slots for {n} tokens")
    if node.backuped and parent.parent is not None and not parent.backuped:
        findings.append(f"node {node.id}: backed up under un-backed parent {parent.id}")
    ticket = node.pending_offload
    if node.offloading != (ticket is not None and not ticket.finished and node in ticket.publish):
        findings.append(f"node {node.id}: offloading state disagrees with its ticket {ticket!r}")
    if node.lock_ref < 0:
        findings.append(f"node {node.id}: negative lock_ref {node.lock_ref}")
    if node.children:  # (a leaf's children hold no locks)
        child_locks = sum(c.lock_ref for c in node.children.values())
        if node.lock_ref < child_locks:
            detail = f"lock_ref {node.lock_ref} < its children's {child_locks}"
            findings.append(f"node {node.id}: {detail}")
    if not kinds.issuperset(node.data):
        foreign = sorted(k.name for k in node.data if k not in kinds)
        findings.append(f"node {node.id}: slots of {foreign} without that component in the tree")
    for c in tree.components:
        c.audit_node(node, findings)
    if tree.evictable_leaf(node) and (node.last_access, node.id) not in filed:
        findings.append(f"node {node.id}: an evictable leaf missing from the eviction heap")
    fmt = tree.key_format
    packed, u32 = _packed(node.key, fmt)
    if node.packed != packed:
        findings.append(f"node {node.id}: packed key disagrees with its key")
    if node.digest_bytes is not None:
        if parent.parent is not None and parent.digest_bytes is None:
            findings.append(f"node {node.id}: hashed under an unhashed parent")
            return
        if parent.parent is None:
            prior = hashing.prior_digest(node.namespace)
        else:
            prior = parent.digest_bytes[-32:] if parent.digest_bytes else b""
        if node.digest_bytes != _chain(prior, u32(), p):
            findings.append(f"node {node.id}: page hashes do not chain from its parent")


def audit(
    tree: RadixTree,
    outside: Mapping[ComponentType, Sequence[torch.Tensor]] | None = None,
    nodes: Sequence[TreeNode] | None = None,
) -> None:
    """Audit `tree`; `outside` holds, per component, slots legitimately held outside it;
    `nodes` is ``list(tree.nodes())`` when the caller listed them for this audit."""
    outside = outside or {}
    findings: list[str] = []
    if nodes is None:
        nodes = list(tree.nodes())
    if tree.node_count != len(nodes):
        findings.append(f"node count {tree.node_count} != {len(nodes)} nodes in the tree")
    filed = {(stamp, nid) for stamp, nid, _ in tree.evict_heap}
    host: list[torch.Tensor] = []
    kinds = frozenset(c.component_type for c in tree.components)
    for node in nodes:
        _check_node(tree, node, filed, findings, kinds)
        if node.host is not None:
            host.append(node.host)
    for c in tree.components:
        c.audit_pool(nodes, outside.get(c.component_type, ()), findings)
    if tree.host_allocator is not None:
        host_pages = page_ids(host, tree.page_size)
        check_conservation("host", host_pages, tree.host_allocator.allocated_page_list(), findings)
    if findings:
        raise TreeConsistencyError(findings)
