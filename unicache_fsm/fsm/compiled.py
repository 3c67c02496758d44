"""The compiled executor: the spec's flat table turned into straight-line Python.

For every `(configuration, trigger)` pair the spec allows, one small function is
generated from source text when the executor is built. It calls the guards and
callbacks by name in the reference order (per candidate: `prepare`, `conditions`,
`unless`; then for the winner: `before`, exits, state change, enters, `after`) and
returns ``None`` on success or the label of the guard that vetoed the last candidate.
A firing is then two dict lookups and one call, with no loops over empty callback
lists and no per-event objects. Bound to a handler, each callback is a constant of
the step (the handler's bound method, looked up once when the executor is built),
so a handler costs no more per firing than methods on the model.

Generated code only ever contains names that validation accepted as Python
identifiers and configuration names passed in as constants, so a spec cannot inject
code. The differential test in ``tests/test_fsm_differential.py`` holds this
executor to the same observable behaviour as `ReferenceExecutor`.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from types import CodeType
from typing import Any

from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.flat import FlatTransition
from unicache_fsm.fsm.spec import MachineSpec

__all__ = ["CompiledExecutor"]

_Step = Callable[[Any, tuple[Any, ...], dict[str, Any]], "str | None"]


def _call(name: str, bound: bool) -> str:
    """The call expression of spec name `name` (a handler constant, or a model method)."""
    return f"CB_{name}(model, *args, **kwargs)" if bound else f"model.{name}(*args, **kwargs)"


def _calls(names: tuple[str, ...], indent: str, bound: bool = False) -> list[str]:
    return [f"{indent}{_call(n, bound)}" for n in names]


@functools.lru_cache(maxsize=8192)
def _step_source(
    group: tuple[FlatTransition, ...], attr: str, observed: bool, bound: bool = False
) -> tuple[str, dict[str, str]]:
    """Source of one `(configuration, trigger)` step function and its constants
    (generated once per process and shared: callers copy the constants, never edit them).

    With `observed`, the step calls ``NOTIFY(model, source, trigger, dest)`` right
    after the state change. With `bound`, callbacks are the handler's (``CB_<name>``).
    """
    consts: dict[str, str] = {"SOURCE": group[0].source, "TRIGGER": group[0].trigger}
    lines = ["def step(model, args, kwargs):"]
    if any(ft.spec.guarded for ft in group):
        lines.append("    rejected = None")
    for i, ft in enumerate(group):
        t = ft.spec
        consts[f"DEST{i}"] = ft.dest
        body: list[str] = []
        guarded = bool(t.conditions or t.unless)
        ind = "        " if guarded else "    "
        body += _calls(t.prepare, ind, bound)
        for n in t.conditions:
            body += [f"{ind}if not {_call(n, bound)}:", f"{ind}    rejected = {n!r}"]
            body += [f"{ind}    break"]
        for n in t.unless:
            body += [f"{ind}if {_call(n, bound)}:", f"{ind}    rejected = 'not {n}'"]
            body += [f"{ind}    break"]
        body += _calls(t.before, ind, bound) + _calls(ft.exits, ind, bound)
        body.append(f"{ind}model.{attr} = DEST{i}")
        if observed:
            body.append(f"{ind}NOTIFY(model, SOURCE, TRIGGER, DEST{i})")
        body += _calls(ft.enters, ind, bound) + _calls(t.after, ind, bound)
        body.append(f"{ind}return None")
        if guarded:
            lines.append(f"    while True:  # candidate {i}: a block that `break` leaves")
        lines += body
        if not guarded:
            break  # later candidates are unreachable (validation forbids them anyway)
    else:
        lines.append("    return rejected")
    return "\n".join(lines) + "\n", consts


@functools.lru_cache(maxsize=8192)
def _probe_source(group: tuple[FlatTransition, ...], bound: bool = False) -> str:
    """Source of the `may_fire` probe: `prepare` and guards of each candidate."""
    lines = ["def probe(model, args, kwargs):"]
    for ft in group:
        t = ft.spec
        lines.append("    while True:")
        lines += _calls(t.prepare, "        ", bound)
        for n in t.conditions:
            lines += [f"        if not {_call(n, bound)}:", "            break"]
        for n in t.unless:
            lines += [f"        if {_call(n, bound)}:", "            break"]
        lines.append("        return True")
    lines.append("    return False")
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=4096)
def _code(source: str, filename: str) -> CodeType:
    """Compiled once per process: every executor of a spec shares the code objects."""
    return compile(source, filename, "exec")


def _compile(source: str, name: str, consts: dict[str, Any], filename: str) -> Any:
    namespace: dict[str, Any] = dict(consts)
    exec(_code(source, filename), namespace)
    return namespace[name]


class CompiledExecutor(Executor):
    """Drives models through dispatch tables of generated step functions."""

    kind = "compiled"

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
        bound = handler is not None
        self._bound = bound
        # the handler's callbacks, looked up once: constants of every generated function
        self._cbs: dict[str, Any] = (
            {f"CB_{n}": getattr(handler, n) for n in self.spec.callback_names()} if bound else {}
        )
        self._probes: dict[str, dict[str, Any]] = {c: {} for c in self.flat.configs}
        self.sources: dict[tuple[str, str], str] = {}
        for (config, trigger), group in self.flat.table.items():
            filename = f"<unicache_fsm {self.name}: {config} --{trigger}-->"
            self.sources[(config, trigger)] = _step_source(group, state_attribute, False, bound)[0]
            probe = _probe_source(group, bound)
            self._probes[config][trigger] = _compile(probe, "probe", self._cbs, filename)
        self._plain = self._build_steps(observed=False)
        self._observed: dict[str, dict[Any, _Step]] | None = None
        self._steps = self._plain

    def _build_steps(self, *, observed: bool) -> dict[str, dict[Any, _Step]]:
        steps: dict[str, dict[Any, _Step]] = {c: {} for c in self.flat.configs}
        for (config, trigger), group in self.flat.table.items():
            filename = f"<unicache_fsm {self.name}: {config} --{trigger}-->"
            src, consts = _step_source(group, self.state_attribute, observed, self._bound)
            extra: dict[str, Any] = {"NOTIFY": self._notify} if observed else {}
            steps[config][trigger] = _compile(
                src, "step", {**consts, **self._cbs, **extra}, filename
            )
        for alias, name in self._alias.items():  # enum members hash by name: own keys
            if alias is not name:
                for table in steps.values():
                    if name in table:
                        table[alias] = table[name]
        return steps

    def _observers_changed(self) -> None:
        if self.observers and self._observed is None:
            self._observed = self._build_steps(observed=True)
        self._steps = self._observed if self.observers and self._observed else self._plain

    def fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> None:
        try:
            step = self._steps[self._get_state(model)][trigger]
        except (KeyError, AttributeError, TypeError):
            name = self._reject_unfireable(model, trigger)  # raises unless an alias
            step = self._steps[self._get_state(model)][name]
        rejected = step(model, args, kwargs)
        if rejected is not None:
            state = self.state_of(model)
            self._guard_rejected(model, state, self._alias[trigger], rejected)

    def may_fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> bool:
        state = self.state_of(model)
        name = self._normalize(trigger)
        if name is None:
            self._reject_unfireable(model, trigger)  # raises UnknownTriggerError
        probe = self._probes[state].get(name) if name is not None else None
        return probe is not None and bool(probe(model, args, kwargs))
