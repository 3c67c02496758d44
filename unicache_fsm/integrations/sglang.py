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
  ``close_store=False``). Nothing is left behind either way.

Its loads and offloads are the store's own machines (`specs/store_load.toml`,
`specs/store_offload.toml`): `counter` counts them (`coverage()`), and with `trace` they
are written to that JSONL file. The store's job executors are shared by every store of
the process, so the trace holds the jobs of every store running meanwhile.

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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.trace import TraceRecorder, TransitionCounter, attach
from unicache_fsm.integrations.errors import (
    LinkerConfigError,
    SglangUnavailableError,
    UnknownBatchError,
)
from unicache_fsm.integrations.protocol import ProtocolMonitor
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.transfer import PoolHitPolicy, PoolName, PoolTransfer
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


class StoreLinker(UnifiedCacheLinker):  # type: ignore[misc]
    """SGLang 0.5.23's linker interface over an `ExternalStore` (module docstring)."""

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
        self.pools = dict(pools)
        self.close_store = close_store
        # the forward waits on the KV pool's own layer ids: an SWAKVPool numbers its
        # Full and SWA layers together, so the counter holds both halves' layers
        layers = sum(m.layers for m in self._mirrors.values())
        self.layer_done_counter = _SettlingCounter(layers, self._settle)
        self.counter = TransitionCounter()
        self.trace = TraceRecorder(trace) if trace is not None else None
        self._observers = [o for o in (self.counter, self.trace) if o is not None]
        for observer in self._observers:
            attach(observer, LOAD_MACHINE, OFFLOAD_MACHINE)
        self._loads: dict[str, list[tuple[PoolName, torch.Tensor]]] = {}
        self._queued: list[str] = []
        self._batches: dict[int, tuple[int, list[str]]] = {}  # counter index -> store batch
        self._results: dict[int, bool] = {}  # store batch -> verdict, popped early
        self._verdicts: dict[int, bool] = {}  # counter index -> settled verdict
        self._empty: set[int] = set()  # counter indices of batches with nothing to load
        self._closed = False

    # -- loads -------------------------------------------------------------------------

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        return self.store.lookup(rid, _ours(transfers))

    def load(self, rid: str, transfers: list[Any]) -> bool:
        ours = _ours(transfers)
        if not self.store.load(rid, ours):
            return False
        self._loads[rid] = [
            (t.name, t.device_indices) for t in ours if t.device_indices is not None
        ]
        self._queued.append(rid)
        return True

    def start_layer_wise_loading(self) -> int:
        batch = self.store.start_loading()
        index: int = self.layer_done_counter.update_producer()
        self.layer_done_counter.set_consumer(index)
        if batch == -1 and not self._queued:  # nothing to load (SGLang starts every batch)
            self.layer_done_counter.futures.pop(index, None)
            self._empty.add(index)
            if len(self._empty) > _EMPTY_KEPT:  # SGLang never finishes them: keep the newest
                self._empty.discard(min(self._empty))
            return index
        self._batches[index] = (batch, self._queued)
        self._queued = []
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
        if not self.store.cancel_queued_load(rid):
            return False
        self._loads.pop(rid, None)
        if rid in self._queued:
            self._queued.remove(rid)
        return True

    def _settle(self, index: int) -> None:
        """Finish batch `index` in the store and copy what landed into SGLang's pools."""
        if index in self._verdicts or index not in self._batches:
            return
        batch, rids = self._batches.pop(index)
        landed = True
        if batch != -1:
            if batch not in self._results:
                self.store.progress()
                while self.store.num_completed_loads() > 0:
                    result = self.store.pop_completed_load()
                    self._results[result.batch] = result.success
            landed = self._results.pop(batch, False)
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
        for t in ours:
            if t.device_indices is not None and t.name in self._mirrors:
                self._mirrors[t.name].to_mirror(t.device_indices)
        return self.store.offload(ours)

    def num_completed_offloads(self) -> int:
        self.store.progress()
        return self.store.num_completed_offloads()

    def pop_completed_offload(self) -> bool:
        return self.store.pop_completed_offload()

    # -- lifecycle ---------------------------------------------------------------------

    def reset(self) -> None:
        self.store.reset()
        while self.store.num_completed_offloads() > 0:
            self.store.pop_completed_offload()
        while self.store.num_completed_loads() > 0:
            self.store.pop_completed_load()
        self._loads.clear()
        self._queued.clear()
        self._batches.clear()
        self._results.clear()
        self._verdicts.clear()
        self._empty.clear()
        self.layer_done_counter.reset()

    def close(self) -> None:
        if self._closed:
            return
        self.reset()
        self._closed = True
        for observer in self._observers:
            LOAD_MACHINE.remove_observer(observer)
            OFFLOAD_MACHINE.remove_observer(observer)
        if self.trace is not None:
            self.trace.close()
        if self.close_store:
            self.store.close()

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
