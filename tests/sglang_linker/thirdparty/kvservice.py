"""A second third-party linker: an in-process KV service, completed from a worker thread.

Written from SGLang 0.5.23's interface docstrings (``unified_cache_linker.py``) as an
author of a KV-service plug-in would, independently of `dirlinker` and of the kit.
Design, unlike `DirLinker` (synchronous files):

- `KvService` -- a named, process-wide object store (``service`` in
  ``linker_extra_config``): instances naming the same service share it, as workers
  share a KV service. Objects are ``namespace:pool:page-hash`` -> blob; a blob is a
  length, a BLAKE2b digest and the page's K/V rows of every layer of its pool. The
  service can be cut off and can fail its next write (`ServiceFaults`, the kit's
  fault interface) and answers each read and write after ``latency_ms``.
- `KvServiceLinker` -- every transfer runs on ONE worker thread: ``offload`` queues a
  job that reads the device pages later and publishes all of its objects or none;
  ``start_layer_wise_loading`` fetches and verifies every page of the batch, then
  copies layer by layer, completing each layer on SGLang's `LayerWiseLoadCounter`
  from the worker thread; a missing or damaged page fails the whole batch before any
  write (a damaged page is dropped from the service). Completed offloads wait in a
  FIFO for ``pop_completed_offload``. ``reset`` drops the queue, waits for the job in
  hand and forgets every completion; ``close`` stops the thread.
"""

from __future__ import annotations

import hashlib
import queue
import struct
import threading
import time
from collections import deque
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (
    LayerWiseLoadCounter,
    UnifiedCacheLinker,
)

_HEADER = struct.Struct("<Q32s")
_SERVICES: dict[str, KvService] = {}
_SERVICES_LOCK = threading.Lock()


class ServiceUnavailable(OSError):
    """The KV service cannot be reached."""


class KvService:
    """A named in-process object store (module docstring)."""

    def __init__(self, latency_s: float = 0.0) -> None:
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.reachable = True
        self.fail_next = False
        self.latency_s = latency_s

    def pause(self) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)

    def gate(self) -> None:
        self.pause()
        if not self.reachable:
            raise ServiceUnavailable("kv service unreachable")

    def exists(self, name: str) -> bool:
        self.gate()
        with self.lock:
            return name in self.objects

    def get(self, name: str) -> bytes | None:
        self.gate()
        with self.lock:
            return self.objects.get(name)

    def put_all(self, items: dict[str, bytes]) -> None:
        """Publish every object or none."""
        self.gate()
        with self.lock:
            if self.fail_next:
                self.fail_next = False
                raise OSError("kv service write failed")
            self.objects.update(items)

    def delete(self, name: str) -> None:
        with self.lock:
            self.objects.pop(name, None)


def service(name: str, latency_s: float = 0.0) -> KvService:
    with _SERVICES_LOCK:
        if name not in _SERVICES:
            _SERVICES[name] = KvService(latency_s)
        return _SERVICES[name]


class ServiceFaults:
    """The kit's `BackendFaults` over a `KvService`."""

    def __init__(self, svc: KvService) -> None:
        self.svc = svc

    @property
    def write_failure_armed(self) -> bool:
        return self.svc.fail_next

    def _names(self, key: str) -> list[str]:
        with self.svc.lock:
            return [n for n in self.svc.objects if n.endswith(":" + key)]

    def lose(self, key: str) -> bool:
        names = self._names(key)
        for n in names:
            self.svc.delete(n)
        return bool(names)

    def _rewrite(self, key: str, change: Any) -> bool:
        names = self._names(key)
        with self.svc.lock:
            for n in names:
                self.svc.objects[n] = change(self.svc.objects[n])
        return bool(names)

    def corrupt(self, key: str) -> bool:
        def flip(b: bytes) -> bytes:
            i = len(b) - 3
            return b[:i] + bytes([b[i] ^ 0x01]) + b[i + 1 :]

        return self._rewrite(key, flip)

    def truncate(self, key: str) -> bool:
        return self._rewrite(key, lambda b: b[: len(b) // 2])

    def fail_next_write(self) -> None:
        self.svc.fail_next = True

    def set_reachable(self, reachable: bool) -> None:
        self.svc.reachable = reachable


class PageDamaged(ValueError):
    """A stored page failed its length or digest check."""


class KvServiceLinker(UnifiedCacheLinker):  # type: ignore[misc]
    """An asynchronous KV-service linker (module docstring)."""

    WAIT_S = 5.0  # longest a call waits on the worker thread

    def __init__(
        self,
        server_args: Any,
        params: Any,
        *,
        components: Any = None,
        extra_config: dict[str, Any] | None = None,
        forward_stream: Any = None,
    ) -> None:
        extra = dict(extra_config or {})
        self.svc = service(str(extra["service"]), float(extra.get("latency_ms", 0)) / 1000)
        self.forward_stream = forward_stream
        self.page = int(params.page_size)
        kv = params.token_to_kv_pool_allocator.get_kvcache()
        if hasattr(kv, "layers_mapping"):  # SWAKVPool: global layer -> (local, is_swa)
            self.pools = {PoolName.KV: kv.full_kv_pool, PoolName.SWA: kv.swa_kv_pool}
            self.layers = [
                (PoolName.SWA if swa else PoolName.KV, local)
                for _, (local, swa) in sorted(kv.layers_mapping.items())
            ]
        else:
            self.pools = {PoolName.KV: kv}
            self.layers = [(PoolName.KV, i) for i in range(kv.layer_num)]
        window = params.sliding_window_size
        self.window_pages = -(-int(window) // self.page) if window else 0
        identity = [str(getattr(server_args, "model_path", "")), str(self.page)]
        for name, pool in sorted(self.pools.items(), key=lambda kv: kv[0].value):
            k = pool.k_buffer[0]
            identity += [name.value, str(k.dtype), str(tuple(k.shape[1:])), str(pool.layer_num)]
        self.ns = hashlib.sha256("|".join(identity).encode()).hexdigest()[:16]
        self.layer_done_counter = LayerWiseLoadCounter(len(self.layers))
        self._queued: dict[str, list[tuple[Any, torch.Tensor, list[str]]]] = {}
        self._completed: deque[bool] = deque()
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._batch_done: dict[int, threading.Event] = {}
        self._generation = 0
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="kvservice-linker", daemon=True)
        self._thread.start()

    def backend_faults(self) -> ServiceFaults:
        return ServiceFaults(self.svc)

    # -- the service's objects ----------------------------------------------------------------

    def _name(self, pool: Any, key: str) -> str:
        return f"{self.ns}:{pool.value}:{key}"

    def _pool_layers(self, pool: Any) -> list[int]:
        return [local for p, local in self.layers if p == pool]

    def _encode(self, pool: Any, rows: torch.Tensor) -> bytes:
        payload = rows.contiguous().view(torch.uint8).numpy().tobytes()
        digest = hashlib.blake2b(payload, digest_size=32).digest()
        return _HEADER.pack(len(payload), digest) + payload

    def _decode(self, pool: Any, blob: bytes | None) -> torch.Tensor:
        if blob is None or len(blob) < _HEADER.size:
            raise PageDamaged("missing or short page")
        size, digest = _HEADER.unpack_from(blob)
        payload = blob[_HEADER.size :]
        if len(payload) != size or hashlib.blake2b(payload, digest_size=32).digest() != digest:
            raise PageDamaged("page fails its digest")
        buf = self.pools[pool].k_buffer[0]
        raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(buf.dtype)
        return raw.reshape(len(self._pool_layers(pool)), 2, self.page, *buf.shape[1:])

    # -- lookup and loads -------------------------------------------------------------------

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        by_pool = {t.name: t for t in transfers}
        full = by_pool.get(PoolName.KV)
        if full is None or not full.keys:
            return []
        keys = list(full.keys)
        try:
            have = 0
            while have < len(keys) and self.svc.exists(self._name(PoolName.KV, keys[have])):
                have += 1
            if PoolName.SWA not in by_pool or PoolName.SWA not in self.pools:
                return list(range(1, have + 1))
            swa = {k for k in keys[:have] if self.svc.exists(self._name(PoolName.SWA, k))}
        except OSError:
            return []
        w = self.window_pages or len(keys)
        return [b for b in range(1, have + 1) if all(k in swa for k in keys[max(0, b - w) : b])]

    def load(self, rid: str, transfers: list[Any]) -> bool:
        if self._closed or not self.svc.reachable:
            return False
        plan = [
            (t.name, t.device_indices.clone().to(torch.int64), list(t.keys or ()))
            for t in transfers
            if t.device_indices is not None and t.name in self.pools
        ]
        with self._lock:
            self._queued[rid] = plan
        return True

    def cancel_queued_load(self, rid: str) -> bool:
        with self._lock:
            return self._queued.pop(rid, None) is not None

    def start_layer_wise_loading(self) -> int:
        with self._lock:
            loads, self._queued = list(self._queued.values()), {}
        if not loads:
            return -1
        index = self.layer_done_counter.update_producer()
        done = threading.Event()
        self._batch_done[index] = done
        self._jobs.put(("load", self._generation, index, loads, done))
        return index

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        done = self._batch_done.pop(counter_index, None)
        if done is not None and not done.wait(self.WAIT_S):
            self.layer_done_counter.fail(counter_index, TimeoutError("load timed out"))
        return bool(self.layer_done_counter.finish(counter_index))

    def _run_load(self, index: int, loads: list[Any]) -> None:
        counter = self.layer_done_counter
        try:
            pages = []  # (pool, slots of one page, decoded rows)
            for plan in loads:
                for pool, slots, keys in plan:
                    for i, key in enumerate(keys):
                        name = self._name(pool, key)
                        try:
                            rows = self._decode(pool, self.svc.get(name))
                        except PageDamaged:
                            self.svc.delete(name)
                            raise
                        pages.append((pool, slots[i * self.page : (i + 1) * self.page], rows))
        except (OSError, ValueError) as exc:
            counter.fail(index, exc)
            return
        for layer in range(len(self.layers)):
            self._copy_layer(layer, pages)
            counter.complete(index, layer)

    def _copy_layer(self, layer: int, pages: list[Any]) -> None:
        pool, local = self.layers[layer]
        at = self._pool_layers(pool).index(local)
        buf = self.pools[pool]
        for p, slots, rows in pages:
            if p == pool:
                self.svc.pause()  # each layer's transfer takes its time
                buf.k_buffer[local][slots] = rows[at, 0]
                buf.v_buffer[local][slots] = rows[at, 1]

    # -- offloads ---------------------------------------------------------------------------

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        if self._closed:
            return False
        plan = [
            (t.name, t.device_indices.clone().to(torch.int64), list(t.keys or ()))
            for t in transfers
            if t.device_indices is not None and t.name in self.pools
        ]
        self._jobs.put(("offload", self._generation, plan))
        return True

    def _run_offload(self, plan: list[Any]) -> bool:
        items = {}
        for pool, slots, keys in plan:
            buf = self.pools[pool]
            for i, key in enumerate(keys):
                page = slots[i * self.page : (i + 1) * self.page]
                rows = torch.stack(
                    [
                        torch.stack([buf.k_buffer[local][page], buf.v_buffer[local][page]])
                        for local in self._pool_layers(pool)
                    ]
                )
                items[self._name(pool, key)] = self._encode(pool, rows)
        try:
            self.svc.put_all(items)
        except OSError:
            return False
        return True

    def num_completed_offloads(self) -> int:
        with self._lock:
            return len(self._completed)

    def pop_completed_offload(self) -> bool:
        with self._lock:
            return self._completed.popleft() if self._completed else False

    # -- the worker thread --------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._idle.clear()
            try:
                kind, generation = job[0], job[1]
                if generation != self._generation:
                    if kind == "load":
                        job[4].set()
                    continue
                if kind == "load":
                    _, _, index, loads, done = job
                    self._run_load(index, loads)
                    done.set()
                else:
                    ok = self._run_offload(job[2])
                    with self._lock:
                        if generation == self._generation:
                            self._completed.append(ok)
            finally:
                self._idle.set()

    def _drain(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None and job[0] == "load":
                job[4].set()

    def reset(self) -> None:
        with self._lock:
            self._generation += 1
            self._queued.clear()
            self._completed.clear()
        self._drain()
        self._idle.wait(self.WAIT_S)
        for done in self._batch_done.values():
            done.set()
        self._batch_done.clear()
        self.layer_done_counter.reset()
        with self._lock:
            self._completed.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.reset()
        self._jobs.put(None)
        self._thread.join(self.WAIT_S)
