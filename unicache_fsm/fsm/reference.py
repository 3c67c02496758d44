"""The reference executor: one `transitions` machine per spec, models never registered.

The spec's flat meaning (`fsm.flat`) becomes a plain `transitions.Machine` whose
states are the configurations and whose transitions are the flat transitions, with
``auto_transitions=False`` and invalid triggers raising. Models are driven through
``machine.events[trigger].trigger(model, ...)`` without ``add_model``: no machine per
object, no per-model registration, nothing stored per model but the state slot.
Guards and callbacks are called on the model, or on the bound handler with the model
first (`Executor._callback` says which), exactly as the compiled executor does.

`transitions` decides everything that is semantics rather than hierarchy: which
candidate wins, when guards run, the callback order, and what an exception does to
the state. The glue here only turns names into calls on the model, records which
guard vetoed, runs the exit/enter callbacks that `fsm.flat` resolved for the
transition being taken, and maps `transitions`' errors onto ours.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from transitions import Machine, State, Transition
from transitions.core import EventData, MachineError

from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.flat import FlatTransition
from unicache_fsm.fsm.spec import MachineSpec

__all__ = ["ReferenceExecutor"]


class _FlatTransition(Transition):
    """A `transitions` transition that remembers the flat transition it stands for."""

    flat: FlatTransition | None = None


class _Machine(Machine):
    transition_cls = _FlatTransition


def _event_call(name: str, fn: Callable[..., Any]) -> Callable[[EventData], Any]:
    """A `transitions` callback that runs ``fn(model, *args, **kwargs)``."""

    def callback(event: EventData) -> Any:
        return fn(event.model, *event.args, **event.kwargs)

    callback.__qualname__ = callback.__name__ = name
    return callback


class ReferenceExecutor(Executor):
    """Drives models through a shared `transitions.Machine` built from the spec."""

    kind = "reference"

    def __init__(
        self,
        spec: MachineSpec | str,
        model_cls: type,
        *,
        state_attribute: str = "state",
        triggers: type[enum.Enum] | None = None,
        states: type[enum.Enum] | None = None,
        handler: object | None = None,
    ) -> None:
        super().__init__(
            spec,
            model_cls,
            state_attribute=state_attribute,
            triggers=triggers,
            states=states,
            handler=handler,
        )
        self._fns: dict[str, Callable[..., Any]] = {
            n: self._callback(n) for n in self.spec.callback_names()
        }
        self._rejected = ""
        self.machine = _Machine(
            model=None,
            states=[
                State(c, on_enter=[self._run_enters], on_exit=[self._run_exits])
                for c in self.flat.configs
            ],
            initial=self.flat.initial,
            auto_transitions=False,
            ignore_invalid_triggers=False,
            send_event=True,
            model_attribute=state_attribute,
            name=f"{self.name}: ",
        )
        for (config, trigger), group in self.flat.table.items():
            for ft in group:
                t = ft.spec
                self.machine.add_transition(
                    trigger,
                    source=config,
                    dest=ft.dest,
                    prepare=[self._call(n) for n in t.prepare],
                    conditions=[self._guard(n, True) for n in t.conditions],
                    unless=[self._guard(n, False) for n in t.unless],
                    before=[self._call(n) for n in t.before],
                    after=[self._call(n) for n in t.after],
                )
                added = self.machine.events[trigger].transitions[config][-1]
                assert isinstance(added, _FlatTransition)
                added.flat = ft

    def _call(self, name: str) -> Callable[[EventData], Any]:
        return _event_call(name, self._fns[name])

    def _guard(self, name: str, expected: bool) -> Callable[[EventData], bool]:
        label = name if expected else f"not {name}"
        fn = self._fns[name]

        def check(event: EventData) -> bool:
            result = bool(fn(event.model, *event.args, **event.kwargs))
            if result is not expected:
                self._rejected = label
            return result

        return check

    @staticmethod
    def _flat_of(event: EventData) -> FlatTransition:
        transition = event.transition
        assert isinstance(transition, _FlatTransition) and transition.flat is not None
        return transition.flat

    def _run_exits(self, event: EventData) -> None:
        for name in self._flat_of(event).exits:
            self._fns[name](event.model, *event.args, **event.kwargs)

    def _run_enters(self, event: EventData) -> None:
        flat = self._flat_of(event)
        if self.observers:
            self._notify(event.model, flat.source, flat.trigger, flat.dest)
        for name in flat.enters:
            self._fns[name](event.model, *event.args, **event.kwargs)

    def fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> None:
        state = self.state_of(model)
        name = self._normalize(trigger)
        event = self.machine.events.get(name) if name is not None else None
        if name is None or event is None or state not in event.transitions:
            self._reject_unfireable(model, trigger)  # raises
            raise AssertionError("unreachable")  # pragma: no cover
        self._rejected = ""
        try:
            ok = event.trigger(model, *args, **kwargs)
        except MachineError as exc:  # pragma: no cover - pre-checked above
            raise AssertionError(f"transitions refused a pre-checked trigger: {exc}") from exc
        if not ok:
            self._guard_rejected(model, state, name, self._rejected)

    def may_fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> bool:
        self.state_of(model)
        name = self._normalize(trigger)
        if name is None:
            self._reject_unfireable(model, trigger)  # raises UnknownTriggerError
        return bool(self.machine._can_trigger(model, name, *args, **kwargs))
