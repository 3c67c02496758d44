"""SWAAllocator: the mapping and the four frees by example, and every bad input."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pool_strategies import PAGE_SIZES, pages_in, slots_of, swa_snapshot
from unicache_fsm.pools import (
    DeviceMismatchError,
    DoubleFreeError,
    DuplicatePagesError,
    ForeignSlotsError,
    LengthMismatchError,
    NotPageMultipleError,
    PoolError,
    SlotsNotAllocatedError,
    SWAAllocator,
    TensorShapeError,
    TensorTypeError,
    UnalignedSlotsError,
)


def setup(page_size: int) -> tuple[SWAAllocator, torch.Tensor, torch.Tensor]:
    """FULL 8 pages, SWA 4 pages; FULL pages 1..4 and SWA pages 1..2 allocated;
    FULL pages 3, 4 mapped to SWA pages 1, 2."""
    a = SWAAllocator(8 * page_size, 4 * page_size, page_size)
    full = a.alloc(4 * page_size)
    swa = a.alloc_swa(2 * page_size)
    assert full is not None
    assert swa is not None
    a.set_full_to_swa_mapping(full[2 * page_size :], swa)
    return a, full, swa


class TestHappyPaths:
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_fresh(self, page_size: int) -> None:
        a = SWAAllocator(8 * page_size, 4 * page_size, page_size)
        assert (a.available_size(), a.available_swa_size()) == (8 * page_size, 4 * page_size)
        assert a.full_to_swa_mapping.shape == (9 * page_size,)
        assert int(a.full_to_swa_mapping.abs().sum()) == 0
        assert a.alloc(0) is not None
        assert a.alloc_swa(5 * page_size) is None

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_mapping_and_translate(self, page_size: int) -> None:
        a, full, swa = setup(page_size)
        assert torch.equal(a.translate(full[2 * page_size :]), swa)
        assert int(a.translate(full[: 2 * page_size]).abs().sum()) == 0
        # any slot of the pool translates, page 0 and any order included
        probe = torch.tensor([0, 3 * page_size + page_size - 1, page_size], dtype=torch.int64)
        assert a.translate(probe).tolist() == [0, page_size + page_size - 1, 0]

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_combined_free_frees_mapped_swa_and_zeroes(self, page_size: int) -> None:
        a, full, _ = setup(page_size)
        a.free(full[page_size : 3 * page_size])  # FULL pages 2 (unmapped) and 3 (-> SWA 1)
        assert a.allocated_page_ids().tolist() == [1, 4]
        assert a.swa_allocated_page_ids().tolist() == [2]
        assert int(a.translate(full[page_size : 3 * page_size]).abs().sum()) == 0
        assert a.available_swa_size() == 3 * page_size

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_full_only_free_leaves_swa_allocated(self, page_size: int) -> None:
        a, full, swa = setup(page_size)
        a.free_full_only(full[2 * page_size :])
        assert a.allocated_page_ids().tolist() == [1, 2]
        assert a.swa_allocated_page_ids().tolist() == [1, 2]
        assert int(a.full_to_swa_mapping.abs().sum()) == 0
        a.free_swa(swa)  # the caller still owns them
        assert a.available_swa_size() == 4 * page_size

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_free_mapped_swa_is_the_tombstone(self, page_size: int) -> None:
        a, full, _ = setup(page_size)
        a.free_mapped_swa(full)  # unmapped FULL pages 1, 2 are skipped
        assert a.allocated_page_ids().tolist() == [1, 2, 3, 4]
        assert a.swa_allocated_page_ids().tolist() == []
        assert int(a.full_to_swa_mapping.abs().sum()) == 0

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_free_swa_unmaps_the_full_side(self, page_size: int) -> None:
        a, full, swa = setup(page_size)
        a.free_swa(swa[:page_size])
        assert a.swa_allocated_page_ids().tolist() == [2]
        assert int(a.translate(full[2 * page_size : 3 * page_size]).abs().sum()) == 0
        assert torch.equal(a.translate(full[3 * page_size :]), swa[page_size:])
        a.free(full)  # FULL 4 still maps to SWA 2, which goes with it
        assert a.available_swa_size() == 4 * page_size

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_remapping_keeps_the_mapping_one_to_one(self, page_size: int) -> None:
        a, full, swa = setup(page_size)
        p = page_size
        # FULL 1 takes SWA 1 (from FULL 3); FULL 4 moves to a fresh SWA page 3.
        fresh = a.alloc_swa(p)
        assert fresh is not None
        a.set_full_to_swa_mapping(torch.cat([full[:p], full[3 * p :]]), torch.cat([swa[:p], fresh]))
        assert pages_in(a.translate(full[:p]), p) == [1]
        assert int(a.translate(full[2 * p : 3 * p]).abs().sum()) == 0  # FULL 3 lost SWA 1
        assert pages_in(a.translate(full[3 * p :]), p) == [3]
        # SWA 2 is now unmapped but still allocated; a combined free of everything FULL
        # frees SWA 1 and 3 only.
        a.free(full)
        assert a.swa_allocated_page_ids().tolist() == [2]

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_swapping_partners_in_one_call(self, page_size: int) -> None:
        a, full, swa = setup(page_size)
        p = page_size
        a.set_full_to_swa_mapping(full[2 * p :], torch.cat([swa[p:], swa[:p]]))
        assert pages_in(a.translate(full[2 * p :]), p) == [2, 1]

    def test_empty_calls_are_no_ops(self) -> None:
        a, _, _ = setup(4)
        before = swa_snapshot(a)
        empty = torch.empty(0, dtype=torch.int64)
        a.set_full_to_swa_mapping(empty, empty)
        a.free(empty)
        a.free_full_only(empty)
        a.free_mapped_swa(empty)
        a.free_swa(empty)
        assert a.translate(empty).shape == (0,)
        assert swa_snapshot(a) == before

    def test_repr(self) -> None:
        a = SWAAllocator(32, 16, 4)
        assert repr(a) == "SWAAllocator(full_size=32, swa_size=16, page_size=4, device='cpu')"


def check(a: SWAAllocator, call: Callable[[], object], error: type[Exception]) -> Exception:
    before = swa_snapshot(a)
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error
    assert isinstance(info.value, PoolError)
    assert swa_snapshot(a) == before
    return info.value


class TestBadInput:
    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_mapping_lengths_differ(self, page_size: int) -> None:
        a, full, swa = setup(page_size)
        err = check(a, lambda: a.set_full_to_swa_mapping(full, swa), LengthMismatchError)
        assert isinstance(err, LengthMismatchError)
        assert (err.left_len, err.right_len) == (4 * page_size, 2 * page_size)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_mapping_a_free_full_page(self, page_size: int) -> None:
        a, _, swa = setup(page_size)
        free_full = slots_of([7, 8], page_size)
        err = check(a, lambda: a.set_full_to_swa_mapping(free_full, swa), SlotsNotAllocatedError)
        assert isinstance(err, SlotsNotAllocatedError)
        assert (err.pool, err.pages) == ("full", (7, 8))

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_mapping_to_a_free_swa_page(self, page_size: int) -> None:
        a, full, swa = setup(page_size)
        target = torch.cat([swa[:page_size], slots_of([4], page_size)])
        err = check(
            a,
            lambda: a.set_full_to_swa_mapping(full[: 2 * page_size], target),
            SlotsNotAllocatedError,
        )
        assert isinstance(err, SlotsNotAllocatedError)
        assert (err.pool, err.pages) == ("swa", (4,))

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_mapping_one_page_twice(self, page_size: int) -> None:
        a, full, swa = setup(page_size)
        twice = torch.cat([swa[:page_size], swa[:page_size]])
        err = check(
            a, lambda: a.set_full_to_swa_mapping(full[: 2 * page_size], twice), DuplicatePagesError
        )
        assert isinstance(err, DuplicatePagesError)
        assert (err.pool, err.pages) == ("swa", (1,))

    @pytest.mark.parametrize("page_size", [4, 16])
    def test_mapping_partial_pages(self, page_size: int) -> None:
        a, full, swa = setup(page_size)
        check(
            a,
            lambda: a.set_full_to_swa_mapping(full[1 : page_size + 1], swa[:page_size]),
            UnalignedSlotsError,
        )

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_swa_slots_beyond_the_swa_pool(self, page_size: int) -> None:
        a, full, _ = setup(page_size)
        # FULL page 6 exists in FULL, not in the 4-page SWA pool
        bad = slots_of([6], page_size)
        err = check(a, lambda: a.set_full_to_swa_mapping(full[:page_size], bad), ForeignSlotsError)
        assert isinstance(err, ForeignSlotsError)
        assert err.pool == "swa"

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    @pytest.mark.parametrize("op", ["free", "free_full_only"])
    def test_full_double_free(self, page_size: int, op: str) -> None:
        a, full, _ = setup(page_size)
        free_it = getattr(a, op)
        bad = torch.cat([full[2 * page_size :], slots_of([5], page_size)])
        err = check(a, lambda: free_it(bad), DoubleFreeError)
        assert isinstance(err, DoubleFreeError)
        assert (err.pool, err.pages) == ("full", (5,))
        twice = torch.cat([full[2 * page_size :], full[2 * page_size : 3 * page_size]])
        check(a, lambda: free_it(twice), DoubleFreeError)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_swa_double_free(self, page_size: int) -> None:
        a, _, _ = setup(page_size)
        err = check(a, lambda: a.free_swa(slots_of([1, 3], page_size)), DoubleFreeError)
        assert isinstance(err, DoubleFreeError)
        assert (err.pool, err.pages) == ("swa", (3,))

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_free_mapped_swa_of_a_free_full_page(self, page_size: int) -> None:
        a, full, _ = setup(page_size)
        bad = torch.cat([full[2 * page_size :], slots_of([5], page_size)])
        err = check(a, lambda: a.free_mapped_swa(bad), SlotsNotAllocatedError)
        assert isinstance(err, SlotsNotAllocatedError)
        assert err.pages == (5,)

    @pytest.mark.parametrize("page_size", PAGE_SIZES)
    def test_translate_outside_the_pool(self, page_size: int) -> None:
        a, _, _ = setup(page_size)
        bad = torch.tensor([page_size, 9 * page_size, -1], dtype=torch.int64)
        err = check(a, lambda: a.translate(bad), ForeignSlotsError)
        assert isinstance(err, ForeignSlotsError)
        assert err.slots == (9 * page_size, -1)
        assert (err.low, err.high) == (0, 9 * page_size)

    @pytest.mark.parametrize(
        "op",
        [
            "free",
            "free_full_only",
            "free_mapped_swa",
            "free_swa",
            "translate",
            "map_full",
            "map_swa",
        ],
    )
    def test_wrong_dtype_device_and_shape_everywhere(self, op: str) -> None:
        a, full, swa = setup(4)

        def call(t: torch.Tensor) -> Callable[[], object]:
            if op == "map_full":
                return lambda: a.set_full_to_swa_mapping(t, swa)
            if op == "map_swa":
                return lambda: a.set_full_to_swa_mapping(full[8:], t)
            fn = getattr(a, op)
            return lambda: fn(t)

        good = swa if op in ("free_swa", "map_swa") else full[8:]
        check(a, call(good.to(torch.int32)), TensorTypeError)
        check(a, call(good.to("meta")), DeviceMismatchError)
        check(a, call(good.view(2, -1)), TensorShapeError)

    def test_alloc_not_a_page_multiple(self) -> None:
        a, _, _ = setup(4)
        check(a, lambda: a.alloc(6), NotPageMultipleError)
        check(a, lambda: a.alloc_swa(2), NotPageMultipleError)
