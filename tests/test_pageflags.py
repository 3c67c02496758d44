"""`PageFlags` (per-page flag bytes) against a set of page ids, native and Python forms."""

from __future__ import annotations

import copy
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.pools.pageflags import PageFlags

try:
    from unicache_fsm import _pagecheck
except ImportError:  # pragma: no cover - built without a C compiler
    _pagecheck = None  # type: ignore[assignment]

NUM_PAGES = 40
ids = st.lists(st.integers(0, NUM_PAGES), max_size=12)


@pytest.mark.parametrize("as_array", ["", "q", "i", "L"])
@pytest.mark.parametrize("native", [True, False])
@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["mark", "clear", "ask"]), ids), max_size=20))
def test_flags_behave_as_a_set_of_ids(
    native: bool, as_array: str, steps: list[tuple[str, list[int]]]
) -> None:
    """Ids as a list or as an ``array('q')`` (what the tree keeps of an insert's tail,
    read in place by the native form), or an array of another type code (copied)."""
    flags, model = PageFlags(NUM_PAGES, native=native), set[int]()
    for op, ids_list in steps:
        batch: list[int] | array[int] = array(as_array, ids_list) if as_array else ids_list
        if op == "mark":
            flags.mark(batch)
            model.update(batch)
        elif op == "clear":
            flags.clear(batch)
            model.difference_update(batch)
        assert flags.any_of(batch) == (not model.isdisjoint(batch))
        assert flags.marked_of(batch) == sorted(model.intersection(batch))
    assert flags.marked() == sorted(model)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("bad", [-1, NUM_PAGES + 1, 2**70])
def test_an_id_outside_the_flags_raises_and_changes_nothing(native: bool, bad: int) -> None:
    flags = PageFlags(NUM_PAGES, native=native)
    flags.mark([3])
    for op in (flags.mark, flags.clear, flags.any_of, flags.marked_of):
        with pytest.raises(IndexError):
            op([5, bad, 7])
        if bad < 2**63:  # (an int64 array cannot hold the others)
            with pytest.raises(IndexError):
                op(array("q", [5, bad, 7]))
    assert flags.marked() == [3]


def test_the_native_calls_take_int64_buffers_only() -> None:
    """A buffer of another item type is a TypeError naming its format, and nothing
    changes; ids that are neither a list nor a buffer are a TypeError too."""
    if _pagecheck is None:
        pytest.skip("the native check was not built")
    flags = bytearray(NUM_PAGES + 1)
    strided = np.arange(8, dtype=np.int64)[::2]  # int64, but not one C-contiguous run
    for bad in (array("i", [1, 2]), bytearray(16), array("d", [1.0]), strided):
        with pytest.raises(TypeError, match="int64"):
            _pagecheck.set_flags(flags, bad, True)
        with pytest.raises(TypeError, match="int64"):
            _pagecheck.any_flagged(flags, bad)
    for bad in ((1, 2), None, 3):
        with pytest.raises(TypeError, match="list or an int64 buffer"):
            _pagecheck.set_flags(flags, bad, True)
    assert flags == bytearray(NUM_PAGES + 1)
    _pagecheck.set_flags(flags, array("q", [2, 5]), True)
    assert _pagecheck.any_flagged(flags, array("q", [5]))
    assert not _pagecheck.any_flagged(flags, array("q", []))
    assert [k for k, f in enumerate(flags) if f] == [2, 5]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_a_bad_size_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="num_pages"):
        PageFlags(bad)  # type: ignore[arg-type]


def test_a_deep_copy_keeps_its_own_flags() -> None:
    flags = PageFlags(8)
    flags.mark([1, 2])
    twin = copy.deepcopy(flags)
    twin.clear([1])
    twin.mark([5])
    assert flags.marked() == [1, 2]
    assert twin.marked() == [2, 5]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("bad", [-1, NUM_PAGES + 1, 2**70, "4", 2.0, None])
def test_a_bad_id_after_a_marked_one_is_still_refused(native: bool, bad: object) -> None:
    """`any_of` checks every id, not only those before the first marked one: the native
    form stopped at the first hit and answered True where the Python form raised."""
    flags = PageFlags(NUM_PAGES, native=native)
    flags.mark([5])
    with pytest.raises((IndexError, TypeError)) as raised:
        flags.any_of([5, bad])  # type: ignore[list-item]
    assert isinstance(raised.value, IndexError) == isinstance(bad, int)
    assert flags.marked() == [5]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("bad", ["4", 2.0, None, object()])
def test_an_id_that_is_no_integer_is_refused_before_any_flag_changes(
    native: bool, bad: object
) -> None:
    """A non-integer id after good ones: TypeError and no flag written (the Python form
    set the ids before it and then raised)."""
    flags = PageFlags(NUM_PAGES, native=native)
    flags.mark([3])
    for op in (flags.mark, flags.clear):
        with pytest.raises(TypeError):
            op([1, 3, bad, 7])  # type: ignore[list-item]
        assert flags.marked() == [3]


@pytest.mark.parametrize("native", [True, False])
def test_ids_may_come_as_any_sequence_on_both_forms(native: bool) -> None:
    """A tuple or range of ids works on both forms (the native form took lists only)."""
    flags = PageFlags(NUM_PAGES, native=native)
    flags.mark((1, 2))
    flags.mark(range(4, 6))
    assert flags.any_of((2,))
    assert not flags.any_of((3, 7))
    flags.clear((1,))
    assert flags.marked() == [2, 4, 5]
