"""Issue 18's executor semantics, on every executor: guards that write the state slot,
concurrent threads on different models, run-to-completion, and async bindings."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fsm_models import RecordingModel, recording_model_class
from unicache_fsm.fsm.compiled import AsyncCompiledExecutor, CompiledExecutor
from unicache_fsm.fsm.conformance import check_trace
from unicache_fsm.fsm.errors import GuardRejectedError, IllegalTransitionError, InvalidSpecError
from unicache_fsm.fsm.executor import AsyncExecutor, Executor
from unicache_fsm.fsm.loader import load_spec
from unicache_fsm.fsm.reference import AsyncReferenceExecutor, ReferenceExecutor
from unicache_fsm.fsm.trace import TraceRecorder

SPECS = Path(__file__).parent / "data" / "specs"
NESTED = load_spec(SPECS / "nested.toml")
NestedModel = recording_model_class(NESTED)
SYNC = [CompiledExecutor, ReferenceExecutor]
ASYNC = [AsyncCompiledExecutor, AsyncReferenceExecutor]


def _names(m: RecordingModel) -> list[str]:
    return [name for name, _a, _k in m.log]


# -- item 9: a guard that writes the state slot, threads on different models -----------
class Meddler(NestedModel):  # type: ignore[misc, valid-type]
    """A model whose guard `g1` writes the state slot before vetoing."""

    __slots__ = ()

    def g1(self, *args: Any, **kwargs: Any) -> bool:
        self.log.append(("g1", args, kwargs))
        self.state = "b.b1"
        return False


@pytest.mark.parametrize("executor", SYNC, ids=lambda c: c.kind)
def test_a_guard_that_writes_the_state_and_vetoes_leaves_the_source_state(
    executor: type[Executor],
) -> None:
    ex = executor(NESTED, Meddler)
    m = Meddler("w-1")
    ex.initialize(m)
    m.guards = {"g2": False}
    with pytest.raises(GuardRejectedError) as info:
        ex.fire(m, "go")
    assert (info.value.state, info.value.guard) == ("a", "g2")
    assert m.state == "a"
    assert _names(m) == ["prep_go", "g1", "g2"]


@pytest.mark.parametrize("executor", SYNC, ids=lambda c: c.kind)
def test_threads_on_different_models_get_their_own_rejecting_guard(
    executor: type[Executor],
) -> None:
    """The veto label was one attribute of the executor: a thread could read the label
    another thread's model had just written."""
    ex = executor(NESTED, NestedModel)
    wanted = {"A": "g2", "B": "not u1"}
    models = {"A": NestedModel("A"), "B": NestedModel("B")}
    models["A"].guards = {"g1": False, "g2": False}
    models["B"].guards = {"g1": False, "g2": True, "u1": True}
    wrong: list[str] = []
    start = threading.Barrier(2)

    def drive(key: str) -> None:
        m = models[key]
        ex.initialize(m)
        start.wait()
        for _ in range(3000):
            m.log.clear()
            try:
                ex.fire(m, "go")
            except GuardRejectedError as exc:
                if exc.guard != wanted[key]:
                    wrong.append(f"{key}: {exc.guard}")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=drive, args=(k,)) for k in models]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert wrong == []


# -- item 5: run-to-completion ------------------------------------------------------------
class Eager(NestedModel):  # type: ignore[misc, valid-type]
    """Fires triggers on itself from inside its own transitions (set `self.ex`)."""

    __slots__ = ("ex",)

    def _maybe_fire(self, name: str) -> None:
        trigger = self.fire_in.pop(name, None)
        if trigger is not None:
            self.log.append((f"fire {trigger}", (), {}))
            self.ex.fire(self, trigger)

    def before_go(self, *args: Any, **kwargs: Any) -> None:
        self.log.append(("before_go", args, kwargs))
        self._maybe_fire("before_go")

    def exit_a(self, *args: Any, **kwargs: Any) -> None:
        self.log.append(("exit_a", args, kwargs))
        self._maybe_fire("exit_a")

    def g1(self, *args: Any, **kwargs: Any) -> bool:
        self.log.append(("g1", args, kwargs))
        self._maybe_fire("g1")
        return self.guards.get("g1", True)

    def after_go(self, *args: Any, **kwargs: Any) -> None:
        self.log.append(("after_go", args, kwargs))
        self._maybe_fire("after_go")


OUTER = ["prep_go", "g1", "before_go", "exit_a", "enter_b", "enter_b1", "after_go"]
INNER = ["exit_b1", "enter_b2", "enter_x", "after_go3"]


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[TraceRecorder]:
    with TraceRecorder(tmp_path / "trace.jsonl") as recorder:
        yield recorder


@pytest.mark.parametrize("executor", SYNC, ids=lambda c: c.kind)
@pytest.mark.parametrize("where", ["g1", "before_go", "exit_a", "after_go"])
def test_a_trigger_fired_inside_a_transition_runs_after_it(
    executor: type[Executor], where: str, traced: TraceRecorder
) -> None:
    ex = executor(NESTED, Eager)
    ex.add_observer(traced)
    m = Eager("w-1")
    m.ex, m.fire_in = ex, {where: "go"}
    ex.initialize(m)
    ex.fire(m, "go")
    assert m.state == "b.b2.x"
    fired_at = OUTER.index(where) + 1
    assert _names(m) == [*OUTER[:fired_at], "fire go", *OUTER[fired_at:], *INNER]
    traced.close()
    assert traced.path is not None
    records = [json.loads(line) for line in traced.path.read_text().splitlines()]
    assert [(r["trigger"], r["dest"]) for r in records] == [
        ("<init>", "a"),
        ("go", "b.b1"),
        ("go", "b.b2.x"),
    ]
    assert check_trace(records, lambda _name: NESTED).ok


@pytest.mark.parametrize("executor", SYNC, ids=lambda c: c.kind)
def test_a_queued_trigger_that_is_illegal_by_then_raises_from_the_outer_fire(
    executor: type[Executor],
) -> None:
    ex = executor(NESTED, Eager)
    m = Eager("w-1")
    m.ex, m.fire_in = ex, {"before_go": "finish"}  # legal nowhere on the way
    ex.initialize(m)
    with pytest.raises(IllegalTransitionError) as info:
        ex.fire(m, "go")
    assert (info.value.state, info.value.trigger) == ("b.b1", "finish")
    assert m.state == "b.b1"


@pytest.mark.parametrize("executor", SYNC, ids=lambda c: c.kind)
def test_a_vetoed_transition_drops_the_triggers_it_queued(executor: type[Executor]) -> None:
    ex = executor(NESTED, Eager)
    m = Eager("w-1")
    m.ex, m.fire_in = ex, {"g1": "drop"}
    m.guards = {"g1": False, "g2": False}
    ex.initialize(m)
    with pytest.raises(GuardRejectedError):
        ex.fire(m, "go")
    assert m.state == "a"
    ex.fire(m, "drop")  # the model is not left marked as running
    assert m.state == "dropped"


# -- item 4: async bindings ---------------------------------------------------------------
class AsyncGuarded(NestedModel):  # type: ignore[misc, valid-type]
    __slots__ = ()

    async def g1(self, *args: Any, **kwargs: Any) -> bool:
        await asyncio.sleep(0)
        self.log.append(("g1", args, kwargs))
        return self.guards.get("g1", True)

    async def enter_b(self, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0)
        self.log.append(("enter_b", args, kwargs))


@pytest.mark.parametrize("executor", SYNC, ids=lambda c: c.kind)
def test_sync_executors_refuse_coroutine_functions_at_bind_time(
    executor: type[Executor],
) -> None:
    with pytest.raises(InvalidSpecError) as info:
        executor(NESTED, AsyncGuarded)
    assert info.value.names("coroutine function on a sync executor") == ("enter_b", "g1")
    handler = type("H", (), {n: getattr(NestedModel, n) for n in NESTED.callback_names()})()
    handler.g1 = AsyncGuarded.g1.__get__(handler)  # type: ignore[attr-defined]
    with pytest.raises(InvalidSpecError, match="g1"):
        executor(NESTED, RecordingModel, handler=handler)


@pytest.mark.parametrize("executor", ASYNC, ids=lambda c: c.kind)
def test_async_executors_await_guards_and_callbacks(executor: type[AsyncExecutor]) -> None:
    ex = executor(NESTED, AsyncGuarded)
    m = AsyncGuarded("w-1")
    ex.initialize(m)
    m.guards = {"g1": False, "g2": False}
    with pytest.raises(GuardRejectedError) as info:
        asyncio.run(ex.fire(m, "go", 7))
    assert (info.value.guard, m.state) == ("g2", "a")
    assert asyncio.run(ex.may_fire(m, "go")) is False
    m.guards, m.log = {}, []
    assert asyncio.run(ex.may_fire(m, "go")) is True
    m.log.clear()
    asyncio.run(ex.fire(m, "go", 7))
    assert m.state == "b.b1"
    assert _names(m) == [*OUTER[:4], "enter_b", "enter_b1", "after_go"]
    assert m.log[1] == ("g1", (7,), {})


class Stalled(NestedModel):  # type: ignore[misc, valid-type]
    __slots__ = ()

    async def before_go(self, *args: Any, **kwargs: Any) -> None:
        self.log.append(("before_go", args, kwargs))
        await asyncio.Event().wait()  # never set: only cancellation ends it


@pytest.mark.parametrize("executor", ASYNC, ids=lambda c: c.kind)
def test_a_cancelled_async_fire_is_cancelled_not_vetoed(executor: type[AsyncExecutor]) -> None:
    """`AsyncMachine` turns a cancelled transition into a failed one; the executor must
    not report that as a guard veto, and the model is not left marked as running."""
    ex = executor(NESTED, Stalled)
    m = Stalled("w-1")
    ex.initialize(m)

    async def scenario() -> None:
        task = asyncio.create_task(ex.fire(m, "go"))
        while not m.log or m.log[-1][0] != "before_go":
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert m.state == "a"
    m.guards = {"g1": False, "g2": False}
    with pytest.raises(GuardRejectedError):
        asyncio.run(ex.fire(m, "go"))


@pytest.mark.parametrize("executor", ASYNC, ids=lambda c: c.kind)
def test_an_async_trigger_from_another_task_waits_for_the_running_transition(
    executor: type[AsyncExecutor],
) -> None:
    ex = executor(NESTED, AsyncGuarded)
    m = AsyncGuarded("w-1")
    ex.initialize(m)

    async def scenario() -> None:
        first = asyncio.create_task(ex.fire(m, "go"))
        while not m.log:  # the first transition is awaiting inside its guard
            await asyncio.sleep(0)
        await ex.fire(m, "go")  # queued behind it: returns at once
        assert m.state == "a"
        await first

    asyncio.run(scenario())
    assert m.state == "b.b2.x"
    assert _names(m)[-len(INNER) :] == INNER
