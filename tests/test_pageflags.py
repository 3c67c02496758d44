"""`PageFlags` (per-page flag bytes) against a set of page ids, native and Python forms."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.pools.pageflags import PageFlags

NUM_PAGES = 40
ids = st.lists(st.integers(0, NUM_PAGES), max_size=12)


@pytest.mark.parametrize("native", [True, False])
@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["mark", "clear", "ask"]), ids), max_size=20))
def test_flags_behave_as_a_set_of_ids(native: bool, steps: list[tuple[str, list[int]]]) -> None:
    flags, model = PageFlags(NUM_PAGES, native=native), set[int]()
    for op, batch in steps:
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
            op([5, bad, 7])  # type: ignore[operator]
    assert flags.marked() == [3]


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
