"""One SGLang worker on CPU around the linker under test, and the scheduler's steps.

`Rig(config, model=..., swa=..., ledger=..., verdicts=...)` builds what a worker
launched with the dynamic linker builds: the scheduler's runtime context (`ServerArgs`
published), a request pool, an MHA KV pool on CPU (page 16; with ``swa=True`` an
`SWAKVPool`, window 32) and its allocator, SGLang 0.5.23's real `UnifiedRadixCache`,
the linker from 0.5.23's factory (`build.build_linker`), the layer counter registered
on the KV pool; then `CheckedLinker` around the linker and a `ContractMonitor` (record
mode, for the coverage diagram) around that, attached with ``cache.init_cache_linker``
(SGLang's `UnifiedCacheLinkerWrapper`). Computed KV is the `KvModel`'s.

Steps, each what the scheduler does (every linker call goes through the checks):

- `compute(tokens)` — a request computed `tokens`: fresh slots, the model's KV, insert
  (the insert queues the write-through offloads).
- `poll()` — one ``check_hicache_events``; `quiesce()` polls until every accepted offload
  completed (`COMPLETIONS_ARRIVE` if not within ``budget_s``).
- `evict()` — evict every unlocked node.
- `load(tokens, rid)` — match with a request, ``init_load_back``, start the batch, the
  forward (the counter pointed at the batch, each layer waited for and read: a layer
  read before it landed fails a batch that then finishes as landed),
  ``finish_external_linker_loads``; a landed load is inserted
  like computed KV, a failed one's slots freed. ``damage=KIND`` injects that backend
  fault on the queued pages between ``load`` and the batch's start.
- `cancel(tokens, rid)` — the same up to ``load``, then the request is released (the
  wrapper cancels the queued load) and the next batch starts: a cancelled load's
  slots must not change (`NOTHING_QUEUED`). `cancel_beside(tokens, rid, other,
  other_rid)` — two loads queued for one batch, the first released: the other lands,
  the cancelled one writes nothing.
- `reset()` — ``cache.reset()`` (SGLang's flush: the linker's ``reset``), allocator
  cleared; no device byte may change after it returned (`BOUNDED_LIFECYCLE`: checked
  after ``QUIET_S`` and before the rig next writes the device); `close()` — the wrapper's ``close``.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Sequence
from typing import Any

import torch

logging.disable(logging.WARNING)  # SGLang logs at INFO on import and per build
logging.getLogger("sglang").setLevel(logging.CRITICAL)  # its "load failed" errors are ours to judge

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InitLoadBackParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from unicache_fsm.integrations.linker_kit.build import build_linker  # noqa: E402
from unicache_fsm.integrations.linker_kit.checked import CheckedLinker, bounded  # noqa: E402
from unicache_fsm.integrations.linker_kit.kvmodel import KvModel  # noqa: E402
from unicache_fsm.integrations.linker_kit.ledger import Ledger  # noqa: E402
from unicache_fsm.integrations.linker_kit.obligations import (  # noqa: E402
    LinkerViolation,
    Obligation,
    Verdicts,
)
from unicache_fsm.integrations.sglang import ContractMonitor  # noqa: E402

__all__ = ["PAGE", "SWA_WINDOW", "Rig"]

PAGE = 16
SWA_WINDOW = 32
DTYPE = torch.bfloat16
HEADS, HEAD_DIM = 2, 4
#: the longest a linker's constructor may take (0.5.23 builds it at worker start)
BUILD_S = 10.0
#: how long after a reset the device must stay untouched before the next step
QUIET_S = 0.05
#: what a load's slots hold until it lands (the KV model's values lie in -120..120)
POISON = 200.0


class Rig:
    """One worker around the linker under test (module docstring)."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        model: str,
        swa: bool,
        ledger: Ledger,
        verdicts: Verdicts,
        tokens: int = 2048,
        budget_s: float = 2.0,
    ) -> None:
        self.page = PAGE
        self.model = KvModel(model)
        self.ledger = ledger
        self.verdicts = verdicts
        self.swa = swa
        self.budget_s = budget_s
        self.req_pool = ReqToTokenPool(
            size=16, max_context_len=4096, device="cpu", enable_memory_saver=False
        )
        if swa:
            self.kvcache: Any = SWAKVPool(
                size=tokens,
                size_swa=tokens,
                page_size=PAGE,
                dtype=DTYPE,
                head_num=HEADS,
                head_dim=HEAD_DIM,
                swa_attention_layer_ids=[0],
                full_attention_layer_ids=[1, 2],
                device="cpu",
            )
            self.allocator: Any = SWATokenToKVPoolAllocator(
                size=tokens,
                size_swa=tokens,
                page_size=PAGE,
                dtype=DTYPE,
                device="cpu",
                kvcache=self.kvcache,
                need_sort=False,
            )
            self.buffers = {
                PoolName.KV: self.kvcache.full_kv_pool,
                PoolName.SWA: self.kvcache.swa_kv_pool,
            }
            components: tuple[Any, ...] = (ComponentType.FULL, ComponentType.SWA)
        else:
            self.kvcache = MHATokenToKVPool(
                size=tokens,
                page_size=PAGE,
                dtype=DTYPE,
                head_num=HEADS,
                head_dim=HEAD_DIM,
                layer_num=2,
                device="cpu",
                enable_memory_saver=False,
            )
            self.allocator = PagedTokenToKVPoolAllocator(
                size=tokens,
                page_size=PAGE,
                dtype=DTYPE,
                device="cpu",
                kvcache=self.kvcache,
                need_sort=False,
            )
            self.buffers = {PoolName.KV: self.kvcache}
            components = (ComponentType.FULL,)
        self.params = CacheInitParams(
            disable=False,
            req_to_token_pool=self.req_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=PAGE,
            sliding_window_size=SWA_WINDOW if swa else None,
            tree_components=components,
            eviction_policy="lru",
            tree_core_backend="python",
        )
        self.cache = UnifiedRadixCache(self.params)
        what = "building it through SGLang's factory"
        try:  # a constructor that hangs or raises (SystemExit too) is a verdict
            self.linker = bounded(
                what,
                lambda: build_linker(
                    config, self.params, set(self.cache.components), model=model, page=PAGE
                ),
                BUILD_S,
            )
        except LinkerViolation:
            raise
        except Exception as exc:
            detail = f"{what} raised {type(exc).__name__}: {exc}".splitlines()[0]
            raise LinkerViolation(Obligation.NO_ESCAPE, detail) from exc
        faults = getattr(self.linker, "backend_faults", None)
        self.faults = faults() if callable(faults) else None
        self.checked = CheckedLinker(
            self.linker,
            model=self.model,
            ledger=ledger,
            verdicts=verdicts,
            buffers=self.buffers,
            faults=self.faults,
        )
        self.checked.page = PAGE
        self.monitor = ContractMonitor.around(self.checked, mode="record")
        self.cache.init_cache_linker(self.monitor)
        self.kvcache.register_layer_transfer_counter(self.linker.layer_done_counter)
        self.closed = False
        self._after_reset: list[torch.Tensor] | None = None  # the device when reset returned

    # -- slots and bytes ------------------------------------------------------------------

    def keys(self, tokens: Sequence[int]) -> list[str]:
        keys: list[str] = get_storage_hash_str(RadixKey(list(tokens)), None, page_size=PAGE)
        self.ledger.learn_pages(keys, tokens, PAGE)
        return keys

    def _alloc(self, n: int) -> torch.Tensor:
        if not self.swa:
            slots = self.allocator.alloc(n)
        else:
            slots = self.allocator.full_attn_allocator.alloc(n)
            swa = self.allocator.swa_attn_allocator.alloc(n)
            if slots is not None and swa is not None:
                self.allocator.set_full_to_swa_mapping(slots, swa)
        if slots is None:
            self.evict()
            return self._alloc(n)
        return slots  # type: ignore[no-any-return]

    def _write(self, tokens: Sequence[int], slots: torch.Tensor) -> None:
        hashes = self.model.prefix_hashes(tokens)
        for pool, buf in self.buffers.items():
            where = slots
            if pool == PoolName.SWA:
                where = self.allocator.full_to_swa_index_mapping[slots].to(torch.int64)
            width = buf.k_buffer[0][0].numel()
            for layer in range(buf.layer_num):
                for kind, bufs in (("k", buf.k_buffer), ("v", buf.v_buffer)):
                    rows = self.model.values(hashes, str(pool.value), layer, kind, width)
                    bufs[layer][where] = rows.view(len(tokens), HEADS, HEAD_DIM).to(DTYPE)

    # -- scheduler steps --------------------------------------------------------------------

    def compute(self, tokens: Sequence[int]) -> None:
        self._check_quiet()
        self.keys(tokens)
        slots = self._alloc(len(tokens))
        self._write(tokens, slots)
        self.cache.insert(InsertParams(key=RadixKey(list(tokens)), value=slots))

    def poll(self) -> None:
        self.cache.check_hicache_events()

    def quiesce(self) -> None:
        deadline = time.monotonic() + self.budget_s
        while self.cache.linker.pending_offloads:
            self.poll()
            if not self.cache.linker.pending_offloads:
                break
            if time.monotonic() > deadline:
                n = len(self.cache.linker.pending_offloads)
                raise LinkerViolation(
                    Obligation.COMPLETIONS_ARRIVE,
                    f"{n} accepted offloads still incomplete after {self.budget_s:g} s of polling",
                )
            time.sleep(0.002)
        self.verdicts.checked(Obligation.COMPLETIONS_ARRIVE)

    def evict(self) -> None:
        self.cache.evict(EvictParams(num_tokens=10**6, swa_num_tokens=10**6 if self.swa else 0))

    def _match(self, tokens: Sequence[int], rid: str) -> tuple[Any, Any]:
        self.keys(tokens)
        req = Req(rid, "", array("i", tokens), SamplingParams())
        result = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(tokens)), req=req))
        req.last_node = result.last_device_node
        req.prefix_len = result.device_prefix_len
        return req, result

    def _forward(self, index: int) -> None:
        """The forward of batch `index`: the TP worker points the layer counter at the
        batch (``set_consumer``, as 0.5.23's ``set_hicache_consumer``), then each layer's
        attention waits for its layer (the KV pool's hook calls ``wait_until``) and reads
        it -- what it read is noted for the batch's verdict (`CheckedLinker.note_layer`)."""
        layers = [1, 2, 0] if self.swa else [0, 1]
        mapping = getattr(self.kvcache, "layers_mapping", None)
        try:
            self.linker.layer_done_counter.set_consumer(index)
            for layer in layers:
                self.kvcache.get_key_buffer(layer)
                if mapping is None:
                    self.checked.note_layer(index, PoolName.KV, layer)
                else:
                    local, is_swa = mapping[layer]
                    self.checked.note_layer(index, PoolName.SWA if is_swa else PoolName.KV, local)
        except LinkerViolation:
            raise
        except Exception as exc:
            detail = f"layer_done_counter.wait_until raised {type(exc).__name__}: {exc}"
            raise LinkerViolation(Obligation.NO_ESCAPE, detail.splitlines()[0]) from exc

    def _queue(self, tokens: Sequence[int], rid: str) -> tuple[Any, Any, int, Any, Any]:
        self._check_quiet()
        req, result = self._match(tokens, rid)
        lock = self.cache.inc_lock_ref(result.last_device_node)
        loaded, req.last_node = self.cache.init_load_back(
            InitLoadBackParams(
                best_match_node=result.best_match_node,
                host_hit_length=result.host_hit_length,
                req=req,
            )
        )
        slots = self.cache.linker.private_load_indices.get(rid)
        if slots is not None:  # no right byte in them until the load lands
            for buf in (self.buffers[PoolName.KV].k_buffer, self.buffers[PoolName.KV].v_buffer):
                for layer in buf:
                    layer[slots] = POISON
        return req, result, loaded, slots, lock

    def load(self, tokens: Sequence[int], rid: str, damage: str | None = None) -> int:
        """Load what the store holds of `tokens`; the tokens loaded (0: none or failed)."""
        req, result, loaded, slots, lock = self._queue(tokens, rid)
        if loaded and damage is not None:
            first = result.device_prefix_len // PAGE
            self.damage(damage, self.keys(tokens)[first : first + loaded // PAGE])
        return self._run_batch(req, result, loaded, slots, lock)

    def _run_batch(self, req: Any, result: Any, loaded: int, slots: Any, lock: Any) -> int:
        if not loaded:
            self.cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())
            return 0
        device = result.device_prefix_len
        req.prefix_len = device + loaded
        value = self.cache.prefix_device_indices(req)  # tree prefix + the private slots
        index = self.cache.ready_to_load_host_cache()
        self._forward(index)
        failed = self.cache.finish_external_linker_loads([req])
        if failed:
            self.allocator.free(slots)
            self.cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())
            return 0
        evicted = {}
        if self.swa and req.kv is not None:
            evicted[ComponentType.SWA] = req.kv.get_evicted_seqlen(ComponentType.SWA)
        self.cache.insert(
            InsertParams(
                key=RadixKey(list(req.origin_input_ids[: device + loaded])),
                value=value,
                prev_prefix_len=device,
                component_evicted_seqlens=evicted,
            )
        )
        self.cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())
        return loaded

    def cancel(self, tokens: Sequence[int], rid: str) -> bool:
        """Queue a load of `tokens` and release the request; True when it was cancelled."""
        req, result, loaded, slots, lock = self._queue(tokens, rid)
        if not loaded:
            self.cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())
            return False
        before = self._snapshot(slots)
        self.cache.release_aborted_request(req)
        if rid in self.cache.linker.inflight_load_rids:  # not cancelled: it runs
            self._run_batch(req, result, loaded, slots, lock)
            return False
        index = self.cache.ready_to_load_host_cache()  # the next batch starts
        self._forward(index)
        after = self._snapshot(slots)
        if not all(torch.equal(a, b) for a, b in zip(before, after, strict=True)):
            raise LinkerViolation(
                Obligation.NOTHING_QUEUED,
                f"cancel_queued_load({rid!r}) answered True, but the next batch wrote its slots",
            )
        self.verdicts.checked(Obligation.NOTHING_QUEUED)
        self.allocator.free(slots)
        self.cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())
        return True

    def cancel_beside(
        self, tokens: Sequence[int], rid: str, other: Sequence[int], other_rid: str
    ) -> int:
        """Queue loads of `tokens` and `other` for one batch, release the first request,
        run the batch: the cancelled load's slots must not change, and the other load
        lands as usual. The tokens the other load brought (0: none or failed)."""
        req, result, loaded, slots, lock = self._queue(tokens, rid)
        queued = self._queue(other, other_rid)
        before = self._snapshot(slots) if loaded else []
        self.cache.release_aborted_request(req)
        cancelled = bool(loaded) and rid not in self.cache.linker.inflight_load_rids
        brought = self._run_batch(*queued)
        if cancelled:
            after = self._snapshot(slots)
            if not all(torch.equal(a, b) for a, b in zip(before, after, strict=True)):
                raise LinkerViolation(
                    Obligation.NOTHING_QUEUED,
                    f"cancel_queued_load({rid!r}) answered True, but the batch beside it "
                    "wrote its slots",
                )
            self.verdicts.checked(Obligation.NOTHING_QUEUED)
        if loaded:
            self.allocator.free(slots)
        self.cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())
        return brought

    def cancel_started(self, tokens: Sequence[int], rid: str) -> None:
        """Start a load of `tokens`, then release the request: the cancel must answer
        False (the load is running) and the batch still finishes."""
        req, result, loaded, slots, lock = self._queue(tokens, rid)
        if not loaded:
            self.cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())
            return
        index = self.cache.ready_to_load_host_cache()
        self.cache.release_aborted_request(req)
        if rid not in self.cache.linker.inflight_load_rids:
            raise LinkerViolation(
                Obligation.NOTHING_QUEUED,
                f"cancel_queued_load({rid!r}) answered True for a load already started",
            )
        self.verdicts.checked(Obligation.NOTHING_QUEUED)
        self._forward(index)
        self.cache.finish_external_linker_loads([req])  # landed or not, the request is gone
        self.allocator.free(slots)
        self.cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())

    def reset_with_load(self, tokens: Sequence[int], rid: str, *, started: bool) -> None:
        """Queue (and with `started`, start) a load of `tokens`, then flush the cache."""
        _, result, loaded, _, lock = self._queue(tokens, rid)
        if loaded and started:
            self.cache.ready_to_load_host_cache()
        self.cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())
        self.reset()

    def _snapshot(self, slots: torch.Tensor) -> list[torch.Tensor]:
        buf = self.buffers[PoolName.KV]
        return [b[slots].clone() for b in [*buf.k_buffer, *buf.v_buffer]]

    # -- faults -------------------------------------------------------------------------------

    def damage(self, kind: str, keys: Sequence[str]) -> None:
        """Lose, corrupt or truncate the stored pages `keys` (the backend's faults)."""
        assert self.faults is not None
        hit = getattr(self.faults, kind)
        for key in keys:
            if hit(key):
                self.ledger.damage([key])

    def fail_next_write(self) -> None:
        assert self.faults is not None
        self.faults.fail_next_write()
        self.ledger.write_fault_armed = True

    def set_reachable(self, reachable: bool) -> None:
        assert self.faults is not None
        self.faults.set_reachable(reachable)
        self.ledger.unreachable = not reachable

    # -- lifecycle ---------------------------------------------------------------------------

    def reset(self) -> None:
        """SGLang's flush; then nothing may write device memory: checked after a quiet
        period (``QUIET_S``) and again before the rig next writes it."""
        self.cache.reset()
        self.allocator.clear()
        self.req_pool.clear()
        self._after_reset = self._device()
        time.sleep(QUIET_S)
        self._check_quiet()

    def _device(self) -> list[torch.Tensor]:
        return [b.clone() for buf in self.buffers.values() for b in (*buf.k_buffer, *buf.v_buffer)]

    def _check_quiet(self) -> None:
        """No device byte changed since the last reset returned (`BOUNDED_LIFECYCLE`)."""
        if self._after_reset is None:
            return
        before, self._after_reset = self._after_reset, None
        for was, now in zip(before, self._device(), strict=True):
            changed = (was != now).reshape(was.shape[0], -1).any(1).nonzero()
            if changed.numel():
                raise LinkerViolation(
                    Obligation.BOUNDED_LIFECYCLE,
                    f"device slot {int(changed[0])} changed after reset returned (reset "
                    "left a transfer writing)",
                )
        self.verdicts.checked(Obligation.BOUNDED_LIFECYCLE)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.cache.linker.close()
