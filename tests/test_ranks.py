"""Rank agreement: the restorable intersection is in every rank's set and maximal, with
ranks simulated by threads and with real gloo processes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.linker import (
    RankGroup,
    RankGroupError,
    SingleRank,
    ThreadRankGroup,
    TorchDistRankGroup,
    agree,
    intersect_restorable,
)

T = TypeVar("T")


def on_threads(world: int, fn: Callable[[RankGroup], T]) -> list[T | BaseException]:
    """Run `fn` on `world` thread ranks; each rank's result or exception, rank order."""
    groups = ThreadRankGroup.create(world, timeout=10.0)
    out: list[T | BaseException] = [RuntimeError("did not finish")] * world

    def run(group: ThreadRankGroup) -> None:
        try:
            out[group.rank] = fn(group)
        except BaseException as exc:
            out[group.rank] = exc

    threads = [threading.Thread(target=run, args=(g,)) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def intersect_on_threads(sets: Sequence[Sequence[int]], num_pages: int) -> list[object]:
    return on_threads(len(sets), lambda g: intersect_restorable(g, sets[g.rank], num_pages))


def test_single_rank_is_the_identity() -> None:
    group = SingleRank()
    assert isinstance(group, RankGroup) and (group.rank, group.world_size) == (0, 1)
    assert intersect_restorable(group, [1, 5], 6) == 5
    assert intersect_restorable(group, [], 6) == 0
    assert intersect_restorable(group, [], 0) == 0
    assert agree(group, True) and not agree(group, False)


def test_two_ranks_take_the_largest_common_boundary_not_the_min_of_maxima() -> None:
    sets = [[2, 4], [2, 3]]  # min of maxima is 3, which rank 0 cannot restore
    assert intersect_on_threads(sets, 4) == [2, 2]
    assert intersect_on_threads([[1, 5], [1, 4, 5]], 6) == [5, 5]
    assert intersect_on_threads([[3], [4]], 4) == [0, 0]


def test_three_ranks_with_sparse_sets() -> None:
    sets = [[1, 3, 5], [1, 3, 4], [1, 2, 3, 5]]  # min of maxima is 4; common is {1, 3}
    assert intersect_on_threads(sets, 5) == [3, 3, 3]
    assert intersect_on_threads([[5], [1, 5], [2, 5]], 5) == [5, 5, 5]
    assert intersect_on_threads([[], [1], [1]], 1) == [0, 0, 0]


def test_agree_is_a_logical_and() -> None:
    flags = [True, True, False]
    assert on_threads(3, lambda g: agree(g, flags[g.rank])) == [False] * 3
    assert on_threads(3, lambda g: agree(g, True)) == [True] * 3
    assert on_threads(2, lambda g: g.all_reduce_min([g.rank, 5 - g.rank, 7])) == [[0, 4, 7]] * 2


@settings(max_examples=40)
@given(
    st.integers(1, 12).flatmap(
        lambda n: st.tuples(
            st.just(n), st.lists(st.sets(st.integers(1, n)), min_size=2, max_size=3)
        )
    )
)
def test_intersection_is_in_every_set_and_maximal(case: tuple[int, list[set[int]]]) -> None:
    num_pages, sets = case
    results = intersect_on_threads([sorted(s) for s in sets], num_pages)
    common = set.intersection(*sets)
    assert results == [max(common, default=0)] * len(sets)


def test_unequal_lengths_raise_on_every_rank() -> None:
    out = on_threads(2, lambda g: g.all_reduce_min([1] * (g.rank + 1)))
    assert all(isinstance(r, RankGroupError) for r in out)


def test_bad_input_on_one_rank_releases_the_others_at_once() -> None:
    start = time.monotonic()
    out = on_threads(3, lambda g: g.all_reduce_min([1, "x" if g.rank == 1 else 2]))  # type: ignore[list-item]
    assert all(isinstance(r, RankGroupError) for r in out)
    assert time.monotonic() - start < 5  # not the barrier timeout
    with pytest.raises(RankGroupError, match=r"outside 1\.\.4"):
        intersect_restorable(SingleRank(), [5], 4)
    with pytest.raises(RankGroupError):
        intersect_restorable(SingleRank(), [1], -1)
    with pytest.raises(RankGroupError):
        ThreadRankGroup.create(0)


def test_torch_dist_group_needs_an_initialised_process_group() -> None:
    if dist.is_initialized():  # pragma: no cover - only when a runner set one up
        pytest.skip("a default process group exists in this process")
    with pytest.raises(RankGroupError, match="init_process_group"):
        TorchDistRankGroup()


# -- real gloo processes --------------------------------------------------------------------


def _gloo_rank(
    rank: int, world: int, init: str, sets: list[list[int]], num_pages: int, out: str
) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        group = TorchDistRankGroup()
        best = intersect_restorable(group, sets[rank], num_pages)
        landed = agree(group, True)
        one_failed = agree(group, rank != world - 1)
        facts = [group.rank, group.world_size, best, landed, one_failed]
        Path(out, f"{rank}.json").write_text(json.dumps(facts))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("sets", "num_pages", "expected"),
    [
        ([[2, 4], [2, 3]], 4, 2),
        ([[1, 3, 5], [1, 3, 4], [1, 2, 3, 5]], 5, 3),
    ],
)
def test_gloo_processes_agree_on_the_largest_common_length(
    tmp_path: Path, sets: list[list[int]], num_pages: int, expected: int
) -> None:
    world = len(sets)
    init = f"file://{tmp_path / 'rendezvous'}"
    args = (world, init, sets, num_pages, str(tmp_path))
    # fork: no torch re-import per rank (a spawned rank costs seconds on 2 cores)
    context = mp.start_processes(
        _gloo_rank, args=args, nprocs=world, join=False, start_method="fork"
    )
    deadline = time.monotonic() + 60
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("gloo ranks did not finish within 60 s")
    facts = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]
    assert facts == [[r, world, expected, True, False] for r in range(world)]


def test_a_bad_boundary_on_one_rank_joins_the_reduction_then_raises_there() -> None:
    """The other ranks get their answer at once (the bad boundary counts as not
    restorable everywhere); only the rank that passed it raises, after the reduction."""
    start = time.monotonic()
    out = on_threads(2, lambda g: intersect_restorable(g, [1, 2] if g.rank else [1, 2, 9], 2))
    assert out[1] == 2 and isinstance(out[0], RankGroupError)
    assert time.monotonic() - start < 5  # not the barrier timeout
