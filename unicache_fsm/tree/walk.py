"""Walking a radix tree of whole pages: how children are filed and how keys compare.

- `child_key(parent, key, pos, namespace, page_size)` — the dict key under which the
  child holding ``key[pos:]`` is filed in `parent.children`: its first page, and at
  the root also the namespace (tenants never share a subtree).
- `common_len(node_key, key, pos, end, page_size)` — the length of the page-aligned
  common prefix of a node's key and ``key[pos:end]``, given that the first page
  matches (it selected the child).
- `check_aligned(what, value, page_size)` — `UnalignedKeyError` unless `value` is a
  page multiple.

Pure functions over nodes and tuples: no tree state, no residency.
"""

from __future__ import annotations

from typing import Any

from unicache_fsm.tree.errors import UnalignedKeyError
from unicache_fsm.tree.node import TreeNode

__all__ = ["check_aligned", "child_key", "common_len"]


def child_key(
    parent: TreeNode, key: tuple[int, ...], pos: int, namespace: str | None, page_size: int
) -> Any:
    page = key[pos : pos + page_size]
    return (namespace, page) if parent.parent is None else page


def common_len(
    node_key: tuple[int, ...], key: tuple[int, ...], pos: int, end: int, page_size: int
) -> int:
    n = len(node_key)
    if end - pos >= n and key[pos : pos + n] == node_key:
        return n
    p = page_size
    lo, hi = 1, min(n, end - pos) // p  # pages; lo pages are known to match
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if key[pos : pos + mid * p] == node_key[: mid * p]:
            lo = mid
        else:
            hi = mid - 1
    return lo * p


def check_aligned(what: str, value: int, page_size: int) -> None:
    if value % page_size:
        msg = (
            f"{what} = {value} is not a multiple of the page size {page_size}; "
            "the tree holds whole pages only"
        )
        raise UnalignedKeyError(msg, what=what, value=value, page_size=page_size)
