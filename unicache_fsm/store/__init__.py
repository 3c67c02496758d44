"""External KV stores: the protocol every backend speaks, the backends (memory, file,
Redis), the store-side machines, the LOOKUP rules, and a fault-injection wrapper.

One concept per module, each listing its primitives and their contracts:
`protocol` (`ExternalStore`, `LoadBatchResult`), `lookup` (restorable-prefix rules),
`requests` (attached page devices, request validation), `staging` (bounded host
staging, layer-major writes), `jobs` (store-side load/offload
records and their machines), `base` (`BaseStore`: queues, completions, worker, chain
books shared by every backend), `memory` (`MemoryStore`), `shared` (`SharedStore`: the
medium-independent half of the persistent stores), `pageformat` (their page header and
checksum), `file` (`FileStore`), `redis` (`RedisStore`; needs redis-py, imported on
first use), `spec` (`open_store("memory" | "file:DIR" | "redis://HOST:PORT")`),
`faults` (`FaultyStore`, `FaultPolicy`, `FaultKind`), `checked` (`CheckedStore`: every
answer checked, every fault of a call contained), `errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unicache_fsm.store.checked import CheckedStore
from unicache_fsm.store.errors import (
    FaultPolicyError,
    NoCompletionError,
    StoreBatchUnknownError,
    StoreClosedError,
    StoreConfigError,
    StoreError,
    StoreFaultError,
    StoreProtocolError,
    StoreStateError,
    StoreTransferError,
    StoreUnavailableError,
    UnknownPoolError,
)
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule, FaultyStore
from unicache_fsm.store.file import FileStore
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
from unicache_fsm.store.spec import open_store

if TYPE_CHECKING:
    from unicache_fsm.store.redis import RedisStore

__all__ = [
    "LOAD_MACHINE",
    "OFFLOAD_MACHINE",
    "CheckedStore",
    "ExternalStore",
    "FaultKind",
    "FaultPolicy",
    "FaultPolicyError",
    "FaultRule",
    "FaultyStore",
    "FileStore",
    "LoadBatchResult",
    "MemoryStore",
    "NoCompletionError",
    "PageHeader",
    "RedisStore",
    "StoreBatchUnknownError",
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
    "StoreProtocolError",
    "StoreStateError",
    "StoreTransferError",
    "StoreUnavailableError",
    "UnknownPoolError",
    "lookup_result",
    "open_store",
    "restorable_prefix_pages",
]


def __getattr__(name: str) -> Any:
    if name == "RedisStore":  # redis-py is optional: imported on first use
        from unicache_fsm.store.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
