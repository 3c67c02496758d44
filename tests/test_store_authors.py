"""docs/store-authors.md cannot rot: its dict-backed store (at most 30 lines) is run,
round-trips pages with per-layer progress, passes the guide's own `StoreMachine`
snippet, and the same store with a planted bug (an erase that keeps the page) is caught."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.store.shared import SharedStore

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "store-authors.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
KV = PoolName.KV
FAST = settings(
    max_examples=8,
    stateful_step_count=20,
    database=None,
    derandomize=True,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)


def _guide() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(BLOCKS[0], str(GUIDE), "exec"), namespace)
    return namespace


def test_the_example_backend_is_at_most_30_lines() -> None:
    assert len([line for line in BLOCKS[0].splitlines() if line.strip()]) <= 30


def test_the_example_backend_round_trips_pages_layer_by_layer() -> None:
    store = _guide()["DictStore"](staging_bytes=1 << 20)
    assert isinstance(store, SharedStore) and isinstance(store, ExternalStore)
    pool = KVPool(64, 4, 3, 8)
    data = torch.arange(2 * 4 * 3 * 8, dtype=torch.float16).view(8, 3, 8)
    pool.write_pages(torch.arange(4, 12), data)
    store.attach({KV: pool})
    keys = page_hashes(list(range(8)), 4)
    assert store.offload([PoolTransfer(KV, torch.arange(4, 12), keys)])
    store.progress()
    assert store.pop_completed_offload() is True
    assert store.lookup("r", [PoolTransfer(KV, None, keys)]) == [1, 2]
    assert store.load("r", [PoolTransfer(KV, torch.arange(20, 28), keys)])
    batch = store.start_loading()
    assert store.loaded_layers(batch) == {KV: 0}
    store.progress()
    assert store.pop_completed_load().success is True
    assert store.loaded_layers(batch) == {KV: 3}
    assert torch.equal(pool.read_pages(torch.arange(20, 28)), data)
    store.close()


def test_the_guides_fuzz_snippet_passes_the_example_backend() -> None:
    namespace = _guide()
    exec(compile(BLOCKS[1], str(GUIDE), "exec"), namespace)
    run_state_machine_as_test(namespace["DictStoreMachine"], settings=FAST)  # type: ignore[no-untyped-call]


def test_the_example_backend_with_a_planted_bug_is_caught() -> None:
    namespace = _guide()
    exec(compile(BLOCKS[1], str(GUIDE), "exec"), namespace)

    class KeepsErased(namespace["DictStore"]):  # type: ignore[misc]
        def medium_erase(self, pool: PoolName, keys: list[str]) -> int:
            return sum((pool, key) in self.values for key in keys)  # counted, never erased

    class Machine(namespace["DictStoreMachine"]):  # type: ignore[misc]
        def make_store(self) -> ExternalStore:
            return KeepsErased()  # type: ignore[no-any-return]

    with pytest.raises(AssertionError, match="the test evicted it"):
        run_state_machine_as_test(Machine, settings=FAST)  # type: ignore[no-untyped-call]
