"""A third-party SGLang 0.5.23 linker that keeps KV pages as files in one directory.

Written the way an outside author writes a linker, from SGLang's interface docstrings
(`UnifiedCacheLinker`, `LayerWiseLoadCounter`) alone -- it uses nothing of unicache_fsm
but the kit's ready `DirectoryFaults`, so `check-linker` can inject backend faults.
`tests/sglang_linker/mutants.py` plants one bug each in copies of it.

Launch JSON::

    {"linker": "DirLinker", "linker_module_path": "sglang_linker.thirdparty.dirlinker",
     "linker_extra_config": {"root": "/some/dir", "namespace": "team-a"}}

Layout: ``ROOT/NAMESPACE/<model digest>/<pool>/<page hash>.kv``; a file is a SHA-256 of
the payload followed by the payload (the page's rows of every layer, K then V), written
to a temporary name and renamed, so a reader sees a whole page or none. Offloads are
written synchronously inside ``offload`` (so a completion is only announced after the
copy); loads run at ``start_layer_wise_loading``, layer by layer, and a page that is
missing, short or fails its checksum fails the batch (and is deleted, so the next lookup
does not offer it again) -- nothing raises into the scheduler.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from pathlib import Path
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (
    LayerWiseLoadCounter,
    UnifiedCacheLinker,
)

from unicache_fsm.integrations.linker_kit.faults import DirectoryFaults


class PageError(Exception):
    """A stored page that cannot be used."""


class DirLinker(UnifiedCacheLinker):
    def __init__(self, server_args, params, *, components, extra_config, forward_stream=None):
        self.base = Path(extra_config["root"])
        namespace = str(extra_config.get("namespace", "default"))
        self.root = self.base / namespace / self.model_dir(server_args)
        self.page = params.page_size
        self.faults = DirectoryFaults(self.base)
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        self.buffers: dict[PoolName, Any] = {}
        if hasattr(kvcache, "full_kv_pool"):  # Full + SWA
            self.buffers[PoolName.KV] = kvcache.full_kv_pool
            self.buffers[PoolName.SWA] = kvcache.swa_kv_pool
            layers = kvcache.full_kv_pool.layer_num + kvcache.swa_kv_pool.layer_num
        else:
            self.buffers[PoolName.KV] = kvcache
            layers = kvcache.layer_num
        self.pools = {name: kvcache for name in self.buffers}
        for name in self.buffers:
            (self.root / str(name.value)).mkdir(parents=True, exist_ok=True)
        self.layer_done_counter = LayerWiseLoadCounter(layers)
        self.forward_stream = forward_stream
        self.queued: dict[str, list[Any]] = {}
        self.completed: deque[bool] = deque()

    # -- the directory --------------------------------------------------------------

    def model_dir(self, server_args: Any) -> str:
        return hashlib.sha256(str(server_args.model_path).encode()).hexdigest()[:16]

    def backend_faults(self) -> DirectoryFaults:
        return self.faults

    def path(self, pool: PoolName, key: str) -> Path:
        return self.root / str(pool.value) / f"{key}.kv"

    def payload_size(self, pool: PoolName) -> int:
        buf = self.buffers[pool]
        row = buf.k_buffer[0][0].numel() * buf.k_buffer[0].element_size()
        return 2 * buf.layer_num * self.page * row

    def page_usable(self, pool: PoolName, key: str) -> bool:
        try:
            return self.path(pool, key).stat().st_size == 32 + self.payload_size(pool)
        except OSError:
            return False

    def write_page(self, pool: PoolName, key: str, slots: torch.Tensor) -> None:
        buf = self.buffers[pool]
        parts = [b[slots].contiguous().view(torch.uint8).flatten() for b in buf.k_buffer]
        parts += [b[slots].contiguous().view(torch.uint8).flatten() for b in buf.v_buffer]
        payload = torch.cat(parts).numpy().tobytes()
        path = self.path(pool, key)
        self.faults.guard_write()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            f.write(hashlib.sha256(payload).digest())
            f.write(payload)
        os.replace(tmp, path)

    def read_page(self, pool: PoolName, key: str) -> bytes:
        path = self.path(pool, key)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PageError(f"{path}: {exc}") from exc
        payload = data[32:]
        if len(payload) != self.payload_size(pool) or not self.checksum_ok(data[:32], payload):
            path.unlink(missing_ok=True)
            raise PageError(f"{path}: damaged")
        return payload

    def checksum_ok(self, digest: bytes, payload: bytes) -> bool:
        return hashlib.sha256(payload).digest() == digest

    def copy_in(self, pool: PoolName, payload: bytes, slots: torch.Tensor) -> None:
        buf = self.buffers[pool]
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        chunks = data.chunk(2 * buf.layer_num)
        for layer in range(buf.layer_num):
            for i, bufs in ((layer, buf.k_buffer), (buf.layer_num + layer, buf.v_buffer)):
                rows = chunks[i].view(bufs[layer].dtype).view(len(slots), *bufs[layer].shape[1:])
                bufs[layer][slots] = rows

    # -- loads ------------------------------------------------------------------------

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        kv = next(t for t in transfers if t.name == PoolName.KV)
        keys = list(kv.keys or ())
        swa = next((t for t in transfers if t.name == PoolName.SWA), None)
        window = len(swa.keys or ()) if swa is not None else 0
        found = []
        for pages in range(1, len(keys) + 1):
            if not self.page_usable(PoolName.KV, keys[pages - 1]):
                break
            if swa is not None and PoolName.SWA in self.buffers:
                tail = keys[max(0, pages - window) : pages]
                if not all(self.page_usable(PoolName.SWA, k) for k in tail):
                    continue
            found.append(pages)
        return found

    def load(self, rid: str, transfers: list[Any]) -> bool:
        for t in transfers:
            if t.name not in self.buffers or t.device_indices is None:
                return False
            if not all(self.page_usable(t.name, k) for k in t.keys or ()):
                return False
        self.queued[rid] = list(transfers)
        return True

    def start_layer_wise_loading(self) -> int:
        index = self.layer_done_counter.update_producer()
        self.layer_done_counter.set_consumer(index)
        batch, self.queued = list(self.queued.values()), {}
        try:
            self.run_batch(batch)
        except Exception as exc:  # a damaged page fails the batch; never the scheduler
            self.layer_done_counter.fail(index, exc)
            return index
        for layer in range(self.layer_done_counter.num_layers):
            self.layer_done_counter.complete(index, layer)
        return index

    def run_batch(self, batch: list[list[Any]]) -> None:
        staged = []
        for transfers in batch:
            for t in transfers:
                slots = t.device_indices.to(torch.int64)
                for i, key in enumerate(t.keys or ()):
                    page_slots = slots[i * self.page : (i + 1) * self.page]
                    staged.append((t.name, self.read_page(t.name, key), page_slots))
        for pool, payload, slots in staged:
            self.copy_in(pool, payload, slots)

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        return self.layer_done_counter.finish(counter_index)

    def cancel_queued_load(self, rid: str) -> bool:
        return self.queued.pop(rid, None) is not None

    # -- offloads ---------------------------------------------------------------------

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        ok = True
        try:
            for t in transfers:
                if t.name not in self.buffers or t.device_indices is None:
                    continue
                slots = t.device_indices.to(torch.int64)
                for i, key in enumerate(t.keys or ()):
                    self.write_page(t.name, key, slots[i * self.page : (i + 1) * self.page])
        except OSError:
            ok = False
        self.completed.append(ok)
        return True

    def num_completed_offloads(self) -> int:
        return len(self.completed)

    def pop_completed_offload(self) -> bool:
        return self.completed.popleft()

    # -- lifecycle --------------------------------------------------------------------

    def reset(self) -> None:
        self.queued.clear()
        self.completed.clear()
        self.layer_done_counter.reset()

    def close(self) -> None:
        self.reset()
