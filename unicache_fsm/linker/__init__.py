"""The linker: the external linker (`unicache_fsm.linker.linker.ExternalLinker`, also
`unicache_fsm.ExternalLinker`), its load and offload records (`load`, `offload`), and
rank agreement (`ranks`).

`ExternalLinker` is composed in `linker.py` from one module per concept over the state
of `state.py`: `matching` (LOOKUP), `loading` (LOAD + PREPARE), `landing` (batches,
LAND, COMMIT), `aborting` (a load that ends without COMMIT), `offloading`, `lifecycle`
(reset, close, drain), `audit` (what it holds); `quarantine` holds slots a misbehaving
store may still touch.

This package module stays light (no tree import): it re-exports the transfer descriptors from
`unicache_fsm.pools.transfer` (PoolName, PoolHitPolicy, PoolTransfer, PoolTransferResult,
LinkerTransferPhase, ExternalLinkerLoadPhase) and the rank-agreement names from
`unicache_fsm.linker.ranks` (RankGroup and its implementations, `intersect_restorable`,
`agree`).
"""

from __future__ import annotations

from unicache_fsm.linker.ranks import (
    RankGroup,
    RankGroupError,
    SingleRank,
    ThreadRankGroup,
    TorchDistRankGroup,
    agree,
    intersect_restorable,
)
from unicache_fsm.pools.transfer import (
    ExternalLinkerLoadPhase,
    InvalidPageKeyError,
    LinkerTransferPhase,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
    check_page_key,
)

__all__ = [
    "ExternalLinkerLoadPhase",
    "InvalidPageKeyError",
    "LinkerTransferPhase",
    "PoolHitPolicy",
    "PoolName",
    "PoolTransfer",
    "PoolTransferResult",
    "RankGroup",
    "RankGroupError",
    "SingleRank",
    "ThreadRankGroup",
    "TorchDistRankGroup",
    "agree",
    "check_page_key",
    "intersect_restorable",
]
