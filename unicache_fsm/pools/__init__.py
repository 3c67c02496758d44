"""Torch pools: paged slot allocators, the SWA allocator with its full->SWA mapping,
and the KV data pools (device and host) that hold the bytes of every slot.

One concept per module: `layout` (page layout, devices), `slots` (slot-tensor
validation), `paged` (`PagedAllocator`), `swa` (`SWAAllocator`), `kv` (`KVPool`),
`host` (`HostKVPool`), `errors`. Each module's docstring lists its primitives and
their contracts. Slots are int64 token-slot ids; a page is P consecutive slots starting
at a multiple of P; page 0 is never handed out; every call takes whole pages and
changes nothing when it raises.
"""

from __future__ import annotations

from unicache_fsm.pools.errors import (
    DeviceMismatchError,
    DeviceUnavailableError,
    DoubleFreeError,
    DuplicatePagesError,
    ForeignSlotsError,
    LengthMismatchError,
    NotPageMultipleError,
    PoolConfigError,
    PoolError,
    SlotsNotAllocatedError,
    TensorShapeError,
    TensorTypeError,
    UnalignedSlotsError,
)
from unicache_fsm.pools.host import HostKVPool
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.layout import PageLayout, resolve_device
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.slots import SlotCodec
from unicache_fsm.pools.swa import SWAAllocator

__all__ = [
    "DeviceMismatchError",
    "DeviceUnavailableError",
    "DoubleFreeError",
    "DuplicatePagesError",
    "ForeignSlotsError",
    "HostKVPool",
    "KVPool",
    "LengthMismatchError",
    "NotPageMultipleError",
    "PageLayout",
    "PagedAllocator",
    "PoolConfigError",
    "PoolError",
    "SWAAllocator",
    "SlotCodec",
    "SlotsNotAllocatedError",
    "TensorShapeError",
    "TensorTypeError",
    "UnalignedSlotsError",
    "resolve_device",
]
