"""PagedAllocator and PageLayout: contract examples and every bad input, state unchanged."""

from __future__ import annotations

import pytest
import torch

from pool_strategies import PAGE_SIZES, pages_in, slots_of, snapshot
from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.pools import (
    DeviceMismatchError,
    DeviceUnavailableError,
    DoubleFreeError,
    ForeignSlotsError,
    NotPageMultipleError,
    PagedAllocator,
    PageLayout,
    PoolConfigError,
    PoolError,
    SlotsNotAllocatedError,
    TensorShapeError,
    TensorTypeError,
    UnalignedSlotsError,
    resolve_device,
)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")


def make(page_size: int, num_pages: int = 8) -> PagedAllocator:
    return PagedAllocator(num_pages * page_size, page_size)


# -- construction --------------------------------------------------------------------


class TestConstruction:
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fresh_allocator(self, page_size: int) -> None:
        a = make(page_size, 5)
        assert a.size == 5 * page_size
        assert a.num_pages == 5
        assert a.num_slots == 6 * page_size
        assert a.available_size() == 5 * page_size
        assert a.free_page_ids().tolist() == [1, 2, 3, 4, 5]
        assert a.allocated_page_ids().tolist() == []
        assert a.device == torch.device("cpu")
        assert repr(a) == (
            f"PagedAllocator(size={5 * page_size}, page_size={page_size}, device='cpu', name='kv')"
        )

    def test_size_not_a_page_multiple(self) -> None:
        with pytest.raises(NotPageMultipleError) as info:
            PagedAllocator(10, 4)
        err = info.value
        assert (err.what, err.value, err.page_size) == ("size", 10, 4)
        assert "use 8 or 12" in str(err)
        assert isinstance(err, ValueError)
        assert isinstance(err, PoolError)
        assert isinstance(err, UnicacheFsmError)

    @pytest.mark.parametrize(
        ("size", "page_size", "argument"),
        [(8, 0, "page_size"), (8, -4, "page_size"), (8, True, "page_size"), (-4, 4, "size")],
    )
    def test_bad_config(self, size: int, page_size: int, argument: str) -> None:
        with pytest.raises(PoolConfigError) as info:
            PagedAllocator(size, page_size)
        assert info.value.argument == argument

    def test_empty_pool_is_allowed(self) -> None:
        a = PagedAllocator(0, 4)
        assert a.available_size() == 0
        assert a.alloc(0) is not None
        assert a.alloc(4) is None

    @no_cuda
    def test_cuda_without_a_gpu_is_a_typed_error(self) -> None:
        with pytest.raises(DeviceUnavailableError) as info:
            PagedAllocator(8, 4, device="cuda")
        assert info.value.device == "cuda"
        assert "cuda" in str(info.value)
        assert isinstance(info.value, RuntimeError)

    @pytest.mark.parametrize("device", ["meta", "not-a-device"])
    def test_unsupported_device(self, device: str) -> None:
        with pytest.raises(PoolConfigError) as info:
            resolve_device(device)
        assert info.value.argument == "device"

    def test_layout_is_a_frozen_value(self) -> None:
        layout = PageLayout(16, 4, "kv")
        assert (layout.num_pages, layout.num_slots) == (4, 20)
        assert layout == PageLayout(16, 4, "kv")
        with pytest.raises(AttributeError):
            layout.size = 8  # type: ignore[misc]


# -- alloc ---------------------------------------------------------------------------


class TestAlloc:
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fresh_pages_come_in_order_as_whole_pages(self, page_size: int) -> None:
        a = make(page_size)
        slots = a.alloc(3 * page_size)
        assert slots is not None
        assert slots.dtype == torch.int64
        assert slots.shape == (3 * page_size,)
        assert pages_in(slots, page_size) == [1, 2, 3]
        assert a.available_size() == 5 * page_size

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_alloc_zero_is_an_empty_int64_tensor(self, page_size: int) -> None:
        a = make(page_size)
        before = snapshot(a)
        got = a.alloc(0)
        assert got is not None
        assert got.dtype == torch.int64
        assert got.shape == (0,)
        assert snapshot(a) == before

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_exhaustion_returns_none_and_changes_nothing(self, page_size: int) -> None:
        a = make(page_size, 4)
        assert a.alloc(3 * page_size) is not None
        before = snapshot(a)
        assert a.alloc(2 * page_size) is None
        assert snapshot(a) == before
        assert a.alloc(page_size) is not None
        assert a.alloc(page_size) is None

    @pytest.mark.parametrize("num_tokens", [1, 3, 5, -4])
    def test_not_a_page_multiple(self, num_tokens: int) -> None:
        a = make(4)
        before = snapshot(a)
        with pytest.raises(NotPageMultipleError) as info:
            a.alloc(num_tokens)
        assert (info.value.what, info.value.value, info.value.page_size) == (
            "num_tokens",
            num_tokens,
            4,
        )
        assert snapshot(a) == before

    @pytest.mark.parametrize("num_tokens", [4.0, True, "4", None])
    def test_non_int_count(self, num_tokens: object) -> None:
        a = make(4)
        before = snapshot(a)
        with pytest.raises(TensorTypeError) as info:
            a.alloc(num_tokens)  # type: ignore[arg-type]
        assert info.value.what == "num_tokens"
        assert snapshot(a) == before

    def test_freed_pages_are_reused(self) -> None:
        a = make(4, 2)
        first = a.alloc(8)
        assert first is not None
        assert a.alloc(4) is None
        a.free(first[4:])
        again = a.alloc(4)
        assert again is not None
        assert pages_in(again, 4) == [2]

    def test_returned_slots_do_not_alias_the_free_list(self) -> None:
        a = make(1, 4)
        got = a.alloc(2)
        assert got is not None
        kept = got.clone()
        a.free(got)
        a.alloc(1)
        assert torch.equal(got, kept)


# -- free ----------------------------------------------------------------------------


class TestFree:
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_free_in_any_page_order(self, page_size: int) -> None:
        a = make(page_size)
        slots = a.alloc(4 * page_size)
        assert slots is not None
        a.free(slots_of([3, 1], page_size))
        assert a.allocated_page_ids().tolist() == [2, 4]
        a.free(slots_of([4, 2], page_size))
        assert a.available_size() == 8 * page_size
        assert a.free_page_ids().tolist() == list(range(1, 9))

    def test_free_empty_is_a_no_op(self) -> None:
        a = make(4)
        before = snapshot(a)
        a.free(torch.empty(0, dtype=torch.int64))
        assert snapshot(a) == before


def _allocated(page_size: int) -> tuple[PagedAllocator, torch.Tensor]:
    """An allocator with pages 1..4 of 8 handed out; returns it and those slots."""
    a = make(page_size)
    slots = a.alloc(4 * page_size)
    assert slots is not None
    return a, slots


class TestBadFree:
    """Every bad free raises its exact type, carries the culprit, and changes nothing."""

    def check(self, a: PagedAllocator, slots: object, error: type[Exception]) -> Exception:
        before = snapshot(a)
        with pytest.raises(error) as info:
            a.free(slots)  # type: ignore[arg-type]
        assert type(info.value) is error
        assert isinstance(info.value, PoolError)
        assert snapshot(a) == before
        return info.value

    @pytest.mark.parametrize("page_size", [4, 16])
    def test_partial_page(self, page_size: int) -> None:
        a, slots = _allocated(page_size)
        err = self.check(a, slots[: page_size - 1], UnalignedSlotsError)
        assert isinstance(err, UnalignedSlotsError)
        assert err.length == page_size - 1
        assert err.page_size == page_size

    @pytest.mark.parametrize("page_size", [4, 16])
    def test_page_not_in_order_within(self, page_size: int) -> None:
        a, slots = _allocated(page_size)
        page = slots[:page_size].flip(0)
        err = self.check(a, page, UnalignedSlotsError)
        assert isinstance(err, UnalignedSlotsError)
        assert err.slots == (page_size * 2 - 1,)

    @pytest.mark.parametrize("page_size", [4, 16])
    def test_page_not_starting_at_a_multiple(self, page_size: int) -> None:
        a, slots = _allocated(page_size)
        shifted = slots[: 2 * page_size] + 1
        err = self.check(a, shifted, UnalignedSlotsError)
        assert isinstance(err, UnalignedSlotsError)
        assert err.slots == (page_size + 1, 2 * page_size + 1)

    @pytest.mark.parametrize("page_size", [4, 16])
    def test_whole_length_but_two_half_pages(self, page_size: int) -> None:
        a, slots = _allocated(page_size)
        half = page_size // 2
        mixed = torch.cat([slots[:half], slots[page_size : page_size + half]])
        self.check(a, mixed, UnalignedSlotsError)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_page_zero_is_foreign(self, page_size: int) -> None:
        a, slots = _allocated(page_size)
        bad = torch.cat([slots[:page_size], slots_of([0], page_size)])
        err = self.check(a, bad, ForeignSlotsError)
        assert isinstance(err, ForeignSlotsError)
        assert err.slots == tuple(range(page_size))
        assert (err.low, err.high) == (page_size, 9 * page_size)
        assert "padding sink" in str(err)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_past_the_end_is_foreign(self, page_size: int) -> None:
        a, _ = _allocated(page_size)
        err = self.check(a, slots_of([9], page_size), ForeignSlotsError)
        assert isinstance(err, ForeignSlotsError)
        assert err.slots == tuple(range(9 * page_size, 10 * page_size))

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_negative_is_foreign(self, page_size: int) -> None:
        a, _ = _allocated(page_size)
        self.check(a, slots_of([-1], page_size), ForeignSlotsError)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_already_free_page(self, page_size: int) -> None:
        a, slots = _allocated(page_size)
        bad = torch.cat([slots[:page_size], slots_of([6], page_size)])
        err = self.check(a, bad, DoubleFreeError)
        assert isinstance(err, DoubleFreeError)
        assert err.pages == (6,)
        assert isinstance(err, SlotsNotAllocatedError)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_freed_twice(self, page_size: int) -> None:
        a, slots = _allocated(page_size)
        a.free(slots[:page_size])
        err = self.check(a, slots[:page_size], DoubleFreeError)
        assert isinstance(err, DoubleFreeError)
        assert err.pages == (1,)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_same_page_twice_in_one_call(self, page_size: int) -> None:
        a, _ = _allocated(page_size)
        err = self.check(a, slots_of([2, 3, 2], page_size), DoubleFreeError)
        assert isinstance(err, DoubleFreeError)
        assert err.pages == (2,)

    @pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.uint8])
    def test_wrong_dtype(self, dtype: torch.dtype) -> None:
        a, slots = _allocated(4)
        err = self.check(a, slots.to(dtype), TensorTypeError)
        assert isinstance(err, TensorTypeError)
        assert (err.got, err.expected) == (dtype, torch.int64)
        assert isinstance(err, TypeError)

    def test_not_a_tensor(self) -> None:
        a, slots = _allocated(4)
        err = self.check(a, slots.tolist(), TensorTypeError)
        assert isinstance(err, TensorTypeError)
        assert err.got is list

    def test_wrong_device(self) -> None:
        a, slots = _allocated(4)
        err = self.check(a, slots.to("meta"), DeviceMismatchError)
        assert isinstance(err, DeviceMismatchError)
        assert err.got == torch.device("meta")

    def test_not_one_dimensional(self) -> None:
        a, slots = _allocated(4)
        err = self.check(a, slots.view(-1, 4), TensorShapeError)
        assert isinstance(err, TensorShapeError)
        assert err.got == (4, 4)


def test_a_deep_copy_is_an_independent_allocator_in_the_same_state() -> None:
    """A search snapshots allocators with copy.deepcopy: the copy's checks read its own
    flags (on CPU a tensor viewing a bytearray), and neither side sees the other's moves."""
    import copy

    alloc = PagedAllocator(64, 4)
    held = alloc.alloc(16)
    assert held is not None
    twin = copy.deepcopy(alloc)
    assert twin.available_size() == alloc.available_size()
    twin.free(held)  # the copy's pages are live in the copy ...
    assert twin.available_size() == alloc.available_size() + 16
    with pytest.raises(PoolError):
        twin.free(held)  # ... and free there now (a double free, on both check paths)
    alloc.check_live(held)  # the original still holds them
    more = twin.alloc(64)
    assert more is not None and alloc.available_size() == 48
