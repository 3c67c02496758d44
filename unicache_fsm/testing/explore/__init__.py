"""Exhaustive small-scope exploration of the real system (``unicache-fsm explore``).

Hypothesis samples the system's behaviours; this package enumerates them. Starting from
a fresh `System` (the kit's real tree, pools, linker, `MemoryStore` inside a
`FaultyStore`, machines) built for a tiny `Scope`, it runs a breadth-first search over
every interleaving of an alphabet of operations, checks every invariant of the kit
(`System.audit`) at every state it reaches, and reports the shortest operation sequence
that breaks one, printed as a runnable pytest test.

Each store fault of the `Scope` is one more variant of every operation that makes the
call it applies to, injected on exactly that call (`inject`); so "the store refuses this
load" and "this batch fails midway" are choices the search takes, not dice. The wild
faults, `RAISE_ERROR` and `GARBAGE_ANSWER`, may hit any call the linker makes: their
variants of an operation are one per eligible call it makes (the first, the second, ...)
and per option the store picks from there (`GARBAGE_ANSWER`: each wrong answer that call
has, a ``"false"`` verdict, None, a foreign batch, ...; `RAISE_ERROR`: two, since the
linker contains every exception type alike and only a cancel that did or did not reach
the store differs). The lying store's faults (`store.faults.LYING`: a completion count
one over or under the truth, a malformed completion, a reply lost after the work was
done, a batch id never started) are variants the same way, one per call they apply to
(and per malformed form of a completion): "the store said this batch was done while it
was still writing" is a state the search reaches on purpose. A lookup whose store evicts
after answering (``evict_after_lookup``) is followed by the LOOKUP that demotes what the
store lost, as ``store_evict`` is.

One concept per module, dependencies pointing down the list:

- `faults` — which faults apply to which calls; `inject` and its one-call policy.
- `scope` — `Scope`: the tiny configuration, and the system it builds.
- `helpers` — what an operation's statement calls: `reverify`, `node_at`, `corrupt`.
- `operations` — `Op`; a state as a namespace; `apply`, `replay`, `snapshot`; `Refused`.
- `variants` — an operation's fault variants (classic, wild, each wild answer).
- `alphabet` — `enabled_ops`: every operation enabled in a state (and the scope options
  that add operations).
- `fingerprint` — `canonical` forms and their 16-byte `fingerprint` (mirror images one).
- `coverage` — which transitions each new operation fires, per machine (`Coverage`, as
  ``unicache-fsm fuzz --coverage`` writes them).
- `expansion` — one state's successors, as a worker computes them (copies, replays and
  the exact shortcuts that skip work).
- `counterexample` — `Counterexample`: the path, as a pytest module and as diagrams.
- `report` — `Report`: what the search saw; its summary.
- `search` — `explore(scope, ...)`: the breadth-first search over worker processes.

Entry points: `explore(scope, ...) -> Report`; `Report.summary()`;
`Counterexample.as_test()` (a pytest module) and `Counterexample.diagrams()`. Helpers the
printed tests use, imported from here: `inject`, `node_at`, `reverify`, `corrupt`.

This package searches one rank. The linker's collective calls (`intersect_restorable`,
`agree`) need every rank inside the call at once: `testing.rank_explore` searches a
world of several ranks (one system each, collective calls on thread ranks).
"""

from __future__ import annotations

from unicache_fsm.testing.explore.alphabet import enabled_ops
from unicache_fsm.testing.explore.counterexample import Counterexample
from unicache_fsm.testing.explore.faults import inject
from unicache_fsm.testing.explore.fingerprint import canonical, fingerprint
from unicache_fsm.testing.explore.helpers import corrupt, node_at, reverify
from unicache_fsm.testing.explore.operations import Op, Refused, apply, replay, snapshot
from unicache_fsm.testing.explore.report import Report
from unicache_fsm.testing.explore.scope import EXTRA_TOKEN as EXTRA_TOKEN  # rank_explore's keys
from unicache_fsm.testing.explore.scope import Scope
from unicache_fsm.testing.explore.search import explore

__all__ = [
    "Counterexample",
    "Op",
    "Refused",
    "Report",
    "Scope",
    "apply",
    "canonical",
    "corrupt",
    "enabled_ops",
    "explore",
    "fingerprint",
    "inject",
    "node_at",
    "replay",
    "reverify",
    "snapshot",
]

# An exception prints with its module (a traceback names ``module.Class``) and the errors
# hierarchy in `unicache_fsm.fsm.errors` names it there: it keeps the public path it had
# before this package was split, not the file that defines it.
Refused.__module__ = __name__
