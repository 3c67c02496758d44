"""KVPool and HostKVPool: exact byte round trips, host backup tier, bad input, CUDA path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pool_strategies import PAGE_SIZES, page_sizes, slots_of
from unicache_fsm.pools import (
    DeviceMismatchError,
    DeviceUnavailableError,
    DuplicatePagesError,
    ForeignSlotsError,
    HostKVPool,
    KVPool,
    LengthMismatchError,
    PagedAllocator,
    PoolConfigError,
    SWAAllocator,
    TensorShapeError,
    TensorTypeError,
    UnalignedSlotsError,
)

LAYERS, WIDTH = 3, 5
needs_cuda = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")


def pattern(num_slots: int, dtype: torch.dtype = torch.float16, seed: int = 0) -> torch.Tensor:
    """Distinct, exactly representable values per element (so equality means same bytes)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1000, 1000, (num_slots, LAYERS, WIDTH), generator=g).to(dtype)


def pool_and_allocator(
    page_size: int, num_pages: int = 8, dtype: torch.dtype = torch.float16
) -> tuple[KVPool, PagedAllocator]:
    a = PagedAllocator(num_pages * page_size, page_size)
    return KVPool.for_allocator(a, LAYERS, WIDTH, dtype=dtype), a


def same_bytes(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x.view(-1), y.view(-1))


class TestKVPool:
    def test_layout_and_defaults(self) -> None:
        kv, a = pool_and_allocator(4)
        assert kv.data.shape == (a.num_slots, LAYERS, WIDTH)
        assert kv.dtype == torch.float16
        assert kv.device == torch.device("cpu")
        assert kv.page_nbytes == 4 * LAYERS * WIDTH * 2
        assert int(kv.data.abs().sum()) == 0
        assert repr(kv) == (
            "KVPool(size=32, page_size=4, num_layers=3, width=5, dtype=torch.float16, "
            "device='cpu', name='kv')"
        )

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.uint8])
    def test_write_then_read_round_trips_exactly(self, page_size: int, dtype: torch.dtype) -> None:
        kv, a = pool_and_allocator(page_size, dtype=dtype)
        slots = a.alloc(3 * page_size)
        assert slots is not None
        data = pattern(slots.numel(), dtype)
        kv.write_pages(slots, data)
        assert same_bytes(kv.read_pages(slots), data)
        # the rows landed at their slots, nothing else was touched
        assert same_bytes(kv.data[slots], data)
        untouched = torch.ones(a.num_slots, dtype=torch.bool)
        untouched[slots] = False
        assert int(kv.data[untouched].float().abs().sum()) == 0

    @settings(max_examples=30, deadline=None)
    @given(page_size=page_sizes, data=st.data())
    def test_pages_in_any_order_round_trip(self, page_size: int, data: st.DataObject) -> None:
        kv, _ = pool_and_allocator(page_size)
        pages = data.draw(
            st.lists(st.integers(1, 8), min_size=0, max_size=8, unique=True), label="pages"
        )
        slots = slots_of(pages, page_size)
        rows = pattern(slots.numel(), seed=len(pages))
        kv.write_pages(slots, rows)
        reorder = data.draw(st.permutations(range(len(pages))), label="reorder")
        again = slots_of([pages[i] for i in reorder], page_size)
        expected = (
            torch.cat([rows[i * page_size : (i + 1) * page_size] for i in reorder])
            if pages
            else rows
        )
        assert same_bytes(kv.read_pages(again), expected)

    def test_read_into_out(self) -> None:
        kv, _ = pool_and_allocator(4)
        slots = slots_of([2, 5], 4)
        rows = pattern(8)
        kv.write_pages(slots, rows)
        out = torch.empty(8, LAYERS, WIDTH, dtype=torch.float16)
        assert kv.read_pages(slots, out=out) is out
        assert same_bytes(out, rows)

    def test_reads_may_repeat_a_page(self) -> None:
        kv, _ = pool_and_allocator(4)
        kv.write_pages(slots_of([3], 4), pattern(4))
        twice = kv.read_pages(slots_of([3, 3], 4))
        assert same_bytes(twice[:4], twice[4:])

    def test_empty_read_and_write(self) -> None:
        kv, _ = pool_and_allocator(4)
        empty = torch.empty(0, dtype=torch.int64)
        assert kv.read_pages(empty).shape == (0, LAYERS, WIDTH)
        kv.write_pages(empty, torch.empty(0, LAYERS, WIDTH, dtype=torch.float16))

    def test_non_contiguous_data_is_written_by_value(self) -> None:
        kv, _ = pool_and_allocator(4)
        rows = pattern(4).transpose(1, 2).contiguous().transpose(1, 2)
        assert not rows.is_contiguous()
        kv.write_pages(slots_of([1], 4), rows)
        assert same_bytes(kv.read_pages(slots_of([1], 4)), rows.contiguous())

    @pytest.mark.parametrize(
        ("kwargs", "argument"),
        [
            ({"num_layers": 0}, "num_layers"),
            ({"width": -1}, "width"),
            ({"dtype": "float16"}, "dtype"),
            ({"page_size": 0}, "page_size"),
        ],
    )
    def test_bad_config(self, kwargs: dict[str, object], argument: str) -> None:
        args: dict[str, object] = {"size": 16, "page_size": 4, "num_layers": 2, "width": 2}
        args.update(kwargs)
        with pytest.raises(PoolConfigError) as info:
            KVPool(**args)  # type: ignore[arg-type]
        assert info.value.argument == argument

    @no_cuda
    def test_cuda_without_a_gpu_is_a_typed_error(self) -> None:
        with pytest.raises(DeviceUnavailableError) as info:
            KVPool(16, 4, 2, 2, device="cuda:0")
        assert info.value.device == "cuda:0"
        assert "cuda:0" in str(info.value)


class TestKVPoolBadInput:
    """Every bad call raises its exact type and leaves every byte as it was."""

    def check(self, kv: KVPool, call: object, error: type[Exception]) -> Exception:
        before = kv.data.clone()
        with pytest.raises(error) as info:
            call()  # type: ignore[operator]
        assert type(info.value) is error
        assert same_bytes(kv.data, before)
        return info.value

    def setup_pool(self) -> tuple[KVPool, torch.Tensor, torch.Tensor]:
        kv, _ = pool_and_allocator(4)
        slots = slots_of([1, 2], 4)
        kv.write_pages(slots, pattern(8))
        return kv, slots, pattern(8, seed=1)

    def test_data_wrong_shape(self) -> None:
        kv, slots, rows = self.setup_pool()
        err = self.check(kv, lambda: kv.write_pages(slots, rows[:4]), TensorShapeError)
        assert isinstance(err, TensorShapeError)
        assert (err.got, err.expected) == ((4, LAYERS, WIDTH), (8, LAYERS, WIDTH))
        self.check(kv, lambda: kv.write_pages(slots, rows.view(8, -1)), TensorShapeError)

    def test_data_wrong_dtype(self) -> None:
        kv, slots, rows = self.setup_pool()
        err = self.check(kv, lambda: kv.write_pages(slots, rows.float()), TensorTypeError)
        assert isinstance(err, TensorTypeError)
        assert (err.got, err.expected) == (torch.float32, torch.float16)

    def test_data_wrong_device(self) -> None:
        kv, slots, rows = self.setup_pool()
        err = self.check(kv, lambda: kv.write_pages(slots, rows.to("meta")), DeviceMismatchError)
        assert isinstance(err, DeviceMismatchError)

    def test_data_not_a_tensor(self) -> None:
        kv, slots, rows = self.setup_pool()
        self.check(kv, lambda: kv.write_pages(slots, rows.tolist()), TensorTypeError)

    def test_out_wrong_shape_or_not_contiguous(self) -> None:
        kv, slots, _ = self.setup_pool()
        bad = torch.empty(4, LAYERS, WIDTH, dtype=torch.float16)
        self.check(kv, lambda: kv.read_pages(slots, out=bad), TensorShapeError)
        strided = torch.empty(8, WIDTH, LAYERS, dtype=torch.float16).transpose(1, 2)
        self.check(kv, lambda: kv.read_pages(slots, out=strided), TensorShapeError)

    def test_write_one_page_twice(self) -> None:
        kv, _, rows = self.setup_pool()
        err = self.check(kv, lambda: kv.write_pages(slots_of([3, 3], 4), rows), DuplicatePagesError)
        assert isinstance(err, DuplicatePagesError)
        assert err.pages == (3,)

    @pytest.mark.parametrize("op", ["read", "write"])
    def test_bad_slots(self, op: str) -> None:
        kv, slots, rows = self.setup_pool()

        def call(s: object) -> object:
            if op == "read":
                return lambda: kv.read_pages(s)  # type: ignore[arg-type]
            return lambda: kv.write_pages(s, rows)  # type: ignore[arg-type]

        self.check(kv, call(slots_of([0, 1], 4)), ForeignSlotsError)
        self.check(kv, call(slots_of([1, 9], 4)), ForeignSlotsError)
        self.check(kv, call(slots + 1), UnalignedSlotsError)
        self.check(kv, call(slots.to(torch.int32)), TensorTypeError)
        self.check(kv, call(slots.to("meta")), DeviceMismatchError)
        self.check(kv, call(slots.view(2, 4)), TensorShapeError)


def test_large_cpu_pages_are_written_page_by_page_exactly() -> None:
    """Pages of 16 KiB and more are written one copy per page: shuffled pages land
    byte-exact, others are untouched, strided data works, a repeated page is refused
    before a byte moves."""
    kv = KVPool(8 * 4, 4, 4, 1024)  # 4 * 4 * 1024 float16 = 32 KiB pages
    assert kv.page_nbytes == 32 << 10
    gen = torch.Generator().manual_seed(9)
    kv.data.copy_(torch.randn(kv.data.shape, generator=gen).to(kv.dtype))
    before = kv.data.clone()
    slots = slots_of([7, 2, 5], 4)
    rows = torch.randn((12, 4, 1024), generator=gen).to(kv.dtype)
    kv.write_pages(slots, rows)
    assert torch.equal(kv.read_pages(slots), rows)
    untouched = slots_of([1, 3, 4, 6, 8], 4)
    assert torch.equal(kv.data[untouched], before[untouched])
    strided = torch.randn((12, 4, 2048), generator=gen).to(kv.dtype)[:, :, ::2]
    kv.write_pages(slots_of([3], 4), strided[:4])
    assert torch.equal(kv.read_pages(slots_of([3], 4)), strided[:4])
    now = kv.data.clone()
    with pytest.raises(DuplicatePagesError):
        kv.write_pages(slots_of([1, 1, 2], 4), rows)
    assert torch.equal(kv.data, now)


class TestHostPool:
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_device_to_host_to_device_round_trip(self, page_size: int) -> None:
        kv, dev_alloc = pool_and_allocator(page_size)
        host = HostKVPool.for_device_pool(kv, 6 * page_size)
        host_alloc = PagedAllocator(6 * page_size, page_size, name="host")
        assert host.device == torch.device("cpu")
        assert not host.is_pinned  # the device pool is on the CPU

        dev_slots = dev_alloc.alloc(3 * page_size)
        host_slots = host_alloc.alloc(3 * page_size)
        assert dev_slots is not None
        assert host_slots is not None
        rows = pattern(dev_slots.numel(), seed=7)
        kv.write_pages(dev_slots, rows)

        host.backup_from(kv, dev_slots, host_slots)
        assert same_bytes(host.read_pages(host_slots), rows)

        dev_alloc.free(dev_slots)  # the device copy is dropped (evicted) ...
        back = dev_alloc.alloc(3 * page_size)
        assert back is not None
        kv.write_pages(back, torch.zeros_like(rows))
        host.restore_to(kv, host_slots, back)  # ... and loaded back into fresh slots
        assert same_bytes(kv.read_pages(back), rows)

    @pytest.mark.parametrize("page_size", [1, 16])
    def test_large_pages_copy_page_by_page_exactly(self, page_size: int) -> None:
        """Pages of 16 KiB and more move between two CPU pools page by page (one copy
        each): random order, a source page backed up twice, bytes exact both ways; a
        repeated destination page is refused before a byte moves."""
        layers, width = 8, 1024 // page_size  # 16 KiB pages of float16
        kv = KVPool(8 * page_size, page_size, layers, width)
        host = HostKVPool.for_device_pool(kv, 8 * page_size)
        assert kv.page_nbytes == 16 << 10
        gen = torch.Generator().manual_seed(3)
        kv.data.copy_(torch.randn(kv.data.shape, generator=gen).to(kv.dtype))
        src = slots_of([5, 2, 7, 2], page_size)
        dst = slots_of([1, 8, 3, 6], page_size)
        host.backup_from(kv, src, dst)
        assert torch.equal(host.read_pages(dst), kv.read_pages(src))
        back = slots_of([4, 1, 8, 6], page_size)
        host.restore_to(kv, dst, back)
        assert torch.equal(kv.read_pages(back), host.read_pages(dst))
        before = host.data.clone(), kv.data.clone()
        with pytest.raises(DuplicatePagesError):
            host.backup_from(kv, slots_of([1, 2], page_size), slots_of([3, 3], page_size))
        with pytest.raises(DuplicatePagesError):
            host.restore_to(kv, slots_of([1, 2], page_size), slots_of([3, 3], page_size))
        assert torch.equal(host.data, before[0]) and torch.equal(kv.data, before[1])

    def test_pinning_needs_cuda(self) -> None:
        if torch.cuda.is_available():
            pytest.skip("checks the no-CUDA error")
        with pytest.raises(DeviceUnavailableError):
            HostKVPool(16, 4, 2, 2, pin_memory=True)

    def test_layout_mismatch_is_refused(self) -> None:
        kv, _ = pool_and_allocator(4)
        other = HostKVPool(16, 4, LAYERS + 1, WIDTH)
        s = slots_of([1], 4)
        with pytest.raises(TensorShapeError):
            other.backup_from(kv, s, s)
        wrong_dtype = HostKVPool(16, 4, LAYERS, WIDTH, dtype=torch.float32)
        with pytest.raises(TensorTypeError):
            wrong_dtype.restore_to(kv, s, s)

    def test_page_counts_must_match_and_nothing_moves(self) -> None:
        kv, _ = pool_and_allocator(4)
        host = HostKVPool.for_device_pool(kv, 16)
        kv.write_pages(slots_of([1, 2], 4), pattern(8))
        before = host.data.clone()
        with pytest.raises(LengthMismatchError) as info:
            host.backup_from(kv, slots_of([1, 2], 4), slots_of([1], 4))
        assert (info.value.left_len, info.value.right_len) == (8, 4)
        with pytest.raises(ForeignSlotsError):
            host.backup_from(kv, slots_of([1], 4), slots_of([5], 4))  # host has 4 pages
        assert same_bytes(host.data, before)


class TestCUDA:
    pytestmark = needs_cuda

    @pytest.mark.parametrize("page_size", [1, 16])
    def test_allocators_on_cuda(self, page_size: int) -> None:
        a = PagedAllocator(8 * page_size, page_size, device="cuda")
        slots = a.alloc(3 * page_size)
        assert slots is not None
        assert slots.is_cuda
        with pytest.raises(DeviceMismatchError):
            a.free(slots.cpu())
        a.free(slots)
        assert a.available_size() == 8 * page_size

        s = SWAAllocator(8 * page_size, 4 * page_size, page_size, device="cuda")
        full, swa = s.alloc(2 * page_size), s.alloc_swa(2 * page_size)
        assert full is not None
        assert swa is not None
        s.set_full_to_swa_mapping(full, swa)
        assert torch.equal(s.translate(full), swa)
        s.free(full)
        assert s.available_swa_size() == 4 * page_size

    @pytest.mark.parametrize("page_size", [1, 16])
    def test_kv_pool_and_pinned_host_round_trip(self, page_size: int) -> None:
        a = PagedAllocator(8 * page_size, page_size, device="cuda")
        kv = KVPool.for_allocator(a, LAYERS, WIDTH, dtype=torch.bfloat16)
        assert kv.data.is_cuda
        slots = a.alloc(4 * page_size)
        assert slots is not None
        rows = pattern(slots.numel(), torch.bfloat16).cuda()
        kv.write_pages(slots, rows)
        assert same_bytes(kv.read_pages(slots), rows)
        with pytest.raises(DeviceMismatchError):
            kv.write_pages(slots, rows.cpu())

        host = HostKVPool.for_device_pool(kv, 8 * page_size)
        assert host.is_pinned
        assert host.data.is_pinned()
        host_slots = slots_of([8, 1, 3, 2], page_size)
        host.backup_from(kv, slots, host_slots)
        assert same_bytes(host.read_pages(host_slots), rows.cpu())
        back = slots.flip(0).view(-1, page_size).flip(1).reshape(-1)  # pages reversed
        host.restore_to(kv, host_slots, back)
        torch.cuda.synchronize()
        # device page back[i] now holds host page host_slots[i], i.e. rows of page i
        assert same_bytes(kv.read_pages(back), rows)


@pytest.mark.parametrize("width", [8, 4096])  # 128 B pages (scatter) / 64 KiB pages (per page)
def test_write_pages_from_an_aliasing_view_never_lands_wrong_bytes(width: int) -> None:
    """Writing pages 2,3 from a view of the same pool's pages 1,2 lands the bytes pages
    1,2 held before the call, on the scatter path (small pages) and the page-by-page
    path (pages >= 16 KiB), which once copied page 1 into page 2, then the overwritten
    page 2 into page 3."""
    p = 4
    pool = KVPool(64, p, 1, width, dtype=torch.float32)
    rows = pool.data.view(-1, p * width)
    for page in range(1, 5):
        rows[page] = page
    before = rows.clone()
    src = pool.data.view(-1, p, 1, width)[1:3].reshape(2 * p, 1, width)  # pages 1, 2
    pool.write_pages(torch.arange(2 * p, 4 * p), src)  # pages 2, 3
    assert torch.equal(rows[0], before[0]) and torch.equal(rows[4], before[4])
    got = [rows[page, 0].item() for page in range(1, 5)]
    assert got == [1.0, 1.0, 2.0, 4.0], got


@settings(max_examples=60, deadline=None)
@given(
    page_size=st.sampled_from([1, 4, 16, 1024]),  # 1024: pages of 30 KiB, page by page
    picks=st.lists(st.integers(1, 8), min_size=0, max_size=8, unique=True),
    seed=st.integers(0, 1000),
)
def test_page_id_moves_equal_slot_moves(page_size: int, picks: list[int], seed: int) -> None:
    """`read_page_ids` / `write_page_ids` with `pages_of`'s ids move exactly what
    `read_pages` / `write_pages` move (both the scatter and the page-by-page path)."""
    by_slots, _ = pool_and_allocator(page_size)
    by_ids, _ = pool_and_allocator(page_size)
    slots = slots_of(picks, page_size)
    pages = by_ids.pages_of(slots, "slots")
    assert pages.tolist() == picks
    data = pattern(slots.numel(), seed=seed)
    by_slots.write_pages(slots, data)
    by_ids.write_page_ids(pages, data)
    assert same_bytes(by_slots.data, by_ids.data)
    assert same_bytes(by_slots.read_pages(slots), by_ids.read_page_ids(pages))
    out = torch.empty_like(data)
    assert by_ids.read_page_ids(pages, out=out) is out and same_bytes(out, data)
    # the data checks stay on the page-id path
    with pytest.raises(TensorShapeError):
        by_ids.write_page_ids(pages, pattern(slots.numel() + 1, seed=seed))
    with pytest.raises(TensorTypeError):
        by_ids.write_page_ids(pages, data.to(torch.float32))
