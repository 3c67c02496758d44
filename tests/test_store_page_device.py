"""Stores move bytes through any page device: a second device, written here, keeps each
layer's K and V in tensors of their own (as SGLang's MHA pool does), not KVPool's one
row per token. Round trips on the memory, file and Redis stores; layer-major progress
observed mid-batch on background stores; the staging budget never exceeded (the device
records the largest tensor it is handed or hands out); chunked and unchunked loads
write the same bytes; a failed batch never reports a layer it did not write."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from redis_helpers import REDIS_SKIP
from redis_helpers import open_store as open_redis_store
from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools.device import PageDevice, PageDeviceError, check_page_device
from unicache_fsm.pools.errors import TensorShapeError
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.layout import PageLayout
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.base import BaseStore
from unicache_fsm.store.errors import StoreBatchUnknownError, StoreConfigError
from unicache_fsm.store.file import FileStore
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.spec import open_store

KV = PoolName.KV
P, LAYERS, HEADS, HEAD_DIM = 4, 3, 2, 2
WIDTH = 2 * HEADS * HEAD_DIM  # K then V of every head, per layer
PAGES = 40  # usable pages per device
ITEM = 2  # float16
PAGE_NBYTES = P * LAYERS * WIDTH * ITEM


class SplitKV:
    """A page device over per-layer K and V buffers, ``[slots, heads, head_dim]`` each.

    Written for these tests, apart from `KVPool`: a page in the store's format is P
    rows x layers x (K heads, V heads). It records the largest tensor handed to
    `write_page_ids` or returned by `read_page_ids` (`largest`), each layer written
    (`writes`), and calls `on_write(layer)` before writing a layer (a test blocks there
    to look at progress mid-batch, or raises to fail the write)."""

    def __init__(self, name: str = "kv", layers: int = LAYERS) -> None:
        self.layout = PageLayout(PAGES * P, P, name)
        self.page_size, self.num_layers, self.width = P, layers, WIDTH
        self.dtype, self.device, self.name = torch.float16, torch.device("cpu"), name
        self.page_nbytes = P * layers * WIDTH * ITEM
        shape = ((PAGES + 1) * P, HEADS, HEAD_DIM)
        self.k = [torch.zeros(shape, dtype=self.dtype) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=self.dtype) for _ in range(layers)]
        self.largest = 0
        self.writes: list[int] = []
        self.on_write: Callable[[int], None] = lambda layer: None

    def _slots(self, pages: torch.Tensor) -> torch.Tensor:
        return (pages.view(-1, 1) * P + torch.arange(P)).view(-1)

    def pages_of(self, slots: object, what: str) -> torch.Tensor:
        assert isinstance(slots, torch.Tensor) and slots.numel() % P == 0, what
        return slots.view(-1, P)[:, 0] // P

    def read_page_ids(
        self, pages: torch.Tensor, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        slots = self._slots(pages)
        rows = [
            torch.cat([self.k[i][slots], self.v[i][slots]], 1).flatten(1)
            for i in range(self.num_layers)
        ]
        data = torch.stack(rows, 1)
        self.largest = max(self.largest, data.nbytes)
        if out is None:
            return data
        out.copy_(data)
        return out

    def write_page_ids(
        self, pages: torch.Tensor, data: torch.Tensor, *, layers: slice | None = None
    ) -> None:
        first, stop = (0, self.num_layers) if layers is None else (layers.start, layers.stop)
        assert data.shape == (pages.numel() * P, stop - first, WIDTH), data.shape
        self.largest = max(self.largest, data.nbytes)
        slots = self._slots(pages)
        for j, layer in enumerate(range(first, stop)):
            self.on_write(layer)
            k, v = data[:, j].reshape(-1, 2, HEADS, HEAD_DIM).unbind(1)
            self.k[layer][slots] = k
            self.v[layer][slots] = v
            self.writes.append(layer)

    def page_bytes(self) -> Any:
        return None

    def fill(self, pages: list[int], seed: int) -> None:
        slots = self._slots(torch.tensor(pages))
        gen = torch.Generator().manual_seed(seed)
        for buffers in (self.k, self.v):
            for layer in buffers:
                values = torch.randint(-500, 500, (slots.numel(), HEADS, HEAD_DIM), generator=gen)
                layer[slots] = values.to(self.dtype)

    def pages(self, pages: list[int]) -> torch.Tensor:
        """The pages' bytes, every layer's K and V (for comparing devices)."""
        return self.read_page_ids(torch.tensor(pages))


def slots_of(pages: list[int]) -> torch.Tensor:
    return (torch.tensor(pages).view(-1, 1) * P + torch.arange(P)).view(-1)


def keys(n: int, start: int = 0) -> list[str]:
    return page_hashes(list(range(start, start + n * P)), P)[:n]


def transfer(pages: list[int], names: list[str]) -> list[PoolTransfer]:
    return [PoolTransfer(KV, slots_of(pages), names)]


def settle(store: BaseStore[Any]) -> None:
    store.progress()
    while store.num_completed_offloads():
        assert store.pop_completed_offload() is True


def run_load(store: BaseStore[Any], rid: str, pages: list[int], names: list[str]) -> bool:
    assert store.load(rid, transfer(pages, names))
    batch = store.start_loading()
    store.progress()
    result = store.pop_completed_load()
    assert result.batch == batch
    return result.success


@pytest.fixture(params=["memory", "file", "redis"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """A factory of stores of one kind (the same medium for every store it makes)."""
    made: list[BaseStore[Any]] = []

    def make(**options: Any) -> Any:
        if request.param == "memory":
            store: BaseStore[Any] = MemoryStore(**options)
        elif request.param == "file":
            store = FileStore(tmp_path / "pages", namespace=f"n{len(made)}", **options)
        else:
            store = open_redis_store(**options)
        made.append(store)
        return store

    if request.param == "redis" and REDIS_SKIP.args[0]:
        pytest.skip(REDIS_SKIP.kwargs["reason"])
    yield make
    for store in made:
        store.close()


# -- the protocol --------------------------------------------------------------------------


def test_kvpool_and_the_split_device_are_page_devices() -> None:
    pool = KVPool(PAGES * P, P, LAYERS, WIDTH)
    for device in (pool, SplitKV()):
        assert isinstance(device, PageDevice)
        assert check_page_device(device, "pool") is device
    assert pool.page_nbytes == SplitKV().page_nbytes


def test_attach_names_what_a_device_lacks() -> None:
    device = SplitKV()
    del device.layout
    lacking = type("NoWrites", (), {"page_size": P})()
    store = MemoryStore()
    for bad, missing in ((device, "layout"), (lacking, "write_page_ids")):
        with pytest.raises(StoreConfigError, match=f"attach: pool kv: .*lacks .*{missing}"):
            store.attach({KV: bad})
    device = SplitKV()
    device.page_nbytes += 1
    with pytest.raises(StoreConfigError, match="page_nbytes is"):
        store.attach({KV: device})
    store.close()


def test_kvpool_writes_a_slice_of_layers_only() -> None:
    pool = KVPool(PAGES * P, P, LAYERS, WIDTH, dtype=torch.float32)
    pages = torch.tensor([3, 7])
    whole = torch.arange(2 * P * LAYERS * WIDTH, dtype=torch.float32).view(2 * P, LAYERS, WIDTH)
    pool.write_page_ids(pages, whole)
    pool.write_page_ids(pages, -whole[:, 1:2].contiguous(), layers=slice(1, 2))
    got = pool.read_page_ids(pages)
    assert torch.equal(got[:, 1], -whole[:, 1])
    assert torch.equal(got[:, 0], whole[:, 0]) and torch.equal(got[:, 2], whole[:, 2])
    for layers in (slice(0, 3, 2), slice(2, 2), slice(1, 4), slice(-1, 2), 1):
        with pytest.raises(PageDeviceError, match="layers must be None"):
            pool.write_page_ids(pages, whole, layers=layers)  # type: ignore[arg-type]
    with pytest.raises(TensorShapeError, match=r"expected \(8, 1, 8\)"):
        pool.write_page_ids(pages, whole, layers=slice(0, 1))
    assert torch.equal(pool.read_page_ids(pages), got)  # a refused write changed nothing


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "64"])
def test_staging_bytes_is_validated(value: object) -> None:
    with pytest.raises(StoreConfigError, match="staging_bytes must be an int >= 1") as info:
        MemoryStore(staging_bytes=value)  # type: ignore[arg-type]
    assert info.value.argument == "staging_bytes"
    with pytest.raises(StoreConfigError, match="staging_bytes"):
        open_store("memory", staging_bytes=value)  # type: ignore[arg-type]


# -- bytes through the second device ---------------------------------------------------------


def test_pages_round_trip_through_the_split_device(make_store: Callable[..., Any]) -> None:
    store, device = make_store(), SplitKV()
    store.attach({KV: device})
    device.fill([1, 2, 3, 4, 5], seed=1)
    names = keys(5)
    assert store.offload(transfer([1, 2, 3, 4, 5], names))
    settle(store)
    assert run_load(store, "r", [11, 12, 13, 14, 15], names)
    assert torch.equal(device.pages([11, 12, 13, 14, 15]), device.pages([1, 2, 3, 4, 5]))
    batch = store.start_loading()
    assert batch == -1
    with pytest.raises(StoreBatchUnknownError, match="batch 99 was never started"):
        store.loaded_layers(99)


def test_the_split_device_and_kvpool_share_the_page_format() -> None:
    """Pages offloaded from a KVPool load into per-layer K/V buffers as the same bytes."""
    pool, device = KVPool(PAGES * P, P, LAYERS, WIDTH), SplitKV()
    gen = torch.Generator().manual_seed(3)
    data = torch.randint(-500, 500, (3 * P, LAYERS, WIDTH), generator=gen).to(torch.float16)
    pool.write_pages(slots_of([2, 4, 6]), data)
    names = keys(3)
    store = MemoryStore()
    store.attach({KV: pool})
    assert store.offload(transfer([2, 4, 6], names))
    settle(store)
    store.attach({KV: device})
    assert run_load(store, "r", [7, 8, 9], names)
    k0 = data[:, 0, : HEADS * HEAD_DIM].reshape(-1, HEADS, HEAD_DIM)
    assert torch.equal(device.k[0][slots_of([7, 8, 9])], k0)
    assert torch.equal(device.pages([7, 8, 9]), data)
    store.close()


# -- per-layer progress --------------------------------------------------------------------------


def test_progress_is_observed_layer_by_layer_mid_batch(make_store: Callable[..., Any]) -> None:
    """A background store's batch is written layer-major: while layer 1 is held back, the
    store reports exactly layer 0 landed, and layer 0's bytes are in every slot."""
    store, device = make_store(background=True), SplitKV()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=2)
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    settle(store)
    at_layer_1, release = threading.Event(), threading.Event()

    def hold(layer: int) -> None:
        if layer == 1:
            at_layer_1.set()
            assert release.wait(30)

    device.on_write = hold
    device.writes.clear()
    assert store.load("r", transfer([21, 22, 23], names))
    batch = store.start_loading()
    assert at_layer_1.wait(30)
    try:
        assert store.loaded_layers(batch) == {KV: 1}
        assert device.writes == [0]
        assert torch.equal(device.k[0][slots_of([21, 22, 23])], device.k[0][slots_of([1, 2, 3])])
        assert not device.k[1][slots_of([21, 22, 23])].any()
    finally:
        release.set()
    store.progress()
    assert store.loaded_layers(batch) == {KV: LAYERS}
    assert store.pop_completed_load().success is True
    assert store.loaded_layers(batch) == {KV: LAYERS}  # still answered after the pop
    assert device.writes == [0, 1, 2]
    assert torch.equal(device.pages([21, 22, 23]), device.pages([1, 2, 3]))


def test_a_failed_write_reports_only_the_layers_written(make_store: Callable[..., Any]) -> None:
    store, device = make_store(), SplitKV()
    store.attach({KV: device})
    device.fill([1, 2], seed=4)
    names = keys(2)
    assert store.offload(transfer([1, 2], names))
    settle(store)

    def fail(layer: int) -> None:
        if layer == 2:
            raise RuntimeError("device lost")

    device.on_write = fail
    assert store.load("r", transfer([5, 6], names))
    batch = store.start_loading()
    assert store.loaded_layers(batch) == {KV: 0}
    store.progress()
    assert store.pop_completed_load().success is False
    assert store.loaded_layers(batch) == {KV: 2}
    for layer in (0, 1):
        assert torch.equal(device.v[layer][slots_of([5, 6])], device.v[layer][slots_of([1, 2])])


def test_a_corrupt_page_fails_the_batch_before_any_layer_lands() -> None:
    store, device = MemoryStore(), SplitKV()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=5)
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    settle(store)
    stored = store.stored_bytes(KV, names[2])
    assert stored is not None
    stored[:4] ^= 0xFF
    device.writes.clear()
    assert store.load("r", transfer([7, 8, 9], names))
    batch = store.start_loading()
    store.progress()
    assert store.pop_completed_load().success is False
    assert store.loaded_layers(batch) == {KV: 0} and device.writes == []
    assert not device.k[0][slots_of([7, 8, 9])].any()
    store.close()


def test_pools_of_fewer_layers_complete_first() -> None:
    """KV (3 layers) and SWA (1 layer) in one batch: after layer 0, SWA is complete."""
    store, kv, swa = MemoryStore(), SplitKV(), SplitKV("swa", layers=1)
    store.attach({KV: kv, PoolName.SWA: swa})
    for device in (kv, swa):
        device.fill([1, 2], seed=9)
    names = keys(2)
    both = [*transfer([1, 2], names), PoolTransfer(PoolName.SWA, slots_of([1, 2]), names)]
    assert store.offload(both)
    settle(store)
    seen: list[dict[PoolName, int]] = []
    kv.on_write = lambda layer: seen.append(store.loaded_layers(0))
    load = [*transfer([5, 6], names), PoolTransfer(PoolName.SWA, slots_of([5, 6]), names)]
    assert store.load("r", load)
    assert store.start_loading() == 0
    store.progress()
    assert store.pop_completed_load().success is True
    assert seen == [{KV: 0, PoolName.SWA: 0}, {KV: 1, PoolName.SWA: 1}, {KV: 2, PoolName.SWA: 1}]
    assert store.loaded_layers(0) == {KV: 3, PoolName.SWA: 1}
    assert torch.equal(swa.pages([5, 6]), swa.pages([1, 2]))
    assert torch.equal(kv.pages([5, 6]), kv.pages([1, 2]))
    store.close()


# -- the staging budget ----------------------------------------------------------------------


def test_staging_stays_within_budget_and_chunks_write_the_same_bytes(
    make_store: Callable[..., Any],
) -> None:
    """With a budget of 3 pages, a 10-page offload and load never hand the device more
    than 3 pages at once; the load lands what an unbounded store lands, and its progress
    jumps to every layer at the end (no layer is in every slot before)."""
    small, big = make_store(staging_bytes=3 * PAGE_NBYTES), make_store()
    dev_small, dev_big = SplitKV(), SplitKV()
    small.attach({KV: dev_small})
    big.attach({KV: dev_big})
    for dev in (dev_small, dev_big):
        dev.fill(list(range(1, 11)), seed=6)
    names = keys(10)
    for store in (small, big):
        assert store.offload(transfer(list(range(1, 11)), names))
        settle(store)
    assert 0 < dev_small.largest <= 3 * PAGE_NBYTES  # the offload's reads
    dev_small.largest = 0
    seen: list[dict[PoolName, int]] = []
    dev_small.on_write = lambda layer: seen.append(small.loaded_layers(0))
    for store in (small, big):
        assert run_load(store, "r", list(range(21, 31)), names)
    assert 0 < dev_small.largest <= 3 * PAGE_NBYTES
    assert seen and all(counts == {KV: 0} for counts in seen)
    assert small.loaded_layers(0) == {KV: LAYERS}
    assert torch.equal(dev_small.pages(list(range(21, 31))), dev_big.pages(list(range(21, 31))))
    assert torch.equal(dev_small.pages(list(range(21, 31))), dev_small.pages(list(range(1, 11))))
    assert dev_big.largest > 3 * PAGE_NBYTES  # the unbounded store moved more at once


def test_a_page_larger_than_the_budget_moves_one_page_at_a_time(
    make_store: Callable[..., Any],
) -> None:
    store, device = make_store(staging_bytes=1), SplitKV()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=7)
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    settle(store)
    assert run_load(store, "r", [4, 5, 6], names)
    assert device.largest == PAGE_NBYTES
    assert torch.equal(device.pages([4, 5, 6]), device.pages([1, 2, 3]))


# -- devices and answers that misbehave --------------------------------------------------------


class _IgnoresOut(SplitKV):
    """Answers a fresh tensor instead of filling `out` (the bytes must still be right)."""

    def read_page_ids(
        self, pages: torch.Tensor, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return super().read_page_ids(pages)


class _WrongShape(SplitKV):
    def read_page_ids(
        self, pages: torch.Tensor, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return super().read_page_ids(pages)[:, :1]


def test_a_device_answering_a_fresh_tensor_still_round_trips(
    make_store: Callable[..., Any],
) -> None:
    store, device = make_store(), _IgnoresOut()
    store.attach({KV: device})
    device.fill([1, 2], seed=8)
    names = keys(2)
    assert store.offload(transfer([1, 2], names))
    settle(store)
    assert run_load(store, "r", [3, 4], names)
    assert torch.equal(device.pages([3, 4]), device.pages([1, 2]))


def test_a_device_answering_the_wrong_shape_fails_the_offload(
    make_store: Callable[..., Any],
) -> None:
    store, device = make_store(), _WrongShape()
    store.attach({KV: device})
    names = keys(2)
    assert store.offload(transfer([1, 2], names))
    store.progress()
    assert store.pop_completed_offload() is False
    assert "answered read_page_ids" in str(store.last_error)
    assert store.lookup("r", [PoolTransfer(KV, None, names)]) == []


def test_a_device_whose_property_raises_is_named_at_attach() -> None:
    class Raises(SplitKV):
        @property  # type: ignore[override]
        def layout(self) -> PageLayout:
            raise RuntimeError("driver gone")

        @layout.setter
        def layout(self, value: PageLayout) -> None:
            pass

    store = MemoryStore()
    with pytest.raises(StoreConfigError, match="lacks layout"):
        store.attach({KV: Raises()})
    store.close()
