"""Differential test: the compiled executors behave exactly like the reference ones.

Each machine runs four ways: with its guards and callbacks on the model, and bound to
a handler object (the model is plain data), each with the sync executors and with the
async ones (`AsyncCompiledExecutor` against `AsyncReferenceExecutor`, every other
guard and callback an ``async def`` that yields to the event loop). Random sequences
of steps — legal and illegal triggers, unknown triggers, guards set true or false,
callbacks that raise, guards that write the state slot (a configuration or garbage),
callbacks and guards that fire a trigger on their own model (re-entrant: queued by
run-to-completion, or run at once from a `may_fire` probe), positional and keyword
arguments, `may_fire` probes — go to one model driven by each executor. After every
step the two must agree on the state, the full callback log (names, order, arguments,
re-entrant fires) and the outcome (the same error type and message, or success).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm_models import (
    Boom,
    RecordingModel,
    firing_names,
    recording_handler_class,
    recording_model_class,
)
from unicache_fsm.fsm.compiled import AsyncCompiledExecutor, CompiledExecutor
from unicache_fsm.fsm.executor import ExecutorBase
from unicache_fsm.fsm.loader import bundled_spec, load_spec
from unicache_fsm.fsm.reference import AsyncReferenceExecutor, ReferenceExecutor
from unicache_fsm.fsm.spec import MachineSpec

SPECS = Path(__file__).parent / "data" / "specs"


def _spec(name: str) -> MachineSpec:
    path = SPECS / f"{name}.toml"
    return load_spec(path) if path.exists() else bundled_spec(name)


MACHINES = ["load_transaction", "offload", "node_residency", "nested", "parallel"]
# history transitions (issue 35), nested and parallel, on every binding, on a small budget
HISTORY_MACHINES = ["history"]
BINDINGS = ["model", "handler", "model-async", "handler-async"]
# the executor options that change what guards and callbacks see or what an illegal
# trigger does (issue 35), on the machines with nesting, regions and internal transitions
OPTIONS = {"ignore_invalid": True, "event_data": True}
OPTION_MACHINES = ["nested", "parallel", "features", "history"]
OPTION_BINDINGS = ["options", "options-async"]
PAIRS: dict[tuple[str, str], tuple[MachineSpec, ExecutorBase, ExecutorBase]] = {}


def _log_transition(
    _ex: ExecutorBase, model: RecordingModel, src: str, trig: str, dest: str
) -> None:
    model.log.append(("<transition>", (src, trig, dest), {}))


for _name in dict.fromkeys([*MACHINES, *HISTORY_MACHINES, *OPTION_MACHINES]):
    _s = _spec(_name)
    for _aio in (False, True) if _name in MACHINES or _name in HISTORY_MACHINES else ():
        compiled = AsyncCompiledExecutor if _aio else CompiledExecutor
        reference = AsyncReferenceExecutor if _aio else ReferenceExecutor
        suffix = "-async" if _aio else ""
        _cls = recording_model_class(_s, aio=_aio)
        PAIRS[(_name, f"model{suffix}")] = (_s, compiled(_s, _cls), reference(_s, _cls))
        _handler = recording_handler_class(_s, aio=_aio)()
        PAIRS[(_name, f"handler{suffix}")] = (
            _s,
            compiled(_s, RecordingModel, handler=_handler),
            reference(_s, RecordingModel, handler=_handler),
        )
    if _name in OPTION_MACHINES:
        for _aio in (False, True):
            compiled = AsyncCompiledExecutor if _aio else CompiledExecutor
            reference = AsyncReferenceExecutor if _aio else ReferenceExecutor
            _cls = recording_model_class(_s, aio=_aio)
            PAIRS[(_name, "options-async" if _aio else "options")] = (
                _s,
                compiled(_s, _cls, **OPTIONS),
                reference(_s, _cls, **OPTIONS),
            )
for _pair in PAIRS.values():
    for _ex in _pair[1:]:
        _ex.add_observer(_log_transition)  # observers see the same transitions, same place


def _outcome(call: Any) -> tuple[str, str]:
    try:
        result = call()
    except Boom as exc:
        return ("Boom", str(exc))
    except Exception as exc:  # every other error must match exactly too
        return (type(exc).__name__, str(exc))
    return ("ok", repr(result))


def _involved(ex: ExecutorBase, state: str, trigger: str) -> list[str]:
    """Names a firing of `trigger` in `state` may call, in spec order."""
    names: dict[str, None] = {}
    for ft in ex.flat.table.get((state, trigger), ()):
        t = ft.spec
        for group in (t.prepare, t.conditions, t.unless, t.before, ft.exits, ft.enters, t.after):
            names.update(dict.fromkeys(group))
    return list(names)


def _draw_step(
    data: st.DataObject, ex: ExecutorBase, state: Any, firing: tuple[str, ...]
) -> dict[str, Any]:
    """One step, biased towards triggers legal in `state` and callbacks they call."""
    spec = ex.spec
    allowed = list(ex.flat.triggers_from(state)) if ex.flat.is_config(state) else []
    everything = [*spec.triggers(), "no_such_trigger"]
    legal = bool(allowed) and data.draw(st.integers(0, 3)) > 0
    trigger = data.draw(st.sampled_from(allowed if legal else everything))
    involved = _involved(ex, state, trigger) or list(spec.callback_names()) or [None]
    guards = sorted({n for t in spec.transitions for n in (*t.conditions, *t.unless)})
    can_fire = [n for n in involved if n in firing]
    fire_in: dict[str, str] = {}
    if can_fire and data.draw(st.integers(0, 2)) == 0:
        fire_in = {data.draw(st.sampled_from(can_fire)): data.draw(st.sampled_from(everything))}
    meddlers = [n for n in involved if n in guards]
    mutate_in = None
    if meddlers and data.draw(st.integers(0, 3)) == 0:
        values = [*ex.flat.first_configs(3), "no-such-configuration"]
        mutate_in = (data.draw(st.sampled_from(meddlers)), data.draw(st.sampled_from(values)))
    return {
        "fire_in": fire_in,
        "mutate_in": mutate_in,
        "trigger": trigger,
        "probe": data.draw(st.integers(0, 4)) == 0,
        "guards": data.draw(st.fixed_dictionaries({g: st.booleans() for g in guards})),
        "raise_in": data.draw(st.one_of(st.none(), st.none(), st.sampled_from(involved))),
        "args": data.draw(st.lists(st.integers(0, 9), max_size=2).map(tuple)),
        "kwargs": data.draw(
            st.dictionaries(st.sampled_from(["n", "why"]), st.integers(0, 3), max_size=1)
        ),
    }


def _run(
    name: str, data: st.DataObject, seen: set[str] | None = None, binding: str = "model"
) -> None:
    _, compiled, reference = PAIRS[(name, binding)]
    aio = binding.endswith("-async")
    with asyncio.Runner() as runner:
        _steps(name, data, compiled, reference, runner if aio else None, seen)


def _steps(
    name: str,
    data: st.DataObject,
    compiled: ExecutorBase,
    reference: ExecutorBase,
    runner: asyncio.Runner | None,
    seen: set[str] | None,
) -> None:
    """Draw and run the steps of one example (async calls go through `runner`)."""
    firing = firing_names(type(compiled.handler) if compiled.handler else compiled.model_cls)
    models: dict[str, RecordingModel] = {}
    for kind, ex in (("compiled", compiled), ("reference", reference)):
        m = ex.model_cls(fsm_id=f"{name}-1")
        m.executor = ex
        ex.initialize(m)
        models[kind] = m
    for i in range(data.draw(st.integers(1, 30))):
        step = _draw_step(data, compiled, models["compiled"].state, firing)
        outcomes = {}
        for kind, ex in (("compiled", compiled), ("reference", reference)):
            m = models[kind]
            m.guards = dict(step["guards"])
            m.raise_in = step["raise_in"]
            m.fire_in = dict(step["fire_in"])
            m.mutate_in = step["mutate_in"]
            fn: Any = ex.may_fire if step["probe"] else ex.fire

            def call(fn: Any = fn, m: RecordingModel = m, s: dict[str, Any] = step) -> Any:
                result = fn(m, s["trigger"], *s["args"], **s["kwargs"])
                return runner.run(result) if runner is not None else result

            outcomes[kind] = _outcome(call)
        c, r = models["compiled"], models["reference"]
        context = f"step {i}: {step}"
        assert outcomes["compiled"] == outcomes["reference"], context
        assert c.state == r.state, context
        assert c.log == r.log, context
        assert getattr(c, "state_history", None) == getattr(r, "state_history", None), context
        if seen is not None:
            seen.add(outcomes["compiled"][0])
            seen.update(f"{n.split()[0]}" for n, _a, _k in c.log if n.startswith("fire "))
            if step["mutate_in"] is not None:
                seen.add("mutated")


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("name", MACHINES)
def test_compiled_agrees_with_reference(name: str, binding: str) -> None:
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        _run(name, data, binding=binding)

    check()


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("name", HISTORY_MACHINES)
def test_compiled_agrees_with_reference_on_history(name: str, binding: str) -> None:
    @settings(max_examples=20)  # a small budget: the hand-computed cases are in test_fsm_history
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        _run(name, data, binding=binding)

    check()


@pytest.mark.parametrize("binding", OPTION_BINDINGS)
@pytest.mark.parametrize("name", OPTION_MACHINES)
def test_compiled_agrees_with_reference_with_options(name: str, binding: str) -> None:
    @settings(max_examples=10)  # a small budget: six more runs of the whole generator
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        _run(name, data, binding=binding)

    check()


def test_differential_sees_every_outcome_kind() -> None:
    """The generator reaches success, illegal, unknown, guard veto and callback errors."""
    seen: set[str] = set()

    @given(data=st.data())
    def collect(data: st.DataObject) -> None:
        _run("nested", data, seen)

    collect()
    expected = {"ok", "IllegalTransitionError", "UnknownTriggerError", "GuardRejectedError"}
    assert expected | {"Boom", "fire", "mutated"} <= seen, seen
