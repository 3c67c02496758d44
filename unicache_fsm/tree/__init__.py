"""The unified radix tree: nodes with explicit residency, components, and the audit.

Modules: `params` (value types), `node` (`TreeNode`), `residency` (the node-residency
machine bound to nodes), `walk` (how keys and children compare; `TokenKey`, a key
that keeps its packing), `tree` (`RadixTree`,
`TreeConfig`: match, insert, split) with the rest of `RadixTree` one concept per
module — `state` (shared fields), `locks`, `eviction`, `host` (the host tier),
`offload` (`OffloadTicket`) — `components` (one module per component: FULL, SWA,
MAMBA, each with its tree and external-linker hooks), `audit` (`RadixTree.check`),
`errors`.
"""

from __future__ import annotations

from unicache_fsm.tree.errors import (
    InsertParamsError,
    LockUnderflowError,
    NodeStateError,
    OwnedSlotsError,
    SlotTensorError,
    TreeConfigError,
    TreeConsistencyError,
    TreeError,
    UnalignedKeyError,
    UnsupportedComponentError,
    ValueLengthError,
)
from unicache_fsm.tree.locks import LockReceipt
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.offload import OffloadTicket
from unicache_fsm.tree.params import (
    ComponentType,
    EvictParams,
    EvictResult,
    InsertParams,
    InsertResult,
    MatchResult,
)
from unicache_fsm.tree.residency import ExecutorKind, ResidencyTrigger
from unicache_fsm.tree.tree import RadixTree, TreeConfig
from unicache_fsm.tree.walk import TokenKey

__all__ = [
    "ComponentType",
    "EvictParams",
    "EvictResult",
    "ExecutorKind",
    "InsertParams",
    "InsertParamsError",
    "InsertResult",
    "LockReceipt",
    "LockUnderflowError",
    "MatchResult",
    "NodeStateError",
    "OffloadTicket",
    "OwnedSlotsError",
    "RadixTree",
    "ResidencyTrigger",
    "SlotTensorError",
    "TokenKey",
    "TreeConfig",
    "TreeConfigError",
    "TreeConsistencyError",
    "TreeError",
    "TreeNode",
    "UnalignedKeyError",
    "UnsupportedComponentError",
    "ValueLengthError",
]
