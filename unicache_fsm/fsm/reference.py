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

History (`TransitionSpec.history`), which `transitions` does not have, is kept here,
by code of its own (nothing shared with the compiled executors'): the exit callback
writes, for each history state the flat transition exits, the source configuration's
leaves beneath it into the model's ``<state_attribute>_history``; a history
transition becomes one `transitions` transition per restoration met so far, each gated
by a first condition (and its `prepare` by the same test) that holds only when the
model's history (or what this very exit records) names that restoration.

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

import attrs
from transitions import Machine, State, Transition
from transitions.core import EventData, MachineError
from transitions.extensions.asyncio import AsyncMachine, AsyncState, AsyncTransition

from unicache_fsm.fsm.executor import AsyncExecutor, Executor, ExecutorBase, TransitionEvent
from unicache_fsm.fsm.flat import FlatTransition
from unicache_fsm.fsm.spec import MachineSpec, StateKind, TransitionSpec

_Match = Callable[[EventData], bool]

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


def _prefixes(path: str) -> list[str]:
    """`path` and each of its ancestors (not the root)."""
    parts = path.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]


def _gated(callback: Any, match: _Match) -> Any:
    """`callback`, run only when `match` holds (the `prepare` of one restoration)."""

    def gated(event: EventData) -> Any:
        return callback(event) if match(event) else None

    return gated


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
        # history: (config, trigger, candidate index) -> {recorded leaves: the flat
        # transition entering through them}, the restorations met so far
        self._history_attr = f"{state_attribute}_history"
        self._restorations: dict[tuple[str, str, int], dict[Any, FlatTransition]] = {}
        if self.flat.enumerated:
            for config, trigger in self.flat.table:
                self._add(config, trigger)
        self._install_lock()

    # -- building the machine ----------------------------------------------------------
    def _state(self, config: str) -> State:
        return self._state_cls(config, on_enter=[self._run_enters], on_exit=[self._run_exits])

    def _add(self, config: str, trigger: str) -> None:
        """Give the `transitions` machine the candidates of one legal pair (again, in
        candidate order, when a new restoration of a history candidate was met)."""
        self._added.add((config, trigger))
        event = self.machine.events.get(trigger)
        if event is not None:
            event.transitions.pop(config, None)
        for i, ft in enumerate(self.flat.group(config, trigger)):
            if not ft.spec.history:
                self._add_one(ft, None)
                continue
            known = self._restorations.setdefault((config, trigger, i), {None: ft})
            for leaves, restored in known.items():
                self._add_one(restored, self._matcher(ft, leaves))

    def _add_one(self, ft: FlatTransition, match: _Match | None) -> None:
        for name in (ft.source, ft.dest):
            if name not in self.machine.states:
                self.machine.add_state(self._state(name))
        t = ft.spec
        conditions, unless = self._guards(t, match)
        prepare = self._calls(t.prepare)
        if match is not None:
            prepare = [_gated(cb, match) for cb in prepare]
        self.machine.add_transition(
            ft.trigger,
            source=ft.source,
            dest=ft.dest,
            prepare=prepare,
            conditions=conditions,
            unless=unless,
            before=self._calls(t.before),
            after=self._calls(t.after),
        )
        added = self.machine.events[ft.trigger].transitions[ft.source][-1]
        assert isinstance(added, _FlatTransition | _AsyncFlatTransition)
        added.flat = ft

    # -- history -----------------------------------------------------------------------
    def _recalled(self, model: Any, ft: FlatTransition) -> tuple[str, ...] | None:
        """What entering `ft`'s dest through its history restores for `model`: what
        this transition's own exit records there, else what the model's history holds
        (None: the dest was never exited)."""
        target = ft.spec.dest
        if target in ft.exited_states:
            return tuple(x for x in ft.source.split(",") if x.startswith(target + "."))
        memory: dict[str, tuple[str, ...]] = getattr(model, self._history_attr)
        return memory.get(target)

    def _matcher(self, ft: FlatTransition, leaves: tuple[str, ...] | None) -> _Match:
        def match(event: EventData) -> bool:
            return self._recalled(event.model, ft) == leaves

        return match

    def _meet_restorations(self, model: Any, config: str, trigger: str) -> None:
        """Before `model` fires `trigger` in `config`: give the machine a transition for
        each history candidate's restoration of this model's history, if new."""
        new = False
        for i, ft in enumerate(self.flat.group(config, trigger)):
            if not ft.spec.history:
                continue
            known = self._restorations.setdefault((config, trigger, i), {None: ft})
            leaves = self._recalled(model, ft)
            if leaves not in known:  # None (never exited) is known from the start
                assert leaves is not None
                known[leaves] = self._restore(ft, leaves)
                new = True
        if new:
            self._add(config, trigger)

    def _restore(self, ft: FlatTransition, leaves: tuple[str, ...]) -> FlatTransition:
        """`ft` entering its dest through the recorded `leaves`: deep keeps every state
        beneath the dest that holds a recorded leaf; shallow keeps the dest's children
        that hold one, and enters each of them by default."""
        spec, target = self.spec, ft.spec.dest
        dest_state = spec.state(target)
        assert dest_state is not None
        holds = {p for leaf in leaves for p in _prefixes(leaf)}
        below = [s for s in dest_state.walk() if s.path != target]
        if ft.spec.history == "deep":
            inside = {s.path for s in below if s.path in holds}
        else:
            inside = set()
            todo = [c for c in dest_state.children if c.path in holds]
            while todo:
                state = todo.pop()
                inside.add(state.path)
                if state.initial is not None and state.kind is StateKind.COMPOUND:
                    todo += [c for c in state.children if c.name == state.initial]
                elif state.kind is StateKind.PARALLEL:
                    todo += list(state.children)
        kept = {p for p in ft.entered_states if not p.startswith(target + ".")}
        outside = {x for x in ft.dest.split(",") if not x.startswith(target + ".")}
        entered = [s for s in spec.states() if s.path in kept or s.path in inside]
        dest = [
            s.path
            for s in spec.states()
            if not s.children and (s.path in outside or s.path in inside)
        ]
        return attrs.evolve(
            ft,
            dest=",".join(dest),
            enters=tuple(cb for s in entered for cb in s.on_enter),
            entered_states=tuple(s.path for s in entered),
        )

    def _record_history(self, event: EventData) -> None:
        flat = _flat_of(event)
        memory: dict[str, tuple[str, ...]] | None = None
        for target in self.history_states:
            if target in flat.exited_states:
                if memory is None:
                    memory = getattr(event.model, self._history_attr)
                memory[target] = tuple(
                    x for x in flat.source.split(",") if x.startswith(target + ".")
                )

    def _legal(self, model: Any, trigger: Any) -> tuple[str, str | None]:
        """The model's configuration and the canonical trigger name, the pair added to
        the machine when it is legal (None: unknown trigger)."""
        state = self.state_of(model)
        name = self._normalize(trigger)
        pending = name is not None and (state, name) not in self._added
        if pending and name in self.flat.triggers_from(state):
            self._add(state, name)
        if name is not None and self.history_states and (state, name) in self._added:
            self._meet_restorations(model, state, name)
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
        return self._run(_flat_of(event).exits, event, self._record_history)

    def _run_enters(self, event: EventData) -> Any:
        flat = _flat_of(event)
        if self.observers:
            self._notify(event.model, flat.source, flat.trigger, flat.dest)
        return self._run(flat.enters, event)

    # -- what differs between the sync and the async machine ---------------------------
    def _calls(self, names: tuple[str, ...]) -> _Callbacks:
        raise NotImplementedError

    def _guards(self, t: TransitionSpec, match: _Match | None) -> tuple[_Callbacks, _Callbacks]:
        raise NotImplementedError

    def _run(
        self,
        names: tuple[str, ...],
        event: EventData,
        then: Callable[[EventData], None] | None = None,
    ) -> Any:
        """Run the callbacks `names`, then `then(event)` if given."""
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

    def _guards(self, t: TransitionSpec, match: _Match | None) -> tuple[_Callbacks, _Callbacks]:
        first: _Callbacks = [match] if match is not None else []  # checked in order
        return first + [self._guard(n, True) for n in t.conditions], [
            self._guard(n, False) for n in t.unless
        ]

    def _run(
        self,
        names: tuple[str, ...],
        event: EventData,
        then: Callable[[EventData], None] | None = None,
    ) -> None:
        for name in names:
            self._fns[name](event.model, *event.args, **self._kwargs(event))
        if then is not None:
            then(event)

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

    def _guards(self, t: TransitionSpec, match: _Match | None) -> tuple[_Callbacks, _Callbacks]:
        checks = [(n, True) for n in t.conditions] + [(n, False) for n in t.unless]
        if not checks and match is None:
            return [], []

        async def guards(event: EventData) -> bool:
            if match is not None and not match(event):
                return False
            for name, expected in checks:
                fn = self._fns[name]
                result = bool(await _settle(fn(event.model, *event.args, **self._kwargs(event))))
                if result is not expected:
                    self._record_veto(event.model, name if expected else f"not {name}")
                    return False
            return True

        return [guards], []

    async def _run(
        self,
        names: tuple[str, ...],
        event: EventData,
        then: Callable[[EventData], None] | None = None,
    ) -> None:
        for name in names:
            await _settle(self._fns[name](event.model, *event.args, **self._kwargs(event)))
        if then is not None:
            then(event)

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
