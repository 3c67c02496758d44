"""`testing.search.breadth_first`: the search both exhaustive explorers share, on toy
state spaces whose answers are known (states are integers, an operation adds to them)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from unicache_fsm.testing.search import SearchExpandError, Successor, breadth_first


def _adder(
    ops: Sequence[int], modulo: int, bad: int | None = None
) -> Any:  # (entries) -> each entry's successors
    def expand(entries: Sequence[tuple[tuple[Any, ...], int | None]]) -> Iterator[list[Any]]:
        for _, state in entries:
            assert state is not None
            out = []
            for op in ops:
                nxt = (state + op) % modulo
                if nxt == bad:
                    out.append(Successor(op, None, f"reached {bad}"))
                else:
                    out.append(Successor(op, nxt, state=nxt))
            yield out

    return expand


def test_a_finite_space_is_exhausted_with_every_state_counted() -> None:
    out = breadth_first(0, {0}, _adder([1, 2], 7))
    assert out.exhausted and out.violation is None
    assert out.states == 7
    # the farthest states from 0 with steps of 1 and 2 modulo 7 are 3 steps away (5: 2+2+1,
    # 6: 2+2+2); a fourth level finds nothing new
    assert out.depth == 4
    assert out.transitions == 2 * 7


def test_the_violation_reported_is_a_shortest_path_to_it() -> None:
    out = breadth_first(0, {0}, _adder([1, 3], 100, bad=9))
    assert out.violation is not None
    path, error = out.violation
    assert error == "reached 9" and sum(path) == 9
    assert len(path) == 3  # 3+3+3: no shorter sum of 1s and 3s makes 9
    assert out.depth == 3 and not out.exhausted


def test_max_depth_and_deadline_stop_without_calling_the_space_exhausted() -> None:
    out = breadth_first(0, {0}, _adder([1], 1000), max_depth=4)
    assert (out.depth, out.states, out.exhausted) == (4, 5, False)
    past = time.perf_counter() - 1.0
    out = breadth_first(0, {0}, _adder([1], 1000), deadline=past)
    assert (out.depth, out.states, out.exhausted) == (0, 1, False)


def test_progress_is_told_each_level() -> None:
    seen: list[tuple[int, int, int]] = []
    breadth_first(0, {0}, _adder([1], 3), progress=lambda *a: seen.append(a))
    assert seen == [(1, 2, 1), (2, 3, 1), (3, 3, 0)]


def test_an_expand_that_drops_or_adds_a_group_is_refused_not_counted_as_a_leaf() -> None:
    full = _adder([1, 2], 7)

    def short(entries: Sequence[tuple[tuple[Any, ...], int | None]]) -> Iterator[list[Any]]:
        groups = list(full(entries))
        yield from groups[:-1]  # the last entry's successors never come

    def long(entries: Sequence[tuple[tuple[Any, ...], int | None]]) -> Iterator[list[Any]]:
        yield from full(entries)
        yield []

    with pytest.raises(SearchExpandError, match="yielded 0 successor groups for 1 entries"):
        breadth_first(0, {0}, short)
    with pytest.raises(SearchExpandError, match="more successor groups than the 1 entries"):
        breadth_first(0, {0}, long)
