"""Fuzzing rank agreement: many ranks, sparse restorable sets, one agreed boundary.

`check_rank_agreement(max_ranks=3, max_pages=8)` is a Hypothesis test body: it draws
2..`max_ranks` ranks, gives each a random (often sparse) set of restorable boundaries,
runs `linker.ranks.intersect_restorable` on thread-simulated ranks
(`ThreadRankGroup`), and checks with `invariants.restorable_intersection` that every
rank got the same boundary, that every rank can restore it, and that no larger one
would do. It also checks `agree` (MIN of verdicts). Call it from a test; it raises
`InvariantViolation` with the falsifying sets.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.linker import ranks
from unicache_fsm.serving.invariants import InvariantViolation, restorable_intersection

__all__ = ["check_rank_agreement", "run_on_ranks"]


def run_on_ranks(
    per_rank: Sequence[Sequence[int]], num_pages: int, flags: Sequence[bool]
) -> tuple[list[int], list[bool]]:
    """Each rank's (intersection, agreement) result, computed on thread ranks."""
    groups = ranks.ThreadRankGroup.create(len(per_rank), timeout=10.0)
    out: list[int] = [-1] * len(per_rank)
    agreed: list[bool] = [False] * len(per_rank)
    errors: list[BaseException] = []

    def work(r: int) -> None:
        try:
            out[r] = ranks.intersect_restorable(groups[r], per_rank[r], num_pages)
            agreed[r] = ranks.agree(groups[r], flags[r])
        except BaseException as exc:  # re-raised below, on the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(len(per_rank))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20.0)
    if errors:
        raise errors[0]
    return out, agreed


def check_rank_agreement(
    max_ranks: int = 3, max_pages: int = 8, *, with_settings: settings | None = None
) -> None:
    """Run the property (see the module docstring) under the active Hypothesis profile,
    or under `with_settings`."""

    @given(
        num_pages=st.integers(1, max_pages),
        data=st.data(),
    )
    def prop(num_pages: int, data: st.DataObject) -> None:
        n = data.draw(st.integers(2, max_ranks), label="ranks")
        boundary = st.integers(1, num_pages)
        per_rank = [
            sorted(data.draw(st.sets(boundary, max_size=num_pages), label=f"rank {r}"))
            for r in range(n)
        ]
        flags = [data.draw(st.booleans(), label=f"verdict {r}") for r in range(n)]
        out, agreed = run_on_ranks(per_rank, num_pages, flags)
        if len(set(out)) != 1:
            raise InvariantViolation("rank agreement", f"ranks disagree: {out} for {per_rank}")
        restorable_intersection(per_rank, num_pages, out[0])
        if set(agreed) != {all(flags)}:
            raise InvariantViolation("rank agreement", f"agree({flags}) gave {agreed}")

    (with_settings(prop) if with_settings is not None else prop)()
