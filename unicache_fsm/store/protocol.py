"""The external-store protocol: what the linker asks of any KV-store backend.

A store holds page bytes filed under (pool, page hash). It reads device pages from the
attached KV pools on OFFLOAD and writes stored pages into reserved device slots on LOAD;
both are asynchronous: calls queue work, completions are popped later, in FIFO order.

Primitives, in the order a caller uses them (one line each, with the contract):

- `attach(pools)` — the page devices (by `PoolName`) the store reads from and writes
  into: any object satisfying `unicache_fsm.pools.device.PageDevice` (a `KVPool`, or
  SGLang's own K/V buffers behind an adapter), every one of the same page size P; else
  `StoreConfigError` naming the pool and what it lacks. Pages move in the store's page
  format (P rows x layers x width, each layer's K then V); host bytes in transit per
  load batch or offload stay within the store's `staging_bytes` budget
  (`unicache_fsm.store.staging`).
- `lookup(rid, transfers) -> list[int]` — every restorable prefix length in pages,
  ascending, tail-relative (1..n); the rules are in `unicache_fsm.store.lookup`. Sparse
  sets are normal (an SWA window stored only at offloaded node ends).
- `load(rid, transfers) -> bool` — validate (keys, whole-page int64 indices inside the
  attached pool, ``len(indices) == len(keys) * P``; typed error and nothing queued
  otherwise) and queue; False = refused (the rid is queued, or in flight: started and
  its batch's result not yet popped; or a key is no longer present).
- `start_loading() -> int` — move every queued load into one batch; the batch id, or -1
  when nothing was queued.
- `loaded_layers(batch) -> dict[PoolName, int]` — for a started batch, how many
  leading layers of each of its pools are written into every slot of the batch:
  monotonic; every pool's `num_layers` once the batch completed successfully; a failed
  batch never reports a layer it did not write. A batch staged whole is written
  layer-major (every page verified first, then layer 0 of every transfer, then layer
  1, ...), so the count rises layer by layer; a batch larger than the staging budget
  is written chunk by chunk and jumps to full at its successful completion. The store
  answers for a batch until its result is popped and for at least the last batch
  popped (a `BaseStore`: its last `history`); a batch the store never started (or has
  forgotten): `StoreBatchUnknownError`, a `LookupError`.
- `num_completed_loads() -> int`, `pop_completed_load() -> LoadBatchResult` — one
  result per batch, FIFO; ``success`` is False when any page of the batch was missing
  or failed its checksum (then nothing of the batch may be trusted: bytes may have been
  written into the reserved slots, which the caller frees).
- `cancel_queued_load(rid) -> bool` — True when a queued (not started) load was
  cancelled; False otherwise (unknown rid, or already started).
- `offload(transfers) -> bool` — validate and queue the persistence of device pages and
  their keys; False = refused (nothing queued, nothing will complete).
- `num_completed_offloads() -> int`, `pop_completed_offload() -> bool` — one success
  flag per accepted offload, in submission order.
- `progress() -> int` — drive completions. A synchronous store performs every started
  load batch and every queued offload now and records their completions; a store with
  a background worker only waits until it is idle. Returns the number of jobs (load
  batches and offloads) it saw finish.
- `evict(keys, pool=None) -> int` — store-side eviction of pages (capacity limits,
  fault injection, tests); all pools when `pool` is None; returns pages removed.
- `contains(pool, key) -> bool` — a cheap presence check, for tests and invariants.
- `reset()` — quiesce: every queued or started load completes as failed, every pending
  offload completes as failed; nothing is queued or in flight afterwards; stored pages
  stay. Completions already recorded stay poppable.
- `close()` — `reset()`, then release resources; any further call raises
  `StoreClosedError` (a second `close()` is a no-op).

Value type: `LoadBatchResult(batch, rids, success)`.

Faults (what a caller may rely on, and what it must survive; the linker's side is
`unicache_fsm.store.checked` and `unicache_fsm.linker.quarantine`): any exception from a
call, of any type, and any answer of the wrong type (a verdict that is not a bool, None
for a list, rids that are not a tuple of str, an unknown batch id, a count no job backs)
is a fault of that call. A conforming store's call that raises has changed nothing in
it — except a pop, which consumed its completion whatever it answered, and `load` /
`cancel_queued_load` / `start_loading`, whose effect the caller cannot tell. The caller
counts a faulty `lookup` as a miss, `load` / `offload` as refused, and a faulty
completion as a failure of the job it may belong to — but it never frees or reuses
device slots the store may still write or read on the strength of a faulty answer:
only the store's own well-formed completion for that job, or a `reset` / `close` that
returned, ends it (until then the caller quarantines those slots).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs

from unicache_fsm.pools.device import PageDevice
from unicache_fsm.pools.transfer import PoolName, PoolTransfer

__all__ = ["ExternalStore", "LoadBatchResult"]


@attrs.frozen
class LoadBatchResult:
    """The completion of one load batch: its id, its loads' rids, and the verdict."""

    batch: int
    rids: tuple[str, ...]
    success: bool


@runtime_checkable
class ExternalStore(Protocol):
    """An asynchronous KV-page store; see the module docstring for each contract."""

    def attach(self, pools: Mapping[PoolName, PageDevice]) -> None: ...

    def lookup(self, rid: str, transfers: Sequence[PoolTransfer]) -> list[int]: ...

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool: ...

    def start_loading(self) -> int: ...

    def loaded_layers(self, batch: int) -> dict[PoolName, int]: ...

    def num_completed_loads(self) -> int: ...

    def pop_completed_load(self) -> LoadBatchResult: ...

    def cancel_queued_load(self, rid: str) -> bool: ...

    def offload(self, transfers: Sequence[PoolTransfer]) -> bool: ...

    def num_completed_offloads(self) -> int: ...

    def pop_completed_offload(self) -> bool: ...

    def progress(self) -> int: ...

    def evict(self, keys: Sequence[str], pool: PoolName | None = None) -> int: ...

    def contains(self, pool: PoolName, key: str) -> bool: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...
