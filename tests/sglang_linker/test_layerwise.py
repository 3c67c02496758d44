"""Layer-wise loading as 0.5.23's `LayerWiseLoadCounter` means it, inside SGLang's real
cache: the forward's `wait_until(layer)` (called by the KV pool before each layer's
attention) returns once the store reports that layer landed, layers complete in order,
an SWA pool's layers (numbered with the Full ones by `SWAKVPool`) map to the right
pool, a failure fails the batch, and nothing waits forever.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from sglang_linker.engine import Engine
from unicache_fsm.integrations.sglang.counter import LayerCounter
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store import MemoryStore

TOKENS = list(range(1, 17))


class Layered:
    """A `MemoryStore` that reports its per-layer progress as the test says (`landed`)
    and hides its load completions while `hold` is set."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.hold = False
        self.landed: dict[PoolName, int] = {}
        self.asked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        return self.inner.load(rid, transfers)

    def loaded_layers(self, batch: int) -> dict[PoolName, int]:
        self.asked += 1
        return dict(self.landed)

    def num_completed_loads(self) -> int:
        return 0 if self.hold else self.inner.num_completed_loads()


def _queued(engine: Engine) -> tuple[Any, int]:
    engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    req, result = engine.match([*TOKENS, 5], "r1")
    loaded, _ = engine.load_back(req, result)
    assert loaded == 16
    return req, engine.cache.ready_to_load_host_cache()


def test_wait_until_returns_once_the_store_reports_that_layer() -> None:
    store = Layered()
    engine = Engine(store, monitored=False)  # type: ignore[arg-type]
    req, index = _queued(engine)
    counter = engine.store_linker.layer_done_counter
    counter.set_consumer(index)
    store.hold, store.landed = True, {PoolName.KV: 1}
    engine.kvcache.get_key_buffer(0)  # the pool waits on layer 0
    futures = counter.futures[index]
    assert futures[0].done() and not futures[1].done()  # layer 1 has not landed
    store.landed = {PoolName.KV: 2}
    engine.kvcache.get_key_buffer(1)
    assert futures[1].done() and futures[1].exception() is None
    store.hold = False
    assert engine.cache.finish_external_linker_loads([req]) == []
    engine.close()


def test_a_store_that_never_progresses_fails_the_batch_in_bounded_time() -> None:
    store = Layered()
    engine = Engine(store, monitored=False, load_timeout_s=0.2)  # type: ignore[arg-type]
    req, index = _queued(engine)
    counter = engine.store_linker.layer_done_counter
    counter.set_consumer(index)
    store.hold = True  # no layer, no completion: ever
    engine.kvcache.get_key_buffer(0)  # returns (the batch's deadline passed)
    assert isinstance(counter.futures[index][0].exception(), RuntimeError)
    failed = engine.cache.finish_external_linker_loads([req])
    assert [r.rid for r in failed] == ["r1"]
    engine.close()


def test_a_lying_progress_report_is_a_fault_not_a_landing() -> None:
    store = Layered()
    engine = Engine(store, monitored=False, load_timeout_s=0.2)  # type: ignore[arg-type]
    req, index = _queued(engine)
    counter = engine.store_linker.layer_done_counter
    counter.set_consumer(index)
    store.hold, store.landed = True, {PoolName.KV: 7}  # more layers than the pool has
    engine.kvcache.get_key_buffer(0)
    assert engine.store_linker.faults.get("loaded_layers", 0) >= 1
    assert counter.futures[index][0].exception() is not None  # never trusted as landed
    store.hold = False
    engine.cache.finish_external_linker_loads([req])
    engine.close()


def test_swa_layers_map_to_the_swa_pool_and_complete_in_order() -> None:
    engine = Engine(MemoryStore(), swa_window=8, monitored=False)
    counter = engine.store_linker.layer_done_counter
    # SWAKVPool numbers layer 0 (SWA) and 1, 2 (Full) together
    assert counter.layers == ((PoolName.SWA, 0), (PoolName.KV, 0), (PoolName.KV, 1))
    index = counter.update_producer()
    counter.land(index, {PoolName.KV: 2})  # the SWA layer 0 has not landed: none may
    assert not any(f.done() for f in counter.futures[index])
    counter.land(index, {PoolName.KV: 1, PoolName.SWA: 1})
    assert [f.done() for f in counter.futures[index]] == [True, True, False]
    counter.land(index, {PoolName.KV: 2, PoolName.SWA: 1})
    assert counter.finish(index) is True
    engine.close()


@pytest.mark.parametrize("layers", [[None, (PoolName.KV, 0)], [(PoolName.KV, 0)]])
def test_a_layer_no_pool_holds_lands_at_once(layers: list[Any]) -> None:
    counter = LayerCounter(layers, lambda index, layer: None)
    index = counter.update_producer()
    counter.land(index, {})
    assert counter.futures[index][0].done() is (layers[0] is None)


@pytest.mark.parametrize("swa_window", [None, 8])
def test_a_store_with_a_worker_lands_every_layer_before_the_forward_reads_it(
    swa_window: int | None,
) -> None:
    """A store whose worker writes the batch on its own thread, layer by layer, while
    the forward waits on each layer in turn: every layer the forward reads holds the
    offloaded bytes."""
    engine = Engine(MemoryStore(background=True), swa_window=swa_window, monitored=False)
    full, swa = engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    loaded = engine.load([*TOKENS, 5], "r1")
    assert (loaded.loaded, loaded.failed) == (16, ())
    mapping = getattr(engine.kvcache, "layers_mapping", None)
    for layer, (k, v) in loaded.layers_read.items():
        local, is_swa = mapping[layer] if mapping is not None else (layer, False)
        want = swa if is_swa else full
        assert want is not None
        cut = slice(-engine.window, None) if is_swa else slice(None)
        assert torch.equal(k[cut], want.k[local][cut]) and torch.equal(v[cut], want.v[local][cut])
    engine.close()
