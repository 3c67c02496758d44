"""The executor contract, checked on both executors."""

from __future__ import annotations

import enum
from pathlib import Path

import pytest

from fsm_models import Boom, RecordingModel, recording_model_class
from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.errors import (
    GuardRejectedError,
    IllegalTransitionError,
    InvalidSpecError,
    UnknownStateError,
    UnknownTriggerError,
)
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.loader import bundled_spec, load_spec
from unicache_fsm.fsm.reference import ReferenceExecutor

SPECS = Path(__file__).parent / "data" / "specs"
EXECUTORS = [CompiledExecutor, ReferenceExecutor]

NESTED = load_spec(SPECS / "nested.toml")
NestedModel = recording_model_class(NESTED)
LOAD = bundled_spec("load_transaction")
LoadModel = recording_model_class(LOAD)


def _names(m: RecordingModel) -> list[str]:
    return [name for name, _a, _k in m.log]


@pytest.fixture(params=EXECUTORS, ids=lambda c: c.kind)
def executor_cls(request: pytest.FixtureRequest) -> type[Executor]:
    cls: type[Executor] = request.param
    return cls


def _nested(executor_cls: type[Executor]) -> tuple[Executor, RecordingModel]:
    ex = executor_cls(NESTED, NestedModel)
    m = NestedModel("w-1")
    ex.initialize(m)
    return ex, m


def test_callback_order_with_nesting(executor_cls: type[Executor]) -> None:
    ex, m = _nested(executor_cls)
    ex.fire(m, "go", 1, why=2)
    assert m.state == "b.b1"
    assert _names(m) == ["prep_go", "g1", "before_go", "exit_a", "enter_b", "enter_b1", "after_go"]
    assert all(args == (1,) and kwargs == {"why": 2} for _n, args, kwargs in m.log)
    m.log.clear()
    ex.fire(m, "go")  # b.b1 -> b.b2: b stays active, b2 enters its initial child x
    assert m.state == "b.b2.x"
    assert _names(m) == ["exit_b1", "enter_b2", "enter_x", "after_go3"]
    m.log.clear()
    ex.fire(m, "up")  # b.b2 -> b: an external transition re-enters b
    assert m.state == "b.b1"
    assert _names(m) == ["before_up", "exit_x", "exit_b2", "exit_b", "enter_b", "enter_b1"]


def test_first_passing_candidate_wins(executor_cls: type[Executor]) -> None:
    ex, m = _nested(executor_cls)
    m.guards = {"g1": False, "g2": True, "u1": False}
    ex.fire(m, "go")
    assert m.state == "b.b2.y"
    assert _names(m)[:5] == ["prep_go", "g1", "g2", "u1", "before_go2"]


def test_guard_veto_names_the_guard_and_keeps_state(executor_cls: type[Executor]) -> None:
    ex, m = _nested(executor_cls)
    m.guards = {"g1": False, "g2": True, "u1": True}
    with pytest.raises(GuardRejectedError) as info:
        ex.fire(m, "go")
    assert info.value.guard == "not u1"  # the last candidate's vetoing guard
    assert (info.value.state, info.value.trigger, info.value.model) == ("a", "go", "w-1")
    assert m.state == "a"
    assert _names(m) == ["prep_go", "g1", "g2", "u1"]


def test_exception_before_state_change_rolls_back(executor_cls: type[Executor]) -> None:
    ex, m = _nested(executor_cls)
    for culprit in ("prep_go", "g1", "before_go", "exit_a"):
        m.raise_in = culprit
        with pytest.raises(Boom):
            ex.fire(m, "go")
        assert m.state == "a", culprit


def test_exception_after_state_change_keeps_new_state(executor_cls: type[Executor]) -> None:
    for culprit, later in (("enter_b", "enter_b1"), ("after_go", None)):
        ex, m = _nested(executor_cls)
        m.raise_in = culprit
        with pytest.raises(Boom):
            ex.fire(m, "go")
        assert m.state == "b.b1", culprit
        if later:
            assert later not in _names(m)  # the remaining callbacks are skipped


def test_illegal_trigger_message_names_everything(executor_cls: type[Executor]) -> None:
    ex = executor_cls(LOAD, LoadModel)
    m = LoadModel("req-7")
    ex.initialize(m)
    with pytest.raises(IllegalTransitionError) as info:
        ex.fire(m, "commit")
    assert str(info.value) == "cannot commit load 'req-7' in state 'idle'; allowed: prepare, abort"
    assert info.value.allowed == ("prepare", "abort")
    assert m.log == [] and m.state == "idle"


def test_unknown_trigger_is_its_own_error(executor_cls: type[Executor]) -> None:
    ex = executor_cls(LOAD, LoadModel)
    m = LoadModel("req-8")
    ex.initialize(m)
    with pytest.raises(UnknownTriggerError, match="no trigger 'comit'"):
        ex.fire(m, "comit")
    with pytest.raises(UnknownTriggerError):
        ex.may_fire(m, "comit")
    assert isinstance(UnknownTriggerError("x", "m", "s", "t", []), IllegalTransitionError)


def test_final_state_allows_nothing(executor_cls: type[Executor]) -> None:
    ex = executor_cls(LOAD, LoadModel)
    m = LoadModel("req-9")
    ex.initialize(m)
    ex.fire(m, "abort")
    assert ex.is_final(m) and ex.allowed_triggers(m) == ()
    with pytest.raises(IllegalTransitionError, match="allowed: none"):
        ex.fire(m, "abort")


def test_may_fire_runs_prepare_and_guards_only(executor_cls: type[Executor]) -> None:
    ex, m = _nested(executor_cls)
    m.guards = {"g1": False, "g2": False}
    assert ex.may_fire(m, "go") is False
    assert _names(m) == ["prep_go", "g1", "g2"]
    m.guards = {"g1": True}
    m.log.clear()
    assert ex.may_fire(m, "go") is True
    assert _names(m) == ["prep_go", "g1"] and m.state == "a"
    assert ex.may_fire(m, "step") is False  # no transition from here


def test_garbage_state_is_typed(executor_cls: type[Executor]) -> None:
    ex, m = _nested(executor_cls)
    m.state = "nowhere"
    with pytest.raises(UnknownStateError):
        ex.fire(m, "go")
    fresh = NestedModel("never-initialized")
    with pytest.raises(UnknownStateError):
        ex.fire(fresh, "go")


class LoadTrigger(str, enum.Enum):
    PREPARE = "prepare"
    START = "start"
    LAND = "land"
    COMMIT = "commit"
    ABORT = "abort"


def test_enum_triggers_are_accepted_and_checked(executor_cls: type[Executor]) -> None:
    ex = executor_cls(LOAD, LoadModel, triggers=LoadTrigger)
    m = LoadModel("req-e")
    ex.initialize(m)
    for trig in (LoadTrigger.PREPARE, LoadTrigger.START, LoadTrigger.LAND, LoadTrigger.COMMIT):
        ex.fire(m, trig)
    assert m.state == "committed"

    class Partial(str, enum.Enum):
        PREPARE = "prepare"
        EXPLODE = "explode"

    with pytest.raises(InvalidSpecError) as info:
        executor_cls(LOAD, LoadModel, triggers=Partial)
    assert info.value.names("Partial members not in the spec") == ("explode",)
    assert set(info.value.names("spec triggers missing from Partial")) == {
        "start",
        "land",
        "commit",
        "abort",
    }


def test_parallel_queries_and_copying_state(executor_cls: type[Executor]) -> None:
    spec = bundled_spec("node_residency")
    cls = recording_model_class(spec)
    ex = executor_cls(spec, cls)
    node = cls("node-1")
    ex.initialize(node)
    ex.fire(node, "start_offload")
    assert ex.is_active(node, "external.offloading") and ex.is_active(node, "device.resident")
    with pytest.raises(IllegalTransitionError):
        ex.fire(node, "delete")  # an offload is in flight
    twin = cls("node-2")
    ex.initialize(twin, like=node)
    assert twin.state == node.state
    ex.fire(node, "offload_succeeded")
    ex.fire(node, "delete")
    assert ex.is_final(node)
    assert not ex.is_final(twin)
    with pytest.raises(UnknownStateError):
        ex.is_active(node, "external.nope")


def test_reference_registers_no_model() -> None:
    ex = ReferenceExecutor(LOAD, LoadModel)
    loads = [LoadModel(f"r{i}") for i in range(50)]
    for m in loads:
        ex.initialize(m)
        ex.fire(m, "prepare")
    assert ex.machine.models == []
    assert all(m.state == "prepared.queued" for m in loads)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_state_attribute_must_be_an_identifier(executor: type[Executor]) -> None:
    with pytest.raises(InvalidSpecError) as info:
        executor(NESTED, NestedModel, state_attribute="my-state")
    assert info.value.names("state attribute is not an identifier") == ("my-state",)


def test_observers_see_each_transition_after_the_state_change(
    executor_cls: type[Executor],
) -> None:
    ex, m = _nested(executor_cls)
    seen: list[tuple[str, str, str, str]] = []

    def observer(_ex: Executor, model: RecordingModel, src: str, trig: str, dest: str) -> None:
        seen.append((model.state, src, trig, dest))
        model.log.append(("<observed>", (), {}))

    ex.fire(m, "go")  # before the observer: not seen
    ex.add_observer(observer)
    ex.fire(m, "go")
    assert seen == [("b.b2.x", "b.b1", "go", "b.b2.x")]
    assert _names(m)[-5:] == ["exit_b1", "<observed>", "enter_b2", "enter_x", "after_go3"]
    ex.remove_observer(observer)
    ex.fire(m, "up")
    assert len(seen) == 1


def test_compile_all_builds_every_pair_once_and_changes_no_behaviour(
    executor_cls: type[Executor],
) -> None:
    lazy, m_lazy = _nested(executor_cls)
    eager, m_eager = _nested(executor_cls)
    seen: list[tuple[str, str, str]] = []
    eager.add_observer(lambda _ex, _m, src, trig, dest: seen.append((src, trig, dest)))
    pairs = len(eager.flat.table)
    built = eager.compile_all()
    assert built == (pairs if executor_cls is CompiledExecutor else 0)
    assert eager.compile_all() == 0  # nothing left to build
    assert m_eager.log == []  # nothing fired, no callback ran
    for trigger in ("go", "go", "up"):
        lazy.fire(m_lazy, trigger)
        eager.fire(m_eager, trigger)
        assert m_eager.state == m_lazy.state
    assert _names(m_eager) == _names(m_lazy)
    assert [dest for _s, _t, dest in seen] == ["b.b1", "b.b2.x", m_eager.state]  # observed
