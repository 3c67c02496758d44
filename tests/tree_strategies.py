"""Helpers and strategies shared by the tree tests (tests/test_tree_*.py).

- `PAGE_SIZES`, `page_pattern(i, P)`, `build_key(pattern_ids, P)`: keys made of a
  few page patterns, so random keys share prefixes and diverge at page boundaries
  (patterns 0 and 1 differ only in their last token, which exercises the common-prefix
  search inside a page).
- `key_patterns`: lists of pattern ids (biased to pattern 0: long shared prefixes).
- `NAMESPACES`: no namespace and two tenant seeds.
- `page_keys(ns, key, P)`: the identity of each whole page of a key in a tree: the
  namespace and the token prefix up to the page's end.
- `tree_pages(tree)`: every page the tree holds, with its slots and its node.
- `node_page_keys(node, P)`: the page identities of one node.
- `TreeSnapshot` / `tree_snapshot(tree)`: everything observable about a tree and its
  allocator, to show that a refused call changed nothing.
- `slots(values)`: an int64 slot tensor.
- `request_slots(alloc, n, first, swa_bound)` / `serve(tree, key, ...)`: what a
  scheduler does for one request (allocate its tail, map and trim its SWA; match,
  lock, insert, unlock).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from hypothesis import strategies as st

from unicache_fsm.hashing import namespace_seed
from unicache_fsm.pools import SWAAllocator
from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.tree import InsertParams, InsertResult, RadixTree, TreeNode

FULL, SWA = ComponentType.FULL, ComponentType.SWA

PAGE_SIZES = (1, 4, 16)
NS_A = namespace_seed(cache_salt="tenant-a")
NS_B = namespace_seed(extra_key="tenant-b")
NAMESPACES = (None, NS_A, NS_B)

PageKey = tuple[str | None, tuple[int, ...]]


def page_pattern(i: int, page_size: int) -> tuple[int, ...]:
    """Page pattern `i`: 0 and 1 share all but the last token (when P > 1)."""
    if page_size == 1:
        return (i + 1,)
    if i == 0:
        return (1,) * page_size
    if i == 1:
        return (1,) * (page_size - 1) + (2,)
    return (i + 1,) * page_size


def key_of(n: int, base: int = 1) -> tuple[int, ...]:
    """`n` distinct tokens ``base, base + 1, ...``."""
    return tuple(range(base, base + n))


def build_key(pattern_ids: Sequence[int], page_size: int) -> tuple[int, ...]:
    return tuple(t for i in pattern_ids for t in page_pattern(i, page_size))


def key_patterns(max_pages: int = 6) -> st.SearchStrategy[list[int]]:
    return st.lists(st.sampled_from((0, 0, 0, 1, 1, 2)), min_size=1, max_size=max_pages)


namespaces = st.sampled_from(NAMESPACES)


def slots(values: Sequence[int] | torch.Tensor) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.to(torch.int64)
    return torch.tensor(list(values), dtype=torch.int64)


def page_keys(ns: str | None, key: Sequence[int], page_size: int) -> list[PageKey]:
    key = tuple(key)
    return [(ns, key[: (j + 1) * page_size]) for j in range(len(key) // page_size)]


def node_tokens(node: TreeNode) -> tuple[int, ...]:
    """The full token prefix from the root to the end of `node`."""
    return tuple(t for n in node.path_from_root() for t in n.key)


def node_page_keys(node: TreeNode, page_size: int) -> list[PageKey]:
    tokens = node_tokens(node)
    return [
        (node.namespace, tokens[: node.start + (j + 1) * page_size])
        for j in range(len(node.key) // page_size)
    ]


@attrs.frozen
class PageInfo:
    """One page of a tree: its FULL slots (None when evicted), node and index in it."""

    slots: tuple[int, ...] | None
    node: TreeNode = attrs.field(repr=False)
    index: int

    def last_of_node(self, page_size: int) -> bool:
        return (self.index + 1) * page_size == len(self.node.key)


def tree_pages(tree: RadixTree) -> dict[PageKey, PageInfo]:
    """Every page in the tree, keyed by (namespace, token prefix up to the page's end)."""
    p = tree.page_size
    out: dict[PageKey, PageInfo] = {}
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(c, ()) for c in tree.root.children.values()]
    while stack:
        node, prefix = stack.pop()
        tokens = prefix + node.key
        full = None if node.slots(FULL) is None else node.slots(FULL).tolist()
        for j in range(len(node.key) // p):
            end = len(prefix) + (j + 1) * p
            page = None if full is None else tuple(full[j * p : (j + 1) * p])
            out[(node.namespace, tokens[:end])] = PageInfo(page, node, j)
        stack.extend((c, tokens) for c in node.children.values())
    return out


@attrs.frozen
class NodeRecord:
    id: int
    parent: int
    start: int
    key: tuple[int, ...]
    full: tuple[int, ...] | None
    swa: tuple[int, ...] | None
    host: tuple[int, ...] | None
    hashes: tuple[str, ...] | None
    residency: str
    lock_ref: int
    hit_count: int


@attrs.frozen
class TreeSnapshot:
    nodes: tuple[NodeRecord, ...]
    free_pages: tuple[int, ...]
    swa_free_pages: tuple[int, ...]
    mapping: tuple[int, ...]


def _t(x: torch.Tensor | None) -> tuple[int, ...] | None:
    return None if x is None else tuple(x.tolist())


def tree_snapshot(tree: RadixTree) -> TreeSnapshot:
    """(node ids, keys, slots, residency, lock_refs, ...) plus the allocator's state."""
    records = []
    for n in tree.nodes():
        assert n.parent is not None
        records.append(
            NodeRecord(
                n.id,
                n.parent.id,
                n.start,
                n.key,
                _t(n.slots(FULL)),
                _t(n.slots(SWA)),
                _t(n.host),
                None if n.hashes is None else tuple(n.hashes),
                n.residency,
                n.lock_ref,
                n.hit_count,
            )
        )
    alloc = tree.allocator
    if isinstance(alloc, SWAAllocator):
        swa_free = tuple(alloc.swa_free_page_ids().tolist())
        mapping = tuple(alloc.full_to_swa_mapping.tolist())
    else:
        swa_free, mapping = (), ()
    return TreeSnapshot(
        tuple(sorted(records, key=lambda r: r.id)),
        tuple(alloc.free_page_ids().tolist()),
        swa_free,
        mapping,
    )


def in_tree(node: TreeNode) -> bool:
    """Whether `node` is still part of its tree (resident or evicted, not deleted)."""
    return node.device_resident or node.evicted


def ranges_of(flags: Sequence[bool], page_size: int) -> list[tuple[int, int]]:
    """Maximal runs of true pages as half-open token ranges."""
    out: list[tuple[int, int]] = []
    for j, flag in enumerate(flags):
        if not flag:
            continue
        start, end = j * page_size, (j + 1) * page_size
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def request_slots(
    alloc: object, first: int, n: int, swa_bound: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh FULL slots for tokens ``[first, n)`` and, with an `SWAAllocator`, mapped
    SWA slots of which those below `swa_bound` are freed again (the request's window
    moved past them). Returns (FULL slots, the SWA slots still held)."""
    from unicache_fsm.pools import PagedAllocator

    assert isinstance(alloc, PagedAllocator | SWAAllocator)
    full = alloc.alloc(n - first)
    assert full is not None, "test pool too small"
    if not isinstance(alloc, SWAAllocator):
        return full, torch.empty(0, dtype=torch.int64)
    swa = alloc.alloc_swa(n - first)
    assert swa is not None, "test SWA pool too small"
    alloc.set_full_to_swa_mapping(full, swa)
    drop = min(max(0, swa_bound - first), n - first)
    if drop:
        alloc.free_swa(swa[:drop])
    return full, swa[drop:]


def serve(
    tree: RadixTree,
    key: Sequence[int],
    *,
    namespace: str | None = None,
    chunked: bool = False,
    swa_bound: int = 0,
) -> InsertResult:
    """One request the way a scheduler runs it: match, lock, alloc the tail, insert
    with ``prev_prefix_len`` = the match, unlock."""
    key = tuple(key)
    m = tree.match_prefix(key, namespace)
    tree.inc_lock_ref(m.last_device_node)
    fresh, _ = request_slots(tree.allocator, m.prefix_len, len(key), swa_bound)
    result = tree.insert(
        InsertParams(
            key,
            torch.cat([m.device_indices, fresh]),
            prev_prefix_len=m.prefix_len,
            swa_evicted_seqlen=swa_bound,
            chunked=chunked,
            track_adopted_ranges=True,
            namespace=namespace,
        )
    )
    tree.dec_lock_ref(m.last_device_node)
    return result
