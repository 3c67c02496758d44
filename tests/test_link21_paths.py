"""The fast paths of this pass answer as the general paths they skip."""

from __future__ import annotations

import random

import pytest

from unicache_fsm.linker.ranks import (
    RankGroupError,
    SingleRank,
    ThreadRankGroup,
    agree,
    intersect_restorable,
)


def test_single_rank_answers_as_a_world_of_one_thread() -> None:
    """`SingleRank` skips the reduction; a one-rank `ThreadRankGroup` runs it."""
    rng = random.Random(7)
    single, world = SingleRank(), ThreadRankGroup.create(1)[0]
    for _ in range(300):
        n = rng.randrange(0, 9)
        found = rng.sample(range(1, n + 1), rng.randrange(0, n + 1)) if n else []
        assert intersect_restorable(single, found, n) == intersect_restorable(world, found, n)
    for flag in (True, False, 1, 0, "x", "", None, [0]):
        assert agree(single, flag) is agree(world, flag)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [[0], [3], [True], [1.0], [1, "2"]])
def test_single_rank_still_refuses_bad_boundaries(bad: list[object]) -> None:
    with pytest.raises(RankGroupError, match="outside 1..2"):
        intersect_restorable(SingleRank(), bad, 2)  # type: ignore[arg-type]
