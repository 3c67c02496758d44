"""What a spec means: configurations and the flat transitions out of each.

Hierarchy is resolved here, once, so that both executors run the same transitions
and cannot disagree about nesting. Primitives:

- `flatten(spec)` — a `FlatMachine`. Building it explores the reachable
  configurations *per group of coupled regions* (below), so its cost grows with the
  spec, not with the product of its parallel regions.
- `FlatMachine.group(config, trigger)` — the ordered candidate `FlatTransition`s of
  one trigger in one configuration, exit/enter callbacks resolved; computed on first
  use and kept.
- `FlatMachine.triggers_from(config)`, `is_config(config)`, `active_states(config)`,
  `is_active(config, path)`, `is_final(config)` — per-configuration questions, each
  answered without enumerating other configurations.
- `FlatMachine.groups` — the reachable configurations of each region group, with
  their transitions: what `fsm.validate` checks. `enumerated` says whether that
  exploration already covered every configuration (a single group).
- `FlatMachine.configs`, `table`, `active`, `final_configs` — the whole reachable
  product, built on first access. They cost what the product costs (2**14
  configurations for 14 independent two-state regions): for diagnostics, tests and
  small machines, never needed to run or validate one.

A *configuration* is the set of active atomic states; its name is their dotted paths
in document order joined by ``","`` (``"prepared.queued"``;
``"device.resident,external.unstored,backup.none"`` for a parallel machine). That
name is what an executor stores in the model's state slot.

Semantics (those of statecharts, restricted to what the specs need):

- A transition applies in a non-final configuration when one of its sources is
  active (a compound source covers all its descendants; ``"*"`` covers every
  non-final configuration) and, per region, one of its `requires` states is active.
- Its domain is the nearest common proper ancestor of the matched source and the
  dest. Every active state below the domain is exited (reverse document order:
  children before parents); the dest and its ancestors below the domain are entered
  (document order), with the default completion of the dest (compound: `initial`;
  parallel: every region) and of the sibling regions of any parallel ancestor entered.
- A configuration is final when, in every top-level region that declares final
  states, the active state is one of them. Nothing applies in a final configuration.

Region groups. In a parallel machine, two top-level regions are *coupled* when a
transition of one names a state of the other in `requires` (transitively). Regions
of different groups never constrain each other: a transition of one group changes
only that group's regions, and whether it applies depends only on them (and on the
machine not being final). So the reachable configurations are exactly the
combinations of each group's reachable parts, and each group is explored alone, with
the other groups held at their initial parts. A machine with a compound root, a
parallel machine whose regions are all coupled, and a parallel machine where some
group's initial part is already final (so finality could couple groups) are explored
as one group: their configurations one by one.
"""

from __future__ import annotations

import functools
import itertools
import sys
from collections import deque
from collections.abc import Iterable, Iterator

import attrs

from unicache_fsm.fsm.spec import ANY_STATE, MachineSpec, StateKind, StateSpec, TransitionSpec

__all__ = ["FlatMachine", "FlatTransition", "RegionGroup", "flatten", "parent_path"]


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
class RegionGroup:
    """The reachable configurations of one group of coupled top-level regions.

    `regions` names the group's top-level regions (``("",)``: the whole machine,
    explored as one group). `configs` are full configuration names, the other groups
    held at their initial parts, in breadth-first order from the initial
    configuration. `table` holds, per ``(config, trigger)``, the candidates among this
    group's transitions; `done` the configs in which every final-declaring region of
    the group is in a final state; `blocked` the configs that are final as they stand
    (nothing applies in them) with, per config, the transitions with an explicit
    source that would otherwise apply there.
    """

    regions: tuple[str, ...]
    configs: tuple[str, ...]
    table: dict[tuple[str, str], tuple[FlatTransition, ...]]
    done: frozenset[str]
    blocked: dict[str, tuple[FlatTransition, ...]]
    parts: frozenset[str]  # each config's leaves in this group's regions, joined by ","
    has_finals: bool


class FlatMachine:
    """The flat meaning of a spec; see the module docstring.

    Instances are shared by every executor of a spec (`flatten` caches them) and
    answer per-configuration questions from memo tables they fill on first use;
    callers must not mutate what they return.
    """

    def __init__(self, spec: MachineSpec) -> None:
        self.spec = spec
        self._states: dict[str, StateSpec] = {"": spec.root}
        self._order: dict[str, int] = {"": -1}
        for i, s in enumerate(spec.states()):
            self._states[s.path] = s
            self._order[s.path] = i
        self._parallel_root = spec.root.kind is StateKind.PARALLEL
        self._history = bool(spec.history_states())
        unknown: dict[str, None] = {}
        # top-level regions that declare final states, and their final leaves
        regions = list(spec.root.children) if self._parallel_root else [spec.root]
        self._final_regions: list[tuple[str, frozenset[str]]] = []
        for region in regions:
            finals = frozenset(s.path for s in region.walk() if s.final)
            if finals:
                self._final_regions.append((region.path, finals))
        # transitions whose every state name is known, indexed by source
        valid: list[TransitionSpec] = []
        for t in spec.transitions:
            names = [s for s in t.sources if s != ANY_STATE] + [t.dest, *t.requires]
            missing = [n for n in names if n not in self._states or n == ""]
            unknown.update(dict.fromkeys(missing))
            if not missing:
                valid.append(t)
        self._by_source: dict[str, list[TransitionSpec]] = {}
        self._from_any: list[TransitionSpec] = []
        for t in valid:
            if ANY_STATE in t.sources:
                self._from_any.append(t)
            for source in dict.fromkeys(t.sources):
                if source != ANY_STATE:
                    self._by_source.setdefault(source, []).append(t)
        self._valid = valid
        self._trigger_rank = {t: i for i, t in enumerate(spec.triggers())}
        init_active = frozenset(self._default_entry("", unknown)) - {""}
        self.unknown_states: tuple[str, ...] = tuple(unknown)
        self.initial: str = self._name(init_active)
        self._active_of: dict[str, frozenset[str]] = {self.initial: init_active}
        self._moves: dict[str, dict[str, tuple[FlatTransition, ...]]] = {}
        self._groups: dict[tuple[str, str], tuple[FlatTransition, ...]] = {}
        self._triggers: dict[str, tuple[str, ...]] = {}
        self.cross_region: tuple[str, ...] = self._crossing(valid)
        self.groups: tuple[RegionGroup, ...] = tuple(
            self._explore(regions) for regions in self._region_groups()
        )

    # -- per-configuration questions ---------------------------------------------------
    def is_config(self, config: object) -> bool:
        """Whether `config` names a reachable configuration (False for any non-string);
        for a machine with history transitions, any legal configuration (history
        restores configurations the default entries explored here need not reach)."""
        if not isinstance(config, str):
            return False
        if config in self._active_of:
            return True
        leaves = config.split(",")
        order = self._order
        last = -1
        for leaf in leaves:
            state = self._states.get(leaf)
            if state is None or leaf == "" or state.kind is not StateKind.ATOMIC:
                return False
            if order[leaf] <= last:
                return False  # not in document order, or repeated
            last = order[leaf]
        active = frozenset(leaves) | {a for leaf in leaves for a in _ancestors(leaf) if a}
        if self._history:
            # a history transition restores what was active beneath its dest, which
            # the exploration (default entries only) does not follow: any legal
            # configuration is accepted, reachable or not
            if not self._legal(active):
                return False
        else:
            for group in self.groups:
                if self._part(leaves, group.regions) not in group.parts:
                    return False
        self._active_of[config] = active
        return True

    def _legal(self, active: frozenset[str]) -> bool:
        """Whether `active` (states with their ancestors) is a legal configuration: one
        child of every active compound state (the root included), every child of every
        active parallel one."""
        for path in (*active, ""):
            state = self._states[path]
            inside = [c for c in state.children if c.path in active]
            if state.kind is StateKind.COMPOUND and state.children and len(inside) != 1:
                return False
            if state.kind is StateKind.PARALLEL and len(inside) != len(state.children):
                return False
        return True

    def active_states(self, config: str) -> frozenset[str]:
        """Every active state path of a configuration (ancestors included).

        `KeyError` when `config` is not a reachable configuration.
        """
        active = self._active_of.get(config)
        if active is None:
            if not self.is_config(config):
                raise KeyError(config)
            active = self._active_of[config]
        return active

    def is_active(self, config: str, path: str) -> bool:
        return path in self.active_states(config)

    def is_final(self, config: str) -> bool:
        """Whether nothing may happen any more in `config` (`KeyError` if unknown)."""
        return self._is_final(self.active_states(config))

    def moves(self, config: str) -> dict[str, tuple[FlatTransition, ...]]:
        """Every trigger with a transition from `config`, with its candidates in
        declaration order (`KeyError` when `config` is not reachable)."""
        found = self._moves.get(config)
        if found is None:
            active = self.active_states(config)
            found = {}
            if not self._is_final(active):
                for ft, dest_active in self._apply_all(config, active):
                    found[ft.trigger] = (*found.get(ft.trigger, ()), ft)
                    self._active_of.setdefault(ft.dest, dest_active)
            found = dict(sorted(found.items(), key=lambda kv: self._trigger_rank[kv[0]]))
            self._moves[config] = found
        return found

    def group(self, config: str, trigger: str) -> tuple[FlatTransition, ...]:
        """The candidates of `trigger` in `config`, in declaration order (empty: none).

        Computes only this trigger's candidates when `moves(config)` was not asked yet.
        """
        found = self._moves.get(config)
        if found is not None:
            return found.get(trigger, ())
        group = self._groups.get((config, trigger))
        if group is None:
            active = self.active_states(config)
            group = ()
            if not self._is_final(active):
                for ft, dest_active in self._apply_all(config, active, trigger=trigger):
                    group += (ft,)
                    self._active_of.setdefault(ft.dest, dest_active)
            self._groups[(config, trigger)] = group
        return group

    def triggers_from(self, config: str) -> tuple[str, ...]:
        """Triggers with at least one transition from `config`, in declaration order."""
        found = self._triggers.get(config)
        if found is None:
            found = self._triggers[config] = tuple(self.moves(config))
        return found

    @property
    def enumerated(self) -> bool:
        """Whether building the machine already walked every reachable configuration
        (one region group), so that `configs` and `table` cost nothing more. An
        executor may build its dispatch eagerly then, and on first use otherwise."""
        return len(self.groups) == 1

    def first_configs(self, limit: int) -> tuple[str, ...]:
        """The first `limit` configurations of `configs`, without walking the rest
        (for messages that list a few known configurations)."""
        return tuple(itertools.islice(self._walk(), limit))

    def iter_configs(self) -> Iterator[str]:
        """The configurations of `configs`, one at a time, walked only as far as the
        caller reads (a bounded pass over a machine whose product is huge)."""
        return self._walk()

    # -- the whole product (cost: the number of reachable configurations) --------------
    @functools.cached_property
    def configs(self) -> tuple[str, ...]:
        """Every reachable configuration, breadth-first from `initial`."""
        if self.enumerated:
            return self.groups[0].configs
        return tuple(self._walk())

    def _walk(self) -> Iterator[str]:
        """Reachable configurations, breadth-first from `initial`, one at a time."""
        if self.enumerated:
            yield from self.groups[0].configs
            return
        seen = {self.initial: None}
        queue = deque([self.initial])
        yield self.initial
        while queue:
            config = queue.popleft()
            taken = sorted(
                (ft for fts in self.moves(config).values() for ft in fts),
                key=lambda ft: ft.spec.index,
            )
            for ft in taken:
                if ft.dest not in seen:
                    seen[ft.dest] = None
                    queue.append(ft.dest)
                    yield ft.dest

    @functools.cached_property
    def table(self) -> dict[tuple[str, str], tuple[FlatTransition, ...]]:
        """``(config, trigger)`` -> candidates, for every reachable configuration."""
        return {(c, t): g for c in self.configs for t, g in self.moves(c).items()}

    @functools.cached_property
    def active(self) -> dict[str, frozenset[str]]:
        """Configuration -> every active state path, for every reachable configuration."""
        return {c: self.active_states(c) for c in self.configs}

    @functools.cached_property
    def final_configs(self) -> frozenset[str]:
        return frozenset(c for c in self.configs if self.is_final(c))

    def transitions(self) -> list[FlatTransition]:
        """Every flat transition, grouped by configuration then trigger."""
        return [ft for group in self.table.values() for ft in group]

    # -- facts composed over the region groups (what validation reports) ---------------
    def reachable_states(self) -> frozenset[str]:
        """Every state active in some reachable configuration."""
        out: set[str] = set()
        for group in self.groups:
            for config in group.configs:
                out |= self.active_states(config)
        return frozenset(out)

    def dead_ends(self, limit: int = 20) -> tuple[str, ...]:
        """Reachable non-final configurations from which no transition applies.

        With one region group, all of them; with several, up to `limit` witnesses.
        """
        stuck: list[list[str]] = []
        for group in self.groups:
            with_exit = {c for (c, _t) in group.table}
            stuck.append([c for c in group.configs if c not in with_exit])
        if len(self.groups) == 1:
            return tuple(c for c in stuck[0] if c not in self.groups[0].blocked)
        if not all(stuck):
            return ()
        finals_exist = bool(self._final_regions)
        out: dict[str, None] = {}
        for k, (group, configs) in enumerate(zip(self.groups, stuck, strict=True)):
            for config in configs:
                if finals_exist and (not group.has_finals or config in group.done):
                    continue  # this choice leaves the machine's finality to the others
                parts = [s[0] for s in stuck]
                parts[k] = config
                out[self._combine(parts)] = None
                if len(out) >= limit:
                    return tuple(out)
        return tuple(out)

    def candidate_groups(self) -> Iterator[tuple[str, str, tuple[FlatTransition, ...]]]:
        """``(config, trigger, candidates)`` triples that together show every way the
        candidates of one trigger meet (what the ambiguity check needs): every group's
        own table, and for a trigger of several groups, configurations that combine each
        candidate-holding configuration of one group with, in every other group, the
        configuration holding that trigger's latest-declared candidate."""
        for group in self.groups:
            for (config, trigger), candidates in group.table.items():
                yield config, trigger, candidates
        if len(self.groups) == 1:
            return
        holders: dict[str, dict[int, list[str]]] = {}
        latest: dict[tuple[str, int], tuple[int, str]] = {}
        for k, group in enumerate(self.groups):
            for (config, trigger), candidates in group.table.items():
                holders.setdefault(trigger, {}).setdefault(k, []).append(config)
                top = max(ft.spec.index for ft in candidates)
                if top > latest.get((trigger, k), (-1, ""))[0]:
                    latest[(trigger, k)] = (top, config)
        for trigger, by_group in holders.items():
            if len(by_group) < 2:
                continue
            for k, configs in by_group.items():
                for config in configs:
                    parts = [g.configs[0] for g in self.groups]
                    for other in by_group:
                        parts[other] = latest[(trigger, other)][1]
                    parts[k] = config
                    combined = self._combine(parts)
                    yield combined, trigger, self.group(combined, trigger)

    @property
    def out_of_final(self) -> tuple[str, ...]:
        """``"trigger from config"`` for every transition of `late_transitions`."""
        return tuple(dict.fromkeys(f"{ft.trigger} from {c}" for c, ft in self.late_transitions()))

    def late_transitions(self) -> Iterator[tuple[str, FlatTransition]]:
        """Transitions with an explicit source that would apply in a reachable final
        configuration, each with one such configuration."""
        finals = [g for g in self.groups if g.has_finals]
        if not finals:
            return
        done_part = {id(g): next((c for c in g.configs if c in g.done), None) for g in finals}
        if any(c is None for c in done_part.values()):
            return  # some group can never finish: no configuration is final
        for k, group in enumerate(self.groups):
            candidates: dict[str, tuple[FlatTransition, ...]] = dict(group.blocked)
            if len(self.groups) > 1:
                for (config, _t), fts in group.table.items():
                    if group.has_finals and config not in group.done:
                        continue
                    explicit = tuple(ft for ft in fts if ANY_STATE not in ft.spec.sources)
                    candidates[config] = candidates.get(config, ()) + explicit
            for config, fts in candidates.items():
                parts = [
                    done_part[id(g)] or "" if g.has_finals else g.configs[0] for g in self.groups
                ]
                parts[k] = config
                witness = self._combine(parts)
                for ft in fts:
                    yield witness, ft

    # -- construction ------------------------------------------------------------------
    def _region(self, path: str) -> str:
        return path.split(".", 1)[0] if self._parallel_root else ""

    def _part(self, leaves: Iterable[str], regions: tuple[str, ...]) -> str:
        if regions == ("",):
            return ",".join(leaves)
        keep = set(regions)
        return ",".join(leaf for leaf in leaves if self._region(leaf) in keep)

    def _combine(self, configs: list[str]) -> str:
        """The configuration made of each group's part of the matching config."""
        leaves: list[str] = []
        for group, config in zip(self.groups, configs, strict=True):
            if group.regions == ("",):
                return config
            leaves += [x for x in config.split(",") if self._region(x) in group.regions]
        leaves.sort(key=self._order.__getitem__)
        return sys.intern(",".join(leaves))

    def _default_entry(self, path: str, unknown: dict[str, None]) -> set[str]:
        s = self._states[path]
        out = {path}
        if s.kind is StateKind.COMPOUND and s.initial is not None:
            init = f"{path}.{s.initial}" if path else s.initial
            if init in self._states:
                out |= self._default_entry(init, unknown)
            else:
                unknown[init] = None
        elif s.kind is StateKind.PARALLEL:
            for c in s.children:
                out |= self._default_entry(c.path, unknown)
        return out

    def _name(self, active: Iterable[str]) -> str:
        leaves = sorted(
            (p for p in active if p and self._states[p].kind is StateKind.ATOMIC),
            key=self._order.__getitem__,
        )
        return sys.intern(",".join(leaves))

    def _is_final(self, active: frozenset[str]) -> bool:
        if not self._final_regions:
            return False
        return all(active & finals for _region, finals in self._final_regions)

    def _done(self, active: frozenset[str], regions: tuple[str, ...]) -> bool:
        keep = set(regions)
        return all(
            active & finals
            for region, finals in self._final_regions
            if regions == ("",) or region in keep
        )

    def _requires_ok(self, t: TransitionSpec, active: frozenset[str]) -> bool:
        if not t.requires:
            return True
        groups: dict[str, list[str]] = {}
        for r in t.requires:
            groups.setdefault(r.split(".")[0], []).append(r)
        return all(any(r in active for r in group) for group in groups.values())

    def _any_source(self, dest: str, active: frozenset[str]) -> str:
        """The state a ``"*"`` transition leaves: the active top-level state (in a
        parallel machine, the active state of the region that holds the dest)."""
        if self._parallel_root:
            region = dest.split(".")[0]
            return next(p for p in active if parent_path(p) == region)
        return next(p for p in active if p and "." not in p)

    def _candidates(self, active: frozenset[str]) -> list[TransitionSpec]:
        found: dict[int, TransitionSpec] = {t.index: t for t in self._from_any}
        for path in active:
            for t in self._by_source.get(path, ()):
                found[t.index] = t
        return [found[i] for i in sorted(found)]

    def _apply_all(
        self,
        config: str,
        active: frozenset[str],
        *,
        only: frozenset[int] | None = None,
        trigger: str | None = None,
        late: list[FlatTransition] | None = None,
    ) -> Iterator[tuple[FlatTransition, frozenset[str]]]:
        """The transitions that apply in configuration `config` (whose active states are
        `active`), in declaration order, each with the active states of its dest.

        `only` restricts them to those indexes, `trigger` to that trigger; with `late`,
        the configuration is final: nothing is yielded and the explicit-source
        transitions that would apply are appended to `late` instead.
        """
        for t in self._candidates(active):
            if only is not None and t.index not in only:
                continue
            if trigger is not None and t.trigger != trigger:
                continue
            if ANY_STATE in t.sources:
                if late is not None:
                    continue
                src: str | None = self._any_source(t.dest, active)
            else:
                src = next((s for s in t.sources if s in active), None)
            if src is None or not self._requires_ok(t, active):
                continue
            applied = self._apply(t, src, config, active)
            if applied is None:
                continue
            if late is not None:
                late.append(applied[0])
            else:
                yield applied

    def _apply(
        self, t: TransitionSpec, src: str, config: str, active: frozenset[str]
    ) -> tuple[FlatTransition, frozenset[str]] | None:
        if t.internal:  # nothing exited, nothing entered: the configuration stays
            return FlatTransition(config, config, t.trigger, t, (), (), (), ()), active
        dest = t.dest
        dest_anc = _ancestors(dest)
        domain = next(a for a in _ancestors(src) if a in dest_anc)
        if self._states[domain].kind is StateKind.PARALLEL:
            return None  # across parallel regions: `cross_region` reports it
        below = [p for p in active if p and (domain == "" or p.startswith(domain + "."))]
        exited = sorted(below, key=self._order.__getitem__, reverse=True)
        entered_set: set[str] = set()
        # path from just below the domain down to dest
        under = [
            a for a in reversed(dest_anc) if a and (domain == "" or a.startswith(domain + "."))
        ]
        chain = [*under, dest]
        unknown: dict[str, None] = {}
        for i, p in enumerate(chain):
            if p == dest:
                entered_set |= self._default_entry(p, unknown)
            else:
                entered_set.add(p)
                s = self._states[p]
                if s.kind is StateKind.PARALLEL:
                    nxt = chain[i + 1]
                    for c in s.children:
                        if c.path != nxt:
                            entered_set |= self._default_entry(c.path, unknown)
        entered = sorted(entered_set, key=self._order.__getitem__)
        gone = set(exited)
        new_active = frozenset((active - gone) | entered_set)
        leaves = [x for x in config.split(",") if x not in gone]
        leaves += [p for p in entered if self._states[p].kind is StateKind.ATOMIC]
        leaves.sort(key=self._order.__getitem__)
        ft = FlatTransition(
            source=config,
            dest=sys.intern(",".join(leaves)),
            trigger=t.trigger,
            spec=t,
            exits=tuple(cb for p in exited for cb in self._states[p].on_exit),
            enters=tuple(cb for p in entered for cb in self._states[p].on_enter),
            exited_states=tuple(exited),
            entered_states=tuple(entered),
        )
        return ft, new_active

    def _crossing(self, valid: list[TransitionSpec]) -> tuple[str, ...]:
        """Labels of the transitions whose domain is a parallel state (for some source)."""
        out: dict[str, None] = {}
        for t in valid:
            sources = list(t.sources)
            if ANY_STATE in sources:  # it leaves a child of the dest's region (or the root's)
                region = self._region(t.dest) if self._parallel_root else ""
                sources = [c.path for c in self._states[region].children[:1]]
            for src in sources:
                dest_anc = _ancestors(t.dest)
                domain = next(a for a in _ancestors(src) if a in dest_anc)
                if self._states[domain].kind is StateKind.PARALLEL:
                    out[t.label()] = None
        return tuple(out)

    def _region_groups(self) -> list[tuple[str, ...]]:
        """Top-level regions grouped by `requires` coupling (one group: explore whole)."""
        if not self._parallel_root:
            return [("",)]
        regions = [c.name for c in self.spec.root.children]
        leader = {r: r for r in regions}

        def find(r: str) -> str:
            while leader[r] != r:
                leader[r] = leader[leader[r]]
                r = leader[r]
            return r

        for t in self._valid:
            touched = {self._region(p) for p in (t.dest, *t.requires, *t.sources) if p != "*"}
            first, *rest = sorted(touched)
            for other in rest:
                leader[find(other)] = find(first)
        groups: dict[str, list[str]] = {}
        for r in regions:
            groups.setdefault(find(r), []).append(r)
        out = [tuple(g) for g in groups.values()]
        init = self._active_of[self.initial]
        if len(out) > 1 and any(
            self._done(init, g) and any(r in g for r, _f in self._final_regions) for g in out
        ):
            return [("",)]  # a group starts final: finality could couple the groups
        return out if len(out) > 1 else [("",)]

    def _explore(self, regions: tuple[str, ...]) -> RegionGroup:
        """Breadth-first search of one group's configurations (others held initial)."""
        whole = regions == ("",)
        only = None
        if not whole:
            keep = set(regions)
            only = frozenset(t.index for t in self._valid if self._region(t.dest) in keep)
        table: dict[tuple[str, str], tuple[FlatTransition, ...]] = {}
        done: set[str] = set()
        blocked: dict[str, tuple[FlatTransition, ...]] = {}
        queue = deque([self.initial])
        seen = {self.initial: None}
        while queue:
            config = queue.popleft()
            active = self._active_of[config]
            if self._done(active, regions):
                done.add(config)
            moves: dict[str, tuple[FlatTransition, ...]] = {}
            if self._is_final(active):
                late: list[FlatTransition] = []
                for _ in self._apply_all(config, active, only=only, late=late):
                    pass
                blocked[config] = tuple(late)
            else:
                for ft, dest_active in self._apply_all(config, active, only=only):
                    moves[ft.trigger] = (*moves.get(ft.trigger, ()), ft)
                    self._active_of.setdefault(ft.dest, dest_active)
                    if ft.dest not in seen:
                        seen[ft.dest] = None
                        queue.append(ft.dest)
            for trigger, fts in moves.items():
                table[(config, trigger)] = fts
            if whole:  # the group is the machine: these are the config's moves
                self._moves[config] = dict(
                    sorted(moves.items(), key=lambda kv: self._trigger_rank[kv[0]])
                )
        configs = tuple(seen)
        return RegionGroup(
            regions=regions,
            configs=configs,
            table=table,
            done=frozenset(done),
            blocked=blocked,
            parts=frozenset(
                configs if whole else (self._part(c.split(","), regions) for c in configs)
            ),
            has_finals=bool(self._final_regions)
            if whole
            else any(r in regions for r, _f in self._final_regions),
        )

    def __repr__(self) -> str:
        return f"<FlatMachine {self.spec.name!r}: {len(self.groups)} region group(s)>"


@functools.lru_cache(maxsize=256)
def flatten(spec: MachineSpec) -> FlatMachine:
    """Resolve a spec's hierarchy: its region groups explored, the rest on demand.

    Specs are immutable, so the result is computed once per spec and shared (callers
    must not mutate it).
    """
    return FlatMachine(spec)
