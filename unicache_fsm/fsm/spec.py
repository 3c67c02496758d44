"""The spec model: a machine declaration as immutable data.

A `MachineSpec` is what a spec file in ``specs/`` says, nothing more: a tree of
`StateSpec` (atomic, compound or parallel) under an implicit root, and an ordered
tuple of `TransitionSpec`. It holds names, never callables; binding the names to a
model class happens in the executors. `fsm.loader` builds specs from TOML,
`fsm.flat` gives them their meaning (configurations and flat transitions) and
`fsm.validate` rejects the ones that make no sense.

State paths are dotted (``"prepared.loading"``); the root has the empty path.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any

import attrs

__all__ = [
    "ANY_STATE",
    "HISTORY_KINDS",
    "MAX_DEPTH",
    "MachineSpec",
    "StateKind",
    "StateSpec",
    "TransitionSpec",
]

#: A transition source meaning "every non-final configuration".
ANY_STATE = "*"

#: How deep states may nest (validation refuses deeper specs: it bounds the recursion
#: of parsing, flattening and drawing).
MAX_DEPTH = 32

#: The values of `TransitionSpec.history` that enter the dest through its history.
HISTORY_KINDS = ("shallow", "deep")


def _as_tuple(value: Any) -> tuple[Any, ...]:
    """A sequence field as a tuple (a lone string is one name), so that a spec written
    in Python with lists is still immutable and hashable; element types are checked by
    validation (`fsm.validate`), not here."""
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(value)
    except TypeError:  # not iterable: kept as one element, for validation to name
        return (value,)


class StateKind(str, enum.Enum):
    """How a state holds its children."""

    ATOMIC = "atomic"  # no children
    COMPOUND = "compound"  # exactly one child active (its `initial` on default entry)
    PARALLEL = "parallel"  # every child (region) active at once


@attrs.frozen(cache_hash=True)
class StateSpec:
    """One declared state.

    `initial` names the child entered by default (compound states only); `final`
    marks an atomic state that ends its region. `on_enter`/`on_exit` name model
    methods run when the state becomes active / stops being active.
    """

    name: str
    path: str
    kind: StateKind = StateKind.ATOMIC
    children: tuple[StateSpec, ...] = attrs.field(default=(), converter=_as_tuple)
    initial: str | None = None
    final: bool = False
    on_enter: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    on_exit: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    description: str = ""

    def walk(self) -> Iterator[StateSpec]:
        """This state and all its descendants, in document order."""
        yield self
        for child in self.children:
            yield from child.walk()

    def child(self, name: str) -> StateSpec | None:
        for c in self.children:
            if c.name == name:
                return c
        return None


@attrs.frozen(cache_hash=True)
class TransitionSpec:
    """One declared transition (possibly from several sources).

    Callbacks run in this order: `prepare`, then the guards (`conditions` must all
    be true, `unless` all false), `before`, the exited states' `on_exit`, the state
    change, the entered states' `on_enter`, `after`. `requires` (parallel machines
    only) names states of *other* regions of which one per region must be active
    for the transition to exist at all; unlike a guard it is resolved when the spec
    is compiled, so it shapes the diagram and the validation. An `internal` transition
    (its dest is its source) changes nothing: no state is exited or entered, its
    `prepare`, guards, `before` and `after` run (a tick, a counter, a timer check).
    """

    trigger: str
    sources: tuple[str, ...] = attrs.field(converter=_as_tuple)
    dest: str
    index: int
    conditions: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    unless: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    prepare: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    before: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    after: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    requires: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    description: str = ""
    internal: bool = False
    history: str = ""

    @property
    def guarded(self) -> bool:
        return bool(self.conditions or self.unless)

    def label(self) -> str:
        """A short human name: ``"prepare: idle -> prepared"``."""
        mark = f" ({self.history} history)" if self.history else ""
        return f"{self.trigger}: {'|'.join(self.sources)} -> {self.dest}{mark}"


@attrs.frozen(cache_hash=True)
class MachineSpec:
    """A whole machine: states under `root`, transitions in declaration order.

    `noun` is what one model of this machine is called in messages ("load", "node").
    `source` says where the spec came from (a file path or ``"<string>"``).
    """

    name: str
    root: StateSpec
    transitions: tuple[TransitionSpec, ...] = attrs.field(converter=_as_tuple)
    noun: str = ""
    description: str = ""
    source: str = ""

    def states(self) -> Iterator[StateSpec]:
        """Every declared state (not the root), in document order."""
        for child in self.root.children:
            yield from child.walk()

    def state(self, path: str) -> StateSpec | None:
        """The state at a dotted path, or None."""
        node: StateSpec | None = self.root
        for part in path.split("."):
            if node is None:
                return None
            node = node.child(part)
        return node

    def history_states(self) -> tuple[str, ...]:
        """The dests of `history` transitions (the states whose history models keep),
        once, in declaration order."""
        return tuple(dict.fromkeys(t.dest for t in self.transitions if t.history))

    def triggers(self) -> tuple[str, ...]:
        """Every declared trigger, once, in declaration order."""
        return tuple(dict.fromkeys(t.trigger for t in self.transitions))

    def callback_names(self) -> tuple[str, ...]:
        """Every model method name the spec refers to (guards and callbacks)."""
        names: dict[str, None] = {}
        for t in self.transitions:
            for group in (t.prepare, t.conditions, t.unless, t.before, t.after):
                names.update(dict.fromkeys(group))
        for s in self.states():
            names.update(dict.fromkeys(s.on_enter))
            names.update(dict.fromkeys(s.on_exit))
        return tuple(names)
