"""Fault injection: every fault kind has its documented effect, policies reproduce from
their seed, bad policy strings are typed errors, and a fault-free `FaultyStore` passes
the whole store contract (it is a transparent wrapper)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch

from test_store_memory import KV, Rig, StoreContract, StoreFactory, drain, kv_lookup
from unicache_fsm.pools.transfer import PoolTransfer
from unicache_fsm.store import (
    LOAD_MACHINE,
    ExternalStore,
    FaultKind,
    FaultPolicy,
    FaultPolicyError,
    FaultRule,
    FaultyStore,
    LoadBatchResult,
    MemoryStore,
    NoCompletionError,
    StoreClosedError,
    StoreError,
    StoreFaultError,
    StoreLoad,
    StoreLoadState,
)
from unicache_fsm.store.faults import ERROR_TYPES


class TestFaultFreeWrapperContract(StoreContract):
    @pytest.fixture
    def store_factory(self) -> Iterator[StoreFactory]:
        def make(capacity_pages: int | None = None) -> ExternalStore:
            return FaultyStore(MemoryStore(capacity_pages=capacity_pages), FaultPolicy())

        yield make

    def corrupt(self, store: ExternalStore, pool: object, key: str) -> None:
        assert isinstance(store, FaultyStore)
        super().corrupt(store.inner, KV, key)


def _stores(policy: str) -> tuple[Rig, MemoryStore, FaultyStore]:
    rig = Rig()
    inner = MemoryStore()
    store = FaultyStore(inner, FaultPolicy.parse(policy))
    store.attach(rig.pools)
    return rig, inner, store


def _stored(rig: Rig, store: ExternalStore, n: int) -> tuple[list[str], torch.Tensor]:
    keys, src = rig.chain(n), rig.fill(KV, n)
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    return keys, src


def test_fail_lookup_raises_a_typed_fault() -> None:
    rig, _, store = _stores("fail_lookup=every:2")
    keys, _ = _stored(rig, store, 3)
    assert store.lookup("a", kv_lookup(keys)) == [1, 2, 3]
    with pytest.raises(StoreFaultError, match="fail_lookup") as info:
        store.lookup("b", kv_lookup(keys))
    assert isinstance(info.value, StoreError) and info.value.operation == "lookup"
    assert store.policy.injected == {FaultKind.FAIL_LOOKUP: 1}


def test_refuse_load_returns_false_and_queues_nothing() -> None:
    rig, inner, store = _stores("refuse_load=every:1")
    keys, _ = _stored(rig, store, 2)
    assert not store.load("r", [PoolTransfer(KV, rig.alloc(KV, 2), keys)])
    assert inner.start_loading() == -1 and store.start_loading() == -1
    assert store.policy.injected[FaultKind.REFUSE_LOAD] == 1


def test_fail_batch_before_start_writes_nothing() -> None:
    rig, inner, store = _stores("fail_batch_before_start=every:1")
    keys, _ = _stored(rig, store, 2)
    dst = rig.alloc(KV, 2)
    before = rig.read(KV, dst).clone()
    assert store.load("a", [PoolTransfer(KV, dst, keys)])
    assert store.load("b", [PoolTransfer(KV, rig.alloc(KV, 1), keys[:1])])
    batch = store.start_loading()
    store.progress()
    assert drain(store)[0] == [LoadBatchResult(batch, ("a", "b"), False)]
    assert torch.equal(rig.read(KV, dst), before)
    cancelled = [r for r in inner.recent_jobs() if isinstance(r, StoreLoad)]
    assert [LOAD_MACHINE.state_of(r) for r in cancelled] == [StoreLoadState.CANCELLED] * 2


def test_fail_batch_midway_writes_pages_but_reports_failure() -> None:
    rig, _, store = _stores("fail_batch_midway=every:1")
    keys, src = _stored(rig, store, 3)
    dst = rig.alloc(KV, 3)
    assert store.load("r", [PoolTransfer(KV, dst, keys)])
    batch = store.start_loading()
    store.progress()
    assert drain(store)[0] == [LoadBatchResult(batch, ("r",), False)]
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))  # bytes landed, verdict False


def test_refuse_offload_queues_nothing() -> None:
    rig, inner, store = _stores("refuse_offload=every:1")
    keys = rig.chain(2)
    assert not store.offload([PoolTransfer(KV, rig.fill(KV, 2), keys)])
    store.progress()
    assert drain(store) == ([], [])
    assert not inner.contains(KV, keys[0])


def test_fail_offload_completes_false() -> None:
    rig, inner, store = _stores("fail_offload=every:2")
    first, second = rig.chain(2), rig.chain(2)
    assert store.offload([PoolTransfer(KV, rig.fill(KV, 2), first)])
    assert store.offload([PoolTransfer(KV, rig.fill(KV, 2), second)])
    store.progress()
    assert drain(store)[1] == [True, False]
    assert inner.contains(KV, second[0])  # the store may hold them; the caller was told no


def test_evict_after_lookup_makes_the_load_of_that_prefix_refused() -> None:
    rig, inner, store = _stores("evict_after_lookup=every:1")
    keys, _ = _stored(rig, store, 5)
    assert store.lookup("r", kv_lookup(keys)) == [1, 2, 3, 4, 5]
    assert not inner.contains(KV, keys[4]) and inner.contains(KV, keys[3])
    assert not store.load("r", [PoolTransfer(KV, rig.alloc(KV, 5), keys)])
    assert store.load("r", [PoolTransfer(KV, rig.alloc(KV, 4), keys[:4])])
    assert store.lookup("x", kv_lookup(rig.chain(2))) == []  # nothing found: nothing evicted
    assert store.policy.injected[FaultKind.EVICT_AFTER_LOOKUP] == 1


def test_delay_completion_holds_results_back_in_fifo_order() -> None:
    rig, _, store = _stores("delay_completion=every:2,delay_steps=2")
    for _ in range(3):
        assert store.offload([PoolTransfer(KV, rig.fill(KV, 1), rig.chain(1))])
    store.progress()  # all three complete inside; the second is delayed, the third waits
    assert store.num_completed_offloads() == 1
    assert store.pop_completed_offload()
    with pytest.raises(NoCompletionError):
        store.pop_completed_offload()
    store.progress()
    assert store.num_completed_offloads() == 0
    store.progress()
    assert drain(store)[1] == [True, True]


def test_delayed_load_is_released_by_reset() -> None:
    rig, _, store = _stores("delay_completion=every:1,delay_steps=5")
    keys, _ = _stored_without_delay(rig, store)
    assert store.load("r", [PoolTransfer(KV, rig.alloc(KV, 1), keys)])
    batch = store.start_loading()
    store.progress()
    assert store.num_completed_loads() == 0
    store.reset()
    assert drain(store)[0] == [LoadBatchResult(batch, ("r",), True)]


def _stored_without_delay(rig: Rig, store: FaultyStore) -> tuple[list[str], torch.Tensor]:
    keys, src = rig.chain(1), rig.fill(KV, 1)
    assert store.inner.offload([PoolTransfer(KV, src, keys)])
    store.inner.progress()
    assert store.inner.pop_completed_offload()
    return keys, src


def test_reset_fails_loads_queued_in_the_inner_store() -> None:
    rig, _, store = _stores("")
    keys, _ = _stored(rig, store, 1)
    assert store.load("q", [PoolTransfer(KV, rig.alloc(KV, 1), keys)])
    store.reset()
    (result,) = drain(store)[0]
    assert (result.rids, result.success) == (("q",), False)
    assert store.start_loading() == -1


def test_closed_wrapper_raises() -> None:
    _, inner, store = _stores("refuse_load=0.5")
    store.close()
    store.close()
    with pytest.raises(StoreClosedError):
        store.start_loading()
    with pytest.raises(StoreClosedError):
        inner.start_loading()


def _run(policy: FaultPolicy) -> list[object]:
    """A fixed workload; returns every observable outcome."""
    rig = Rig(pages=256)
    store = FaultyStore(MemoryStore(), policy)
    store.attach(rig.pools)
    seen: list[object] = []
    for i in range(12):
        keys = rig.chain(3)
        seen.append(store.offload([PoolTransfer(KV, rig.fill(KV, 3), keys)]))
        store.progress()
        seen.append(drain(store))
        try:
            seen.append(store.lookup(f"r{i}", kv_lookup(keys)))
        except StoreFaultError:
            seen.append("fault")
        seen.append(store.load(f"r{i}", [PoolTransfer(KV, rig.alloc(KV, 2), keys[:2])]))
        seen.append(store.start_loading())
        store.progress()
        seen.append(drain(store))
    store.close()
    return seen


def test_policies_are_reproducible_from_their_seed() -> None:
    text = (
        "fail_lookup=0.2,refuse_load=0.3,fail_batch_midway=0.3,fail_offload=0.3,"
        "delay_completion=0.3,evict_after_lookup=0.2,seed=7"
    )
    a, b = FaultPolicy.parse(text), FaultPolicy.parse(text)
    assert _run(a) == _run(b)
    assert a.injected == b.injected and sum(a.injected.values()) > 0
    c = a.fresh()
    assert not c.injected
    assert _run(c) == _run(FaultPolicy.parse(text))
    other = FaultPolicy.parse(text.replace("seed=7", "seed=8"))
    assert _run(other) != _run(FaultPolicy.parse(text))


def test_a_deep_copy_draws_what_the_original_draws_and_is_independent() -> None:
    rules = {
        FaultKind.REFUSE_LOAD: FaultRule(probability=0.5),
        FaultKind.FAIL_OFFLOAD: FaultRule(every=3),
    }
    policy = FaultPolicy(rules, seed=11, delay_steps=4)
    warm = [policy.roll(FaultKind.REFUSE_LOAD) for _ in range(7)]
    policy.roll(FaultKind.FAIL_OFFLOAD)
    twin = copy.deepcopy(policy)
    assert str(twin) == str(policy) and twin.delay_steps == 4
    assert twin.injected == policy.injected and twin.calls(FaultKind.FAIL_OFFLOAD) == 1
    ahead = [policy.roll(FaultKind.REFUSE_LOAD) for _ in range(40)]
    assert [twin.roll(FaultKind.REFUSE_LOAD) for _ in range(40)] == ahead
    assert sum(warm) + sum(ahead) > 0 and not all(ahead)
    # the copy's counters and stream are its own
    policy.roll(FaultKind.FAIL_OFFLOAD)
    assert policy.calls(FaultKind.FAIL_OFFLOAD) == 2 and twin.calls(FaultKind.FAIL_OFFLOAD) == 1
    policy.pick([0, 1, 2])  # one draw on the original only: the streams part
    assert [twin.roll(FaultKind.REFUSE_LOAD) for _ in range(40)] != [
        policy.roll(FaultKind.REFUSE_LOAD) for _ in range(40)
    ]


def test_probability_rules_fire_at_about_their_rate() -> None:
    policy = FaultPolicy({FaultKind.REFUSE_LOAD: FaultRule(probability=0.25)}, seed=3)
    hits = sum(policy.roll(FaultKind.REFUSE_LOAD) for _ in range(2000))
    assert 400 < hits < 600 and policy.injected[FaultKind.REFUSE_LOAD] == hits
    assert not policy.roll(FaultKind.FAIL_LOOKUP)  # no rule: never, and no draw consumed


def test_parse_round_trips_and_names_every_kind() -> None:
    policy = FaultPolicy.parse(
        " refuse_load = 0.3 , fail_batch_midway=every:4, seed=7, delay_steps=3 "
    )
    assert policy.rules == {
        FaultKind.REFUSE_LOAD: FaultRule(probability=0.3),
        FaultKind.FAIL_BATCH_MIDWAY: FaultRule(every=4),
    }
    assert (policy.seed, policy.delay_steps) == (7, 3)
    text = str(policy)
    assert text == "refuse_load=0.3,fail_batch_midway=every:4,seed=7,delay_steps=3"
    again = FaultPolicy.parse(text)
    assert (again.rules, again.seed, again.delay_steps) == (policy.rules, 7, 3)
    assert eval(repr(policy)).rules == policy.rules  # repr is valid Python
    assert FaultPolicy.parse("").rules == {} == FaultPolicy.parse("none").rules
    every = ",".join(f"{k.value}=0.5" for k in FaultKind)
    assert set(FaultPolicy.parse(every).rules) == set(FaultKind)


@pytest.mark.parametrize(
    ("text", "culprit"),
    [
        ("refuse_loads=0.3", "refuse_loads=0.3"),
        ("refuse_load=1.5", "refuse_load=1.5"),
        ("refuse_load=lots", "refuse_load=lots"),
        ("refuse_load=every:0", "refuse_load=every:0"),
        ("refuse_load", "refuse_load"),
        ("refuse_load=0.1,refuse_load=0.2", "refuse_load=0.2"),
        ("seed=x", "seed=x"),
        ("delay_steps=0", "delay_steps=0"),
    ],
)
def test_parse_errors_are_typed_and_name_the_item(text: str, culprit: str) -> None:
    with pytest.raises(FaultPolicyError) as info:
        FaultPolicy.parse(text)
    assert info.value.item == culprit and culprit in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, StoreError)


def test_bad_rules_and_arguments_are_typed() -> None:
    with pytest.raises(FaultPolicyError, match="not both"):
        FaultRule(probability=0.5, every=2)
    with pytest.raises(FaultPolicyError):
        FaultRule(probability=-0.1)
    with pytest.raises(FaultPolicyError):
        FaultPolicy({"refuse_load": FaultRule(0.1)})  # type: ignore[dict-item]
    with pytest.raises(FaultPolicyError):
        FaultPolicy(delay_steps=0)
    with pytest.raises(FaultPolicyError):
        FaultPolicy.parse(3)  # type: ignore[arg-type]


# -- misbehaviour: arbitrary exceptions and ill-typed answers ----------------------------


def test_raise_error_raises_any_type_and_changes_nothing_it_should_not() -> None:
    rig, inner, store = _stores("")
    keys, _ = _stored(rig, store, 2)
    store.policy = FaultPolicy({FaultKind.RAISE_ERROR: FaultRule(every=1)}, seed=3)
    seen: set[type] = set()
    dst = rig.alloc(KV, 2)
    for _ in range(12):
        with pytest.raises(ERROR_TYPES) as info:
            store.load("r", [PoolTransfer(KV, dst, keys)])
        seen.add(type(info.value))
        assert "raise_error" in str(info.value)
    assert len(seen) >= 4, seen  # not only StoreFaultError
    assert inner.start_loading() == -1, "a load that raised was queued anyway"
    with pytest.raises(ERROR_TYPES):
        store.offload([PoolTransfer(KV, rig.fill(KV, 1), rig.chain(1))])
    inner.progress()
    assert inner.num_completed_offloads() == 0, "an offload that raised was queued anyway"
    # a pop raises after taking its completion: it is consumed, the answer lost
    store.policy = FaultPolicy()
    assert store.load("r", [PoolTransfer(KV, dst, keys)])
    store.start_loading()
    store.progress()
    assert store.num_completed_loads() == 1
    store.policy = FaultPolicy({FaultKind.RAISE_ERROR: FaultRule(every=1)})
    with pytest.raises(ERROR_TYPES):
        store.pop_completed_load()
    store.policy = FaultPolicy()
    assert store.num_completed_loads() == 0


def test_garbage_answer_is_ill_typed_and_a_pop_still_consumes() -> None:
    rig, inner, store = _stores("")
    keys, _ = _stored(rig, store, 2)
    store.policy = FaultPolicy({FaultKind.GARBAGE_ANSWER: FaultRule(every=1)}, seed=5)
    answers = [store.lookup("r", kv_lookup(keys)) for _ in range(20)]
    assert all(a != [1, 2] for a in answers)
    assert any(a is None or not isinstance(a, list) for a in answers)
    dst = rig.alloc(KV, 2)
    loads = [store.load("r", [PoolTransfer(KV, dst, keys)]) for _ in range(10)]
    assert not any(isinstance(answer, bool) for answer in loads), loads
    assert inner.start_loading() == -1, "a garbage-answered load was queued"
    store.policy = FaultPolicy()
    assert store.load("r", [PoolTransfer(KV, dst, keys)])
    batch = store.start_loading()
    store.progress()
    store.policy = FaultPolicy({FaultKind.GARBAGE_ANSWER: FaultRule(every=1)}, seed=1)
    junk = store.pop_completed_load()
    assert not (isinstance(junk, LoadBatchResult) and junk == LoadBatchResult(batch, ("r",), True))
    store.policy = FaultPolicy()
    assert store.num_completed_loads() == 0  # consumed


# -- the lying store: answers that misstate work the store really has ---------------------


def _policy(kind: FaultKind) -> FaultPolicy:
    return FaultPolicy({kind: FaultRule(every=1)}, seed=2)


def test_an_overcount_claims_a_running_batch_done_and_the_batch_still_writes() -> None:
    rig, _, store = _stores("")
    keys, src = _stored(rig, store, 2)
    dst = rig.alloc(KV, 2)
    assert store.load("r", [PoolTransfer(KV, dst, keys)])
    batch = store.start_loading()
    store.policy = _policy(FaultKind.OVERCOUNT_COMPLETIONS)
    assert store.num_completed_loads() == 1  # nothing has run yet
    with pytest.raises(NoCompletionError):  # ... and the store cannot back its count
        store.pop_completed_load()
    store.policy = FaultPolicy()
    store.progress()  # the batch runs on: it writes into the slots after all
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    assert drain(store)[0] == [LoadBatchResult(batch, ("r",), True)]
    # offloads alike: one more than ready while an accepted offload is still queued
    assert store.offload([PoolTransfer(KV, rig.fill(KV, 1), rig.chain(1))])
    store.policy = _policy(FaultKind.OVERCOUNT_COMPLETIONS)
    assert store.num_completed_offloads() == 1
    store.policy = FaultPolicy()
    assert store.num_completed_offloads() == 0
    store.progress()
    assert drain(store)[1] == [True]
    store.policy = _policy(FaultKind.OVERCOUNT_COMPLETIONS)
    assert drain(store) == ([], [])  # nothing in flight: no count to inflate
    assert not store.policy.injected


def test_an_undercount_hides_a_completion_that_stays_poppable() -> None:
    rig, _, store = _stores("")
    keys, _ = _stored(rig, store, 1)
    assert store.load("r", [PoolTransfer(KV, rig.alloc(KV, 1), keys)])
    batch = store.start_loading()
    assert store.offload([PoolTransfer(KV, rig.fill(KV, 1), rig.chain(1))])
    store.progress()
    store.policy = _policy(FaultKind.UNDERCOUNT_COMPLETIONS)
    assert (store.num_completed_loads(), store.num_completed_offloads()) == (0, 0)
    store.policy = FaultPolicy()
    assert drain(store) == ([LoadBatchResult(batch, ("r",), True)], [True])


def test_a_malformed_completion_is_consumed_in_every_form() -> None:
    rig, _, store = _stores("")
    keys, _ = _stored(rig, store, 1)
    forms: list[object] = []
    flags: list[object] = []
    for i in range(24):
        store.policy = FaultPolicy()
        assert store.load(f"r{i}", [PoolTransfer(KV, rig.alloc(KV, 1), keys)])
        batch = store.start_loading()
        assert store.offload([PoolTransfer(KV, rig.fill(KV, 1), rig.chain(1))])
        store.progress()
        store.policy = FaultPolicy({FaultKind.MALFORMED_COMPLETION: FaultRule(every=1)}, seed=i)
        got = store.pop_completed_load()
        assert got != LoadBatchResult(batch, (f"r{i}",), True)
        forms.append(got)
        flags.append(store.pop_completed_offload())
        store.policy = FaultPolicy()
        assert drain(store) == ([], [])  # both consumed
    results = [f for f in forms if isinstance(f, LoadBatchResult)]
    assert any(r.rids is None for r in results)
    assert any(isinstance(r.rids, str) for r in results)
    assert any(isinstance(r.batch, str) for r in results)
    assert any(isinstance(r.rids, tuple) and len(r.rids) == 2 for r in results)
    assert any(type(f) is tuple for f in forms)
    assert all(not isinstance(f, bool) for f in flags) and {type(f) for f in flags} >= {int, str}


def test_a_lost_reply_comes_after_the_work_was_done() -> None:
    rig, inner, store = _stores("")
    keys, src = _stored(rig, store, 1)
    dst = rig.alloc(KV, 1)
    store.policy = _policy(FaultKind.LOST_REPLY)
    with pytest.raises(TimeoutError, match="lost_reply"):
        store.load("r", [PoolTransfer(KV, dst, keys)])  # queued all the same
    with pytest.raises(TimeoutError, match="lost_reply"):
        store.start_loading()  # ... and started
    assert store.start_loading() == -1  # nothing is queued any more (no work: no lie)
    with pytest.raises(TimeoutError):
        store.offload([PoolTransfer(KV, rig.fill(KV, 1), rig.chain(1))])
    store.policy = FaultPolicy()
    store.progress()
    (result,), flags = drain(store)
    assert (result.rids, result.success, flags) == (("r",), True, [True])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    assert inner.start_loading() == -1


def test_an_unknown_batch_id_starts_nothing() -> None:
    rig, _, store = _stores("")
    keys, _ = _stored(rig, store, 1)
    store.policy = _policy(FaultKind.UNKNOWN_BATCH)
    phantom = store.start_loading()  # nothing queued: a batch id all the same, not -1
    assert phantom >= 0
    assert store.load("r", [PoolTransfer(KV, rig.alloc(KV, 1), keys)])
    never = store.start_loading()
    assert never >= 0 and never != phantom
    store.progress()
    store.policy = FaultPolicy()
    assert store.num_completed_loads() == 0  # neither id started anything
    real = store.start_loading()  # the load was still queued
    assert real not in (phantom, never)
    store.progress()
    assert drain(store)[0] == [LoadBatchResult(real, ("r",), True)]


def test_lying_kinds_are_misbehaviour_and_parse_by_name() -> None:
    from unicache_fsm.store.faults import LYING, MISBEHAVIOUR

    assert LYING <= MISBEHAVIOUR
    names = "overcount_completions,undercount_completions,malformed_completion,lost_reply"
    policy = FaultPolicy.parse(f"{names},unknown_batch=every:3".replace(",", "=0.5,", 4))
    assert set(policy.rules) == LYING
    assert FaultPolicy.parse(str(policy)).rules == policy.rules
