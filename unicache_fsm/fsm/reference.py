"""The reference executors: one `transitions` machine per spec, models never registered.

The spec's flat meaning (`fsm.flat`) becomes a plain `transitions.Machine` (for
`AsyncReferenceExecutor`, `transitions.extensions.asyncio.AsyncMachine`) whose states
are configurations and whose transitions are flat transitions, with
``auto_transitions=False`` and invalid triggers raising. Configurations and their
transitions are added to the machine the first time a model fires a trigger in them
(all at once when flattening already enumerated the configurations), so a machine of
many independent parallel regions never has its product built. Models are driven
through ``machine.events[trigger].trigger(model, ...)`` without ``add_model``: no
machine per object, no per-model registration, nothing stored per model but the state
slot. Guards and callbacks are called on the model, or on the bound handler with the
model first (`ExecutorBase._callback` says which), exactly as the compiled executors do.

`transitions` decides everything that is semantics rather than hierarchy: which
candidate wins, when guards run, the callback order, and what an exception does to
the state. The glue here only turns names into calls on the model, records which
guard vetoed (per model, so threads driving different models never read each other's
veto), runs the exit/enter callbacks that `fsm.flat` resolved for the transition
being taken, and maps `transitions`' errors onto ours. Run-to-completion is the
executor API's (`fsm.executor`): a trigger fired during a transition is queued before
it reaches `transitions`.

One exception to "transitions decides": `AsyncMachine` runs the callbacks of one list
(and the guards of one transition) concurrently with ``asyncio.gather``, so their side
effects would interleave in scheduling order and every guard would run even after one
vetoed. The spec promises list order, so the async glue hands each list over as one
callback that awaits its names one after another, and the guards of a transition as
one condition that stops at the first veto, as the sync executors do.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from transitions import Machine, State, Transition
from transitions.core import EventData, MachineError
from transitions.extensions.asyncio import AsyncMachine, AsyncState, AsyncTransition

from unicache_fsm.fsm.executor import AsyncExecutor, Executor, ExecutorBase, TransitionEvent
from unicache_fsm.fsm.flat import FlatTransition
from unicache_fsm.fsm.spec import MachineSpec, TransitionSpec

__all__ = ["AsyncReferenceExecutor", "ReferenceExecutor"]

_Callback = Callable[[EventData], Any]
#: What `Machine.add_transition` takes for a callback list (its stubs are narrower).
_Callbacks = list[Any]


class _FlatTransition(Transition):
    """A `transitions` transition that remembers the flat transition it stands for."""

    flat: FlatTransition | None = None


class _Machine(Machine):
    transition_cls = _FlatTransition


class _AsyncFlatTransition(AsyncTransition):
    flat: FlatTransition | None = None


class _AsyncMachine(AsyncMachine):
    transition_cls = _AsyncFlatTransition


def _flat_of(event: EventData) -> FlatTransition:
    flat = getattr(event.transition, "flat", None)
    assert isinstance(flat, FlatTransition)
    return flat


class _ReferenceGlue(ExecutorBase):
    """The `transitions` machine of a spec, filled on first use; see the module docstring."""

    _machine_cls: ClassVar[type[Machine]]
    _state_cls: ClassVar[type[State]]

    def __init__(
        self,
        spec: MachineSpec | str,
        model_cls: type,
        *,
        state_attribute: str = "state",
        triggers: type[enum.Enum] | None = None,
        states: type[enum.Enum] | None = None,
        handler: object | None = None,
        ignore_invalid: bool = False,
        model_methods: bool = False,
        event_data: bool = False,
        lock: bool = False,
    ) -> None:
        super().__init__(
            spec,
            model_cls,
            state_attribute=state_attribute,
            triggers=triggers,
            states=states,
            handler=handler,
            ignore_invalid=ignore_invalid,
            model_methods=model_methods,
            event_data=event_data,
            lock=lock,
        )
        self._fns: dict[str, Callable[..., Any]] = {
            n: self._callback(n) for n in self.spec.callback_names()
        }
        # id(model) -> the guard that vetoed last, while a `fire` of that model runs
        self._vetoes: dict[int, str] = {}
        self.machine = self._machine_cls(
            model=None,
            states=[self._state(self.flat.initial)],
            initial=self.flat.initial,
            auto_transitions=False,
            ignore_invalid_triggers=False,
            send_event=True,
            model_attribute=state_attribute,
            name=f"{self.name}: ",
        )
        # (configuration, trigger) pairs given to the machine: on first use, or all at
        # once for a spec whose configurations were all enumerated while flattening
        self._added: set[tuple[str, str]] = set()
        if self.flat.enumerated:
            for config, trigger in self.flat.table:
                self._add(config, trigger)
        self._install_lock()

    # -- building the machine ----------------------------------------------------------
    def _state(self, config: str) -> State:
        return self._state_cls(config, on_enter=[self._run_enters], on_exit=[self._run_exits])

    def _add(self, config: str, trigger: str) -> None:
        """Give the `transitions` machine the candidates of one legal pair."""
        self._added.add((config, trigger))
        for ft in self.flat.group(config, trigger):
            for name in (config, ft.dest):
                if name not in self.machine.states:
                    self.machine.add_state(self._state(name))
            t = ft.spec
            conditions, unless = self._guards(t)
            self.machine.add_transition(
                trigger,
                source=config,
                dest=ft.dest,
                prepare=self._calls(t.prepare),
                conditions=conditions,
                unless=unless,
                before=self._calls(t.before),
                after=self._calls(t.after),
            )
            added = self.machine.events[trigger].transitions[config][-1]
            assert isinstance(added, _FlatTransition | _AsyncFlatTransition)
            added.flat = ft

    def _legal(self, model: Any, trigger: Any) -> tuple[str, str | None]:
        """The model's configuration and the canonical trigger name, the pair added to
        the machine when it is legal (None: unknown trigger)."""
        state = self.state_of(model)
        name = self._normalize(trigger)
        pending = name is not None and (state, name) not in self._added
        if pending and name in self.flat.triggers_from(state):
            self._add(state, name)
        return state, name

    def _event(self, model: Any, trigger: Any) -> tuple[str, str, Any] | None:
        """For `fire`: configuration, trigger name and the `transitions` event, None
        for a trigger the executor ignores, or the error of an unfireable trigger."""
        state, name = self._legal(model, trigger)
        event = self.machine.events.get(name) if name is not None else None
        if name is None or event is None or state not in event.transitions:
            if self._reject_unfireable(model, trigger) is None:  # raises unless ignored
                return None
            raise AssertionError("unreachable")  # pragma: no cover
        return state, name, event

    def _kwargs(self, event: EventData) -> dict[str, Any]:
        """The keyword arguments of a guard or callback: the trigger's, plus ``event``
        (a `TransitionEvent` of the transition being tried) with ``event_data=True``."""
        if not self.event_data:
            return event.kwargs
        flat = _flat_of(event)
        return {**event.kwargs, "event": TransitionEvent(flat.trigger, flat.source, flat.dest)}

    def _record_veto(self, model: Any, label: str) -> None:
        key = id(model)
        if key in self._vetoes:
            self._vetoes[key] = label

    def _run_exits(self, event: EventData) -> Any:
        return self._run(_flat_of(event).exits, event)

    def _run_enters(self, event: EventData) -> Any:
        flat = _flat_of(event)
        if self.observers:
            self._notify(event.model, flat.source, flat.trigger, flat.dest)
        return self._run(flat.enters, event)

    # -- what differs between the sync and the async machine ---------------------------
    def _calls(self, names: tuple[str, ...]) -> _Callbacks:
        raise NotImplementedError

    def _guards(self, t: TransitionSpec) -> tuple[_Callbacks, _Callbacks]:
        raise NotImplementedError

    def _run(self, names: tuple[str, ...], event: EventData) -> Any:
        raise NotImplementedError


class ReferenceExecutor(_ReferenceGlue, Executor):
    """Drives models through a shared `transitions.Machine` built from the spec."""

    kind = "reference"
    _machine_cls = _Machine
    _state_cls = State

    def _call(self, name: str) -> _Callback:
        fn = self._fns[name]

        def callback(event: EventData) -> Any:
            return fn(event.model, *event.args, **self._kwargs(event))

        callback.__qualname__ = callback.__name__ = name
        return callback

    def _calls(self, names: tuple[str, ...]) -> _Callbacks:
        return [self._call(n) for n in names]

    def _guard(self, name: str, expected: bool) -> Callable[[EventData], bool]:
        label = name if expected else f"not {name}"
        fn = self._fns[name]

        def check(event: EventData) -> bool:
            value = fn(event.model, *event.args, **self._kwargs(event))
            if inspect.isawaitable(value):
                self._refuse_awaitable(value, name)
            result = bool(value)
            if result is not expected:
                self._record_veto(event.model, label)
            return result

        return check

    def _guards(self, t: TransitionSpec) -> tuple[_Callbacks, _Callbacks]:
        return [self._guard(n, True) for n in t.conditions], [
            self._guard(n, False) for n in t.unless
        ]

    def _run(self, names: tuple[str, ...], event: EventData) -> None:
        for name in names:
            self._fns[name](event.model, *event.args, **self._kwargs(event))

    def _fire_one(
        self, model: Any, trigger: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        found = self._event(model, trigger)
        if found is None:
            return
        state, name, event = found
        key = id(model)
        self._vetoes[key] = ""
        try:
            ok = event.trigger(model, *args, **kwargs)
        except MachineError as exc:  # pragma: no cover - pre-checked above
            raise AssertionError(f"transitions refused a pre-checked trigger: {exc}") from exc
        finally:
            veto = self._vetoes.pop(key)
        if not ok:
            self._guard_rejected(model, state, name, veto)

    def may_fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> bool:
        state, name = self._legal(model, trigger)
        if name is None:
            self._reject_unfireable(model, trigger)  # raises UnknownTriggerError
        if (state, name) not in self._added:
            return False
        return bool(self.machine._can_trigger(model, name, *args, **kwargs))


async def _settle(value: Any) -> Any:
    """`value`, awaited when it is awaitable (what `AsyncMachine` does with results)."""
    return await value if inspect.isawaitable(value) else value


class AsyncReferenceExecutor(_ReferenceGlue, AsyncExecutor):
    """Drives models through a shared `transitions` `AsyncMachine` built from the spec."""

    kind = "async-reference"
    _machine_cls = _AsyncMachine
    _state_cls = AsyncState

    def _calls(self, names: tuple[str, ...]) -> _Callbacks:
        if not names:
            return []

        async def callbacks(event: EventData) -> None:
            await self._run(names, event)

        callbacks.__qualname__ = callbacks.__name__ = "+".join(names)
        return [callbacks]

    def _guards(self, t: TransitionSpec) -> tuple[_Callbacks, _Callbacks]:
        checks = [(n, True) for n in t.conditions] + [(n, False) for n in t.unless]
        if not checks:
            return [], []

        async def guards(event: EventData) -> bool:
            for name, expected in checks:
                fn = self._fns[name]
                result = bool(await _settle(fn(event.model, *event.args, **self._kwargs(event))))
                if result is not expected:
                    self._record_veto(event.model, name if expected else f"not {name}")
                    return False
            return True

        return [guards], []

    async def _run(self, names: tuple[str, ...], event: EventData) -> None:
        for name in names:
            await _settle(self._fns[name](event.model, *event.args, **self._kwargs(event)))

    async def _fire_one(
        self, model: Any, trigger: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        found = self._event(model, trigger)
        if found is None:
            return
        state, name, event = found
        key = id(model)
        self._vetoes[key] = ""
        try:
            running: Awaitable[bool] = event.trigger(model, *args, **kwargs)
            ok = await running
        except MachineError as exc:  # pragma: no cover - pre-checked above
            raise AssertionError(f"transitions refused a pre-checked trigger: {exc}") from exc
        finally:
            veto = self._vetoes.pop(key)
        if not ok:
            if not veto:  # `AsyncMachine` reports a cancelled transition as a failed one
                raise asyncio.CancelledError
            self._guard_rejected(model, state, name, veto)

    async def may_fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> bool:
        state, name = self._legal(model, trigger)
        if name is None:
            self._reject_unfireable(model, trigger)  # raises UnknownTriggerError
        if (state, name) not in self._added:
            return False
        can: Awaitable[bool] = self.machine._can_trigger(model, name, *args, **kwargs)
        return bool(await can)
