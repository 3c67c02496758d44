"""Recording test models for any spec: every guard and callback of the spec is a method
that appends ``(name, args, kwargs)`` to ``model.log``; guards answer from
``model.guards`` (default True); the method named in ``model.raise_in`` raises `Boom`.

Misbehaviour on demand, for the differential test: the method named by a key of
``model.fire_in`` fires that trigger on the model itself through ``model.executor``
(once: the entry is consumed), logged as ``"fire <trigger>"``; the guard named by
``model.mutate_in[0]`` writes ``model.mutate_in[1]`` into the state slot first.

`recording_model_class(spec, aio=True)` makes every other method an ``async def`` that
yields to the event loop before doing the same (for the async executors);
`firing_names(cls)` says which methods can fire (async classes: the async ones).

`recording_handler_class(spec)` is the same behaviour for a handler-bound executor: the
handler's methods take the model first and record into it, so a handler-bound run and a
model-bound run of the same steps leave identical logs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from unicache_fsm.fsm.spec import MachineSpec


class Boom(Exception):
    """Raised by a test model's callback on purpose."""


class RecordingModel:
    __slots__ = (
        "executor",
        "fire_in",
        "fsm_id",
        "guards",
        "log",
        "mutate_in",
        "raise_in",
        "state",
        "state_history",
    )

    def __init__(self, fsm_id: str = "m-1") -> None:
        self.fsm_id = fsm_id
        self.log: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.guards: dict[str, bool] = {}
        self.raise_in: str | None = None
        self.executor: Any = None
        self.fire_in: dict[str, str] = {}
        self.mutate_in: tuple[str, Any] | None = None

    def __repr__(self) -> str:
        return f"RecordingModel({self.fsm_id!r})"


def _enter(model: RecordingModel, name: str, args: Any, kwargs: Any) -> str | None:
    """Log the call, apply `mutate_in`; the trigger to fire now, if any."""
    model.log.append((name, args, kwargs))
    if model.mutate_in is not None and model.mutate_in[0] == name:
        model.state = model.mutate_in[1]
    trigger = model.fire_in.pop(name, None)
    if trigger is not None:
        model.log.append((f"fire {trigger}", (), {}))
    return trigger


def _leave(model: RecordingModel, name: str, guard: bool) -> Any:
    if model.raise_in == name:
        raise Boom(name)
    if guard:
        return model.guards.get(name, True)
    return None


def _method(name: str, guard: bool, aio: bool = False) -> Callable[..., Any]:
    if aio:

        async def amethod(self: RecordingModel, *args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)
            trigger = _enter(self, name, args, kwargs)
            if trigger is not None:
                await self.executor.fire(self, trigger)
            return _leave(self, name, guard)

        amethod.__name__ = name
        return amethod

    def method(self: RecordingModel, *args: Any, **kwargs: Any) -> Any:
        trigger = _enter(self, name, args, kwargs)
        if trigger is not None:
            self.executor.fire(self, trigger)
        return _leave(self, name, guard)

    method.__name__ = name
    return method


def _async_names(spec: MachineSpec, aio: bool) -> set[str]:
    return set(sorted(spec.callback_names())[::2]) if aio else set()


def recording_model_class(spec: MachineSpec, aio: bool = False) -> type[RecordingModel]:
    """A `RecordingModel` subclass with one method per guard and callback of `spec`
    (every other one an ``async def`` when `aio`)."""
    guards = {n for t in spec.transitions for n in (*t.conditions, *t.unless)}
    asyncs = _async_names(spec, aio)
    methods = {n: _method(n, n in guards, n in asyncs) for n in spec.callback_names()}
    firing = tuple(sorted(asyncs)) if aio else tuple(sorted(methods))
    name = f"{spec.name.title()}{'Async' if aio else ''}Model"
    return type(name, (RecordingModel,), {"__slots__": (), "FIRING": firing, **methods})


def firing_names(cls: type) -> tuple[str, ...]:
    """The methods of a recording class that can fire a trigger from inside."""
    names: tuple[str, ...] = cls.FIRING  # type: ignore[attr-defined]
    return names


def _handler_method(name: str, guard: bool, aio: bool = False) -> Callable[..., Any]:
    inner = _method(name, guard, aio)
    if aio:

        async def amethod(self: object, model: RecordingModel, *args: Any, **kwargs: Any) -> Any:
            return await inner(model, *args, **kwargs)

        amethod.__name__ = name
        return amethod

    def method(self: object, model: RecordingModel, *args: Any, **kwargs: Any) -> Any:
        return inner(model, *args, **kwargs)

    method.__name__ = name
    return method


def recording_handler_class(spec: MachineSpec, aio: bool = False) -> type:
    """A handler class with one method ``(model, *args, **kwargs)`` per guard and callback
    (every other one an ``async def`` when `aio`)."""
    guards = {n for t in spec.transitions for n in (*t.conditions, *t.unless)}
    asyncs = _async_names(spec, aio)
    methods = {n: _handler_method(n, n in guards, n in asyncs) for n in spec.callback_names()}
    firing = tuple(sorted(asyncs)) if aio else tuple(sorted(methods))
    name = f"{spec.name.title()}{'Async' if aio else ''}Handler"
    return type(name, (), {"__slots__": (), "FIRING": firing, **methods})
