"""A search's report: what it saw, how far it went, and what it found (`Report`).

- `Report` — the scope, distinct states, transitions, operations refused by the tiny
  pools, depth, whether the search exhausted the space, time and workers, the
  violation (a `Counterexample`, or None) and the transitions covered.
- `Report.summary()` — the lines ``unicache-fsm explore`` prints.
- `Report.declared()` — (declared transitions reached, declared transitions) over the
  bundled specs.
"""

from __future__ import annotations

import attrs

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.testing.explore.counterexample import Counterexample
from unicache_fsm.testing.explore.scope import Scope
from unicache_fsm.testing.search import summary


@attrs.define
class Report:
    """What one search saw and found; `summary()` is what the CLI prints."""

    scope: Scope
    states: int = 0
    transitions: int = 0
    refused: int = 0
    depth: int = 0
    exhausted: bool = False
    seconds: float = 0.0
    workers: int = 1
    violation: Counterexample | None = None
    coverage: Coverage = attrs.field(factory=Coverage)

    @property
    def rate(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else 0.0

    def declared(self) -> tuple[int, int]:
        """(declared transitions reached, declared transitions) over the bundled specs."""
        from unicache_fsm.fsm import loader

        arrows = missing = 0
        for name in loader.bundled_machines():
            spec = loader.bundled_spec(name)
            arrows += len(self.coverage.declared(spec))
            missing += len(self.coverage.missing(spec))
        return arrows - missing, arrows

    def summary(self) -> str:
        reached, arrows = self.declared()
        v = self.violation
        return summary(
            scope=self.scope.describe(),
            states=self.states,
            transitions=self.transitions,
            refused=self.refused,
            depth=self.depth,
            timing=f"{self.seconds:.1f} s, {self.rate:.0f} states/s, {self.workers} worker(s)",
            violation=None if v is None else (len(v), v.error),
            exhausted=self.exhausted,
            extra=[f"coverage       {reached}/{arrows} declared transitions reached"],
        )
