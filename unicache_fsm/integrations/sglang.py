"""SGLang 0.5.23's `UnifiedRadixCache` served by this project's stores, and watched.

Importing this module needs SGLang 0.5.23 (``sglang`` importable, version 0.5.23);
anything else raises `SglangUnavailableError` saying why.

`StoreLinker(store, pools, *, trace=None, close_store=True)` — a real
`UnifiedCacheLinker` that serves SGLang's cache from any `ExternalStore` of this project
(`MemoryStore`, `FileStore`, `RedisStore`, or `open_store(...)`). `pools` is what SGLang
calls ``linker.pools``: ``{PoolName.KV: kv_pool}`` for Full only,
``{PoolName.KV: swa_kv_pool, PoolName.SWA: swa_kv_pool}`` for Full + SWA (the FULL and
the SWA halves of an `SWAKVPool`). The store keeps its own page format, so the linker
keeps a mirror `KVPool` per pool, slot for slot with SGLang's (same size, page size,
dtype, device; one row per token holding every layer's K then V): an offload copies the
node's slots into the mirror and hands those slots to the store; a load lets the store
write the mirror's slots and copies them into SGLang's buffers when its batch settles.
The mirror doubles the KV memory of the pools it serves: the price of speaking the
store's format without changing SGLang's pools. The calls:

- `lookup` — the store's restorable boundaries (tail-relative pages).
- `load` — validates and queues a store load into the request-private slots.
- `start_layer_wise_loading` — starts every queued load as one store batch and returns
  a `layer_done_counter` index. The batch settles (the store finishes it and, when it
  landed, the bytes are copied into SGLang's pools) at the first `wait_until` of a
  layer or at `finish_layer_wise_loading(index)`, which returns the store's verdict.
- `cancel_queued_load` — the store's answer (True only for a load not started).
- `offload` — copies the pages into the mirror and queues the store's offload;
  `num_completed_offloads` drives the store (`progress`) and counts its completions;
  `pop_completed_offload` pops them in submission order.
- `reset` — quiesces the store and discards every completion and every load in
  flight; `close` resets, detaches the trace and closes the store (unless
  ``close_store=False``). Nothing is left behind either way, except the fence below
  when the store's reset or close failed.

No store call raises into SGLang (every call goes through a `CheckedStore`; faults are
counted in `faults`), every completion loop pops at most what can be in flight, and a
batch whose completion is faulty, missing or unproven answers "not landed" (SGLang
aborts its requests, which recompute) while its mirror rows stay fenced — no load or
offload may use them — until the store's own completion or a reset (`fenced()`); see
``docs/contract.md``, "Stores can lie".

Its loads and offloads are the store's own machines (`specs/store_load.toml`,
`specs/store_offload.toml`): `counter` counts them (`coverage()`), and with `trace` they
are written to that JSONL file. The store's job executors are shared by every store of
the process, so the trace holds the jobs of every store running meanwhile. A trace write
or flush that fails (a full disk) stops the trace, is logged and kept in `trace_error`,
and never reaches SGLang's scheduler nor `close()` (`fsm.trace.GuardedTrace`).

`ContractMonitor(linker, *, mode="raise", trace=None)` — a `UnifiedCacheLinker` that
wraps any linker (SGLang's own, a user's, a `StoreLinker`) and drives
`unicache_fsm.integrations.protocol.ProtocolMonitor` from the real calls: an illegal
call order raises `ProtocolViolation` (an `IllegalTransitionError` carrying that load's
or offload's history) before the wrapped linker is called, or, with ``mode="record"``,
logs it and calls through. Every answer of the wrapped linker is checked as it is
(never coerced: a verdict of ``"False"`` is a violation, not a landing) and returned to
the caller unchanged in either mode. With `trace` the protocol machines' transitions go
to that JSONL file (``unicache-fsm check-trace`` accepts it); `coverage()` /
`save_coverage(path)` give what ``unicache-fsm diagram --coverage`` draws.
"""

from __future__ import annotations

import importlib.metadata
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.executor import Observer
from unicache_fsm.fsm.trace import GuardedTrace, TraceRecorder, TransitionCounter, attach
from unicache_fsm.integrations.errors import (
    LinkerConfigError,
    SglangUnavailableError,
    UnknownBatchError,
)
from unicache_fsm.integrations.protocol import ProtocolMonitor
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.transfer import PoolHitPolicy, PoolName, PoolTransfer
from unicache_fsm.store.checked import CheckedStore
from unicache_fsm.store.errors import StoreProtocolError
from unicache_fsm.store.jobs import LOAD_MACHINE, OFFLOAD_MACHINE
from unicache_fsm.store.protocol import ExternalStore

SGLANG_VERSION = "0.5.23"


def _check_sglang_version() -> None:
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        msg = (
            "unicache_fsm.integrations.sglang needs SGLang 0.5.23, and sglang is not "
            "importable in this Python (bash scripts/sglang_env.sh builds a virtualenv "
            "that holds it next to this project)"
        )
        raise SglangUnavailableError(msg) from None
    if version != SGLANG_VERSION:
        msg = (
            f"unicache_fsm.integrations.sglang speaks SGLang {SGLANG_VERSION}'s linker "
            f"protocol; this Python has sglang {version}"
        )
        raise SglangUnavailableError(msg)


_check_sglang_version()
try:
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (
        LayerWiseLoadCounter,
        UnifiedCacheLinker,
    )
except Exception as exc:  # any failure of SGLang's import means: no SGLang here
    msg = f"importing SGLang {SGLANG_VERSION}'s UnifiedCacheLinker failed: {exc!r}"
    raise SglangUnavailableError(msg) from exc

__all__ = ["SGLANG_VERSION", "ContractMonitor", "StoreLinker"]

#: indices of empty batches kept for a `finish` that SGLang never sends for them
_EMPTY_KEPT = 64

#: SGLang's pool names -> this project's (the stores file pages under these)
_POOLS = {"kv": PoolName.KV, "swa": PoolName.SWA}


class _PoolMirror:
    """SGLang's token-major K/V buffers of one pool and a `KVPool` slot for slot."""

    def __init__(self, name: PoolName, kv: Any) -> None:
        keys, values = list(kv.k_buffer), list(kv.v_buffer)
        rows = kv.size + kv.page_size
        for buf in keys + values:
            if buf.dim() < 2 or buf.shape[0] != rows:
                msg = (
                    f"{name} pool: a K/V buffer of shape {tuple(buf.shape)} is not token-major "
                    f"(rows = size + page_size = {rows}); StoreLinker serves the default "
                    "KV cache layout only"
                )
                raise LinkerConfigError(msg, argument="pools", value=tuple(buf.shape))
        self.keys = [b.view(rows, -1) for b in keys]
        self.values = [b.view(rows, -1) for b in values]
        self.k_width = self.keys[0].shape[1]
        self.v_width = self.values[0].shape[1]
        self.layers = len(keys)
        self.mirror = KVPool(
            kv.size,
            kv.page_size,
            self.layers,
            self.k_width + self.v_width,
            dtype=keys[0].dtype,
            device=keys[0].device,
            name=str(name),
        )

    def to_mirror(self, slots: torch.Tensor) -> None:
        """Copy SGLang's K/V of `slots` into the mirror's rows."""
        rows = torch.cat(
            [
                torch.stack([k.index_select(0, slots) for k in self.keys], dim=1),
                torch.stack([v.index_select(0, slots) for v in self.values], dim=1),
            ],
            dim=2,
        )
        self.mirror.data.index_copy_(0, slots, rows)

    def from_mirror(self, slots: torch.Tensor) -> None:
        """Copy the mirror's rows of `slots` into SGLang's K/V buffers."""
        rows = self.mirror.data.index_select(0, slots)
        for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            k.index_copy_(0, slots, rows[:, layer, : self.k_width])
            v.index_copy_(0, slots, rows[:, layer, self.k_width :])


def _halves(pools: Mapping[Any, object]) -> dict[PoolName, Any]:
    """SGLang's `linker.pools` -> the token-major pool serving each project pool."""
    out: dict[PoolName, Any] = {}
    for name, pool in pools.items():
        ours = _POOLS.get(getattr(name, "value", name))
        if ours is None:
            msg = (
                f"pool {name!r} is not served by StoreLinker (it serves "
                f"{', '.join(_POOLS)}); leave it out of pools"
            )
            raise LinkerConfigError(msg, argument="pools", value=name)
        half = "swa_kv_pool" if ours is PoolName.SWA else "full_kv_pool"
        out[ours] = getattr(pool, half, pool)  # an SWAKVPool holds both halves
    return out


class _SettlingCounter(LayerWiseLoadCounter):  # type: ignore[misc]
    """SGLang's layer counter; waiting on a layer first settles that batch."""

    def __init__(self, num_layers: int, settle: Callable[[int], None]) -> None:
        super().__init__(num_layers)
        self._settle = settle

    def wait_until(self, threshold: int) -> None:
        if self.consumer_index in self.futures:
            self._settle(self.consumer_index)
        super().wait_until(threshold)


def _ours(transfers: Sequence[Any]) -> list[PoolTransfer]:
    out = []
    for t in transfers:
        name = _POOLS.get(getattr(t.name, "value", t.name))
        if name is None:
            msg = f"a {t.name!r} transfer reached StoreLinker, which serves {', '.join(_POOLS)}"
            raise LinkerConfigError(msg, argument="transfers", value=t.name)
        policy = PoolHitPolicy(getattr(t.hit_policy, "value", t.hit_policy))
        idx = t.device_indices
        if idx is not None:
            idx = idx.to(torch.int64)
        out.append(PoolTransfer(name, idx, tuple(t.keys or ()), policy))
    return out


#: completions a store may report beyond the batches the linker knows in flight (one
#: started by a `start_loading` whose answer was lost); more is a miscount, a fault
_COUNT_SLACK = 2

#: a load batch's `_Fence` key (the store batch id whose own completion releases it;
#: None: only a reset or close of the store that returned)
_Release = int | None


class _Fence:
    """Mirror rows a misbehaving store may still touch (write for a load, read for an
    offload), held until its own job for them ended: no new load or offload may use
    them, so a late write or read of the store meets nobody else's bytes.

    Loads are held by the batch whose completion releases them (`hold` / `release`);
    offloads whose completion can no longer be told from the next one's are `owed`,
    oldest first: each later well-formed offload completion releases the oldest.
    """

    def __init__(self) -> None:
        self.loads: list[tuple[_Release, list[tuple[PoolName, torch.Tensor]]]] = []
        self.owed: deque[list[tuple[PoolName, torch.Tensor]]] = deque()

    def hold(self, key: _Release, rows: list[tuple[PoolName, torch.Tensor]]) -> None:
        if rows:
            self.loads.append((key, rows))

    def release(self, key: int) -> bool:
        kept = [(k, rows) for k, rows in self.loads if k != key]
        released = len(kept) != len(self.loads)
        self.loads = kept
        return released

    def clear(self) -> None:
        self.loads.clear()
        self.owed.clear()

    def touches(self, transfers: Sequence[PoolTransfer]) -> bool:
        """Whether any transfer's slots meet a held row of its pool."""
        held: dict[PoolName, list[torch.Tensor]] = {}
        for rows in [*(r for _, r in self.loads), *self.owed]:
            for name, slots in rows:
                held.setdefault(name, []).append(slots)
        for t in transfers:
            fenced = held.get(t.name)
            idx = t.device_indices
            if fenced and idx is not None and bool(torch.isin(idx, torch.cat(fenced)).any()):
                return True
        return False

    def __len__(self) -> int:
        return len(self.loads) + len(self.owed)


def _rows(transfers: Sequence[PoolTransfer]) -> list[tuple[PoolName, torch.Tensor]]:
    return [(t.name, t.device_indices) for t in transfers if t.device_indices is not None]


class StoreLinker(UnifiedCacheLinker):  # type: ignore[misc]
    """SGLang 0.5.23's linker interface over an `ExternalStore` (module docstring).

    Every store call goes through a `CheckedStore`: an exception or an ill-typed answer
    is a fault of that call (counted in `faults`, the last kept in `last_fault`), never
    raised into SGLang's scheduler (with 0.5.23 that kills the worker). A lookup fault
    is a miss, a load or offload fault a refusal, a batch whose completion is faulty,
    missing or names other loads fails (SGLang aborts its requests, which recompute).
    Mirror rows the store may still touch after it broke the protocol are fenced
    (`_Fence`) until its own completion for that job, or a reset or close of the store
    that returned: a load or an offload that would use one is refused. Completion loops
    pop at most what can be in flight.
    """

    def __init__(
        self,
        store: ExternalStore,
        pools: Mapping[Any, object],
        *,
        trace: str | Path | None = None,
        close_store: bool = True,
    ) -> None:
        halves = _halves(pools)
        if PoolName.KV not in halves:
            msg = "pools must hold the KV pool (PoolName.KV), the FULL component's pages"
            raise LinkerConfigError(msg, argument="pools", value=tuple(pools))
        self._mirrors = {name: _PoolMirror(name, kv) for name, kv in halves.items()}
        store.attach({name: m.mirror for name, m in self._mirrors.items()})
        self.store = store
        self.calls = CheckedStore(store, self._fault)
        self.faults: dict[str, int] = {}  # store faults by call
        self.last_fault: BaseException | None = None
        self.pools = dict(pools)
        self.close_store = close_store
        # the forward waits on the KV pool's own layer ids: an SWAKVPool numbers its
        # Full and SWA layers together, so the counter holds both halves' layers
        layers = sum(m.layers for m in self._mirrors.values())
        self.layer_done_counter = _SettlingCounter(layers, self._settle)
        self.counter = TransitionCounter()
        self.trace = TraceRecorder(trace) if trace is not None else None
        # a failing trace write (a full disk) stops the trace, never the linker call
        self._guard = GuardedTrace(self.trace, "StoreLinker") if self.trace is not None else None
        self._observers: list[Observer] = [self.counter]
        if self._guard is not None:
            self._observers.append(self._guard)
        for observer in self._observers:
            attach(observer, LOAD_MACHINE, OFFLOAD_MACHINE)
        self._loads: dict[str, list[tuple[PoolName, torch.Tensor]]] = {}
        self._queued: list[str] = []
        # counter index -> (store batch id, None when the store's answer was lost or
        # cannot be trusted; its rids), in start order
        self._batches: dict[int, tuple[int | None, list[str]]] = {}
        self._results: dict[int, bool] = {}  # store batch -> verdict, popped early
        self._verdicts: dict[int, bool] = {}  # counter index -> settled verdict
        self._empty: set[int] = set()  # counter indices of batches with nothing to load
        self._fence = _Fence()
        # mirror rows of the offloads the store accepted and has not completed, FIFO
        self._offloads: deque[list[tuple[PoolName, torch.Tensor]]] = deque()
        self._ready: deque[bool] = deque()  # verdicts popped, not yet taken by SGLang
        self._unreported = 0  # accepted offloads SGLang has no verdict for yet
        self._closed = False

    def _fault(self, operation: str, error: BaseException) -> None:
        self.faults[operation] = self.faults.get(operation, 0) + 1
        self.last_fault = error

    def _protocol_fault(self, operation: str, value: object, msg: str) -> None:
        self._fault(operation, StoreProtocolError(msg, operation=operation, value=value))

    # -- loads -------------------------------------------------------------------------

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        ours = _ours(transfers)
        pages = max((len(t.keys) for t in ours if t.name is PoolName.KV), default=0)
        return self.calls.lookup(rid, ours, pages) or []

    def _fenced(self, transfers: Sequence[PoolTransfer]) -> bool:
        """Whether the store may still touch rows of `transfers` (its completions taken
        first: the one that releases them may have come)."""
        if not self._fence.touches(transfers):
            return False
        if self._fence.loads:
            self._take_load_completions()
        return self._fence.touches(transfers)

    def load(self, rid: str, transfers: list[Any]) -> bool:
        ours = _ours(transfers)
        if self._fenced(ours):  # the store may still touch those rows
            return False
        if not self.calls.load(rid, ours):
            return False
        self._loads[rid] = _rows(ours)
        self._queued.append(rid)
        return True

    def start_layer_wise_loading(self) -> int:
        batch = self.calls.start_loading()
        index: int = self.layer_done_counter.update_producer()
        self.layer_done_counter.set_consumer(index)
        if batch == -1 and not self._queued:  # nothing to load (SGLang starts every batch)
            self.layer_done_counter.futures.pop(index, None)
            self._empty.add(index)
            if len(self._empty) > _EMPTY_KEPT:  # SGLang never finishes them: keep the newest
                self._empty.discard(min(self._empty))
            return index
        rids, self._queued = self._queued, []
        if batch == -1:  # the store holds none of them: nothing was started, none lands
            self._batches[index] = (-1, rids)
            return index
        known = {b for b, _ in self._batches.values()} | {k for k, _ in self._fence.loads}
        if batch is not None and batch in known:
            msg = f"start_loading: the store answered batch {batch}, already in flight or fenced"
            self._protocol_fault("start_loading", batch, msg)
            batch = None
        # None: the store may have started them (its answer was lost): they fail, and
        # their rows stay fenced until a reset
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
        self._settle(counter_index)
        landed = self._verdicts.pop(counter_index)
        self.layer_done_counter.finish(counter_index)
        return landed

    def cancel_queued_load(self, rid: str) -> bool:
        if rid not in self._queued or not self.calls.cancel_queued_load(rid):
            return False
        self._loads.pop(rid, None)
        self._queued.remove(rid)
        return True

    def _take_load_completions(self) -> None:
        """Pop the store's load completions (at most what can be in flight): each ends
        its own batch's wait (`_results`) or releases fenced rows; a faulty or unknown
        one fences the oldest batch in flight (it fails)."""
        calls = self.calls
        calls.progress()
        running = [b for b, _ in self._batches.values() if b is not None and b >= 0]
        limit = len(running) + len(self._fence.loads) + _COUNT_SLACK
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

    def _distrust(self, index: int, release: _Release) -> None:
        """Batch `index` fails; its rows stay fenced until `release`'s own completion."""
        _, rids = self._batches[index]
        self._batches[index] = (None, rids)
        self._fence.hold(release, [r for rid in rids for r in self._loads.pop(rid, [])])

    def _settle(self, index: int) -> None:
        """Finish batch `index` in the store and copy what landed into SGLang's pools."""
        if index in self._verdicts or index not in self._batches:
            return
        batch, _ = self._batches[index]
        if batch is not None and batch >= 0 and batch not in self._results:
            self._take_load_completions()
            batch, _ = self._batches[index]
        batch, rids = self._batches.pop(index)
        if batch is None:  # not to be trusted: rows fenced (until a reset, at least)
            landed = False
            self._fence.hold(None, [r for rid in rids for r in self._loads.pop(rid, [])])
        elif batch == -1:
            landed = False
        elif batch in self._results:
            landed = self._results.pop(batch)
        else:  # the store has not finished it: it may still write the rows
            landed = False
            self._fence.hold(batch, [r for rid in rids for r in self._loads.pop(rid, [])])
        for rid in rids:
            for name, slots in self._loads.pop(rid, []):
                if landed:
                    self._mirrors[name].from_mirror(slots)
        counter = self.layer_done_counter
        if landed:
            for layer in range(counter.num_layers):
                if not counter.futures[index][layer].done():
                    counter.complete(index, layer)
        else:
            counter.fail(index, RuntimeError(f"store load batch {batch} failed"))
        self._verdicts[index] = landed

    # -- offloads ----------------------------------------------------------------------

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        ours = _ours(transfers)
        if self._fenced(ours):  # the store may still touch those rows
            return False
        for t in ours:
            if t.device_indices is not None and t.name in self._mirrors:
                self._mirrors[t.name].to_mirror(t.device_indices)
        if not self.calls.offload(ours):
            return False
        rows = _rows(ours)
        if self._fence.owed:  # behind the held ones: completions cannot be told apart
            self._fence.owed.append(rows)
        else:
            self._offloads.append(rows)
        self._unreported += 1
        return True

    def num_completed_offloads(self) -> int:
        """Pop the store's completions now (at most what can be in flight); SGLang takes
        their verdicts with `pop_completed_offload`. After a faulty pop no verdict can
        be matched to its offload: each later one is reported failed, and releases the
        oldest fenced offload's rows."""
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
        return self._ready.popleft() if self._ready else False

    # -- lifecycle ---------------------------------------------------------------------

    def reset(self) -> None:
        """Quiesce the store and discard every completion and every load in flight
        (bounded: at most what can be in flight is popped). A reset of the store that
        returned releases the fence; one that failed fences every row in flight (a
        batch's own completion, when it comes, still releases its rows)."""
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
                running + len(self._fence.loads) + _COUNT_SLACK,
            )
            self._fence.clear()
        else:  # not quiesced: fenced until their own completions (or a reset) come
            for index, (batch, _) in list(self._batches.items()):
                self._distrust(index, batch if batch is not None and batch >= 0 else None)
            self._fence.hold(None, [r for rows in self._loads.values() for r in rows])
            self._fence.owed.extend(self._offloads)
        self._loads.clear()
        self._queued.clear()
        self._batches.clear()
        self._results.clear()
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
        """Jobs whose mirror rows a misbehaving store may still touch: load batches
        and offloads, held until the store's own completion or a reset returns."""
        return len(self._fence)


class ContractMonitor(UnifiedCacheLinker):  # type: ignore[misc]
    """Any `UnifiedCacheLinker`, with every call checked against 0.5.23's protocol."""

    def __init__(self, linker: Any, *, mode: str = "raise", trace: str | Path | None = None):
        self.linker = linker
        self.monitor = ProtocolMonitor(mode=mode, trace=trace)

    @property
    def layer_done_counter(self) -> object:
        return self.linker.layer_done_counter

    @property
    def pools(self) -> dict[Any, object]:
        pools: dict[Any, object] = self.linker.pools
        return pools

    @property
    def forward_stream(self) -> Any:
        return getattr(self.linker, "forward_stream", None)

    def record_offload_ready(self) -> list[Any]:
        events: list[Any] = self.linker.record_offload_ready()
        return events

    def coverage(self) -> Coverage:
        return self.monitor.coverage()

    def save_coverage(self, path: str | Path) -> None:
        self.monitor.coverage().save(path)

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        self.monitor.before_lookup(rid)
        found: list[int] = self.linker.lookup(rid, transfers)
        return found

    def load(self, rid: str, transfers: list[Any]) -> bool:
        self.monitor.before_load(rid)
        try:
            queued: bool = self.linker.load(rid, transfers)
        except BaseException:
            self.monitor.after_load(rid, False)
            raise
        self.monitor.after_load(rid, queued)
        return queued

    def start_layer_wise_loading(self) -> int:
        self.monitor.before_start()
        index: int = self.linker.start_layer_wise_loading()
        self.monitor.after_start(index)
        return index

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        self.monitor.before_finish(counter_index)
        landed: bool = self.linker.finish_layer_wise_loading(counter_index)
        self.monitor.after_finish(counter_index, landed)
        return landed

    def cancel_queued_load(self, rid: str) -> bool:
        self.monitor.before_cancel(rid)
        cancelled: bool = self.linker.cancel_queued_load(rid)
        self.monitor.after_cancel(rid, cancelled)
        return cancelled

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        self.monitor.before_offload()
        pages = len(transfers[0].keys or ()) if transfers else 0
        try:
            queued: bool = self.linker.offload(transfers, session_id=session_id)
        except BaseException:
            self.monitor.after_offload(False, pages)
            raise
        self.monitor.after_offload(queued, pages)
        return queued

    def num_completed_offloads(self) -> int:
        self.monitor.before_count()
        n: int = self.linker.num_completed_offloads()
        self.monitor.after_count(n)
        return n

    def pop_completed_offload(self) -> bool:
        self.monitor.before_pop()
        ok: bool = self.linker.pop_completed_offload()
        self.monitor.after_pop(ok)
        return ok

    def reset(self) -> None:
        self.monitor.before_reset()
        self.linker.reset()
        self.monitor.after_reset()

    def close(self) -> None:
        self.monitor.before_close()
        try:
            self.linker.close()
        finally:
            self.monitor.after_close()
            self.monitor.close_trace()


# The linker test kit (check any linker, as `unicache-fsm check-linker` does), loaded on
# first use: the kit itself imports this module.
_KIT = ("CheckedLinker", "LinkerMachine", "StorePlugin", "check_linker")


def __getattr__(name: str) -> Any:
    if name not in _KIT:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    from unicache_fsm.integrations import linker_kit

    return getattr(linker_kit, name)
