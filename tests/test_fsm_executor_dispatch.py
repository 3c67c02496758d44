"""Executor behaviour of issue 18 that rests on `FlatMachine`'s per-configuration
answers: dispatch built on first use (a machine of many parallel regions never has its
product walked), observers copied on write, a typed error for an unhashable state
value, and error messages naming models as traces do (`fsm.identity.model_id`)."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from unicache_fsm.fsm import model_id
from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.errors import IllegalTransitionError, UnknownStateError
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.flat import flatten
from unicache_fsm.fsm.loader import bundled_spec, parse_spec
from unicache_fsm.fsm.reference import ReferenceExecutor

EXECUTORS = [CompiledExecutor, ReferenceExecutor]


class Plain:
    def __init__(self) -> None:
        self.state = ""


def _regions(k: int) -> str:
    text = ['machine = "regions"', "parallel = true"]
    for i in range(k):
        text += [f"[states.r{i}]", f"[states.r{i}.states.off]", f"[states.r{i}.states.on]"]
        for trigger, src, dst in ((f"on_{i}", "off", "on"), (f"off_{i}", "on", "off")):
            text += ["[[transitions]]", f'trigger = "{trigger}"']
            text += [f'source = "r{i}.{src}"', f'dest = "r{i}.{dst}"']
    return "\n".join(text) + "\n"


@pytest.mark.parametrize("executor", EXECUTORS, ids=lambda c: c.kind)
def test_an_executor_of_many_regions_never_walks_their_product(executor: type[Executor]) -> None:
    """Item 6: executors take what they need per configuration. Six regions keep the
    test quick while the product is walked; with the edit, 20 regions cost the same."""
    k = 6
    spec = parse_spec(_regions(k))
    ex = executor(spec, Plain)
    model = Plain()
    ex.initialize(model)
    for i in range(0, k, 3):
        ex.fire(model, f"on_{i}")
    ex.fire(model, "off_3")
    assert ex.state_of(model) == ",".join(
        f"r{i}.{'on' if i % 3 == 0 and i != 3 else 'off'}" for i in range(k)
    )
    assert ex.may_fire(model, "on_3") and not ex.may_fire(model, "off_1")
    assert not ex.is_final(model) and ex.is_active(model, "r0.on")
    with pytest.raises(IllegalTransitionError):
        ex.fire(model, "off_1")
    assert "configs" not in vars(flatten(spec))


@pytest.mark.parametrize("executor", EXECUTORS, ids=lambda c: c.kind)
def test_an_observer_that_removes_itself_does_not_hide_the_event(
    executor: type[Executor],
) -> None:
    """Item 9: removing an observer during a notification skipped the next observer."""
    spec = bundled_spec("offload")

    class Record:
        def __init__(self) -> None:
            self.state = ""

        def store_accepted(self) -> bool:
            return True

        def succeeded(self) -> bool:
            return True

        def roll_back_nodes(self) -> None:
            pass

        publish_nodes = roll_back_nodes

    ex = executor(spec, Record)
    seen: list[str] = []

    def once(_ex: Any, _m: Any, _s: str, trigger: str, _d: str) -> None:
        seen.append(f"once:{trigger}")
        ex.remove_observer(once)

    def always(_ex: Any, _m: Any, _s: str, trigger: str, _d: str) -> None:
        seen.append(f"always:{trigger}")

    ex.add_observer(once)
    ex.add_observer(always)
    record = Record()
    ex.initialize(record)
    ex.fire(record, "submit")
    assert seen == ["once:<init>", "always:<init>", "always:submit"]


@pytest.mark.parametrize("executor", EXECUTORS, ids=lambda c: c.kind)
@pytest.mark.parametrize("garbage", [["idle"], {"a": 1}, {"idle"}])
def test_an_unhashable_state_value_is_a_typed_error(executor: type[Executor], garbage: Any) -> None:
    """Item 9: an unhashable value in the state slot raised a bare TypeError."""

    class Load(Plain):
        def reserve_slots(self) -> None:
            pass

        queue_store_load = publish = withdraw_store_load = reserve_slots
        free_reservation = record_abort = reserve_slots

        def landed_everywhere(self) -> bool:
            return True

    ex = executor(bundled_spec("load_transaction"), Load)
    model = Load()
    model.state = garbage
    for call in (ex.state_of, ex.allowed_triggers, ex.is_final, lambda m: ex.fire(m, "prepare")):
        with pytest.raises(UnknownStateError):
            call(model)


def test_executor_errors_name_models_as_traces_do() -> None:
    """Item 3: error messages and traces name a model the same way."""
    ex = CompiledExecutor(parse_spec(_regions(1)), Plain)
    model = Plain()
    ex.initialize(model)
    with pytest.raises(IllegalTransitionError) as info:
        ex.fire(model, "off_0")
    assert info.value.model == model_id(model)


class Flip(str, enum.Enum):
    ON_0 = "on_0"
    OFF_0 = "off_0"
    ON_1 = "on_1"
    OFF_1 = "off_1"


@pytest.mark.parametrize("executor", EXECUTORS, ids=lambda c: c.kind)
@pytest.mark.parametrize("observe_first", [False, True])
def test_enum_triggers_and_observers_on_dispatch_built_on_first_use(
    executor: type[Executor], observe_first: bool
) -> None:
    spec = parse_spec(_regions(2))
    ex = executor(spec, Plain, triggers=Flip)
    seen: list[str] = []
    model = Plain()
    if observe_first:
        ex.add_observer(lambda _e, _m, _s, t, d: seen.append(f"{t}>{d}"))
    ex.initialize(model)
    ex.fire(model, Flip.ON_0)
    ex.fire(model, "on_1")
    if not observe_first:
        ex.add_observer(lambda _e, _m, _s, t, d: seen.append(f"{t}>{d}"))
    ex.fire(model, Flip.OFF_0)
    ex.fire(model, Flip.OFF_1)
    assert ex.state_of(model) == "r0.off,r1.off"
    tail = ["off_0>r0.off,r1.on", "off_1>r0.off,r1.off"]
    head = ["<init>>r0.off,r1.off", "on_0>r0.on,r1.off", "on_1>r0.on,r1.on"]
    assert seen == (head + tail if observe_first else tail)
    assert "configs" not in vars(flatten(spec))
