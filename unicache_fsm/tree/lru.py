"""An LRU list of tree nodes: the eviction order a component keeps apart from the
node-wide access stamps (SWA keeps one; a future component may keep its own).

A doubly linked list from the most recently used end (MRU) to the least (LRU),
every operation O(1) except the walks:

- `insert_mru(node)` — `node` (not in the list) becomes the most recent.
- `insert_after(anchor, node)` — `node` (not in the list) goes right behind
  `anchor`, one step less recent (a split-off parent keeps its child's recency).
- `remove(node)` / `contains(node)`.
- `refresh_path(node, budget, include)` — `node` and its ancestors, walking up while
  fewer than `budget` tokens of keys were passed, move to the MRU end in path order
  (`node` most recent, each ancestor right behind the previous one); nodes for which
  `include` is false are passed (their keys count) but not moved.
- `least_recent(skip)` / `more_recent(node, skip)` — the LRU end, or the next node
  towards the MRU end from `node`, passing nodes for which `skip` is true.
- `__iter__` — MRU to LRU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from unicache_fsm.tree.node import TreeNode

__all__ = ["LRUList"]


class LRUList:
    """An eviction order over tree nodes, most to least recently used; O(1) insert,
    remove and membership, the walks bounded by the list's length. Holds each node at
    most once: inserting a node already present is the caller's error (the primitives
    are in the module docstring)."""

    __slots__ = ("_newer", "_older")

    def __init__(self) -> None:
        # _older[x]: the next node towards the LRU end (None at the end); _newer[x]: the
        # next towards the MRU end. The key None stands for the list's own ends.
        self._older: dict[TreeNode | None, TreeNode | None] = {None: None}
        self._newer: dict[TreeNode | None, TreeNode | None] = {None: None}

    def __len__(self) -> int:
        return len(self._older) - 1

    def __contains__(self, node: object) -> bool:
        return node is not None and node in self._older

    def contains(self, node: TreeNode) -> bool:
        return node in self._older

    def __iter__(self) -> Iterator[TreeNode]:
        x = self._older[None]
        while x is not None:
            yield x
            x = self._older[x]

    def _link_after(self, anchor: TreeNode | None, node: TreeNode) -> None:
        """Link `node` right behind `anchor` (None: at the MRU end)."""
        older = self._older[anchor]
        self._older[anchor] = node
        self._older[node] = older
        self._newer[node] = anchor
        self._newer[older] = node

    def _unlink(self, node: TreeNode) -> None:
        older = self._older.pop(node)
        newer = self._newer.pop(node)
        self._older[newer] = older
        self._newer[older] = newer

    def insert_mru(self, node: TreeNode) -> None:
        assert node not in self._older, f"{node!r} is already in the list"
        self._link_after(None, node)

    def insert_after(self, anchor: TreeNode, node: TreeNode) -> None:
        assert anchor in self._older and node not in self._older
        self._link_after(anchor, node)

    def remove(self, node: TreeNode) -> None:
        self._unlink(node)

    def refresh_path(
        self, node: TreeNode, budget: int, include: Callable[[TreeNode], bool]
    ) -> None:
        prev: TreeNode | None = None
        passed = 0
        cur: TreeNode | None = node
        while cur is not None and cur.parent is not None and passed < budget:
            if include(cur):
                assert cur in self._older, f"{cur!r} should be in the list"
                self._unlink(cur)
                self._link_after(prev, cur)
                prev = cur
            passed += len(cur.key)
            cur = cur.parent

    def least_recent(self, skip: Callable[[TreeNode], bool]) -> TreeNode | None:
        return self._walk_newer(self._newer[None], skip)

    def more_recent(self, node: TreeNode, skip: Callable[[TreeNode], bool]) -> TreeNode | None:
        return self._walk_newer(self._newer[node], skip)

    def _walk_newer(self, x: TreeNode | None, skip: Callable[[TreeNode], bool]) -> TreeNode | None:
        while x is not None and skip(x):
            x = self._newer[x]
        return x
