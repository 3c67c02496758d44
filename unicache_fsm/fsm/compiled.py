"""The compiled executors: the spec's flat table turned into straight-line Python.

For a `(configuration, trigger)` pair the spec allows, one small function is generated
from source text the first time a model fires (or probes) that trigger in that
configuration (a machine of many independent parallel regions never has its product
walked; source and code objects are made once per process and shared by every
executor of the spec, so a new executor only binds its handler's callbacks). It calls
the guards and callbacks by name in the reference order (per candidate: `prepare`,
`conditions`, `unless`; then for the winner: `before`, exits, state change, enters,
`after`) and returns ``None`` on success or the label of the guard that vetoed the
last candidate. A firing is then two dict lookups and one call, with no loops over
empty callback lists and no per-event objects. Bound to a handler, each callback is a
constant of the step (the handler's bound method, looked up once when the executor is
built), so a handler costs no more per firing than methods on the model.

With observers, the steps fire from observed tables (built when the first observer
comes) that call each observer right after the state change, in a loop inlined in the
step. When the only observer is a `TransitionCounter` (exactly that class), the step
adds its count itself, ``counter.counts[(name, source, trigger, dest)] += 1`` with the
key built once, which is all a call of that observer does; the tables are rebuilt
whenever the observers change between the two cases.

History (`TransitionSpec.history`): a candidate that exits a state some history
transition targets writes, after its exits, that state's recorded leaves (a constant
of the step: they follow from the source configuration) into the model's
``<state_attribute>_history``. A pair with a history candidate dispatches on what that
slot holds for the candidate's dest to a step generated for that restoration, computed
here from the spec (`_restored`; the reference executor restores by code of its own).

`AsyncCompiledExecutor` generates ``async def`` steps instead: each call's result is
awaited when it is awaitable, at the same place in the same order.

Generated code only ever contains names that validation accepted as Python
identifiers and configuration names passed in as constants, so a spec cannot inject
code. The differential test in ``tests/test_fsm_differential.py`` holds these
executors to the same observable behaviour as the reference executors.
"""

from __future__ import annotations

import builtins
import copy
import enum
import functools
import inspect
import itertools
import types
from collections.abc import Callable, Coroutine
from types import CodeType
from typing import Any

import attrs

from unicache_fsm.fsm.executor import AsyncExecutor, Executor, ExecutorBase, TransitionEvent
from unicache_fsm.fsm.flat import FlatTransition
from unicache_fsm.fsm.spec import MachineSpec, StateKind, StateSpec
from unicache_fsm.fsm.trace import TransitionCounter

__all__ = ["AsyncCompiledExecutor", "CompiledExecutor"]


def _ignored(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The step of a trigger an `ignore_invalid` executor ignores: nothing happens."""


async def _ignored_async(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """`_ignored` for the async executor."""


#: How many pairs `compile_all` builds at most by default.
COMPILE_ALL_LIMIT = 10_000

_Step = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]


def _call(name: str, bound: bool) -> str:
    """The call expression of spec name `name` (a handler constant, or a model method)."""
    return f"CB_{name}(model, *args, **kwargs)" if bound else f"model.{name}(*args, **kwargs)"


def _value(name: str, ind: str, bound: bool, aio: bool) -> tuple[list[str], str]:
    """Lines that compute a guard's value, and the expression that holds it.

    A sync step refuses an awaitable answer (`AwaitableGuardError`, raised by
    ``AWAITED``): a bool costs two identity tests, anything else one more call."""
    if not aio:
        return [
            f"{ind}_r = {_call(name, bound)}",
            f"{ind}if _r is not True and _r is not False and ISAWAITABLE(_r):",
            f"{ind}    AWAITED(_r, {name!r})",
        ], "_r"
    return [
        f"{ind}_r = {_call(name, bound)}",
        f"{ind}if ISAWAITABLE(_r):",
        f"{ind}    _r = await _r",
    ], "_r"


def _calls(names: tuple[str, ...], ind: str, bound: bool, aio: bool) -> list[str]:
    """Lines that call each of `names` in order (awaiting awaitable results if `aio`)."""
    if not aio:
        return [f"{ind}{_call(n, bound)}" for n in names]
    out: list[str] = []
    for n in names:
        out += [f"{ind}_r = {_call(n, bound)}", f"{ind}if ISAWAITABLE(_r):", f"{ind}    await _r"]
    return out


def _guard(name: str, veto_if: bool, ind: str, bound: bool, aio: bool) -> list[str]:
    """Lines that evaluate one guard and leave the candidate's block when it vetoes."""
    lines, value = _value(name, ind, bound, aio)
    test = value if veto_if else f"not {value}"
    return [*lines, f"{ind}if {test}:"]


#: Per candidate of a step: the ``{history state: leaves beneath it}`` its exit records.
_Records = tuple[tuple[tuple[str, tuple[str, ...]], ...], ...]


@functools.lru_cache(maxsize=64)
def _document_order(spec: MachineSpec) -> dict[str, int]:
    """Each state path's rank in document order (the root first)."""
    return {"": -1, **{s.path: i for i, s in enumerate(spec.states())}}


def _beneath(path: str, state: str) -> bool:
    return path.startswith(state + ".")


def _records(
    history_states: tuple[str, ...], ft: FlatTransition
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What taking `ft` records: for each history state it exits, the leaves of its
    source configuration beneath that state (all a deep restore needs; a shallow one
    reads the direct children off them)."""
    leaves = ft.source.split(",")
    return tuple(
        (h, tuple(x for x in leaves if _beneath(x, h)))
        for h in history_states
        if h in ft.exited_states
    )


def _default_completion(state: StateSpec) -> list[StateSpec]:
    """`state` and what its default entry enters beneath it."""
    out = [state]
    if state.kind is StateKind.COMPOUND and state.initial is not None:
        child = state.child(state.initial)
        assert child is not None  # validation
        out += _default_completion(child)
    elif state.kind is StateKind.PARALLEL:
        for child in state.children:
            out += _default_completion(child)
    return out


def _restored(
    spec: MachineSpec, ft: FlatTransition, leaves: tuple[str, ...] | None
) -> FlatTransition:
    """`ft` (a history transition, as `fsm.flat` resolved it: the dest entered by
    default) entering its dest through the recorded `leaves` instead (None: never
    exited yet, so the default entry stands)."""
    target, mode = ft.spec.dest, ft.spec.history
    if leaves is None:
        return ft
    inside: set[str] = set()
    if mode == "deep":
        for leaf in leaves:  # the leaf and its ancestors strictly beneath the target
            path = leaf
            while path != target:
                inside.add(path)
                path = path.rpartition(".")[0]
    else:  # shallow: the direct children holding the leaves, each entered by default
        depth = target.count(".") + 1
        for leaf in leaves:
            child = spec.state(".".join(leaf.split(".")[: depth + 1]))
            assert child is not None
            inside.update(s.path for s in _default_completion(child))
    order = _document_order(spec)
    entered = sorted(
        [p for p in ft.entered_states if not _beneath(p, target)] + list(inside),
        key=order.__getitem__,
    )
    atomic = [p for p in inside if not spec.state(p).children]  # type: ignore[union-attr]
    dest = sorted(
        [x for x in ft.dest.split(",") if not _beneath(x, target)] + atomic,
        key=order.__getitem__,
    )
    enters = tuple(cb for p in entered for cb in spec.state(p).on_enter)  # type: ignore[union-attr]
    return attrs.evolve(ft, dest=",".join(dest), enters=enters, entered_states=tuple(entered))


@functools.lru_cache(maxsize=8192)
def _step_source(
    group: tuple[FlatTransition, ...],
    attr: str,
    observed: str,
    bound: bool = False,
    aio: bool = False,
    events: bool = False,
    records: _Records = (),
) -> tuple[str, dict[str, Any]]:
    """Source of one `(configuration, trigger)` step function and its constants
    (generated once per process and shared: callers copy the constants, never edit them).

    With `observed` ``"count"``, the step adds one to ``COUNTER.counts[KEY<i>]`` (the
    only observer, a `TransitionCounter`, and the key it would count) right after the
    state change; with any other non-empty `observed` it calls every observer of ``EX``
    (the executor), ``observer(EX, model, source, trigger, dest)``, right after the
    state change: the loop is inlined (no call to `ExecutorBase._notify` per firing)
    and reads ``EX.observers`` at each firing, so the copy-on-write tuple of observers
    keeps its meaning (a change during a notification takes effect from the next one).
    With `bound`, callbacks are the handler's (``CB_<name>``).
    With `aio`, the step is a coroutine function awaiting awaitable results.
    With `events`, every guard and callback of candidate ``i`` gets the keyword
    argument ``event=EVENT<i>`` (its `TransitionEvent`, a constant).
    With `records` (per candidate, see `_records`), a candidate that exits history
    states writes them into ``model.<attr>_history`` after the exits, before the state
    change.
    """
    consts: dict[str, Any] = {"SOURCE": group[0].source, "TRIGGER": group[0].trigger}
    lines = [f"{'async ' if aio else ''}def step(model, args, kwargs):"]
    if any(ft.spec.guarded for ft in group):
        lines.append("    rejected = None")
    for i, ft in enumerate(group):
        t = ft.spec
        consts[f"DEST{i}"] = ft.dest
        body: list[str] = []
        guarded = bool(t.conditions or t.unless)
        ind = "        " if guarded else "    "
        body += _calls(t.prepare, ind, bound, aio)
        for n in t.conditions:
            body += _guard(n, False, ind, bound, aio)
            body += [f"{ind}    rejected = {n!r}", f"{ind}    break"]
        for n in t.unless:
            body += _guard(n, True, ind, bound, aio)
            body += [f"{ind}    rejected = 'not {n}'", f"{ind}    break"]
        body += _calls(t.before, ind, bound, aio) + _calls(ft.exits, ind, bound, aio)
        if records and records[i]:
            consts[f"RECORD{i}"] = dict(records[i])
            body.append(f"{ind}model.{attr}_history.update(RECORD{i})")
        body.append(f"{ind}model.{attr} = DEST{i}")
        if observed == "count":
            body.append(f"{ind}COUNTER.counts[KEY{i}] += 1")
        elif observed:
            body += [
                f"{ind}for _observer in EX.observers:",
                f"{ind}    _observer(EX, model, SOURCE, TRIGGER, DEST{i})",
            ]
        body += _calls(ft.enters, ind, bound, aio) + _calls(t.after, ind, bound, aio)
        body.append(f"{ind}return None")
        if events:
            consts[f"EVENT{i}"] = TransitionEvent(ft.trigger, ft.source, ft.dest)
            body = [f"{ind}_kw = {{**kwargs, 'event': EVENT{i}}}", *_with_event(body)]
        if guarded:
            lines.append(f"    while True:  # candidate {i}: a block that `break` leaves")
        lines += body
        if not guarded:
            break  # later candidates are unreachable (validation forbids them anyway)
    else:
        lines.append("    return rejected")
    return "\n".join(lines) + "\n", consts


def _with_event(lines: list[str]) -> list[str]:
    """`lines` with every guard and callback call passed ``_kw`` (kwargs + event)."""
    return [line.replace("**kwargs)", "**_kw)") for line in lines]


@functools.lru_cache(maxsize=8192)
def _probe_source(
    group: tuple[FlatTransition, ...], bound: bool = False, aio: bool = False, events: bool = False
) -> tuple[str, dict[str, Any]]:
    """Source of the `may_fire` probe: `prepare` and guards of each candidate (with
    `events`, as in `_step_source`), and its constants."""
    lines = [f"{'async ' if aio else ''}def probe(model, args, kwargs):"]
    consts: dict[str, Any] = {}
    ind = "        "
    for i, ft in enumerate(group):
        t = ft.spec
        lines.append("    while True:")
        body = _calls(t.prepare, ind, bound, aio)
        for n in t.conditions:
            body += [*_guard(n, False, ind, bound, aio), f"{ind}    break"]
        for n in t.unless:
            body += [*_guard(n, True, ind, bound, aio), f"{ind}    break"]
        if events:
            consts[f"EVENT{i}"] = TransitionEvent(ft.trigger, ft.source, ft.dest)
            body = [f"{ind}_kw = {{**kwargs, 'event': EVENT{i}}}", *_with_event(body)]
        lines += [*body, f"{ind}return True"]
    lines.append("    return False")
    return "\n".join(lines) + "\n", consts


@functools.lru_cache(maxsize=4096)
def _code(source: str) -> CodeType:
    """The code of the one function `source` defines, compiled once per process per
    source text: every step of the same shape (a ring of ten thousand callback-free
    states has one) shares it, whatever its pair, machine or executor."""
    module = compile(source, "<unicache_fsm step>", "exec")
    return next(c for c in module.co_consts if isinstance(c, CodeType))


def _compile(source: str, consts: dict[str, Any], filename: str) -> Any:
    """The function `source` defines, with `consts` as its globals; its code names
    `filename` (the pair) in tracebacks."""
    namespace: dict[str, Any] = {"__builtins__": builtins, **consts}
    code = _code(source)
    return types.FunctionType(code.replace(co_filename=filename), namespace, code.co_name)


class _CompiledDispatch(ExecutorBase):
    """Dispatch tables of generated steps, filled on first use; see the module docstring."""

    #: Whether the generated steps and probes are coroutine functions.
    _aio = False

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
        bound = handler is not None
        self._bound = bound
        # constants of every generated function: the handler's callbacks, looked up once
        self._consts: dict[str, Any] = (
            {f"CB_{n}": getattr(handler, n) for n in self.spec.callback_names()} if bound else {}
        )
        self._consts.update(self._helpers())
        # dispatch tables, filled on first use of each (configuration, trigger): an
        # executor costs nothing per pair it never fires (a system builds several, and a
        # fuzzing run builds a system per example)
        self._probes: dict[str, dict[str, Any]] = {}
        self.sources: dict[tuple[str, str], str] = {}
        self._plain: dict[str, dict[Any, _Step]] = {}
        self._observed: dict[str, dict[Any, _Step]] | None = None
        # what the observed tables were built for: "count" (one TransitionCounter,
        # counted inline) or "loop" (any other observers, called in a loop)
        self._observed_for = ""
        self._observed_counter: TransitionCounter | None = None
        self._steps = self._plain
        # trigger name -> its enum members (each a key of its own in the tables)
        self._enum_aliases: dict[str, tuple[Any, ...]] = {}
        for alias, name in self._alias.items():
            if alias is not name:
                self._enum_aliases[name] = (*self._enum_aliases.get(name, ()), alias)
        self._install_fire()
        self._install_lock()

    def _install_fire(self) -> None:
        """Hook: an executor that generates its own `fire` puts it in the instance."""

    def _helpers(self) -> dict[str, Any]:
        """Constants every generated function may use besides the callbacks."""
        return {"ISAWAITABLE": inspect.isawaitable, "AWAITED": self._refuse_awaitable}

    def _compile_step(
        self, steps: dict[str, dict[Any, _Step]], config: str, trigger: str, *, observed: bool
    ) -> _Step:
        """Compile the step of one legal `(config, trigger)` into `steps`: only that pair
        (its probe waits for a `may_fire`; other triggers wait for their first use)."""
        group = self.flat.group(config, trigger)
        history = self.history_states
        records = tuple(_records(history, ft) for ft in group) if history else ()
        step: _Step
        if any(ft.spec.history for ft in group):
            step = self._by_restoration(
                group, records, lambda g: self._build_step(g, records, observed=observed)
            )
        else:
            step = self._build_step(group, records, observed=observed)
        table = steps.setdefault(config, {})
        table[trigger] = step
        for alias in self._enum_aliases.get(trigger, ()):  # enum members hash by name
            table[alias] = step
        if (config, trigger) not in self.sources:
            self.sources[(config, trigger)] = _step_source(
                group, self.state_attribute, "", self._bound, self._aio, self.event_data, records
            )[0]
        return step

    def _by_restoration(
        self,
        group: tuple[FlatTransition, ...],
        records: _Records,
        build: Callable[[tuple[FlatTransition, ...]], _Step],
    ) -> _Step:
        """The step (or probe) of a pair with history candidates: it picks, by what the
        model's history holds for their dests (or what the candidate's own exit records
        there), the one `build` made for that restoration (on first use, then kept)."""
        spec, history_attr = self.spec, f"{self.state_attribute}_history"
        targets = [
            (i, ft.spec.dest, dict(records[i])) for i, ft in enumerate(group) if ft.spec.history
        ]
        variants: dict[tuple[Any, ...], _Step] = {}

        def step(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            memory = getattr(model, history_attr)
            key = tuple(own.get(dest, memory.get(dest)) for _i, dest, own in targets)
            found = variants.get(key)
            if found is None:
                restored = list(group)
                for (i, _dest, _own), leaves in zip(targets, key, strict=True):
                    restored[i] = _restored(spec, group[i], leaves)
                found = variants[key] = build(tuple(restored))
            return found(model, args, kwargs)

        return step

    def _build_step(
        self, group: tuple[FlatTransition, ...], records: _Records, *, observed: bool
    ) -> _Step:
        """The generated step of one group of candidates (see `_step_source`)."""
        config, trigger = group[0].source, group[0].trigger
        filename = f"<unicache_fsm {self.name}: {config} --{trigger}-->"
        attr, bound, aio = self.state_attribute, self._bound, self._aio
        mode = self._observed_for if observed else ""
        src, consts = _step_source(group, attr, mode, bound, aio, self.event_data, records)
        extra: dict[str, Any] = {"EX": self} if observed else {}
        if mode == "count":  # one key per candidate, as the counter would build it
            extra["COUNTER"] = self._observed_counter
            for i, ft in enumerate(group):
                extra[f"KEY{i}"] = (self.name, ft.source, ft.trigger, ft.dest)
        step: _Step = _compile(src, {**consts, **self._consts, **extra}, filename)
        return step

    def _compile_probe(self, config: str, trigger: str) -> Any:
        """Compile the `may_fire` probe of one legal `(config, trigger)`."""
        group = self.flat.group(config, trigger)
        filename = f"<unicache_fsm {self.name}: may {config} --{trigger}-->"

        def build(group: tuple[FlatTransition, ...]) -> Any:
            src, consts = _probe_source(group, self._bound, self._aio, self.event_data)
            return _compile(src, {**consts, **self._consts}, filename)

        if self.event_data and any(ft.spec.history for ft in group):  # events name the dest
            records = tuple(_records(self.history_states, ft) for ft in group)
            probe = self._by_restoration(group, records, build)
        else:
            probe = build(group)
        self._probes.setdefault(config, {})[trigger] = probe
        return probe

    def compile_all(self, limit: int = COMPILE_ALL_LIMIT) -> int:
        """Build the step of every legal `(configuration, trigger)` pair now, into
        the tables `fire` dispatches through (with observers: the observed ones); return
        how many were built. Nothing fires, no callback runs. A caller that knows it
        will fire most pairs (a simulation, before its clock starts) pays compilation
        up front instead of at each pair's first use.

        `limit` bounds the pairs looked at, in breadth-first order of their
        configurations, so a machine of many independent regions (3**20
        configurations for 20 regions of 3 states) is never walked whole: pairs past
        the bound are compiled at their first use, as always."""
        built = 0
        observed = self._steps is self._observed
        flat = self.flat
        pairs = (
            iter(flat.table)
            if flat.enumerated
            else ((c, t) for c in flat.iter_configs() for t in flat.triggers_from(c))
        )
        for config, trigger in itertools.islice(pairs, max(limit, 0)):
            if trigger not in self._steps.get(config, {}):
                self._compile_step(self._steps, config, trigger, observed=observed)
                built += 1
        return built

    # attributes a copy shares (immutable) or starts afresh (they hold the bound callbacks)
    _SHARED = frozenset(
        {"spec", "flat", "model_cls", "_get_state", "_triggers", "_alias", "_enum_aliases"}
    )
    _FRESH = frozenset(
        {
            "_consts",
            "_probes",
            "sources",
            "_plain",
            "_observed",
            "_observed_for",
            "_observed_counter",
            "_steps",
        }
    )

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy bound to the deep copy of the handler (``copy.deepcopy`` of whatever
        holds the executor, e.g. a whole system snapshotted by a search).

        The spec and its flat table are shared; observers are shared callables; the
        dispatch tables start empty and fill on first use again, because every generated
        step holds the original handler's bound methods as constants.
        """
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            if name in self._SHARED:
                setattr(new, name, value)
            elif name == "observers":
                new.observers = tuple(value)
            elif name == "_active":
                new._active = []
            elif name == "_queued":
                new._queued = {}
            elif name not in self._FRESH:
                setattr(new, name, copy.deepcopy(value, memo))
        handler = new.handler
        # the same callback names as the original's (its constants), bound to the copy
        new._consts = (
            {k: getattr(handler, k[3:]) for k in self._consts if k.startswith("CB_")}
            if new._bound
            else {}
        )
        new._consts.update(new._helpers())
        new._probes, new.sources, new._plain, new._observed = {}, {}, {}, None
        new._observed_for, new._observed_counter = "", None
        new._steps = new._plain
        new._observers_changed()
        vars(new).pop("fire", None)  # the original's generated fire: bound to it
        vars(new).pop("_fast_fire", None)
        vars(new).pop("locked", None)
        new._install_fire()
        new._install_lock()
        return new

    def _observers_changed(self) -> None:
        observers = self.observers
        if not observers:
            self._steps = self._plain
            return
        only = observers[0] if len(observers) == 1 else None
        counter = only if type(only) is TransitionCounter else None
        mode = "loop" if counter is None else "count"
        if (
            self._observed is None
            or mode != self._observed_for
            or counter is not self._observed_counter
        ):
            # (re)build the observed tables, for every pair built so far: a counting
            # step holds its counter, a looping one reads the observers at each firing
            pairs = {
                (config, trigger): None
                for tables in (self._plain, self._observed or {})
                for config, table in tables.items()
                for trigger in table
                if type(trigger) is str  # not enum aliases
            }
            self._observed_for, self._observed_counter = mode, counter
            observed: dict[str, dict[Any, _Step]] = {}
            self._observed = observed
            for config, trigger in pairs:
                self._compile_step(observed, config, trigger, observed=True)
        self._steps = self._observed

    def initialize(self, model: object, like: object | None = None) -> None:
        """`ExecutorBase.initialize`; a lone `TransitionCounter` (which counts no
        initialization) is not called for it."""
        if like is None and self._steps is self._observed and self._observed_for == "count":
            setattr(model, self.state_attribute, self.flat.initial)
            self._initialize_history(model, like)
            return
        super().initialize(model, like)

    def _lookup(self, model: Any, trigger: Any) -> tuple[str, _Step]:
        """The model's configuration and the step of `trigger` there (compiled now if
        it is legal but not built yet); raises the error of an unfireable trigger."""
        try:
            state: str = self._get_state(model)
            return state, self._steps[state][trigger]
        except (KeyError, AttributeError, TypeError):
            name = self._reject_unfireable(model, trigger)  # raises unless legal after all
            state = self._get_state(model)
            if name is None:  # ignored (`ignore_invalid`): a step that does nothing
                return state, _ignored_async if self._aio else _ignored
            step = self._steps.get(state, {}).get(name) or self._compile_step(
                self._steps, state, name, observed=self._steps is self._observed
            )
            return state, step

    def _probe(self, model: Any, trigger: Any) -> Any:
        """The `may_fire` probe of `trigger` in the model's state (None: not legal)."""
        state = self.state_of(model)
        name = self._normalize(trigger)
        if name is None:
            self._reject_unfireable(model, trigger)  # raises UnknownTriggerError
        if name is None or name not in self.flat.triggers_from(state):
            return None
        probe = self._probes.get(state, {}).get(name)
        return probe if probe is not None else self._compile_probe(state, name)


# The body of `CompiledExecutor.fire`, generated per executor (STATE_SLOT: its state
# attribute, a validated identifier): one attribute read, two dict lookups and the step
# call, in one frame, with the cheapest run-to-completion mark there is.
#
# Why the mark is a global: marking the model by id in the `_active` list (what the
# other executors do) costs a call of `id`, an append and a remove per firing, about a
# quarter of a firing of the load lifecycle (issue 35 measured 1.23x hand-written
# with it, 1.07x without). Here the common case (no firing of this executor running,
# in any thread) stores the model in the function's own global BUSY instead: a load,
# a test and two stores. Any other case (BUSY set, or a model marked in `_active`)
# takes `_fire_marked`, which queues the trigger when the model is BUSY or marked and
# otherwise marks it in `_active` as always: the same contract, checked by the
# run-to-completion tests. The test of BUSY and its store have no call and no backward
# jump between them, the only places CPython hands the GIL to another thread, so two
# threads cannot both take the fast path.
_FIRE_SOURCE = """\
def fire(model, trigger, /, *args, **kwargs):
    global BUSY
    if BUSY is not None or ACTIVE:
        return SLOW(model, trigger, args, kwargs, BUSY)
    BUSY = model
    try:
        try:
            state = model.STATE_SLOT
            step = EX._steps[state][trigger]
        except (KeyError, AttributeError, TypeError):
            state, step = EX._lookup(model, trigger)
        rejected = step(model, args, kwargs)
        if rejected is not None:
            EX._guard_rejected(model, state, EX._alias[trigger], rejected)
        if QUEUED:
            EX._drain(model, ID(model))
    finally:
        BUSY = None
        if QUEUED:
            QUEUED.pop(ID(model), None)
    return None
"""


class CompiledExecutor(_CompiledDispatch, Executor):
    """Drives models through dispatch tables of generated step functions."""

    kind = "compiled"

    def fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> None:
        """`Executor.fire` with the first transition's dispatch inlined: one frame per
        firing on the common path (a built step, no trigger queued), the same contract
        (run-to-completion, errors, observers).

        Each executor fires through a function generated for it (`_install_fire`, an
        instance attribute that shadows this method), with the state slot read as a
        plain attribute and its tables as constants; this method is what it does."""
        self._fast_fire(model, trigger, *args, **kwargs)

    def _install_fire(self) -> None:
        """Generate this executor's `fire` (`_fast_fire`) and put it in the instance as
        `fire` (see `fire`), unless a subclass overrides `fire` (its `super().fire`
        then runs the generated one)."""
        consts = {
            "EX": self,
            "ID": id,
            "ACTIVE": self._active,
            "QUEUED": self._queued,
            "SLOW": self._fire_marked,
            "BUSY": None,
        }
        source = _FIRE_SOURCE.replace("STATE_SLOT", self.state_attribute)
        fire: Callable[..., None] = _compile(source, consts, f"<unicache_fsm {self.name}: fire>")
        fire.__doc__ = CompiledExecutor.fire.__doc__
        self._fast_fire = fire
        if type(self).fire is CompiledExecutor.fire:
            vars(self)["fire"] = fire

    def _fire_one(
        self, model: Any, trigger: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        state, step = self._lookup(model, trigger)
        rejected = step(model, args, kwargs)
        if rejected is not None:
            self._guard_rejected(model, state, self._alias[trigger], rejected)

    def may_fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> bool:
        probe = self._probe(model, trigger)
        return probe is not None and bool(probe(model, args, kwargs))


class AsyncCompiledExecutor(_CompiledDispatch, AsyncExecutor):
    """`CompiledExecutor` with coroutine steps that await awaitable results."""

    kind = "async-compiled"
    _aio = True

    async def _fire_one(
        self, model: Any, trigger: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        state, step = self._lookup(model, trigger)
        running: Coroutine[Any, Any, str | None] = step(model, args, kwargs)
        rejected = await running
        if rejected is not None:
            self._guard_rejected(model, state, self._alias[trigger], rejected)

    async def may_fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> bool:
        probe = self._probe(model, trigger)
        return probe is not None and bool(await probe(model, args, kwargs))
