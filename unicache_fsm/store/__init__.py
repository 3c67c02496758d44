"""External KV stores: the protocol every backend speaks, the embedded memory store, the
store-side machines, the LOOKUP rules, and a fault-injection wrapper for any store.

One concept per module, each listing its primitives and their contracts:
`protocol` (`ExternalStore`, `LoadBatchResult`), `lookup` (restorable-prefix rules),
`requests` (attached pools, request validation), `jobs` (store-side load/offload
records and their machines), `memory` (`MemoryStore`), `faults` (`FaultyStore`,
`FaultPolicy`, `FaultKind`), `errors`.
"""

from __future__ import annotations

from unicache_fsm.store.errors import (
    FaultPolicyError,
    NoCompletionError,
    StoreClosedError,
    StoreConfigError,
    StoreError,
    StoreFaultError,
    StoreStateError,
    StoreTransferError,
    UnknownPoolError,
)
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule, FaultyStore
from unicache_fsm.store.jobs import (
    LOAD_MACHINE,
    OFFLOAD_MACHINE,
    StoreLoad,
    StoreLoadState,
    StoreLoadTrigger,
    StoreOffload,
    StoreOffloadState,
    StoreOffloadTrigger,
)
from unicache_fsm.store.lookup import lookup_result, restorable_prefix_pages
from unicache_fsm.store.memory import MemoryStore, PageHeader
from unicache_fsm.store.protocol import ExternalStore, LoadBatchResult

__all__ = [
    "LOAD_MACHINE",
    "OFFLOAD_MACHINE",
    "ExternalStore",
    "FaultKind",
    "FaultPolicy",
    "FaultPolicyError",
    "FaultRule",
    "FaultyStore",
    "LoadBatchResult",
    "MemoryStore",
    "NoCompletionError",
    "PageHeader",
    "StoreClosedError",
    "StoreConfigError",
    "StoreError",
    "StoreFaultError",
    "StoreLoad",
    "StoreLoadState",
    "StoreLoadTrigger",
    "StoreOffload",
    "StoreOffloadState",
    "StoreOffloadTrigger",
    "StoreStateError",
    "StoreTransferError",
    "UnknownPoolError",
    "lookup_result",
    "restorable_prefix_pages",
]
