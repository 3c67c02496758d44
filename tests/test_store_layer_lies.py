"""Lies about per-layer progress are caught: `CheckedStore.loaded_layers` contains each
one (a fault, never an answer), `FaultyStore`'s ``overreport_layers`` tells them, and
`StoreMachine` catches both that and a planted store that counts a layer landed before
its copy lands (a counter bumped when a copy is queued)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.base import LoadBatch
from unicache_fsm.store.checked import CheckedStore
from unicache_fsm.store.errors import StoreBatchUnknownError, StoreProtocolError
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule, FaultyStore
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing.store_machine import MemoryStoreMachine, StoreMachine

KV, SWA = PoolName.KV, PoolName.SWA
# deterministic; it stops at the first failure, so a catch costs a second or two
HUNT = settings(
    max_examples=150,
    stateful_step_count=40,
    database=None,
    derandomize=True,
    deadline=None,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)


class _Answers:
    """A store whose `loaded_layers` answers what the test says (or raises it)."""

    def __init__(self, answer: object) -> None:
        self.answer = answer

    def loaded_layers(self, batch: int) -> object:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


LAYERS = {KV: 4, SWA: 2}


@pytest.mark.parametrize(
    ("answer", "previous"),
    [
        ({KV: 5}, None),  # more layers than the pool has
        ({KV: -1}, None),
        ({KV: "2"}, None),
        ({KV: True}, None),
        ({KV: 2.0}, None),
        ({PoolName.MAMBA: 1}, None),  # a pool not attached
        ({"kv": 1}, None),
        ([(KV, 1)], None),
        (None, None),
        ({KV: 1}, {KV: 2}),  # below the last answer
        ({SWA: 2}, {KV: 1}),  # a pool left out counts 0: below the last answer
        (ConnectionError("gone"), None),
        (StoreBatchUnknownError("never started", batch=3), None),
    ],
)
def test_checked_store_contains_every_lie_about_layers(answer: object, previous: Any) -> None:
    faults: list[tuple[str, BaseException]] = []
    checked = CheckedStore(_Answers(answer), lambda op, exc: faults.append((op, exc)))  # type: ignore[arg-type]
    assert checked.loaded_layers(3, LAYERS, previous) is None
    assert [op for op, _ in faults] == ["loaded_layers"]
    if not isinstance(answer, Exception):
        assert isinstance(faults[0][1], StoreProtocolError)
        assert faults[0][1].value is answer


def test_checked_store_passes_an_honest_answer() -> None:
    faults: list[object] = []
    checked = CheckedStore(_Answers({KV: 2, SWA: 2}), lambda op, exc: faults.append(exc))  # type: ignore[arg-type]
    assert checked.loaded_layers(0, LAYERS, {KV: 2, SWA: 1}) == {KV: 2, SWA: 2}
    assert checked.loaded_layers(0, LAYERS) == {KV: 2, SWA: 2}
    assert not faults


def _started(store: ExternalStore) -> int:
    pool = KVPool(64, 4, 3, 8)
    store.attach({KV: pool})
    keys = page_hashes(list(range(8)), 4)
    assert store.offload([PoolTransfer(KV, torch.arange(4, 12), keys)])
    store.progress()
    assert store.pop_completed_offload() is True
    assert store.load("r", [PoolTransfer(KV, torch.arange(20, 28), keys)])
    return store.start_loading()


def test_faulty_store_overreports_only_what_is_still_running() -> None:
    policy = FaultPolicy({FaultKind.OVERREPORT_LAYERS: FaultRule(every=1)}, seed=1)
    store = FaultyStore(MemoryStore(), policy)
    batch = _started(store)
    lies = {repr(store.loaded_layers(batch)) for _ in range(12)}
    assert lies == {repr({KV: 3}), repr({KV: 4}), repr({KV: "0"})}
    store.progress()
    assert store.loaded_layers(batch) == {KV: 3}  # landed: the truth, whatever the policy
    assert store.pop_completed_load().success is True
    assert store.loaded_layers(batch) == {KV: 3}
    with pytest.raises(StoreBatchUnknownError):
        store.loaded_layers(batch + 1)
    assert policy.injected[FaultKind.OVERREPORT_LAYERS] == 12
    store.close()


def test_an_overreporting_store_is_caught_by_the_store_machine() -> None:
    class Overreporting(StoreMachine):
        pool_names = (KV,)

        def make_store(self) -> ExternalStore:
            policy = FaultPolicy({FaultKind.OVERREPORT_LAYERS: FaultRule(probability=0.5)})
            return FaultyStore(MemoryStore(), policy)

    with pytest.raises(AssertionError, match=r"loaded_layers\(\d+\) (reports|returned)"):
        run_state_machine_as_test(Overreporting, settings=HUNT)  # type: ignore[no-untyped-call]


@attrs.define
class _Queued:
    """A device wrapper whose write only queues the copy: it lands at the next write, or
    at `flush` (a copy enqueued on a stream and counted before it completes)."""

    inner: Any
    pending: tuple[Any, ...] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write_page_ids(
        self, pages: torch.Tensor, data: torch.Tensor, *, layers: Any = None
    ) -> None:
        self.flush()
        self.pending = (pages, data, layers)

    def flush(self) -> None:
        if self.pending is not None:
            pages, data, layers = self.pending
            self.pending = None
            self.inner.write_page_ids(pages, data, layers=layers)


class CountsBeforeCopies(MemoryStore):
    """Planted: each layer is counted landed when its copy is queued, not when it lands."""

    def write_layers(self, batch: LoadBatch, parts: Any) -> None:
        queued = [_Queued(part.device) for part in parts]
        late = [attrs.evolve(p, device=q) for p, q in zip(parts, queued, strict=True)]
        super().write_layers(batch, late)
        for device in queued:
            device.flush()


class _CountsFirstMachine(MemoryStoreMachine):
    pool_names = (KV,)
    host_view = False  # pools the host cannot view: loads are written layer by layer

    def make_store(self) -> ExternalStore:
        return CountsBeforeCopies(capacity_pages=self.capacity_pages)


@pytest.mark.parametrize("after", [0, 1])
def test_a_store_counting_layers_before_they_land_fails_a_short_program(after: int) -> None:
    """The program: offload two pages, load them, break the device's write `after` more
    writes, start and settle. The copy that fails was counted already."""
    machine = _CountsFirstMachine()
    machine.open_store(page_size=4)
    chain = machine.offload(cut=0, mamba=0, pages=(1, 2), parent=None, settle=True, swa=0)
    machine.load(chain=chain, start=0, count=2, settle=False)
    machine.break_device(KV, after)
    with pytest.raises(AssertionError, match=f"reports {after + 1} kv layer.*layer {after} still"):
        machine.start_loading(settle=True)
    machine.teardown()


class _LayerWiseMachine(MemoryStoreMachine):
    host_view = False


def test_the_same_program_passes_the_honest_store() -> None:
    machine = _LayerWiseMachine()
    machine.open_store(page_size=4)
    chain = machine.offload(cut=0, mamba=0, pages=(1, 2), parent=None, settle=True, swa=0)
    machine.load(chain=chain, start=0, count=2, settle=False)
    machine.break_device(KV, 1)
    machine.start_loading(settle=True)
    assert machine.layers_seen == {} and not machine.started  # popped: failed, checked
    machine.teardown()


def test_the_honest_memory_store_passes_the_same_hunt() -> None:
    class Machine(MemoryStoreMachine):
        pool_names = (KV,)
        host_view = False

    run_state_machine_as_test(Machine, settings=settings(HUNT, max_examples=30))  # type: ignore[no-untyped-call]


def test_checked_store_reads_a_dict_subclass_as_a_plain_dict() -> None:
    class Odd(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise RuntimeError("not called")

    class Count(int):
        pass

    faults: list[object] = []
    checked = CheckedStore(_Answers(Odd({KV: 2})), lambda op, exc: faults.append(exc))  # type: ignore[arg-type]
    assert checked.loaded_layers(0, LAYERS) == {KV: 2} and not faults
    checked = CheckedStore(_Answers({KV: Count(2)}), lambda op, exc: faults.append(exc))  # type: ignore[arg-type]
    assert checked.loaded_layers(0, LAYERS) is None and len(faults) == 1
