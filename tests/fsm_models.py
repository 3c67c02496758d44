"""Recording test models for any spec: every guard and callback of the spec is a method
that appends ``(name, args, kwargs)`` to ``model.log``; guards answer from
``model.guards`` (default True); the method named in ``model.raise_in`` raises `Boom`.

`recording_handler_class(spec)` is the same behaviour for a handler-bound executor: the
handler's methods take the model first and record into it, so a handler-bound run and a
model-bound run of the same steps leave identical logs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unicache_fsm.fsm.spec import MachineSpec


class Boom(Exception):
    """Raised by a test model's callback on purpose."""


class RecordingModel:
    __slots__ = ("fsm_id", "guards", "log", "raise_in", "state")

    def __init__(self, fsm_id: str = "m-1") -> None:
        self.fsm_id = fsm_id
        self.log: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.guards: dict[str, bool] = {}
        self.raise_in: str | None = None

    def __repr__(self) -> str:
        return f"RecordingModel({self.fsm_id!r})"


def _method(name: str, guard: bool) -> Callable[..., Any]:
    def method(self: RecordingModel, *args: Any, **kwargs: Any) -> Any:
        self.log.append((name, args, kwargs))
        if self.raise_in == name:
            raise Boom(name)
        if guard:
            return self.guards.get(name, True)
        return None

    method.__name__ = name
    return method


def recording_model_class(spec: MachineSpec) -> type[RecordingModel]:
    """A `RecordingModel` subclass with one method per guard and callback of `spec`."""
    guards = {n for t in spec.transitions for n in (*t.conditions, *t.unless)}
    methods = {n: _method(n, n in guards) for n in spec.callback_names()}
    return type(f"{spec.name.title()}Model", (RecordingModel,), {"__slots__": (), **methods})


def _handler_method(name: str, guard: bool) -> Callable[..., Any]:
    def method(self: object, model: RecordingModel, *args: Any, **kwargs: Any) -> Any:
        return _method(name, guard)(model, *args, **kwargs)

    method.__name__ = name
    return method


def recording_handler_class(spec: MachineSpec) -> type:
    """A handler class with one method ``(model, *args, **kwargs)`` per guard and callback."""
    guards = {n for t in spec.transitions for n in (*t.conditions, *t.unless)}
    methods = {n: _handler_method(n, n in guards) for n in spec.callback_names()}
    return type(f"{spec.name.title()}Handler", (), {"__slots__": (), **methods})
