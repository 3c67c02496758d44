"""What a spec means: configurations and flat transitions.

Hierarchy is resolved here, once, so that both executors run the same flat table
and cannot disagree about nesting. Primitives:

- `flatten(spec)` — a `FlatMachine`: the initial configuration, every configuration
  reachable from it (ignoring guards), and for each `(configuration, trigger)` the
  ordered candidate `FlatTransition`s with their exit/enter callbacks resolved.
- `FlatMachine.is_active(config, path)` — whether a state is active in a configuration.

A *configuration* is the set of active atomic states; its name is their dotted paths
in document order joined by ``","`` (``"prepared.queued"``;
``"device.resident,external.unstored,backup.none"`` for a parallel machine). That
name is what an executor stores in the model's state slot.

Semantics (those of statecharts, restricted to what the specs need):

- A transition applies in a configuration when one of its sources is active (a
  compound source covers all its descendants; ``"*"`` covers every non-final
  configuration) and, per region, one of its `requires` states is active.
- Its domain is the nearest common proper ancestor of the matched source and the
  dest. Every active state below the domain is exited (reverse document order:
  children before parents); the dest and its ancestors below the domain are entered
  (document order), with the default completion of the dest (compound: `initial`;
  parallel: every region) and of the sibling regions of any parallel ancestor entered.
- A configuration is final when, in every top-level region that declares final
  states, the active state is one of them.
"""

from __future__ import annotations

import functools
import sys
from collections import deque
from collections.abc import Iterable

import attrs

from unicache_fsm.fsm.spec import ANY_STATE, MachineSpec, StateKind, StateSpec, TransitionSpec

__all__ = ["FlatMachine", "FlatTransition", "flatten", "parent_path"]


def parent_path(path: str) -> str:
    """The dotted path of a state's parent ("" for top-level states)."""
    return path.rpartition(".")[0]


def _ancestors(path: str) -> list[str]:
    """Proper ancestors of a path, nearest first, ending with the root ""."""
    out = []
    while path:
        path = parent_path(path)
        out.append(path)
    return out


@attrs.frozen
class FlatTransition:
    """One declared transition as it applies in one configuration.

    `exits` and `enters` are the `on_exit` / `on_enter` callback names to run, in
    order; `spec` is the declaration it comes from.
    """

    source: str
    dest: str
    trigger: str
    spec: TransitionSpec
    exits: tuple[str, ...]
    enters: tuple[str, ...]
    exited_states: tuple[str, ...]
    entered_states: tuple[str, ...]


@attrs.frozen
class FlatMachine:
    """The flat meaning of a spec; see the module docstring."""

    spec: MachineSpec
    initial: str
    configs: tuple[str, ...]  # reachable, in breadth-first order from `initial`
    final_configs: frozenset[str]
    table: dict[tuple[str, str], tuple[FlatTransition, ...]]
    active: dict[str, frozenset[str]]  # config -> every active state path (with ancestors)
    unknown_states: tuple[str, ...]
    out_of_final: tuple[str, ...]  # "trigger from config" for explicit sources in final configs
    cross_region: tuple[str, ...]

    def is_active(self, config: str, path: str) -> bool:
        return path in self.active[config]

    def triggers_from(self, config: str) -> tuple[str, ...]:
        """Triggers with at least one transition from `config`, in declaration order."""
        found = {t: None for (c, t) in self.table if c == config}
        return tuple(t for t in self.spec.triggers() if t in found)

    def transitions(self) -> list[FlatTransition]:
        """Every flat transition, grouped by configuration then trigger."""
        return [ft for group in self.table.values() for ft in group]


class _Flattener:
    def __init__(self, spec: MachineSpec) -> None:
        self.spec = spec
        self.states: dict[str, StateSpec] = {"": spec.root}
        self.order: dict[str, int] = {"": -1}
        for i, s in enumerate(spec.states()):
            self.states[s.path] = s
            self.order[s.path] = i
        self.unknown: dict[str, None] = {}
        self.out_of_final: dict[str, None] = {}
        self.cross_region: dict[str, None] = {}
        # top-level regions that declare final states, and their final leaves
        regions = list(spec.root.children) if spec.root.kind is StateKind.PARALLEL else [spec.root]
        self.final_regions: list[set[str]] = []
        for region in regions:
            finals = {s.path for s in region.walk() if s.final}
            if finals:
                self.final_regions.append(finals)

    # -- helpers ---------------------------------------------------------------------
    def known(self, path: str) -> bool:
        if path in self.states and path != "":
            return True
        self.unknown[path] = None
        return False

    def default_entry(self, path: str) -> set[str]:
        s = self.states[path]
        out = {path}
        if s.kind is StateKind.COMPOUND and s.initial is not None:
            init = f"{path}.{s.initial}" if path else s.initial
            if init in self.states:
                out |= self.default_entry(init)
            else:
                self.unknown[init] = None
        elif s.kind is StateKind.PARALLEL:
            for c in s.children:
                out |= self.default_entry(c.path)
        return out

    def name(self, active: Iterable[str]) -> str:
        leaves = sorted(
            (p for p in active if p and self.states[p].kind is StateKind.ATOMIC),
            key=self.order.__getitem__,
        )
        return sys.intern(",".join(leaves))

    def is_final(self, active: frozenset[str]) -> bool:
        if not self.final_regions:
            return False
        return all(active & finals for finals in self.final_regions)

    def requires_ok(self, t: TransitionSpec, active: frozenset[str]) -> bool:
        if not t.requires:
            return True
        groups: dict[str, list[str]] = {}
        for r in t.requires:
            groups.setdefault(r.split(".")[0], []).append(r)
        return all(any(r in active for r in group) for group in groups.values())

    def any_source(self, dest: str, active: frozenset[str]) -> str:
        """The state a ``"*"`` transition leaves: the active top-level state (in a
        parallel machine, the active state of the region that holds the dest)."""
        if self.spec.root.kind is StateKind.PARALLEL:
            region = dest.split(".")[0]
            return next(p for p in active if parent_path(p) == region)
        return next(p for p in active if p and "." not in p)

    def apply(self, t: TransitionSpec, src: str, active: frozenset[str]) -> FlatTransition | None:
        dest = t.dest
        dest_anc = _ancestors(dest)
        domain = next(a for a in _ancestors(src) if a in dest_anc)
        if self.states[domain].kind is StateKind.PARALLEL:
            self.cross_region[t.label()] = None
            return None
        below = [p for p in active if p and (domain == "" or p.startswith(domain + "."))]
        exited = sorted(below, key=self.order.__getitem__, reverse=True)
        entered_set: set[str] = set()
        # path from just below the domain down to dest
        under = [
            a for a in reversed(dest_anc) if a and (domain == "" or a.startswith(domain + "."))
        ]
        chain = [*under, dest]
        for i, p in enumerate(chain):
            if p == dest:
                entered_set |= self.default_entry(p)
            else:
                entered_set.add(p)
                s = self.states[p]
                if s.kind is StateKind.PARALLEL:
                    nxt = chain[i + 1]
                    for c in s.children:
                        if c.path != nxt:
                            entered_set |= self.default_entry(c.path)
        entered = sorted(entered_set, key=self.order.__getitem__)
        new_active = (set(active) - set(exited)) | entered_set
        return FlatTransition(
            source=self.name(active),
            dest=self.name(new_active),
            trigger=t.trigger,
            spec=t,
            exits=tuple(cb for p in exited for cb in self.states[p].on_exit),
            enters=tuple(cb for p in entered for cb in self.states[p].on_enter),
            exited_states=tuple(exited),
            entered_states=tuple(entered),
        )

    # -- main ------------------------------------------------------------------------
    def run(self) -> FlatMachine:
        spec = self.spec
        valid: list[TransitionSpec] = []
        for t in spec.transitions:
            ok = all(s == ANY_STATE or self.known(s) for s in t.sources)
            ok = self.known(t.dest) and ok
            ok = all(self.known(r) for r in t.requires) and ok
            if ok:
                valid.append(t)
        init_active = frozenset(self.default_entry("")) - {""}
        initial = self.name(init_active)
        active_of: dict[str, frozenset[str]] = {initial: init_active}
        finals: set[str] = set()
        table: dict[tuple[str, str], list[FlatTransition]] = {}
        queue = deque([initial])
        order = [initial]
        while queue:
            config = queue.popleft()
            active = active_of[config]
            final = self.is_final(active)
            if final:
                finals.add(config)
            for t in valid:
                if ANY_STATE in t.sources:
                    if final:
                        continue
                    src: str | None = self.any_source(t.dest, active)
                else:
                    src = next((s for s in t.sources if s in active), None)
                if src is None or not self.requires_ok(t, active):
                    continue
                if final:
                    self.out_of_final[f"{t.trigger} from {config}"] = None
                    continue
                ft = self.apply(t, src, active)
                if ft is None:
                    continue
                table.setdefault((config, t.trigger), []).append(ft)
                if ft.dest not in active_of:
                    new_active = (active - set(ft.exited_states)) | set(ft.entered_states)
                    active_of[ft.dest] = frozenset(new_active)
                    order.append(ft.dest)
                    queue.append(ft.dest)
        return FlatMachine(
            spec=spec,
            initial=initial,
            configs=tuple(order),
            final_configs=frozenset(finals),
            table={k: tuple(v) for k, v in table.items()},
            active={
                c: frozenset(a | {x for p in a for x in _ancestors(p) if x})
                for c, a in active_of.items()
            },
            unknown_states=tuple(self.unknown),
            out_of_final=tuple(self.out_of_final),
            cross_region=tuple(self.cross_region),
        )


@functools.lru_cache(maxsize=256)
def flatten(spec: MachineSpec) -> FlatMachine:
    """Resolve a spec's hierarchy into reachable configurations and flat transitions.

    Specs are immutable, so the result is computed once per spec and shared (callers
    must not mutate it).
    """
    return _Flattener(spec).run()
