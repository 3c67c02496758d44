"""Several tensor-parallel ranks, one linker each, agreeing through `ThreadRankGroup`.

Every rank has its own pools, tree, store and linker, runs in its own thread, and makes
the same calls in the same order (drive loops run a fixed number of rounds, as a
scheduler steps every rank alike). A fault on one rank must lead every rank to the same
outcome: LOOKUP lengths intersect (sparse sets to the largest common boundary), load
and offload verdicts are agreed (MIN).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from unicache_fsm.linker.load import AbortReason
from unicache_fsm.linker.ranks import ThreadRankGroup
from unicache_fsm.pools.transfer import PoolHitPolicy, PoolName, PoolTransfer
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule
from unicache_fsm.testing.system import System, kv_bytes, run_ranks

P = 4
ROUNDS = 5


def key_of(pages: int, p: int = P, base: int = 100) -> tuple[int, ...]:
    return tuple(range(base, base + pages * p))


def always(kind: FaultKind) -> FaultPolicy:
    return FaultPolicy({kind: FaultRule(every=1)})


def on_rank(faulty_rank: int, kind: FaultKind) -> Callable[[int], FaultPolicy]:
    return lambda rank: always(kind) if rank == faulty_rank else FaultPolicy()


def ranks(n: int, fn: Callable[[int, ThreadRankGroup], Any], timeout: float = 20.0) -> list[Any]:
    return run_ranks(n, fn, timeout=timeout)


def build(rank: int, group: ThreadRankGroup, *, swa: bool = False, **kw: Any) -> System:
    return System.build(P, swa=swa, faults=FaultPolicy(), group=group, **kw)


# -- load verdicts ---------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
@pytest.mark.parametrize(
    "kind", [FaultKind.FAIL_BATCH_MIDWAY, FaultKind.FAIL_BATCH_BEFORE_START], ids=lambda k: k.value
)
def test_a_failed_verdict_on_one_rank_aborts_everywhere(
    world: int, swa: bool, kind: FaultKind
) -> None:
    x = key_of(6)
    policy = on_rank(world - 1, kind)

    def step(rank: int, group: ThreadRankGroup) -> tuple[str, AbortReason | None, bool]:
        s = build(rank, group, swa=swa)
        s.compute("A", x)
        s.evict_all()
        s.faulty.policy = policy(rank)
        b = s.begin("B", x)
        s.drive(ROUNDS, fixed=True)
        s.faulty.policy = FaultPolicy()
        assert b.load is not None
        state, reason = b.load.state, b.load.abort_reason
        s.complete(b)
        assert b.slots is not None
        assert torch.equal(s.full_bytes(b.slots), kv_bytes(x, 0))
        s.evict_all()
        again = s.begin("again", x)
        s.drive(ROUNDS, fixed=True)
        s.complete(again)
        s.assert_quiet()
        return state, reason, again.outcome == "committed"

    results = ranks(world, step)
    assert results == [("aborted", AbortReason.LOAD_FAILED, True)] * world


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_a_delayed_completion_on_one_rank_delays_every_rank(swa: bool) -> None:
    x = key_of(6)

    def step(rank: int, group: ThreadRankGroup) -> list[str]:
        s = build(rank, group, swa=swa)
        s.compute("A", x)
        s.evict_all()
        if rank == 1:
            s.faulty.policy = FaultPolicy(
                {FaultKind.DELAY_COMPLETION: FaultRule(every=1)}, delay_steps=2
            )
        b = s.begin("B", x)
        assert b.load is not None
        s.linker.start_loading()
        seen = []
        for _ in range(4):
            s.store.progress()
            s.linker.finish_loads()
            s.audit()
            seen.append(b.load.state)
        s.complete(b)
        s.assert_quiet()
        return seen

    results = ranks(2, step)
    assert results[0] == results[1]
    assert results[0][0] == "prepared.loading" and results[0][-1] == "committed"


def test_a_failed_lookup_on_one_rank_is_a_miss_everywhere() -> None:
    x = key_of(6)

    def step(rank: int, group: ThreadRankGroup) -> str:
        s = build(rank, group)
        s.compute("A", x)
        s.evict_all()
        s.faulty.policy = on_rank(0, FaultKind.FAIL_LOOKUP)(rank)
        b = s.begin("B", x)
        s.drive(ROUNDS, fixed=True)
        s.complete(b)
        s.assert_quiet()
        return b.outcome

    assert ranks(2, step) == ["miss", "miss"]


def test_a_failed_offload_on_one_rank_unstores_everywhere() -> None:
    x = key_of(6)

    def step(rank: int, group: ThreadRankGroup) -> tuple[str, bool]:
        s = build(rank, group)
        s.faulty.policy = on_rank(1, FaultKind.FAIL_OFFLOAD)(rank)
        a = s.compute("A", x, settle=False)
        s.drive(ROUNDS, fixed=True)
        s.faulty.policy = FaultPolicy()
        assert a.offload is not None
        stored = any(n.external_cache_stored for n in s.tree.nodes())
        s.assert_quiet()
        return a.offload.state, stored

    assert ranks(2, step) == [("failed", False), ("failed", False)]


# -- sparse restorable sets ------------------------------------------------------------
def lookup_pages(s: System, hashes: list[str], window_pages: int) -> list[int]:
    transfers = [PoolTransfer(PoolName.KV, keys=tuple(hashes))]
    if s.swa:
        transfers.append(
            PoolTransfer(
                PoolName.SWA,
                keys=tuple(hashes[-window_pages:]),
                hit_policy=PoolHitPolicy.TRAILING_PAGES,
            )
        )
    return s.store.lookup("probe", transfers)


@pytest.mark.parametrize(
    ("swa", "lost", "restorable", "common"),
    [
        # SWA window of one page: boundary L needs the SWA page L-1
        (True, [{0, 2}, {0, 3}], [[2, 4], [2, 3]], 2),  # MIN of the maxima would say 3
        (True, [{0, 2}, {0, 2}, {0, 1}], [[2, 4], [2, 4], [3, 4]], 4),
        (True, [{1, 3}, {0, 2}], [[1, 3], [2, 4]], 0),
        # FULL only: a page lost ends the leading run
        (False, [{3}, {5}], [[1, 2, 3], [1, 2, 3, 4, 5]], 3),
    ],
    ids=["swa-2-of-4-3", "swa-3-ranks", "swa-disjoint", "full"],
)
def test_sparse_restorable_sets_intersect_to_the_largest_common_boundary(
    swa: bool, lost: list[set[int]], restorable: list[list[int]], common: int
) -> None:
    """Each rank's store lost different pages (SWA pages, or FULL pages)."""
    pages = 4 if swa else 6
    x = key_of(pages)

    def step(rank: int, group: ThreadRankGroup) -> tuple[list[int], int, str]:
        s = build(rank, group, swa=swa, window_pages=1)
        a = s.compute("A", x, swa_boundary=0)  # every node keeps live SWA
        assert a.last_node is not None
        hashes = [h for n in a.last_node.path_from_root() for h in (n.hashes or ())]
        pool = PoolName.SWA if swa else PoolName.KV
        s.store.evict([hashes[i] for i in sorted(lost[rank])], pool=pool)
        found = lookup_pages(s, hashes, 1)
        s.evict_all()
        s.check_stored = False  # the store lost pages on purpose
        b = s.begin("B", x)
        hit = 0 if b.match is None else b.match.external_hit_len // P
        s.drive(ROUNDS, fixed=True)
        outcome = "miss" if b.load is None else b.load.state
        if b.load is not None and b.load.state == "committed":
            assert b.load.slots is not None
            assert torch.equal(s.full_bytes(b.load.slots), kv_bytes(x[: hit * P], 0))
            if swa:
                live, got = s.swa_bytes_of(b.load.slots)
                assert bool(live[-P:].all())
                assert torch.equal(got, kv_bytes(x, 0, swa=True)[: hit * P][live])
        s.complete(b)
        s.assert_quiet()
        return found, hit, outcome

    results = ranks(len(lost), step)
    assert [r[0] for r in results] == restorable
    assert {r[1] for r in results} == {common}
    assert {r[2] for r in results} == {"committed" if common else "miss"}


# -- divergent outcomes the linker does not agree on (bugs) -----------------------------
@pytest.mark.parametrize(
    "kind", [FaultKind.REFUSE_LOAD, FaultKind.EVICT_AFTER_LOOKUP], ids=lambda k: k.value
)
def test_a_refused_load_on_one_rank_aborts_everywhere(kind: FaultKind) -> None:
    x = key_of(6)

    def step(rank: int, group: ThreadRankGroup) -> tuple[str, AbortReason | None]:
        s = build(rank, group)
        s.compute("A", x)
        s.evict_all()
        s.faulty.policy = on_rank(1, kind)(rank)
        b = s.begin("B", x)
        for _ in range(ROUNDS):  # not `drive`: a stuck rank must not skip collectives
            s.linker.start_loading()
            s.store.progress()
            s.linker.finish_loads()
            s.linker.poll_offloads()
        assert b.load is not None
        return b.load.state, b.load.abort_reason

    results = ranks(2, step, timeout=5)
    assert {r[0] for r in results} == {"aborted"}


def test_a_refused_offload_on_one_rank_fails_everywhere() -> None:
    x, y = key_of(6), key_of(4, base=500)

    def step(rank: int, group: ThreadRankGroup) -> tuple[str, str, bool]:
        s = build(rank, group)
        s.faulty.policy = on_rank(1, FaultKind.REFUSE_OFFLOAD)(rank)
        a = s.compute("A", x, settle=False)
        s.faulty.policy = FaultPolicy()
        yreq = s.compute("Y", y, settle=False)
        for _ in range(ROUNDS):
            s.store.progress()
            s.linker.poll_offloads()
        assert a.offload is not None and yreq.offload is not None
        assert yreq.last_node is not None
        return a.offload.state, yreq.offload.state, yreq.last_node.external_cache_stored

    results = ranks(2, step, timeout=5)
    assert results == [("failed", "published", True)] * 2


def test_verify_stored_with_a_failed_lookup_on_one_rank() -> None:
    x = key_of(4)

    def step(rank: int, group: ThreadRankGroup) -> int:
        s = build(rank, group)
        a = s.compute("A", x)
        assert a.last_node is not None
        s.store.evict(list(a.last_node.hashes or ())[-1:])
        s.faulty.policy = on_rank(1, FaultKind.FAIL_LOOKUP)(rank)
        return s.linker.verify_stored(a.last_node)

    results = ranks(2, step, timeout=2)
    assert results[0] == results[1]
