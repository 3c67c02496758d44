"""SWA checkpoints (issue 37): with `swa_checkpoint` K a request keeps the SWA window
ending at every K-page checkpoint too, the tree holds each as live nodes of their own,
and a prefix ending at a checkpoint is reusable from the device and from the store; off
(the default) nothing changes. Through the public APIs: `tree.swa_checkpoints`,
`RadixTree.insert`, `serving.System`, `Simulation` and the command line."""

from __future__ import annotations

import collections
import importlib.util
import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.cli import main
from unicache_fsm.pools.transfer import ComponentType, PoolName, PoolTransfer
from unicache_fsm.scheduler import SimConfig, Simulation
from unicache_fsm.scheduler.simulation import SimConfigError
from unicache_fsm.serving.request import Outcome
from unicache_fsm.serving.system import System
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.tree import EvictParams, InsertParams, InsertParamsError, TreeConfigError
from unicache_fsm.tree.swa_checkpoints import check_interval, checkpoint_windows

SWA = ComponentType.SWA
P = 4
WINDOW_PAGES = 2  # the window: 2 pages = 8 tokens (sliding window 6 tokens)


def _system(k: int | None, **kw: object) -> System:
    return System.build(
        P, swa=True, full_pages=64, swa_pages=64, window_pages=WINDOW_PAGES, swa_checkpoint=k, **kw
    )


def _key(pages: int, base: int = 1000) -> tuple[int, ...]:
    return tuple(range(base, base + pages * P))


def _path(s: System, key: Sequence[int]) -> list[tuple[int, int, bool]]:
    """(start, end, SWA live) of the nodes on `key`'s path, root first."""
    node = s.tree.match_prefix(tuple(key)).last_device_node
    out = []
    while node.parent is not None:
        out.append((node.start, node.start + len(node.key), node.slots(SWA) is not None))
        node = node.parent
    return out[::-1]


# -- the policy's windows -------------------------------------------------------------------


def test_windows_end_at_each_checkpoint_clipped_and_merged() -> None:
    # checkpoints every 12 tokens, window 8: [4,12) and [16,24) below the limit 24
    assert checkpoint_windows(0, 32, 24, 8, 12) == ((4, 12), (16, 24))
    # overlapping windows (checkpoint every 4, window 8) are one range: each page once
    assert checkpoint_windows(0, 32, 24, 8, 4) == ((0, 24),)
    # a request computing from 14 keeps only what lies in [14, limit)
    assert checkpoint_windows(14, 32, 24, 8, 12) == ((16, 24),)
    assert checkpoint_windows(0, 32, 24, 8, 0) == ()  # off


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    st.integers(0, 12),
    st.integers(0, 12),
    st.integers(0, 12),
    st.integers(1, 4),
    st.integers(1, 5),
)
def test_windows_cover_exactly_the_checkpoint_windows(
    start: int, length: int, cut: int, window: int, interval: int
) -> None:
    end = start + length
    limit = min(end, start + cut)
    got = checkpoint_windows(start, end, limit, window, interval)
    covered = {t for a, b in got for t in range(a, b)}
    want = {
        t
        for c in range(interval, end + 1, interval)
        if c > start
        for t in range(max(start, c - window), min(c, limit))
    }
    assert covered == want
    assert all(a < b for a, b in got)
    assert all(b1 < a2 for (_, b1), (a2, _) in itertools.pairwise(got))  # merged


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_a_bad_interval_is_refused_by_name(bad: object) -> None:
    with pytest.raises(TreeConfigError, match="swa_checkpoint"):
        check_interval(bad)
    with pytest.raises(TreeConfigError, match="swa_checkpoint"):
        _system(bad)  # type: ignore[arg-type]


# -- the tree -------------------------------------------------------------------------------


def test_each_kept_window_is_a_live_node_and_the_gaps_are_tombstones() -> None:
    s = _system(3)  # checkpoints every 12 tokens
    key = _key(8)
    s.compute("a", key)
    s.audit()  # mapping, slot conservation, and every live window's bytes
    assert _path(s, key) == [
        (0, 4, False),
        (4, 12, True),
        (12, 16, False),
        (16, 24, True),
        (24, 32, True),  # the request's own last window
    ]


def test_without_checkpoints_the_insert_is_sglangs() -> None:
    s = _system(None)
    key = _key(8)
    s.compute("a", key)
    assert _path(s, key) == [(0, 24, False), (24, 32, True)]


@pytest.mark.parametrize(("k", "hit"), [(3, 24), (None, 0)])
def test_a_prefix_ending_at_a_checkpoint_is_reused_from_the_device(k: int | None, hit: int) -> None:
    s = _system(k)
    s.compute("a", _key(8))
    b = _key(6) + _key(2, base=5000)  # shares 24 tokens, the second checkpoint
    assert s.tree.match_prefix(b).prefix_len == hit
    req = s.compute("b", b)
    assert req.slots is not None and req.slots.numel() == len(b)
    s.audit()


@pytest.mark.parametrize(("k", "outcome"), [(3, Outcome.COMMITTED), (None, Outcome.MISS)])
def test_a_prefix_ending_at_a_checkpoint_is_restored_from_the_store(
    k: int | None, outcome: Outcome
) -> None:
    s = _system(k)
    s.compute("a", _key(8))  # offloaded (write-through), settled
    s.tree.evict(EvictParams(num_tokens=10**6))
    assert s.tree.match_prefix(_key(8)).prefix_len == 0
    b = _key(6) + _key(2, base=5000)
    req = s.serve("b", b)  # LOOKUP, LOAD, land, COMMIT; every invariant audited
    assert req.outcome is outcome
    if outcome is Outcome.COMMITTED:
        assert req.load is not None and req.load.prefix_len == 24
        # the loaded window is live in the tree and holds the bytes recompute gives
        assert (16, 24, True) in _path(s, b)
    s.audit()


class _CountingStore(MemoryStore):
    """The memory store, counting the SWA pages each offload sends."""

    def __init__(self) -> None:
        super().__init__()
        self.swa_sent: collections.Counter[str] = collections.Counter()

    def offload(self, transfers: Sequence[PoolTransfer]) -> bool:
        for t in transfers:
            if t.name is PoolName.SWA:
                self.swa_sent.update(t.keys)
        return super().offload(transfers)


def test_overlapping_windows_are_stored_once_with_their_bytes() -> None:
    store = _CountingStore()
    s = _system(1, store_factory=lambda: store)  # a window every page: windows overlap
    s.compute("a", _key(6))
    s.compute("b", _key(4) + _key(3, base=5000))
    s.audit()
    assert store.swa_sent and max(store.swa_sent.values()) == 1
    live: dict[str, torch.Tensor] = {}
    for n in s.tree.nodes():
        swa = n.slots(SWA)
        if swa is not None and n.hashes:
            for i, h in enumerate(n.hashes):
                live[h] = swa[i * P]
    assert set(store.stored_keys(PoolName.SWA)) == set(live) == set(store.swa_sent)
    assert s.swa_kv is not None
    pool = s.swa_kv.page_bytes()
    for h, slot in live.items():
        stored = store.stored_bytes(PoolName.SWA, h)
        assert stored is not None
        assert stored.numpy().tobytes() == pool[int(slot) // P].tobytes()
    swa_bytes = len(store.stored_keys(PoolName.SWA)) * s.swa_kv.page_nbytes
    assert swa_bytes == len(set(store.swa_sent)) * s.swa_kv.page_nbytes


# -- the insert's check ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "ranges",
    [((8, 4),), ((0, 4), (2, 8)), ((0, 28),), ((2, 4),), ((-4, 4),), ("ab",), ((1, 2, 3),), 5],
)
def test_bad_kept_ranges_are_refused_and_change_nothing(ranges: object) -> None:
    s = _system(None)
    key = _key(8)
    slots = s.alloc(len(key))
    before = (s.allocator.available_size(), s.allocator.available_swa_size())  # type: ignore[union-attr]
    with pytest.raises((InsertParamsError, ValueError), match="swa_kept_ranges"):
        s.tree.insert(
            InsertParams(key=key, value=slots, swa_evicted_seqlen=24, swa_kept_ranges=ranges)  # type: ignore[arg-type]
        )
    assert s.tree.match_prefix(key).prefix_len == 0
    after = (s.allocator.available_size(), s.allocator.available_swa_size())  # type: ignore[union-attr]
    assert after == before
    s.allocator.free(slots)
    s.audit()


def test_a_kept_range_without_mapped_swa_is_refused_and_changes_nothing() -> None:
    s = _system(None)
    key = _key(8)
    slots = s.alloc(len(key))  # FULL slots only: nothing maps them to SWA
    free = s.allocator.available_swa_size()  # type: ignore[union-attr]
    with pytest.raises(InsertParamsError, match=r"\(4, 12\).*map to no SWA slot"):
        s.tree.insert(
            InsertParams(key=key, value=slots, swa_evicted_seqlen=32, swa_kept_ranges=[(4, 12)])
        )
    assert s.tree.match_prefix(key).prefix_len == 0
    assert s.allocator.available_swa_size() == free  # type: ignore[union-attr]
    s.allocator.free(slots)
    s.audit()


# -- the scheduler and the command line -----------------------------------------------------


def test_simulate_with_checkpoints_serves_a_sliding_window_workload_again() -> None:
    base = SimConfig(workload="few_shot", requests=30, swa_window=256)
    plain = Simulation(SimConfig(workload="few_shot", requests=30)).run()
    default = Simulation(base).run()
    sim = Simulation(SimConfig(workload="few_shot", requests=30, swa_window=256, swa_checkpoint=32))
    kept = sim.run()
    hit = lambda r: r.device_hit_tokens + r.loaded_tokens  # noqa: E731
    assert hit(default) == 0  # 0.5.23's retention: nothing of a shared template is reusable
    assert hit(kept) == hit(plain) > 0
    assert kept.loads_mismatched == 0 and not any(kept.leaked_slots.values())
    assert sim.stored_pages[PoolName.SWA] > 0


def test_simulate_refuses_checkpoints_without_a_window() -> None:
    with pytest.raises(SimConfigError, match="--swa-checkpoint 4 needs --swa-window"):
        Simulation(SimConfig(requests=2, swa_checkpoint=4))
    with pytest.raises(SimConfigError, match="--swa-checkpoint"):
        Simulation(SimConfig(requests=2, swa_window=64, swa_checkpoint=-1))


def test_the_command_line_refuses_checkpoints_without_a_window(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--requests", "2", "--swa-checkpoint", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--swa-checkpoint 4 needs --swa-window" in err[0]
    assert main(["explore", "--swa-window", "0", "--swa-checkpoint", "1"]) == 2
    assert "--swa-checkpoint needs --swa-window" in capsys.readouterr().err


def test_the_benchmark_prints_each_configuration_against_no_swa_and_the_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_swa.py"
    spec = importlib.util.spec_from_file_location("_bench_swa", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    plain, default, k32 = bench.compare("few_shot", 12, (32,))
    assert default.hit == 0 < k32.hit == plain.hit
    assert k32.store_bytes >= default.store_bytes > plain.store_bytes > 0
    out = capsys.readouterr().out
    assert "K=32 (best K)" in out and "SWA pool mean / peak" in out
