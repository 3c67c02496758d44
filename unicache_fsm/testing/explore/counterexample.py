"""A counterexample: the shortest operation sequence found that breaks an invariant.

- `Counterexample.as_test()` — a pytest module that replays the path with the kit's
  `System` calls (it fails on its last line while the bug is there); it imports `Scope`
  and the helpers it calls from `unicache_fsm.testing.explore`.
- `Counterexample.trace()` — replay the path observing every machine: the transitions
  taken, each machine's last state, its spec.
- `Counterexample.diagrams()` — each machine the path drove, in Mermaid, its arrows
  labelled with how often the path took them and its last state highlighted.
"""

from __future__ import annotations

import contextlib
from typing import Any

import attrs

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.diagram import render_mermaid
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.spec import MachineSpec
from unicache_fsm.fsm.trace import TransitionCounter
from unicache_fsm.testing.explore.coverage import observing
from unicache_fsm.testing.explore.operations import Op, apply, fresh_namespace
from unicache_fsm.testing.explore.scope import Scope


@attrs.define
class Counterexample:
    """The shortest operation sequence found that breaks an invariant."""

    scope: Scope
    path: tuple[Op, ...]
    error: str

    def __len__(self) -> int:
        return len(self.path)

    def as_test(self, name: str = "test_explore_counterexample") -> str:
        """A pytest module that replays the path with the kit's `System` calls (it fails
        on the last line while the bug is there)."""
        lines = [
            f'"""Found by `unicache-fsm explore`: {self.error.splitlines()[0][:200]}"""',
            "",
            "from unicache_fsm.store.faults import FaultKind",
            "from unicache_fsm.testing.explore import Scope, inject, node_at, reverify",
            "from unicache_fsm.tree import EvictParams",
            "",
            "",
            f"def {name}() -> None:",
            f"    s = {self.scope.source()}.build()",
        ]
        for op in self.path:
            lines.append(f"    # {op.label}")
            lines += ["    " + line for line in op.code.splitlines()]
            lines.append("    s.audit()")
        used = ("EvictParams", "FaultKind", "corrupt", "inject", "node_at", "reverify")
        body = "\n".join(lines[8:])
        header = lines[:8]
        if "EvictParams" not in body:
            header.remove("from unicache_fsm.tree import EvictParams")
        helpers = [h for h in used[2:] if f"{h}(" in body]
        header[3] = f"from unicache_fsm.testing.explore import {', '.join(['Scope', *helpers])}"
        if "FaultKind" not in body:
            header.remove("from unicache_fsm.store.faults import FaultKind")
        return "\n".join([*header, *lines[8:]]) + "\n"

    def trace(self) -> tuple[Coverage, dict[str, str], dict[str, MachineSpec]]:
        """Replay the path, observing every machine: (transitions taken, each machine's
        last state, its spec)."""
        counter = TransitionCounter()
        last: dict[str, str] = {}
        specs: dict[str, MachineSpec] = {}

        def observe(ex: Executor, model: Any, source: str, trigger: str, dest: str) -> None:
            counter(ex, model, source, trigger, dest)
            last[ex.spec.name] = dest
            specs[ex.spec.name] = ex.spec

        ns = fresh_namespace(self.scope.build())
        with observing(ns["s"], observe):
            for op in self.path:
                with contextlib.suppress(Exception):
                    apply(op, ns, audit=False)
        return Coverage.from_counter(counter), last, specs

    def diagrams(self) -> str:
        """Mermaid diagrams of the machines the path drove: arrows labelled with how often
        it took them, each machine's last state highlighted."""
        cov, last, specs = self.trace()
        parts = []
        for name in sorted(specs):
            parts.append(f"%% {name}: last state {last[name]}")
            # a parallel machine's configuration lists one state per region: the first
            # region's is highlighted, the comment above names them all
            first = last[name].split(",")[0]
            parts.append(render_mermaid(specs[name], first, cov.declared(specs[name])))
        return "\n".join(parts)
