"""Node residency: the `node_residency` spec bound to `TreeNode`.

A node's residency is one string in `TreeNode.residency`, the configuration of the
parallel regions of ``specs/node_residency.toml`` (device / external / backup, and
one region per separately evictable component, fired by that component's hooks).
It changes only through `Residency.fire`, i.e. through an executor; reads go through
the precomputed sets below (one frozenset membership test each), so the derived
flags (`external_cache_stored`, `backuped`, `evicted`) cost nothing.

- `ResidencyTrigger` — the spec's triggers as an enum, generated from the spec
  (`unicache_fsm.spec_enums`, re-exported here; checked again when the executor is bound).
- `Residency(kind)` — the executor for tree nodes, compiled (default) or reference.
- `RESIDENT`, `EVICTED`, `STORED`, `OFFLOADING`, `BACKED_UP`, `BACKING_UP` — the
  configurations in which that state is active; `configs_where(path)` gives the same
  set for any state (components compute theirs with it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.flat import flatten
from unicache_fsm.fsm.loader import bundled_spec
from unicache_fsm.fsm.reference import ReferenceExecutor

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode
from unicache_fsm.spec_enums import ResidencyTrigger

__all__ = [
    "BACKED_UP",
    "BACKING_UP",
    "EVICTED",
    "INITIAL",
    "OFFLOADING",
    "RESIDENT",
    "STORED",
    "ExecutorKind",
    "Residency",
    "ResidencyTrigger",
    "configs_where",
]

MACHINE = "node_residency"


class ExecutorKind(str, enum.Enum):
    COMPILED = "compiled"
    REFERENCE = "reference"


_FLAT = flatten(bundled_spec(MACHINE))


def configs_where(path: str) -> frozenset[str]:
    """Every configuration in which the state at dotted `path` is active."""
    if _FLAT.spec.state(path) is None:
        msg = f"{MACHINE} has no state {path!r}"
        raise ValueError(msg)
    return frozenset(c for c in _FLAT.configs if _FLAT.is_active(c, path))


INITIAL = _FLAT.initial
RESIDENT = configs_where("device.resident")
EVICTED = configs_where("device.evicted")
STORED = configs_where("external.stored")
OFFLOADING = configs_where("external.offloading")
BACKED_UP = configs_where("backup.backed_up")
BACKING_UP = configs_where("backup.backing_up")


class Residency:
    """Fires residency triggers at tree nodes through one shared executor."""

    __slots__ = ("executor", "on_fire")

    def __init__(
        self,
        kind: ExecutorKind = ExecutorKind.COMPILED,
        on_fire: Callable[[TreeNode], None] | None = None,
    ) -> None:
        """`on_fire(node)` runs after every trigger fired at a node (the tree keeps its
        evictable-leaf order with it). Held as data, not in a closure, so a deep copy
        of a tree (a search's snapshot) calls the copy's own hook."""
        from unicache_fsm.tree.node import TreeNode  # node imports this module's sets

        cls: type[Executor] = (
            CompiledExecutor if kind is ExecutorKind.COMPILED else ReferenceExecutor
        )
        self.executor = cls(
            MACHINE, TreeNode, state_attribute="residency", triggers=ResidencyTrigger
        )
        self.on_fire = on_fire

    def fire(self, node: TreeNode, trigger: str, /, *args: Any, **kw: Any) -> None:
        """Fire `trigger` at `node`, then `on_fire(node)`."""
        self.executor.fire(node, trigger, *args, **kw)
        if self.on_fire is not None:
            self.on_fire(node)

    def initialize(self, node: TreeNode, like: TreeNode | None = None) -> None:
        self.executor.initialize(node, like)
