"""The executor API shared by the reference and the compiled executors, sync and async.

An executor binds one spec to one model class and drives any number of models of
that class; it keeps no per-model data (but, while a model's transition runs, the
triggers queued behind it). A model's whole FSM state is one attribute
(the *state slot*, ``state`` unless bound otherwise) holding its configuration name.

Where the spec's guards and callbacks live is the binding's choice:

- on the model (default): each is a method, called ``model.name(*args, **kwargs)``;
- on a *handler* (``handler=obj``): the model is plain data and each name is a method
  of `obj`, called ``obj.name(model, *args, **kwargs)`` — the record holds no
  reference to whoever does the work (a linker drives its loads this way).

A `states` enum (``states=LoadState``), when given, must name exactly the spec's
configurations; a trigger enum (``triggers=...``) exactly its triggers. Either drift
is an `InvalidSpecError` when the executor is built.

Primitives:

- `initialize(model, like=None)` — put a new model in the initial configuration (or
  in the configuration of `like`, for a node born by splitting another).
- `fire(model, trigger, *args, **kwargs)` — run one transition: `prepare`, guards,
  `before`, exits, state change, enters, `after`, each called as
  ``model.name(*args, **kwargs)``. Raises `IllegalTransitionError` (no transition
  from this state; nothing ran), `UnknownTriggerError` (not a trigger of this
  machine), `GuardRejectedError` (every candidate vetoed; the state slot holds the
  source configuration again, even if a guard wrote it) or `UnknownStateError` (the
  slot holds garbage). An exception from a callback before the state change
  propagates with the state unchanged; one from an `on_enter` or `after` callback
  propagates with the new state kept (no rollback after the change).
- `may_fire(model, trigger, *args, **kwargs)` — whether `fire` would pass the guards
  now; runs `prepare` callbacks and guards, never `before`/`after` (so never
  allocate in `prepare`).
- `allowed_triggers(model)`, `state_of(model)`, `is_active(model, path)`,
  `is_final(model)` — queries that run no callback.
- `add_observer(fn)` / `remove_observer(fn)` — call ``fn(executor, model, source,
  trigger, dest)`` for every transition taken, right after the state change and before
  the `on_enter` callbacks (traces, coverage counters), and for every `initialize`
  (trigger `INIT_TRIGGER`, source ``""``). Without observers nothing is paid for them.
  Adding or removing an observer during a notification takes effect from the next one.
- `compile_all(limit=10_000)` — build now what an executor otherwise builds at each
  `(configuration, trigger)` pair's first use (the compiled executors' steps; the
  reference executors build nothing), so a run that fires most pairs pays it before
  its clock starts; at most `limit` pairs, so a machine whose product of parallel
  regions is huge is never walked whole (the rest is built on first use).

Run-to-completion. A trigger fired on a model while one of that model's transitions is
running (from its `prepare`, guards, `before`, `on_exit`, `on_enter` or `after`
callbacks; in an async executor also from another task) does not run at once: it is
queued, `fire` returns ``None``, and the outermost `fire` runs the queued triggers in
order once the running transition has finished, each as a transition of its own
(observers see them in that order). An error ends the run: when the running
transition or a queued one raises (illegal by then, vetoed, a callback failing),
the triggers still queued are dropped and the error propagates from the outermost
`fire`. `may_fire` and the queries run at once, wherever they are called from.

Sync and async. `Executor`'s `fire` and `may_fire` are plain methods; binding a
coroutine function (``async def``) as a guard or callback is an `InvalidSpecError`
naming it (its coroutine would be truthy and never run). `AsyncExecutor`'s `fire`
and `may_fire` are coroutines that await every guard or callback returning an
awaitable, one after another in spec order, exactly where the sync executors call
them; plain functions are called as they are. Initialization and the queries are
plain methods on both.

Neither executor is thread-safe for one model unless built with ``lock=True``: a
model is driven from one thread (or task) at a time. Different models may be driven
from different threads at once.

Options (keyword arguments of every executor, all off by default):

- ``ignore_invalid`` — `fire` of a declared trigger that has no transition from the
  model's configuration does nothing (returns, runs nothing, notifies no observer);
  an undeclared trigger still raises `UnknownTriggerError`, a veto `GuardRejectedError`.
- ``model_methods`` — `install_model_methods`: trigger, ``may_<trigger>`` and
  ``is_<state>`` methods on the model class; a clash is an `InvalidSpecError`.
- ``event_data`` — every guard and callback (in `may_fire` too) gets the keyword
  argument ``event``, the `TransitionEvent` (trigger, source, dest) of its candidate.
- ``lock`` — sync executors: a per-model re-entrant lock held for a whole outermost
  firing (queued triggers included); a second thread waits, then runs its own
  transition in its own thread. Refused on async executors (`InvalidSpecError`): their
  run-to-completion already serialises one model's triggers across tasks.

Executors pickle (`__getstate__`): the spec, the model class, the options (the handler
included) and the observers; the rest is rebuilt on load.
"""

from __future__ import annotations

import abc
import enum
import operator
import threading
import types
from collections.abc import Callable
from typing import Any, ClassVar, NoReturn

import attrs

from unicache_fsm.fsm.errors import (
    AwaitableGuardError,
    GuardRejectedError,
    IllegalTransitionError,
    InvalidSpecError,
    SpecProblem,
    UnknownStateError,
    UnknownTriggerError,
)
from unicache_fsm.fsm.flat import FlatMachine, flatten
from unicache_fsm.fsm.identity import model_id
from unicache_fsm.fsm.loader import bundled_spec
from unicache_fsm.fsm.spec import MachineSpec
from unicache_fsm.fsm.validate import check_binding, check_spec

__all__ = [
    "INIT_TRIGGER",
    "AsyncExecutor",
    "Executor",
    "ExecutorBase",
    "Observer",
    "TransitionEvent",
    "install_model_methods",
    "model_id",
]

#: The trigger observers see when a model is initialized (never a spec trigger).
INIT_TRIGGER = "<init>"

#: ``fn(executor, model, source, trigger, dest)``, called for every transition taken.
Observer = Callable[["ExecutorBase", Any, str, str, str], None]

#: A trigger waiting for the running transition of its model: (trigger, args, kwargs).
_Queued = tuple[Any, tuple[Any, ...], dict[str, Any]]


@attrs.frozen
class TransitionEvent:
    """What an ``event_data=True`` executor passes to every guard and callback as the
    keyword argument ``event``: the trigger, the source configuration and the dest
    configuration of the candidate transition being tried or taken (for an internal
    transition, dest is the source)."""

    trigger: str
    source: str
    dest: str


def install_model_methods(executor: ExecutorBase, model_cls: type) -> None:
    """Give `model_cls` a method per trigger (``model.open(*args)`` fires ``open``;
    ``may_open(*args)`` asks `may_fire`) and ``is_<state>()`` per state (dots become
    ``_``: ``is_prepared_loading()``), all going through `executor` (the opt-in
    ``model_methods=True`` of the executors; an async executor's trigger methods are
    coroutines). Nothing is overwritten: a name the class already has (its own
    methods, a guard or callback of the spec, the state slot, another executor's
    methods) is an `InvalidSpecError` listing every clash, and nothing is installed.
    """
    methods: dict[str, Callable[..., Any]] = {}
    for trigger in executor.spec.triggers():
        methods[trigger] = _trigger_method(executor, trigger)
        methods[f"may_{trigger}"] = _may_method(executor, trigger)
    for state in executor.spec.states():
        name = "is_" + state.path.replace(".", "_")
        methods[name] = _is_method(executor, state.path, name in methods)
    taken = [n for n in methods if hasattr(model_cls, n) or n == executor.state_attribute]
    taken += [n for n, fn in methods.items() if getattr(fn, "clash", False)]
    if taken:
        problem = SpecProblem(f"model method already defined on {model_cls.__name__}", taken)
        raise InvalidSpecError(executor.name, executor.spec.source, [problem])
    for name, fn in methods.items():
        setattr(model_cls, name, fn)


def _trigger_method(executor: ExecutorBase, trigger: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return executor.fire(self, trigger, *args, **kwargs)  # type: ignore[attr-defined]

    method.__name__ = method.__qualname__ = trigger
    method.__doc__ = f"Fire {trigger!r} ({executor.name})."
    return method


def _may_method(executor: ExecutorBase, trigger: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return executor.may_fire(self, trigger, *args, **kwargs)  # type: ignore[attr-defined]

    method.__name__ = method.__qualname__ = f"may_{trigger}"
    return method


def _is_method(executor: ExecutorBase, path: str, clash: bool) -> Callable[..., bool]:
    def method(self: Any) -> bool:
        return executor.is_active(self, path)

    method.__name__ = method.__qualname__ = "is_" + path.replace(".", "_")
    method.clash = clash  # type: ignore[attr-defined]  # two states, one method name
    return method


class ExecutorBase(abc.ABC):
    """What sync and async executors share: binding, queries, observers, errors."""

    kind: ClassVar[str]
    #: Whether guards and callbacks may be coroutine functions (`AsyncExecutor`).
    awaits: ClassVar[bool] = False

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
        if isinstance(spec, str):
            spec = bundled_spec(spec)
        # what `__getstate__` keeps: the executor is rebuilt from these
        self._options: dict[str, Any] = {
            "state_attribute": state_attribute,
            "triggers": triggers,
            "states": states,
            "handler": handler,
            "ignore_invalid": ignore_invalid,
            "model_methods": model_methods,
            "event_data": event_data,
            "lock": lock,
        }
        self.lock = lock
        if lock and self.awaits:
            problem = SpecProblem("lock on an async executor", [type(self).__name__])
            raise InvalidSpecError(spec.name, spec.source, [problem])
        self.ignore_invalid = ignore_invalid
        self.event_data = event_data
        check_spec(spec)  # a spec written in Python is held to what a spec file is
        check_binding(
            spec,
            model_cls,
            state_attribute,
            triggers,
            states=states,
            handler=handler,
            coroutines=self.awaits,
        )
        self.spec = spec
        # the states whose history models keep (`TransitionSpec.history`), if any
        self.history_states = spec.history_states()
        self.handler = handler
        self.flat: FlatMachine = flatten(spec)
        self.model_cls = model_cls
        self.state_attribute = state_attribute
        self.name = spec.name
        self.noun = spec.noun or spec.name
        self._get_state: Callable[[Any], Any] = operator.attrgetter(state_attribute)
        self._triggers = frozenset(spec.triggers())
        # trigger aliases: enum members hash by name, so they get their own keys
        self._alias: dict[Any, str] = {t: t for t in self._triggers}
        if triggers is not None:
            for member in triggers:
                self._alias[member] = str(member.value)
        # a tuple: changed only through add_observer / remove_observer, which tell the
        # executor (a compiled one specialises its steps on them); editing it in place fails
        self.observers: tuple[Observer, ...] = ()
        # run-to-completion: the ids of the models whose outermost `fire` is running (a
        # list: it holds one id or a few, and appending and removing an int is the
        # cheapest mark there is; ints compare exactly, unlike models with an __eq__),
        # and the triggers queued behind a running transition, per model id (an entry
        # lives at most as long as that model's outermost `fire`)
        self._active: list[int] = []
        self._queued: dict[int, list[_Queued]] = {}
        if model_methods:
            install_model_methods(self, model_cls)

    def _install_lock(self) -> None:
        """With ``lock=True`` (sync executors): make `fire` hold a per-model re-entrant
        lock for the whole of an outermost firing, queued triggers included, so two
        threads never interleave one model's transitions (the second waits; nested
        firings on the same thread re-enter). A lock lives only while some thread
        fires the model: nothing is kept per model afterwards."""
        if not self.lock or "locked" in vars(self):
            return
        inner = vars(self).get("fire") or types.MethodType(type(self).fire, self)  # type: ignore[attr-defined]
        guard = threading.Lock()
        locks: dict[int, list[Any]] = {}  # id(model) -> [RLock, threads using it]

        def fire(model: Any, trigger: Any, /, *args: Any, **kwargs: Any) -> None:
            key = id(model)
            with guard:
                entry = locks.get(key)
                if entry is None:
                    entry = locks[key] = [threading.RLock(), 0]
                entry[1] += 1
            try:
                with entry[0]:
                    inner(model, trigger, *args, **kwargs)
            finally:
                with guard:
                    entry[1] -= 1
                    if not entry[1]:
                        del locks[key]

        fire.__doc__ = inner.__doc__
        vars(self)["fire"] = fire
        vars(self)["locked"] = True

    # -- pickling ----------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """What a pickle keeps: the spec, the model class (by reference), the binding
        options (the handler included) and the observers; everything else (dispatch
        tables, the `transitions` machine) is rebuilt on load."""
        return {
            "spec": self.spec,
            "model_cls": self.model_cls,
            "options": self._options,
            "observers": self.observers,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        options = dict(state["options"])
        # the model class keeps the methods of the executor that installed them (this
        # process), or gets this one's (a fresh process)
        first = next(iter(state["spec"].triggers()), "")
        if options["model_methods"] and hasattr(state["model_cls"], first):
            options["model_methods"] = False
        type(self).__init__(self, state["spec"], state["model_cls"], **options)
        self._options = dict(state["options"])
        for observer in state["observers"]:
            self.add_observer(observer)

    def _callback(self, name: str) -> Callable[..., Any]:
        """The spec name `name` as a function of ``(model, *args, **kwargs)``."""
        if self.handler is not None:
            bound: Callable[..., Any] = getattr(self.handler, name)
            return bound

        def call(model: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(model, name)(*args, **kwargs)

        call.__qualname__ = call.__name__ = name
        return call

    # -- observers ---------------------------------------------------------------------
    def add_observer(self, observer: Observer) -> None:
        """Call `observer` for every transition taken from now on."""
        # copy-on-write: a notification in progress keeps iterating the tuple it started
        self.observers = (*self.observers, observer)
        self._observers_changed()

    def remove_observer(self, observer: Observer) -> None:
        observers = list(self.observers)
        observers.remove(observer)
        self.observers = tuple(observers)
        self._observers_changed()

    def compile_all(self, limit: int = 10_000) -> int:
        """Build whatever dispatch this executor builds lazily, for every legal
        `(configuration, trigger)` pair (at most `limit` of them), now; return how many
        pairs were built (the reference executors build nothing: 0)."""
        return 0

    def _observers_changed(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Hook for executors that specialise their dispatch on having observers."""

    def _notify(self, model: Any, source: str, trigger: str, dest: str) -> None:
        for observer in self.observers:
            observer(self, model, source, trigger, dest)

    # -- queries -----------------------------------------------------------------------
    def initialize(self, model: object, like: object | None = None) -> None:
        """Set `model`'s state slot to the initial configuration (or to `like`'s).

        Observers see it as a pseudo-transition ``("", INIT_TRIGGER, config)``.
        """
        config = self.flat.initial if like is None else self.state_of(like)
        setattr(model, self.state_attribute, config)
        self._initialize_history(model, like)
        if self.observers:
            self._notify(model, "", INIT_TRIGGER, config)

    def _initialize_history(self, model: object, like: object | None) -> None:
        """For a machine with history transitions: the model's history slot
        (``<state_attribute>_history``: each history state's recorded leaves) empty, or
        a copy of `like`'s."""
        if self.history_states:
            attr = f"{self.state_attribute}_history"
            setattr(model, attr, {} if like is None else dict(getattr(like, attr)))

    def state_of(self, model: object) -> str:
        """The model's configuration name; `UnknownStateError` if the slot holds garbage."""
        state = getattr(model, self.state_attribute, None)
        if not self.flat.is_config(state):  # False for non-strings, unhashable values
            raise UnknownStateError(self.name, state, self.flat.first_configs(13))
        assert isinstance(state, str)
        return state

    def allowed_triggers(self, model: object) -> tuple[str, ...]:
        """Triggers with a transition from the model's state (guards not evaluated)."""
        return self.flat.triggers_from(self.state_of(model))

    def is_active(self, model: object, path: str) -> bool:
        """Whether the state at dotted `path` is active for `model`."""
        if self.spec.state(path) is None:
            raise UnknownStateError(self.name, path, [s.path for s in self.spec.states()])
        return self.flat.is_active(self.state_of(model), path)

    def is_final(self, model: object) -> bool:
        return self.flat.is_final(self.state_of(model))

    # -- shared error paths ------------------------------------------------------------
    def _normalize(self, trigger: object) -> str | None:
        try:
            return self._alias.get(trigger)
        except TypeError:  # unhashable
            return None

    def _reject_unfireable(self, model: object, trigger: object) -> str | None:
        """Resolve `trigger` for a model whose fast lookup missed, or raise the right error.

        Returns the canonical trigger name when it is legal after all (an enum alias,
        or a pair whose dispatch is built on first use); None when it is a declared
        trigger with no transition here and the executor ignores those.
        """
        state = self.state_of(model)
        allowed = self.flat.triggers_from(state)
        name = self._normalize(trigger)
        if name is None:
            raise UnknownTriggerError(
                self.name, model_id(model), state, str(trigger), allowed, noun=self.noun
            )
        if name not in allowed:
            if self.ignore_invalid:
                return None
            raise IllegalTransitionError(
                self.name, model_id(model), state, name, allowed, noun=self.noun
            )
        return name

    def _refuse_awaitable(self, value: object, guard: str) -> NoReturn:
        """A sync executor's guard answered with an awaitable: close it (a coroutine
        never awaited: no RuntimeWarning, no side effect) and raise
        `AwaitableGuardError`."""
        close = getattr(value, "close", None)
        if callable(close):
            close()
        raise AwaitableGuardError(self.name, guard, value)

    def _guard_rejected(self, model: object, state: str, trigger: str, guard: str) -> None:
        """Put the source configuration back (a guard may have written the slot) and
        raise `GuardRejectedError`."""
        setattr(model, self.state_attribute, state)
        raise GuardRejectedError(self.name, model_id(model), state, trigger, guard, noun=self.noun)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.model_cls.__qualname__}>"


class Executor(ExecutorBase):
    """A sync executor; see the module docstring."""

    def fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> None:
        """Run one transition, or queue it behind the model's running one (see the
        module docstring for the contract)."""
        self._fire_marked(model, trigger, args, kwargs, None)

    def _fire_marked(
        self,
        model: Any,
        trigger: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        busy: object,
    ) -> None:
        """`fire` with the model marked by id in `_active`; `busy` is a model that a
        compiled executor's fast path marked instead (None: none), and counts as
        running too."""
        key = id(model)
        active = self._active
        if busy is model or (active and key in active):
            self._queued.setdefault(key, []).append((trigger, args, kwargs))
            return
        active.append(key)
        try:
            self._fire_one(model, trigger, args, kwargs)
            if self._queued:
                self._drain(model, key)
        finally:
            active.remove(key)
            if self._queued:
                self._queued.pop(key, None)  # what an error left queued is dropped

    def _drain(self, model: Any, key: int) -> None:
        """Run the triggers queued behind `model`'s transition, in order (each may
        queue more)."""
        queue = self._queued.get(key)
        while queue:
            trigger, args, kwargs = queue.pop(0)
            self._fire_one(model, trigger, args, kwargs)

    @abc.abstractmethod
    def _fire_one(
        self, model: Any, trigger: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Run exactly one transition now (the model is marked as running)."""

    @abc.abstractmethod
    def may_fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> bool:
        """Whether `fire` would pass the guards now (runs `prepare` and guards)."""


class AsyncExecutor(ExecutorBase):
    """An async executor: `fire` and `may_fire` are coroutines; see the module docstring."""

    awaits = True

    async def fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> None:
        """Run one transition, awaiting its guards and callbacks, or queue it behind the
        model's running one (see the module docstring for the contract)."""
        key = id(model)
        active = self._active
        if key in active:
            self._queued.setdefault(key, []).append((trigger, args, kwargs))
            return
        active.append(key)
        try:
            await self._fire_one(model, trigger, args, kwargs)
            queue = self._queued.get(key)
            while queue:
                trigger, args, kwargs = queue.pop(0)
                await self._fire_one(model, trigger, args, kwargs)
        finally:
            active.remove(key)
            self._queued.pop(key, None)  # what an error left queued is dropped

    @abc.abstractmethod
    async def _fire_one(
        self, model: Any, trigger: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Run exactly one transition now (the model is marked as running)."""

    @abc.abstractmethod
    async def may_fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> bool:
        """Whether `fire` would pass the guards now (awaits `prepare` and guards)."""
