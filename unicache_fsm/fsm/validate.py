"""Validation of specs and of their binding to a model class.

Primitives:

- `structural_problems(spec)` — everything wrong with a spec on its own: bad names
  (a machine name is a file name too, so it can never address another directory),
  an `initial` that is not a child, unknown states, `requires` that name no parallel
  region, unreachable states, non-final dead ends, transitions out of final states,
  ambiguous unguarded transitions, transitions across parallel regions.
- `binding_problems(spec, model_cls, state_attribute, triggers, states=, handler=)` —
  guard and callback names the model class (or the handler, when one is bound) lacks,
  a missing state slot, a trigger enum or a state enum that disagrees with the spec.
- `check_binding(...)` — raise `InvalidSpecError` when `binding_problems` finds any.

Each problem lists *all* offending names of its kind, so one run tells the whole story.
The loader runs `structural_problems`; the executors run `check_binding` when bound.
"""

from __future__ import annotations

import enum
import functools
import inspect
import keyword
import re

from unicache_fsm.fsm.errors import InvalidSpecError, SpecProblem
from unicache_fsm.fsm.flat import FlatMachine, flatten
from unicache_fsm.fsm.spec import (
    ANY_STATE,
    HISTORY_KINDS,
    MAX_DEPTH,
    MachineSpec,
    StateKind,
    StateSpec,
    TransitionSpec,
)

__all__ = ["binding_problems", "check_binding", "check_spec", "structural_problems"]

#: The most states a spec may declare (a bound on the work validation does).
_MAX_STATES = 100_000

# Patterns are matched with `fullmatch` (``$`` would accept a trailing newline).
_STATE_NAME = re.compile(r"[a-z][a-z0-9_]*")
# A machine's name becomes a file name (`diagram -o DIR` writes DIR/<machine>.svg):
# no separators, no dots, nothing a shell or a file system reads specially.
_MACHINE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _bad_identifiers(names: list[str]) -> list[str]:
    return [n for n in names if not _IDENTIFIER.fullmatch(n) or keyword.iskeyword(n)]


def _bad_callbacks(names: list[str]) -> list[str]:
    """Callback names that are not identifiers, or name Python's own machinery: a
    ``__dunder__`` (``__init__`` would re-run the constructor) or a name-mangled
    ``__private`` one."""
    return [n for n in names if n in _bad_identifiers([n]) or n.startswith("__")]


def _shape_problems(spec: object) -> list[SpecProblem]:
    """What makes `spec` not a well-formed `MachineSpec` at all: wrong types, a state
    tree whose paths, kinds and initial children disagree, repeated transition indexes.

    The loader never builds such a spec; a `MachineSpec` written in Python can.
    """
    if not isinstance(spec, MachineSpec):
        return [SpecProblem("not a MachineSpec", [type(spec).__name__])]
    out: dict[str, list[str]] = {}

    def add(kind: str, name: str) -> None:
        out.setdefault(kind, []).append(name)

    for field in ("name", "noun", "description", "source"):
        if not isinstance(getattr(spec, field), str):
            add("field of the wrong type", f"machine.{field} (expected a string)")
    root = spec.root
    if not isinstance(root, StateSpec) or root.path != "" or root.name != "":
        add("field of the wrong type", "machine.root (expected the StateSpec with path '')")
        return [SpecProblem(k, v) for k, v in out.items()]
    if root.kind is StateKind.ATOMIC:
        add("inconsistent state tree", "machine.root (atomic: it needs children)")
    todo = [root]
    seen = 0
    while todo:
        state = todo.pop()
        seen += 1
        where = state.path or "machine"
        if seen > _MAX_STATES:
            add("inconsistent state tree", f"more than {_MAX_STATES} states")
            break
        if state.path.count(".") >= MAX_DEPTH:
            add("inconsistent state tree", f"{where} (nested deeper than {MAX_DEPTH} levels)")
            continue
        kind: object = state.kind  # (typed, but a Python caller may pass anything)
        if not isinstance(kind, StateKind):
            add("field of the wrong type", f"{where}.kind (expected a StateKind)")
            continue
        for field in ("initial",):
            value = getattr(state, field)
            if value is not None and not isinstance(value, str):
                add("field of the wrong type", f"{where}.{field} (expected a string or None)")
        for field in ("on_enter", "on_exit"):
            if not all(isinstance(n, str) for n in getattr(state, field)):
                add("field of the wrong type", f"{where}.{field} (expected names)")
        final: object = state.final
        if not isinstance(final, bool):
            add("field of the wrong type", f"{where}.final (expected a bool)")
        names = []
        children: tuple[object, ...] = state.children
        for child in children:
            if not isinstance(child, StateSpec):
                add("field of the wrong type", f"{where}.children (expected StateSpecs)")
                continue
            names.append(child.name)
            expected = f"{state.path}.{child.name}" if state.path else child.name
            if not isinstance(child.name, str) or child.path != expected:
                add("inconsistent state tree", f"{child.path!r} (expected path {expected!r})")
            else:
                todo.append(child)
        if len(set(names)) != len(names):
            add("inconsistent state tree", f"{where} (two children with one name)")
        if state.kind is StateKind.ATOMIC and state.children:
            add("inconsistent state tree", f"{where} (atomic, with children)")
        if state.kind is StateKind.COMPOUND and state is not root and not state.children:
            add("inconsistent state tree", f"{where} (compound, without children)")
        if state.kind is StateKind.COMPOUND and state.children and state.initial is None:
            add("inconsistent state tree", f"{where} (compound, without initial)")
    indexes: set[int] = set()
    transitions: tuple[object, ...] = spec.transitions
    for i, t in enumerate(transitions):
        if not isinstance(t, TransitionSpec):
            add("field of the wrong type", f"transitions[{i}] (expected a TransitionSpec)")
            continue
        for field in ("trigger", "dest", "description", "history"):
            if not isinstance(getattr(t, field), str):
                add("field of the wrong type", f"transitions[{i}].{field} (expected a string)")
        for field in ("sources", "conditions", "unless", "prepare", "before", "after", "requires"):
            if not all(isinstance(n, str) for n in getattr(t, field)):
                add("field of the wrong type", f"transitions[{i}].{field} (expected names)")
        if not t.sources:
            add("field of the wrong type", f"transitions[{i}].sources (empty)")
        internal: object = t.internal
        if not isinstance(internal, bool):
            add("field of the wrong type", f"transitions[{i}].internal (expected a bool)")
        if not isinstance(t.index, int) or t.index in indexes:
            add("inconsistent transition index", f"transitions[{i}] (index {t.index!r})")
        indexes.add(t.index)
    return [SpecProblem(k, v) for k, v in out.items()]


def structural_problems(spec: MachineSpec, flat: FlatMachine | None = None) -> list[SpecProblem]:
    """Every structural problem of `spec` (empty when it is sound)."""
    problems = _shape_problems(spec)
    if problems:  # not a well-formed spec: nothing below could read it
        return problems

    def add(kind: str, names: list[str]) -> None:
        if names:
            problems.append(SpecProblem(kind, sorted(dict.fromkeys(names))))

    states = list(spec.states())
    add("invalid machine name", [spec.name] if not _MACHINE_NAME.fullmatch(spec.name) else [])
    add("invalid state name", [s.path for s in states if not _STATE_NAME.fullmatch(s.name)])
    add(
        "initial that is not a child",
        [
            f"{s.path or 'machine'} (initial {s.initial!r})"
            for s in [spec.root, *states]
            if s.initial is not None
            and s.kind is not StateKind.ATOMIC
            and ("." in s.initial or s.child(s.initial) is None)
        ],
    )
    add(
        "parallel state without regions",
        [
            s.path or "machine"
            for s in [spec.root, *states]
            if s.kind is StateKind.PARALLEL and not s.children
        ],
    )
    add("invalid trigger name", _bad_identifiers([t.trigger for t in spec.transitions]))
    add("invalid callback name", _bad_callbacks(list(spec.callback_names())))
    add(
        "final state with children",
        [s.path for s in states if s.final and s.kind is not StateKind.ATOMIC],
    )
    add(
        "initial on a state without children",
        [s.path for s in states if s.kind is StateKind.ATOMIC and s.initial is not None],
    )
    add(
        "parallel state with a non-compound region",
        [
            c.path
            for s in [spec.root, *states]
            if s.kind is StateKind.PARALLEL
            for c in s.children
            if c.kind is StateKind.ATOMIC
        ],
    )
    add(
        "requires outside a parallel machine",
        [
            t.label()
            for t in spec.transitions
            if t.requires and spec.root.kind is not StateKind.PARALLEL
        ],
    )
    add(
        "internal transition that leaves its source",
        [t.label() for t in spec.transitions if t.internal and set(t.sources) != {t.dest}],
    )
    add(
        "invalid history",
        [
            f"{t.label()} (history {t.history!r}; allowed: {', '.join(HISTORY_KINDS)})"
            for t in spec.transitions
            if t.history and t.history not in HISTORY_KINDS
        ],
    )
    add(
        "history transition into a state without children",
        [
            t.label()
            for t in spec.transitions
            if t.history and (dest := spec.state(t.dest)) is not None and not dest.children
        ],
    )
    add(
        "internal history transition",
        [t.label() for t in spec.transitions if t.history and t.internal],
    )
    add(
        "'*' mixed with other sources",
        [t.label() for t in spec.transitions if ANY_STATE in t.sources and len(t.sources) > 1],
    )
    if problems:  # names are unusable; the graph checks below would only add noise
        return problems

    flat = flat if flat is not None else flatten(spec)
    add("unknown state", list(flat.unknown_states))
    if any(p.kind == "unknown state" for p in problems):
        return problems
    add("requires naming the transition's own region", _own_region_requires(spec))

    reachable = flat.reachable_states()
    add("unreachable state", [s.path for s in states if s.path not in reachable])
    add("non-final state with no outgoing transition", list(flat.dead_ends()))
    add("transition out of final state", list(flat.out_of_final))
    add("transition across parallel regions", list(flat.cross_region))

    ambiguous = []
    for config, trigger, group in flat.candidate_groups():
        for earlier in group[:-1]:
            if not earlier.spec.guarded:
                shadow = f"#{earlier.spec.index} unguarded"
                ambiguous.append(f"{config} --{trigger}--> ({len(group)} transitions, {shadow})")
                break
    add("ambiguous transitions without guards", ambiguous)
    return problems


def _own_region_requires(spec: MachineSpec) -> list[str]:
    """Transitions whose `requires` names a state that is not in a region parallel to
    their source: such a state is either implied by the source (always active with it)
    or exclusive with it (never active with it), so the transition would always or
    never exist — and it is drawn all the same."""

    def parallel_to(a: str, b: str) -> bool:
        if a == b or a.startswith(b + ".") or b.startswith(a + "."):
            return False
        pa, pb = a.split("."), b.split(".")
        common = 0
        while pa[common] == pb[common]:
            common += 1
        parent = spec.state(".".join(pa[:common])) if common else spec.root
        return parent is not None and parent.kind is StateKind.PARALLEL

    out = []
    for t in spec.transitions:
        sources = [t.dest] if ANY_STATE in t.sources else list(t.sources)
        culprits = [r for r in t.requires if not all(parallel_to(r, s) for s in sources)]
        if culprits:
            out.append(f"{t.label()} (requires {', '.join(culprits)})")
    return out


@functools.lru_cache(maxsize=256)
def _cached_problems(spec: MachineSpec) -> tuple[SpecProblem, ...]:
    return tuple(structural_problems(spec))


def check_spec(spec: MachineSpec) -> None:
    """Raise `InvalidSpecError` listing every structural problem of `spec`.

    What the loader checks of a spec file, for a spec however it was made (a
    `MachineSpec` written in Python included); the answer is kept per spec.
    """
    try:
        problems: tuple[SpecProblem, ...] | list[SpecProblem] = _cached_problems(spec)
    except TypeError:  # unhashable: a field holds a list or a dict; name it
        problems = structural_problems(spec)
    if problems:
        name = getattr(spec, "name", "?")
        source = getattr(spec, "source", "")
        raise InvalidSpecError(
            name if isinstance(name, str) else repr(name),
            source if isinstance(source, str) else repr(source),
            problems,
        )


def _is_coroutine_function(fn: object) -> bool:
    """Whether `fn` is a coroutine function, also behind ``functools.wraps`` wrappers."""
    if inspect.iscoroutinefunction(fn):
        return True
    try:
        return inspect.iscoroutinefunction(inspect.unwrap(fn))  # type: ignore[arg-type]
    except ValueError:  # a __wrapped__ cycle
        return False


def _enum_drift(
    problems: list[SpecProblem], members: type[enum.Enum], declared: set[str], what: str
) -> None:
    values = {str(m.value) for m in members}
    if values - declared:
        problems.append(
            SpecProblem(f"{members.__name__} members not in the spec", sorted(values - declared))
        )
    if declared - values:
        problems.append(
            SpecProblem(f"spec {what} missing from {members.__name__}", sorted(declared - values))
        )


def binding_problems(
    spec: MachineSpec,
    model_cls: type,
    state_attribute: str,
    triggers: type[enum.Enum] | None = None,
    *,
    states: type[enum.Enum] | None = None,
    handler: object | None = None,
    coroutines: bool = False,
) -> list[SpecProblem]:
    """What keeps `model_cls` (with `handler`, when given) from running `spec`.

    Empty when it can. With a handler, guards and callbacks are looked up on it;
    `states` must then name exactly the spec's configurations (`fsm.flat`). Unless
    `coroutines` (an async executor), no guard or callback may be a coroutine function.
    """
    problems: list[SpecProblem] = []
    guard_names = {n for t in spec.transitions for n in (*t.conditions, *t.unless)}
    missing_guards: list[str] = []
    missing_callbacks: list[str] = []
    coroutine_functions: list[str] = []
    owner: object = model_cls if handler is None else handler
    owner_name = model_cls.__name__ if handler is None else type(handler).__name__
    for name in spec.callback_names():
        attr = getattr(owner, name, None)
        if attr is None or not callable(attr):
            (missing_guards if name in guard_names else missing_callbacks).append(name)
        elif not coroutines and _is_coroutine_function(attr):
            coroutine_functions.append(name)
    if missing_guards:
        problems.append(SpecProblem(f"guard missing on {owner_name}", missing_guards))
    if missing_callbacks:
        problems.append(SpecProblem(f"callback missing on {owner_name}", missing_callbacks))
    if coroutine_functions:
        problems.append(
            SpecProblem("coroutine function on a sync executor", sorted(coroutine_functions))
        )
    if not state_attribute.isidentifier() or keyword.iskeyword(state_attribute):
        problems.append(SpecProblem("state attribute is not an identifier", [state_attribute]))
    if state_attribute in spec.callback_names():
        # the slot holds the configuration name: "calling" it would call a string
        problems.append(SpecProblem("callback named like the state attribute", [state_attribute]))
    slots = {s for k in model_cls.__mro__ for s in getattr(k, "__slots__", ())}
    has_dict = any("__dict__" in vars(k) for k in model_cls.__mro__ if k is not object)
    if state_attribute not in slots and not has_dict and not hasattr(model_cls, state_attribute):
        problems.append(
            SpecProblem(f"state attribute missing on {model_cls.__name__}", [state_attribute])
        )
    if triggers is not None:
        _enum_drift(problems, triggers, set(spec.triggers()), "triggers")
    if states is not None:
        _enum_drift(problems, states, set(flatten(spec).configs), "configurations")
    return problems


def check_binding(
    spec: MachineSpec,
    model_cls: type,
    state_attribute: str,
    triggers: type[enum.Enum] | None = None,
    *,
    states: type[enum.Enum] | None = None,
    handler: object | None = None,
    coroutines: bool = False,
) -> None:
    """Raise `InvalidSpecError` listing everything that keeps `model_cls` from running `spec`."""
    problems = binding_problems(
        spec,
        model_cls,
        state_attribute,
        triggers,
        states=states,
        handler=handler,
        coroutines=coroutines,
    )
    if problems:
        raise InvalidSpecError(spec.name, spec.source, problems)
