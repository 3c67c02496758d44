"""Transition coverage: which transitions a run or a fuzz campaign took, and how often.

- `Coverage` — counts per machine per flat transition ``(source, trigger, dest)``;
  built from a `fsm.trace.TransitionCounter`, saved to and loaded from JSON.
- `Coverage.declared(spec)` — the counts folded onto the spec's declared transitions
  (one entry per declared source, as diagrams draw them), so a diagram can colour
  each arrow and mark the ones never taken.
- `Coverage.missing(spec)` — the declared transitions never taken.

File format: ``{"machines": {name: [[source, trigger, dest, count], ...]}}``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import attrs

from unicache_fsm.fsm.flat import flatten
from unicache_fsm.fsm.spec import ANY_STATE, MachineSpec, TransitionSpec
from unicache_fsm.fsm.trace import TransitionCounter

__all__ = ["Coverage", "EdgeKey"]

#: A declared arrow: (transition index in the spec, declared source path or "*").
EdgeKey = tuple[int, str]


@attrs.define
class Coverage:
    counts: dict[str, Counter[tuple[str, str, str]]] = attrs.field(factory=dict)

    @classmethod
    def from_counter(cls, counter: TransitionCounter) -> Coverage:
        cov = cls()
        for (machine, source, trigger, dest), n in counter.counts.items():
            cov.counts.setdefault(machine, Counter())[(source, trigger, dest)] += n
        return cov

    def merge(self, other: Coverage) -> None:
        for machine, counts in other.counts.items():
            self.counts.setdefault(machine, Counter()).update(counts)

    def save(self, path: str | Path) -> None:
        data = {
            "machines": {
                m: [[s, t, d, n] for (s, t, d), n in sorted(c.items())]
                for m, c in sorted(self.counts.items())
            }
        }
        Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Coverage:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        cov = cls()
        for machine, rows in data.get("machines", {}).items():
            cov.counts[machine] = Counter({(s, t, d): int(n) for s, t, d, n in rows})
        return cov

    def declared(self, spec: MachineSpec) -> dict[EdgeKey, int]:
        """Counts per declared arrow ``(transition index, declared source)``."""
        flat = flatten(spec)
        out: dict[EdgeKey, int] = {(t.index, s): 0 for t in spec.transitions for s in t.sources}
        for (config, trigger, dest), n in self.counts.get(spec.name, Counter()).items():
            if not flat.is_config(config):
                continue  # a count recorded against another version of the spec
            # candidates with the same dest: the first one is the arrow it is counted on
            ft = next((ft for ft in flat.group(config, trigger) if ft.dest == dest), None)
            if ft is not None:
                out[(ft.spec.index, _declared_source(ft.spec, flat.active_states(config)))] += n
        return out

    def missing(self, spec: MachineSpec) -> list[str]:
        """Declared arrows never taken, as ``"trigger: source -> dest"``."""
        by_index = {t.index: t for t in spec.transitions}
        return [
            f"{by_index[i].trigger}: {src} -> {by_index[i].dest}"
            for (i, src), n in self.declared(spec).items()
            if n == 0
        ]


def _declared_source(t: TransitionSpec, active: frozenset[str]) -> str:
    if ANY_STATE in t.sources:
        return ANY_STATE
    return next(s for s in t.sources if s in active)
