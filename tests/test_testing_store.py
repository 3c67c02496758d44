"""The public store-fuzzing kit (`unicache_fsm.testing.store_machine`, `.strategies`).

The kit must pass correct stores (the memory store bounded, unbounded and lossless, with
a worker thread, and under every injected fault; the example's `DictStore`) and catch
broken ones within the ``ci`` profile: the example's `LeakyDictStore` and planted bugs
in `MemoryStore`. A caught failure's program, as Hypothesis prints it, is pasted back
and run: it must fail the same way (every value in it has a valid-Python repr).
"""

from __future__ import annotations

import collections
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, run_state_machine_as_test

from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools.transfer import PoolName, check_page_key
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule, FaultyStore
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import ExternalStore, LoadBatchResult
from unicache_fsm.store.requests import CheckedTransfer
from unicache_fsm.testing.store_machine import (
    Chain,
    LoadTicket,
    MemoryStoreMachine,
    StoreMachine,
)
from unicache_fsm.testing.strategies import (
    fault_policies,
    keys_with_shared_prefixes,
    page_key_chains,
    page_sizes,
    pool_sizes,
    token_keys,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fuzz_your_store.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_example_fuzz_your_store", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- correct stores pass -------------------------------------------------------------------

TestMemoryStoreMachine = MemoryStoreMachine.TestCase  # settings: the loaded profile


class UnboundedMemoryStoreMachine(MemoryStoreMachine):
    """No capacity: the memory store then drops, refuses and fails nothing on its own."""

    capacity_pages = None
    lossless = True


class BackgroundMemoryStoreMachine(UnboundedMemoryStoreMachine):
    background = True


class FaultyMemoryStoreMachine(StoreMachine):
    """A bounded memory store inside `FaultyStore`, with a drawn policy over every kind."""

    progress_completes = False  # delay_completion holds completions back

    @initialize(
        page_size=st.sampled_from((1, 4)),
        policy=fault_policies(max_probability=0.3),
    )
    def open_store(self, page_size: int, policy: FaultPolicy) -> None:
        self.policy = policy
        super().open_store(page_size)

    def make_store(self) -> ExternalStore:
        return FaultyStore(MemoryStore(capacity_pages=24), self.policy)


TestUnboundedMemoryStoreMachine = UnboundedMemoryStoreMachine.TestCase
TestBackgroundMemoryStoreMachine = BackgroundMemoryStoreMachine.TestCase
TestFaultyMemoryStoreMachine = FaultyMemoryStoreMachine.TestCase


def test_example_store_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert _example().main(["--examples", "30"]) == 0
    assert "DictStore passed 30 programs" in capsys.readouterr().out


def test_open_store_attaches_real_pools() -> None:
    machine = MemoryStoreMachine()
    machine.open_store(page_size=4)
    assert set(machine.kv_pools) == set(PoolName)
    assert all(pool.page_size == 4 for pool in machine.kv_pools.values())
    machine.teardown()


# -- broken stores are caught ----------------------------------------------------------------

# The ci profile, whatever profile runs the suite; deterministic, and no shrinking
# (minutes at 50 steps), so a printed program is long: it is replayed below, not read.
CATCH = settings(
    settings.get_profile("ci"),
    database=None,
    derandomize=True,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
PROGRAM_LINE = re.compile(r"^(state\b|\w+ = state\.)")


def _caught(machine: type[StoreMachine], match: str) -> AssertionError:
    """Run `machine` under `CATCH`; its failure must match, and so must its replay."""
    with pytest.raises(AssertionError, match=match) as info:
        run_state_machine_as_test(machine, settings=CATCH)  # type: ignore[no-untyped-call]
    notes = "\n".join(getattr(info.value, "__notes__", []))
    program = [line for line in notes.splitlines() if PROGRAM_LINE.match(line)]
    assert program and program[0] == f"state = {machine.__name__}()", notes
    names = {
        machine.__name__: machine,
        "Chain": Chain,
        "LoadTicket": LoadTicket,
        "PoolName": PoolName,
        "ComponentType": PoolName,  # the same enum: builds() prints its class name
        "FaultPolicy": FaultPolicy,
    }
    with pytest.raises(AssertionError) as replay:
        exec("\n".join(program), names)
    assert str(replay.value) == str(info.value), "the printed program fails differently"
    return info.value


def test_leaky_example_store_is_caught() -> None:
    leaky = _example().LeakyDictStoreMachine
    error = _caught(leaky, r"cannot be in the store: the test evicted it \(evict #\d+\)")
    assert re.search(r"\((kv|swa|mamba), [0-9a-f]{12}\.\.\.\)", str(error)), error


def _offload_failure_reported_true(monkeypatch: pytest.MonkeyPatch) -> None:
    pop = MemoryStore.pop_completed_offload

    def pop_true(self: MemoryStore) -> bool:
        pop(self)
        return True

    monkeypatch.setattr(MemoryStore, "pop_completed_offload", pop_true)


def _pages_land_in_the_wrong_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    load = MemoryStore._load

    def reversed_slots(self: MemoryStore, batch: Any, plan: list[Any], rejected: Any) -> bool:
        def flipped(ct: CheckedTransfer) -> CheckedTransfer:
            slots = ct.slots.view(len(ct.keys), -1).flip(0).reshape(-1)  # page i -> n-1-i
            pages = ct.pages.flip(0)  # the same move by page id (what the store writes by)
            return attrs.evolve(ct, slots=slots, pages=pages)

        return load(self, batch, [(flipped(ct), *rest) for ct, *rest in plan], rejected)

    monkeypatch.setattr(MemoryStore, "_load", reversed_slots)


def _odd_batch_results_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    finish = MemoryStore.finish_load_batch

    def lose_odd(self: MemoryStore, batch: Any, ok: bool) -> None:
        finish(self, batch, ok)
        if batch.batch % 2:
            self._load_results.pop()  # the batch ran; its result is never recorded

    monkeypatch.setattr(MemoryStore, "finish_load_batch", lose_odd)


PLANTED = {
    "offload_failure_reported_true": (
        _offload_failure_reported_true,
        UnboundedMemoryStoreMachine,
        r"contains\((kv|swa|mamba), [0-9a-f]{12}\.\.\.\) is False, but a successful offload",
    ),
    "pages_land_in_the_wrong_slots": (
        _pages_land_in_the_wrong_slots,
        MemoryStoreMachine,
        r"reported success, but load 'load-\d+' \w+ page \d+ .* holds the bytes of page \d+"
        r"|loaded_layers\(\d+\) reports \d+ \w+ layer\(s\) landed, but load 'load-\d+' "
        r"page \d+ .* holds other bytes",
    ),
    "batch_results_lost": (
        _odd_batch_results_lost,
        MemoryStoreMachine,
        r"load batch result\(s\) are recorded, but .* a result was lost",
    ),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_memory_store_bug_is_caught(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plant, machine, match = PLANTED[bug]
    plant(monkeypatch)
    _caught(machine, match)


# -- strategies ------------------------------------------------------------------------------


@given(page_sizes())
def test_page_sizes_are_powers_of_two(p: int) -> None:
    assert 1 <= p <= 16 and p & (p - 1) == 0


@given(st.data(), page_sizes())
def test_keys_are_whole_pages_and_share_prefixes(data: st.DataObject, p: int) -> None:
    key = data.draw(token_keys(p, max_pages=3))
    assert len(key) % p == 0 and 1 <= len(key) // p <= 3
    keys = data.draw(keys_with_shared_prefixes(p, min_keys=2))
    assert all(key and len(key) % p == 0 for key in keys)
    tails = [next((t for t in key if t >= 4), None) for key in keys]  # vocab 4: own tokens
    own = [t for t in tails if t is not None]
    assert len(own) == len(set(own)), "every tail starts with a token of its own"
    assert data.draw(pool_sizes(p)) % p == 0


def test_shared_prefixes_make_hits_common() -> None:
    shared = 0

    @settings(max_examples=50, database=None, derandomize=True)
    @given(keys_with_shared_prefixes(4, min_keys=3))
    def count(keys: list[tuple[int, ...]]) -> None:
        nonlocal shared
        shared += any(a[:4] == b[:4] for i, a in enumerate(keys) for b in keys[i + 1 :])

    count()
    assert shared >= 25, f"only {shared} of 50 key sets share a first page"


@given(fault_policies())
def test_fault_policies_paste_back(policy: FaultPolicy) -> None:
    assert isinstance(policy, FaultPolicy) and not policy.injected
    again = eval(repr(policy), {"FaultPolicy": FaultPolicy})
    assert str(again) == str(policy)
    assert set(policy.rules) <= set(FaultKind)


@given(token_keys(4, max_pages=3), st.sampled_from([None, "ab" * 32]))
def test_page_key_chains_are_the_hash_chains_of_drawn_tokens(
    tokens: tuple[int, ...], prior: str | None
) -> None:
    keys = page_hashes(tokens, 4, prior)
    assert len(keys) == len(tokens) // 4 and all(check_page_key(k) for k in keys)


@given(page_key_chains(4, max_pages=3))
def test_page_key_chains_are_valid_keys(keys: tuple[str, ...]) -> None:
    assert 1 <= len(keys) <= 3 and all(check_page_key(k) for k in keys)
    assert len(set(keys)) == len(keys)  # chained: a repeated page still hashes anew


def test_chain_records_paste_back() -> None:
    chain = Chain(page_size=2, pages=(0, 3))
    assert eval(repr(chain), {"Chain": Chain}) == chain
    assert chain.keys == tuple(page_hashes((0, 0, 3, 3), 2))
    assert eval(repr(LoadTicket("load-1")), {"LoadTicket": LoadTicket}) == LoadTicket("load-1")


# -- the lying store (issue 31) --------------------------------------------------------------


class HastyStore:
    """A store whose load completions run ahead of its writes (a planted "free on a
    miscount" in a store): each batch is reported failed ("timed out") as soon as it
    starts, while the memory store inside still runs it and writes its pages later; the
    inner store's own late result is dropped. Everything else is the memory store's."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.queued: list[str] = []
        self.results: collections.deque[LoadBatchResult] = collections.deque()
        self.hasty: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def load(self, rid: str, transfers: Any) -> bool:
        accepted = self.inner.load(rid, transfers)
        if accepted:
            self.queued.append(rid)
        return accepted

    def cancel_queued_load(self, rid: str) -> bool:
        cancelled = self.inner.cancel_queued_load(rid)
        if cancelled:
            self.queued.remove(rid)
        return cancelled

    def start_loading(self) -> int:
        batch = self.inner.start_loading()
        if batch >= 0:
            self.results.append(LoadBatchResult(batch, tuple(self.queued), False))
            self.hasty.add(batch)
        self.queued.clear()
        return batch

    def num_completed_loads(self) -> int:
        self._absorb()
        return len(self.results)

    def pop_completed_load(self) -> LoadBatchResult:
        self._absorb()
        if not self.results:
            return self.inner.pop_completed_load()  # (raises NoCompletionError)
        return self.results.popleft()

    def reset(self) -> None:
        self.inner.reset()
        self.queued.clear()

    def _absorb(self) -> None:
        while self.inner.num_completed_loads():
            result = self.inner.pop_completed_load()
            if result.batch in self.hasty:
                self.hasty.discard(result.batch)  # reported already
            else:
                self.results.append(result)


class HastyStoreMachine(StoreMachine):
    pool_names = (PoolName.KV,)

    def make_store(self) -> ExternalStore:
        return HastyStore()  # type: ignore[return-value]


def test_a_store_whose_completions_run_ahead_of_its_writes_is_caught_by_data() -> None:
    error = _caught(HastyStoreMachine, r"written after the machine freed them \(load 'load-\d+'")
    assert "still writes into slots it gave back" in str(error)


LIES = {
    FaultKind.OVERCOUNT_COMPLETIONS: r"a count the store cannot back with a completion",
    FaultKind.UNDERCOUNT_COMPLETIONS: r"a result was lost|a completion was lost",
    FaultKind.MALFORMED_COMPLETION: r"expected a LoadBatchResult|expected a bool|reports rids",
    FaultKind.LOST_REPLY: r"lost_reply",
    FaultKind.UNKNOWN_BATCH: r"want -1|a result was lost",
}


@pytest.mark.parametrize("kind", list(LIES), ids=lambda k: k.value)
def test_every_lie_of_a_lying_store_is_caught(kind: FaultKind) -> None:
    class Lying(StoreMachine):
        pool_names = (PoolName.KV,)

        def make_store(self) -> ExternalStore:
            policy = FaultPolicy({kind: FaultRule(probability=0.5)}, seed=3)
            return FaultyStore(MemoryStore(), policy)

    # a lost reply raises where the store did its work: the store's exception propagates
    with pytest.raises((AssertionError, TimeoutError), match=LIES[kind]):
        run_state_machine_as_test(Lying, settings=CATCH)  # type: ignore[no-untyped-call]
