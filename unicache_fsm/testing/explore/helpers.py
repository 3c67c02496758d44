"""The helpers an operation's statement calls, so the printed counterexample tests too.

- `reverify(s)` — the LOOKUP that demotes every stored node the store lost pages of.
- `node_at(s, tokens)` — the tree node whose path from the root spells `tokens` (a
  `LookupError` when none does).
- `corrupt(s, key)` — flip the first bytes of a KV page the memory store holds.
- `path_key(node)` — the tokens of a node's path from the root (how operations and
  canonical forms name a node independently of its identity).
"""

from __future__ import annotations

from collections.abc import Sequence

from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.serving.system import System
from unicache_fsm.tree.node import TreeNode


def corrupt(s: System, key: str) -> None:
    """Flip the first bytes of the KV page `key` the memory store holds (a bad disk)."""
    view = s.memory.stored_bytes(PoolName.KV, key)
    assert view is not None, f"the store holds no KV page {key!r}"
    view[:8] ^= 0xFF


def reverify(s: System) -> None:
    """The LOOKUP that demotes every stored node the store lost pages of."""
    for node in s.stored_nodes():
        s.linker.verify_stored(node)


def node_at(s: System, tokens: Sequence[int]) -> TreeNode:
    """The tree node whose path from the root spells exactly `tokens`."""
    want = tuple(tokens)
    for node in s.tree.nodes():
        if node.end == len(want) and path_key(node) == want:
            return node
    msg = f"no tree node ends at {want}"
    raise LookupError(msg)


def path_key(node: TreeNode) -> tuple[int, ...]:
    key: tuple[int, ...] = ()
    for n in node.path_from_root():
        key += tuple(n.key)
    return key
