"""Transition coverage: which transitions a run or a fuzz campaign took, and how often.

- `Coverage` — counts per machine per flat transition ``(source, trigger, dest)``;
  built from a `fsm.trace.TransitionCounter`, saved to and loaded from JSON.
- `Coverage.declared(spec)` — the counts folded onto the spec's declared transitions
  (one entry per declared source, as diagrams draw them), so a diagram can colour
  each arrow and mark the ones never taken.
- `Coverage.missing(spec)` — the declared transitions never taken.
- `Coverage.unknown(spec)` — counted rows that are not transitions of the spec (a file
  from another version of it, or edited by hand).

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
        """Read a coverage file; `ValueError` naming the first malformed part (rows must be
        ``[source, trigger, dest, count]``: three strings and an int >= 0)."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        machines = data.get("machines") if isinstance(data, dict) else None
        if not isinstance(machines, dict):
            msg = 'a coverage file is {"machines": {name: [[source, trigger, dest, count], ...]}}'
            raise ValueError(msg)
        cov = cls()
        for machine, rows in machines.items():
            if not isinstance(rows, list):
                msg = f"machine {machine!r}: rows must be a list, got {type(rows).__name__}"
                raise ValueError(msg)
            counts: Counter[tuple[str, str, str]] = Counter()
            for row in rows:
                if not isinstance(row, list) or len(row) != 4:
                    msg = f"machine {machine!r}: row {row!r} is not [source, trigger, dest, count]"
                    raise ValueError(msg)
                s, t, d, n = row
                if not all(isinstance(x, str) for x in (s, t, d)):
                    msg = f"machine {machine!r}: row {row!r} names states and trigger by string"
                    raise ValueError(msg)
                if isinstance(n, bool) or not isinstance(n, int):
                    msg = f"machine {machine!r}: row {row!r} has a count that is not an int"
                    raise ValueError(msg)
                if n < 0:
                    msg = f"machine {machine!r}: row {row!r} has a negative count"
                    raise ValueError(msg)
                counts[(s, t, d)] += n
            cov.counts[machine] = counts
        return cov

    def unknown(self, spec: MachineSpec) -> list[str]:
        """Rows for `spec` that are not transitions of it, as ``"source --trigger--> dest"``."""
        flat = flatten(spec)
        known = {(c, t, ft.dest) for (c, t), group in flat.table.items() for ft in group}
        return [
            f"{s} --{t}--> {d}"
            for (s, t, d) in sorted(self.counts.get(spec.name, Counter()))
            if (s, t, d) not in known
        ]

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
