"""`StoreLinker`: SGLang 0.5.23's linker interface over any store of this project.

Built by SGLang's own factory from the launch flags (``docs/sglang.md``):
``StoreLinker(server_args, params, *, components, extra_config, forward_stream)``
validates ``extra_config`` (`settings.StoreLinkerSettings`), serves the cache's KV pool
(and the SWA half of an `SWAKVPool` when SWA is a component), opens the store it names
(``memory``, ``file:DIR``, ``redis://HOST:PORT[/DB]``) under the namespace bound to the
model identity (`identity.ModelIdentity`), and attaches SGLang's own per-layer buffers
to it (`buffers.LayerBuffers`). A key, a store or a pool it cannot use is a
`LinkerConfigError`, one line, raised at construction. ``StoreLinker.from_store(store,
pools)`` serves SGLang pools from a store built by hand (tests, embedding).

No mirror: an offload's pages are read by the store from SGLang's K and V buffers (every
layer) into the store's page format, a load's verified pages are written by the store
straight into the request's reserved slots, layer by layer. The linker owns no KV-sized
tensor.

The calls:

- `lookup` — the store's restorable boundaries (tail-relative pages).
- `load` — queues a store load into the request-private slots and opens them for the
  store's writes (the gate of `buffers`).
- `start_layer_wise_loading` — starts every queued load as one store batch and returns
  its `layer_done_counter` index. The forward's `wait_until(layer)` drives the store
  until that layer landed (the store's per-layer progress) or the batch failed; every
  wait is bounded by ``load_timeout_s``, past which the batch fails.
- `finish_layer_wise_loading(index)` — waits (bounded) for the batch's own completion
  and answers whether every layer landed; either way the batch's slots are closed to the
  store before it returns, so SGLang may free and reuse them: a write the store makes
  later is refused, never lands in another request's KV.
- `cancel_queued_load` — the store's answer (True only for a load not started).
- `offload` — opens the node's slots for the store's reads and queues the store's
  offload; `num_completed_offloads` drives the store and counts its completions;
  `pop_completed_offload` hands SGLang the oldest verdict and closes that offload's
  slots (SGLang unlocks the node next).
- `reset` — quiesces the store and discards every completion and every job in flight;
  `close` resets, detaches the trace and closes the store (unless ``close_store=False``).

No store call raises into SGLang (every call goes through a `CheckedStore`; faults are
counted in `faults`), every completion loop pops at most what can be in flight, and a
batch whose completion is faulty, missing or unproven answers "not landed" (SGLang
aborts its requests, which recompute). Slots the store may still touch after it broke
the protocol are fenced (`fence.Fence`) — no later load or offload of this store may use
them — until the store's own completion or a reset (`fenced()`); see
``docs/contract.md``, "Stores can lie".

Its loads and offloads are the store's own machines (`specs/store_load.toml`,
`specs/store_offload.toml`): `counter` counts them (`coverage()`), and with `trace` they
are written to that JSONL file — per rank when the deployment has more than one
(`identity.Placement.per_rank`: ``linker.tp0.pp1.cp0.jsonl`` for ``linker.jsonl``), as
every rank is launched with the same JSON. Only its own store's jobs are observed (the
job machines are process-wide; a job's transfers name the devices it moves). A trace
write that fails (a full disk) stops the trace, is logged and kept in `trace_error`, and
never reaches SGLang's scheduler.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from sglang.srt.mem_cache.hicache_storage import PoolName as SglangPoolName
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.executor import Observer
from unicache_fsm.fsm.trace import GuardedTrace, TraceRecorder, TransitionCounter, attach
from unicache_fsm.integrations.errors import LinkerConfigError, UnknownBatchError
from unicache_fsm.integrations.sglang.buffers import POOLS, Access, LayerBuffers, halves
from unicache_fsm.integrations.sglang.counter import LayerCounter, LayerMap
from unicache_fsm.integrations.sglang.fence import Fence, Release, Rows, rows_of
from unicache_fsm.integrations.sglang.identity import ModelIdentity, Placement
from unicache_fsm.integrations.sglang.settings import DEFAULT_LOAD_TIMEOUT_S, StoreLinkerSettings
from unicache_fsm.pools.transfer import PoolHitPolicy, PoolName, PoolTransfer
from unicache_fsm.store.checked import CheckedStore
from unicache_fsm.store.errors import StoreConfigError, StoreProtocolError
from unicache_fsm.store.jobs import LOAD_MACHINE, OFFLOAD_MACHINE
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.store.spec import open_store

__all__ = ["StoreLinker"]

#: indices of empty batches kept for a `finish` that SGLang never sends for them
EMPTY_KEPT = 64

#: completions a store may report beyond the batches the linker knows in flight (one
#: started by a `start_loading` whose answer was lost); more is a miscount, a fault
COUNT_SLACK = 2

#: longest pause between two polls of a store while a wait is bounded by a deadline
POLL_MAX_S = 0.005

#: one job's gate permits: (pool, page ids) it opened
Permits = list[tuple[PoolName, torch.Tensor]]


def _ours(transfers: Sequence[Any]) -> list[PoolTransfer]:
    out = []
    for t in transfers:
        name = POOLS.get(getattr(t.name, "value", t.name))
        if name is None:
            msg = f"a {t.name!r} transfer reached StoreLinker, which serves {', '.join(POOLS)}"
            raise LinkerConfigError(msg, argument="transfers", value=t.name)
        policy = PoolHitPolicy(getattr(t.hit_policy, "value", t.hit_policy))
        idx = t.device_indices
        if idx is not None:
            idx = idx.to(torch.int64)
        out.append(PoolTransfer(name, idx, tuple(t.keys or ()), policy))
    return out


def _layer_map(kvcache: Any, buffers: Mapping[PoolName, LayerBuffers]) -> LayerMap:
    """SGLang's layer ids (the KV pool's ``layer_id - start_layer``) -> (pool, own layer)."""
    mapping = getattr(kvcache, "layers_mapping", None)
    if not mapping:  # one pool: its layers are SGLang's
        return [(PoolName.KV, layer) for layer in range(buffers[PoolName.KV].num_layers)]
    start = int(getattr(kvcache, "start_layer", 0) or 0)
    out: list[tuple[PoolName, int] | None] = []
    for layer in range(int(kvcache.layer_num)):
        local, is_swa = mapping[layer + start]
        name = PoolName.SWA if is_swa else PoolName.KV
        out.append((name, int(local)) if name in buffers else None)
    return out


class _OwnJobs:
    """`observer` called only for store jobs that move one of `devices`: a job's
    transfers name the attached page device they move (`CheckedTransfer.device`), the
    very objects a linker attaches, so its own store's jobs pass through any wrapper
    that forwards `attach`, and another linker's store's jobs do not."""

    __slots__ = ("devices", "observer")

    def __init__(self, observer: Observer, devices: Iterable[object]) -> None:
        self.observer = observer
        self.devices = frozenset(id(d) for d in devices)

    def __call__(self, ex: Any, model: Any, source: str, trigger: str, dest: str) -> None:
        ids = self.devices
        if any(id(getattr(t, "device", None)) in ids for t in getattr(model, "transfers", ())):
            self.observer(ex, model, source, trigger, dest)


class StoreLinker(UnifiedCacheLinker):  # type: ignore[misc]
    """SGLang 0.5.23's linker interface over an `ExternalStore` (module docstring).

    Every store call goes through a `CheckedStore`: an exception or an ill-typed answer
    is a fault of that call (counted in `faults`, the last kept in `last_fault`), never
    raised into SGLang's scheduler (with 0.5.23 that kills the worker).
    """

    def __init__(
        self,
        server_args: Any,
        params: Any,
        *,
        components: Any,
        extra_config: Mapping[str, Any] | None,
        forward_stream: Any = None,
    ) -> None:
        settings = StoreLinkerSettings.parse(extra_config)
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        names = {str(getattr(c, "name", c)) for c in components}
        unserved = sorted(names - {"FULL", "SWA"})
        if unserved:  # SGLang would send their transfers to every call
            msg = f"components {unserved}: StoreLinker serves FULL and SWA only"
            raise LinkerConfigError(msg, argument="components", value=unserved)
        pools: dict[Any, object] = {SglangPoolName.KV: kvcache}
        if "SWA" in names and hasattr(kvcache, "swa_kv_pool"):
            pools[SglangPoolName.SWA] = kvcache
        served = halves(pools)
        buffers = {name: LayerBuffers(name, kv) for name, kv in served.items()}
        page = max(b.page_nbytes for b in buffers.values())
        if settings.staging_bytes < page:
            msg = (
                f"linker_extra_config.staging_bytes {settings.staging_bytes} is smaller than "
                f"one page ({page} bytes in the store's format); give at least that"
            )
            where = "linker_extra_config.staging_bytes"
            raise LinkerConfigError(msg, argument=where, value=settings.staging_bytes)
        identity = ModelIdentity.of(server_args, params, components, served)
        if settings.trace is not None:  # every rank is launched with the one path
            settings = attrs.evolve(settings, trace=Placement.of(params).per_rank(settings.trace))
        self.identity: ModelIdentity | None = identity
        self.namespace: str | None = identity.namespace(settings.namespace)
        where = "linker_extra_config.store"
        try:
            store = open_store(
                settings.store,
                namespace=self.namespace,
                capacity_pages=settings.capacity_pages,
                staging_bytes=settings.staging_bytes,
            )
        except StoreConfigError as exc:  # a spec it cannot open, a medium it cannot reach
            msg = f"{where} {settings.store!r}: {exc}".splitlines()[0]
            raise LinkerConfigError(msg, argument=where, value=settings.store) from None
        try:
            self._setup(store, buffers, pools, settings, close_store=True)
        except StoreConfigError as exc:  # the store cannot serve these pools
            store.close()
            msg = f"{where} {settings.store!r}: {exc}".splitlines()[0]
            raise LinkerConfigError(msg, argument=where, value=settings.store) from None
        except BaseException:
            store.close()
            raise
        self.forward_stream = forward_stream

    @classmethod
    def from_store(
        cls,
        store: ExternalStore,
        pools: Mapping[Any, object],
        *,
        trace: str | Path | None = None,
        close_store: bool = True,
        load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
    ) -> StoreLinker:
        """A linker over `store`, built by hand: `pools` is what SGLang calls
        ``linker.pools`` (``{PoolName.KV: kv_pool}`` for Full only, ``{PoolName.KV:
        swa_kv_pool, PoolName.SWA: swa_kv_pool}`` for Full + SWA); nothing is opened,
        the namespace and the staging budget are the store's own."""
        extra: dict[str, Any] = {"load_timeout_s": load_timeout_s}
        if trace is not None:
            extra["trace"] = str(trace)
        settings = StoreLinkerSettings.parse(extra)
        buffers = {name: LayerBuffers(name, kv) for name, kv in halves(pools).items()}
        self = cls.__new__(cls)
        self.identity = None
        self.namespace = None
        self.forward_stream = None
        self._setup(store, buffers, pools, settings, close_store=close_store)
        return self

    def _setup(
        self,
        store: ExternalStore,
        buffers: dict[PoolName, LayerBuffers],
        pools: Mapping[Any, object],
        settings: StoreLinkerSettings,
        *,
        close_store: bool,
    ) -> None:
        if PoolName.KV not in buffers:
            msg = "pools must hold the KV pool (PoolName.KV), the FULL component's pages"
            raise LinkerConfigError(msg, argument="pools", value=tuple(pools))
        trace = settings.trace
        try:
            self.trace = TraceRecorder(trace) if trace is not None else None
        except (OSError, ValueError) as exc:
            where = "linker_extra_config.trace"
            msg = f"{where} {trace!r}: cannot write it: {exc}"
            raise LinkerConfigError(msg, argument=where, value=trace) from None
        self.buffers = buffers
        store.attach(self.buffers)
        self.settings = settings
        self.store = store
        self.calls = CheckedStore(store, self._fault)
        # a store that runs its jobs on a worker of its own (`BaseStore(background=True)`)
        self._background = getattr(store, "background", False) is True
        self.faults: dict[str, int] = {}  # store faults by call
        self.last_fault: BaseException | None = None
        self.pools = dict(pools)
        self.close_store = close_store
        kvcache = next(iter(pools.values()))
        self.layer_done_counter = LayerCounter(_layer_map(kvcache, self.buffers), self._advance)
        self.counter = TransitionCounter()
        # a failing trace write (a full disk) stops the trace, never the linker call
        self._guard = GuardedTrace(self.trace, "StoreLinker") if self.trace is not None else None
        # the job machines are process-wide: only the jobs that move this linker's
        # buffers (its own store's, whatever wraps the store) reach its observers
        own: list[Observer] = [self.counter]
        if self._guard is not None:
            own.append(self._guard)
        self._observers: list[Observer] = [_OwnJobs(o, self.buffers.values()) for o in own]
        for observer in self._observers:
            attach(observer, LOAD_MACHINE, OFFLOAD_MACHINE)
        self._loads: dict[str, tuple[Rows, Permits]] = {}
        self._queued: list[str] = []
        # counter index -> (store batch id, None when the store's answer was lost or
        # cannot be trusted; its rids), in start order
        self._batches: dict[int, tuple[int | None, list[str]]] = {}
        self._deadlines: dict[int, float] = {}  # counter index -> when its wait ends
        self._results: dict[int, bool] = {}  # store batch -> verdict, popped early
        self._layers_seen: dict[int, dict[PoolName, int]] = {}  # store batch -> layers landed
        self._verdicts: dict[int, bool] = {}  # counter index -> settled verdict
        self._empty: set[int] = set()  # counter indices of batches with nothing to load
        self._fence = Fence()
        # slots of the offloads the store accepted and has not completed, FIFO
        self._offloads: deque[Rows] = deque()
        # read permits of the offloads SGLang holds no verdict for, in its order
        self._reading: deque[Permits] = deque()
        self._ready: deque[bool] = deque()  # verdicts popped, not yet taken by SGLang
        self._unreported = 0  # accepted offloads SGLang has no verdict for yet
        self._closed = False

    def _fault(self, operation: str, error: BaseException) -> None:
        self.faults[operation] = self.faults.get(operation, 0) + 1
        self.last_fault = error

    def _protocol_fault(self, operation: str, value: object, msg: str) -> None:
        self._fault(operation, StoreProtocolError(msg, operation=operation, value=value))

    # -- the gate ------------------------------------------------------------------------

    def _open(self, access: Access, transfers: Sequence[PoolTransfer]) -> Permits | None:
        """Open the transfers' pages for the store's `access`; None (nothing opened)
        when a transfer's slots are not whole pages of its pool."""
        permits: Permits = []
        try:
            for t in transfers:
                if t.device_indices is not None and t.name in self.buffers:
                    pages = self.buffers[t.name].pages_of(t.device_indices, f"{access} slots")
                    permits.append((t.name, pages))
        except Exception as exc:
            self._fault(f"{access} slots", exc)
            return None
        for name, pages in permits:
            self.buffers[name].allow(access, pages)
        return permits

    def _close(self, access: Access, permits: Permits) -> None:
        for name, pages in permits:
            self.buffers[name].revoke(access, pages)

    # -- loads ---------------------------------------------------------------------------

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        ours = _ours(transfers)
        pages = max((len(t.keys) for t in ours if t.name is PoolName.KV), default=0)
        return self.calls.lookup(rid, ours, pages) or []

    def _fenced(self, transfers: Sequence[PoolTransfer]) -> bool:
        """Whether the store may still touch slots of `transfers` (its completions taken
        first: the one that releases them may have come)."""
        if not self._fence.touches(transfers):
            return False
        if self._fence.loads:
            self._take_load_completions()
        return self._fence.touches(transfers)

    def load(self, rid: str, transfers: list[Any]) -> bool:
        ours = _ours(transfers)
        if self._fenced(ours):  # the store may still touch those slots
            return False
        permits = self._open("write", ours)
        if permits is None:
            return False
        if not self.calls.load(rid, ours):
            self._close("write", permits)
            return False
        self._loads[rid] = (rows_of(ours), permits)
        self._queued.append(rid)
        return True

    def _drop_load(self, rid: str) -> Rows:
        """Forget load `rid`: its slots are closed to the store; returns them."""
        rows, permits = self._loads.pop(rid, ([], []))
        self._close("write", permits)
        return rows

    def start_layer_wise_loading(self) -> int:
        batch = self.calls.start_loading()
        index: int = self.layer_done_counter.update_producer()
        self.layer_done_counter.set_consumer(index)
        if batch == -1 and not self._queued:  # nothing to load (SGLang starts every batch)
            self.layer_done_counter.futures.pop(index, None)
            self._empty.add(index)
            if len(self._empty) > EMPTY_KEPT:  # SGLang never finishes them: keep the newest
                self._empty.discard(min(self._empty))
            return index
        rids, self._queued = self._queued, []
        self._deadlines[index] = time.monotonic() + self.settings.load_timeout_s
        if batch == -1:  # the store holds none of them: nothing was started, none lands
            self._batches[index] = (-1, rids)
            return index
        known = {b for b, _ in self._batches.values()} | {k for k, _ in self._fence.loads}
        if batch is not None and batch in known:
            msg = f"start_loading: the store answered batch {batch}, already in flight or fenced"
            self._protocol_fault("start_loading", batch, msg)
            batch = None
        # None: the store may have started them (its answer was lost): they fail, and
        # their slots stay fenced until a reset
        self._batches[index] = (batch, rids)
        return index

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        if counter_index in self._empty:
            self._empty.discard(counter_index)
            return True
        if counter_index not in self._batches and counter_index not in self._verdicts:
            started = tuple(sorted(self._batches))
            msg = (
                f"finish_layer_wise_loading({counter_index!r}): no such batch is loading "
                f"(started and unfinished: {list(started)}); pass an index that "
                "start_layer_wise_loading returned"
            )
            raise UnknownBatchError(msg, index=counter_index, started=started)
        self._settle(counter_index, wait=True)
        landed = self._verdicts.pop(counter_index)
        self.layer_done_counter.finish(counter_index)
        return landed

    def cancel_queued_load(self, rid: str) -> bool:
        if rid not in self._queued or not self.calls.cancel_queued_load(rid):
            return False
        self._drop_load(rid)
        self._queued.remove(rid)
        return True

    def _take_load_completions(self, *, drive: bool = True) -> None:
        """Pop the store's load completions (at most what can be in flight): each ends
        its own batch's wait (`_results`) or releases fenced slots; a faulty or unknown
        one fences the oldest batch in flight (it fails). With `drive` the store is
        driven first (`progress`: a synchronous store runs its jobs there)."""
        calls = self.calls
        if drive:
            calls.progress()
        running = [b for b, _ in self._batches.values() if b is not None and b >= 0]
        limit = len(running) + len(self._fence.loads) + COUNT_SLACK
        for _ in range(calls.bounded("num_completed_loads", calls.num_completed_loads(), limit)):
            result = calls.pop_completed_load()
            if result is not None and self._fence.release(result.batch):
                continue  # the store's own completion of a fenced batch: it is done
            waiting = [(i, b) for i, (b, _) in self._batches.items() if b is not None and b >= 0]
            waiting = [(i, b) for i, b in waiting if b not in self._results]
            if result is not None and any(b == result.batch for _, b in waiting):
                position = [b for _, b in waiting].index(result.batch)
                for index, skipped in waiting[:position]:  # FIFO: the store skipped these
                    msg = f"pop_completed_load: batch {result.batch} completed before {skipped}"
                    self._protocol_fault("pop_completed_load", result, msg)
                    self._distrust(index, skipped)
                index, batch = waiting[position]
                rids = self._batches[index][1]
                if sorted(result.rids) != sorted(rids):
                    msg = (
                        f"pop_completed_load: the completion of batch {batch} names "
                        f"{sorted(result.rids)}, the batch holds {sorted(rids)}"
                    )
                    self._protocol_fault("pop_completed_load", result, msg)
                    self._distrust(index, None)
                else:
                    self._results[batch] = result.success
                continue
            if result is not None:
                msg = f"pop_completed_load: batch {result.batch} is not in flight"
                self._protocol_fault("pop_completed_load", result, msg)
            if waiting:  # a faulty pop, or a completion of no known batch
                index, batch = waiting[0]
                self._distrust(index, batch)

    def _distrust(self, index: int, release: Release) -> None:
        """Batch `index` fails; its slots stay fenced until `release`'s own completion."""
        _, rids = self._batches[index]
        self._batches[index] = (None, rids)
        self._fence.hold(release, [r for rid in rids for r in self._drop_load(rid)])

    def _landed_layers(self, batch: int) -> Mapping[PoolName, int]:
        """The store's per-layer progress of `batch` (pool -> leading layers landed),
        checked; a faulty answer keeps what was known (no layer beyond it is trusted)."""
        counts = {name: b.num_layers for name, b in self.buffers.items()}
        seen = self._layers_seen.get(batch, {})
        got = self.calls.loaded_layers(batch, counts, seen)
        if got is not None:
            self._layers_seen[batch] = seen = got
        return seen

    def _advance(self, index: int, layer: int) -> None:
        """`layer_done_counter.wait_until(layer)` of batch `index`: drive the store
        until that layer landed or the batch settled; past the batch's deadline it
        settles as failed."""
        counter = self.layer_done_counter
        pause = 0.0
        while counter.pending(index, layer):
            if index not in self._batches:
                return  # settled or reset: the counter's futures say what landed
            batch, _ = self._batches[index]
            if batch is None or batch < 0:
                self._settle(index, wait=False)
                return
            # a store with a worker of its own lands layers as it goes: poll it (its
            # `progress` would wait for the whole batch); a synchronous one is driven
            self._take_load_completions(drive=not self._background)
            if batch in self._results:
                self._settle(index, wait=False)
                return
            counter.land(index, self._landed_layers(batch))
            if not counter.pending(index, layer):
                return
            if time.monotonic() >= self._deadlines.get(index, 0.0):
                self._settle(index, wait=False)
                return
            pause = min(POLL_MAX_S, pause * 2 or 0.0001)
            time.sleep(pause)

    def _settle(self, index: int, *, wait: bool) -> None:
        """Decide batch `index`'s verdict (with `wait`, after waiting for the store's
        completion until the batch's deadline) and close its slots to the store."""
        if index in self._verdicts or index not in self._batches:
            return
        pause = 0.0
        while True:
            batch, _ = self._batches[index]
            if batch is None or batch < 0 or batch in self._results:
                break
            self._take_load_completions(drive=not self._background)  # (bounded waits)
            batch, _ = self._batches[index]
            done = batch is None or batch < 0 or batch in self._results
            if done or not wait or time.monotonic() >= self._deadlines.get(index, 0.0):
                break
            pause = min(POLL_MAX_S, pause * 2 or 0.0001)
            time.sleep(pause)
        batch, rids = self._batches.pop(index)
        self._deadlines.pop(index, None)
        if batch is not None:
            self._layers_seen.pop(batch, None)
        if batch is None:  # not to be trusted: slots fenced (until a reset, at least)
            landed = False
            self._fence.hold(None, [r for rid in rids for r in self._drop_load(rid)])
        elif batch == -1:
            landed = False
        elif batch in self._results:
            landed = self._results.pop(batch)
        else:  # the store has not finished it: it may still try to write the slots
            landed = False
            self._fence.hold(batch, [r for rid in rids for r in self._drop_load(rid)])
        for rid in rids:
            self._drop_load(rid)
        counter = self.layer_done_counter
        if landed:
            counter.land_all(index)
        else:
            counter.fail(index, RuntimeError(f"store load batch {batch} failed"))
        self._verdicts[index] = landed

    # -- offloads ------------------------------------------------------------------------

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        ours = _ours(transfers)
        if self._fenced(ours):  # the store may still touch those slots
            return False
        permits = self._open("read", ours)
        if permits is None:
            return False
        if not self.calls.offload(ours):
            # refused, or its reply lost (the store may have queued it): SGLang keeps no
            # lock on the node, so its slots are closed to the store now, and a read of
            # a queued one is refused (that offload fails, storing nothing)
            self._close("read", permits)
            return False
        rows = rows_of(ours)
        if self._fence.owed:  # behind the held ones: completions cannot be told apart
            self._fence.owed.append(rows)
        else:
            self._offloads.append(rows)
        self._reading.append(permits)
        self._unreported += 1
        return True

    def num_completed_offloads(self) -> int:
        """Pop the store's completions now (at most what can be in flight); SGLang takes
        their verdicts with `pop_completed_offload`. After a faulty pop no verdict can
        be matched to its offload: each later one is reported failed, and releases the
        oldest fenced offload's slots."""
        calls = self.calls
        calls.progress()
        fence = self._fence
        limit = len(self._offloads) + len(fence.owed)
        for _ in range(
            calls.bounded("num_completed_offloads", calls.num_completed_offloads(), limit)
        ):
            verdict = calls.pop_completed_offload()
            if verdict is None:  # which offload ended is unknown from here on
                fence.owed.extend(self._offloads)
                self._offloads.clear()
                self._report(False)
            elif fence.owed:
                fence.owed.popleft()  # the store is done with the oldest held one
                self._report(False)
            else:
                self._offloads.popleft()
                self._report(verdict)
        return len(self._ready)

    def _report(self, verdict: bool) -> None:
        if self._unreported > 0:
            self._unreported -= 1
            self._ready.append(verdict)

    def pop_completed_offload(self) -> bool:
        if not self._ready:
            return False
        if self._reading:  # SGLang's oldest pending offload: its node unlocks next
            self._close("read", self._reading.popleft())
        return self._ready.popleft()

    # -- lifecycle -----------------------------------------------------------------------

    def reset(self) -> None:
        """Quiesce the store and discard every completion and every job in flight
        (bounded: at most what can be in flight is popped). A reset of the store that
        returned releases the fence; one that failed fences every slot in flight (a
        batch's own completion, when it comes, still releases its slots). Every slot is
        closed to the store either way."""
        calls = self.calls
        if calls.reset():
            running = sum(1 for b, _ in self._batches.values() if b is not None and b >= 0)
            calls.drain(
                calls.num_completed_offloads,
                calls.pop_completed_offload,
                len(self._offloads) + len(self._fence.owed),
            )
            calls.drain(
                calls.num_completed_loads,
                calls.pop_completed_load,
                running + len(self._fence.loads) + COUNT_SLACK,
            )
            self._fence.clear()
        else:  # not quiesced: fenced until their own completions (or a reset) come
            for index, (batch, _) in list(self._batches.items()):
                self._distrust(index, batch if batch is not None and batch >= 0 else None)
            self._fence.hold(None, [r for rid in list(self._loads) for r in self._drop_load(rid)])
            self._fence.owed.extend(self._offloads)
        for rid in list(self._loads):
            self._drop_load(rid)
        while self._reading:
            self._close("read", self._reading.popleft())
        self._queued.clear()
        self._batches.clear()
        self._deadlines.clear()
        self._results.clear()
        self._layers_seen.clear()
        self._verdicts.clear()
        self._empty.clear()
        self._offloads.clear()
        self._ready.clear()
        self._unreported = 0
        self.layer_done_counter.reset()

    @property
    def trace_error(self) -> OSError | None:
        """Why the trace stopped (a write or flush that failed), if it did."""
        return None if self._guard is None else self._guard.error

    def close(self) -> None:
        if self._closed:
            return
        self.reset()
        self._closed = True
        for observer in self._observers:
            LOAD_MACHINE.remove_observer(observer)
            OFFLOAD_MACHINE.remove_observer(observer)
        if self._guard is not None:
            self._guard.close()
        if self.close_store:
            try:
                self.store.close()
            except Exception as exc:
                self._fault("close", exc)
                return
            self._fence.clear()

    # -- inspection ----------------------------------------------------------------------

    def coverage(self) -> Coverage:
        """The store job transitions this linker's store took (``diagram --coverage``)."""
        return Coverage.from_counter(self.counter)

    def in_flight(self) -> dict[str, int]:
        """What is outstanding: queued loads, unsettled batches, unfinished verdicts."""
        return {
            "loads": len(self._loads),
            "batches": len(self._batches),
            "verdicts": len(self._verdicts),
        }

    def fenced(self) -> int:
        """Jobs whose slots a misbehaving store may still touch: load batches and
        offloads, held until the store's own completion or a reset returns."""
        return len(self._fence)

    def open_pages(self) -> dict[str, int]:
        """Pages open to the store now, by access (the gate of `buffers`)."""
        return {
            access: sum(b.opened(access) for b in self.buffers.values())
            for access in ("read", "write")
        }
