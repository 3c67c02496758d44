"""One expansion: every successor of one state, as a worker process computes it.

- `expand_state(scope, path, run)` — replay `path` once on a fresh system (without the
  audits, which passed the first time), then run each enabled operation on a copy of
  that state, the last one on the state itself: (successors with their fingerprints or
  findings, operations refused, transition counts). `expand_job` takes the arguments as
  one tuple (what a worker pool maps).
- `SNAPSHOT_AFTER` — below this many operations a replay of the path is cheaper than a
  `snapshot` (``copy.deepcopy``'s semantics with fast paths, `unicache_fsm.copying.deep`)
  and is used instead.

Exact shortcuts, each for this system: an operation whose successor has the parent's own
fingerprint (a self-loop: an eviction with nothing to evict, a `finish` with nothing
landed; about half of all operations) leaves a copy that is the parent's state still,
and the next operation runs on it instead of a fresh copy (states of one fingerprint are
one state). A fault variant whose fault finds no store call to apply to (counted, not
injected, while the plain operation runs) is the plain operation and is not taken again;
a wild fault's variants are made from those counts, and its further answers from the
options its first answer saw (none is refused). A worker audits a fingerprint once per
search (`run`): the same state met through another path passed its audit already.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from unicache_fsm.serving.system import System
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule
from unicache_fsm.testing.explore.alphabet import enabled_ops
from unicache_fsm.testing.explore.coverage import Gate, observing_globals, system_executors
from unicache_fsm.testing.explore.faults import NEVER, OPTIONS, WILD_FAULTS
from unicache_fsm.testing.explore.fingerprint import fingerprint
from unicache_fsm.testing.explore.operations import (
    Op,
    Refused,
    apply,
    fresh_namespace,
    snapshot,
)
from unicache_fsm.testing.explore.scope import Scope
from unicache_fsm.testing.explore.variants import other_answers, wild_variants
from unicache_fsm.testing.search import Successor

# a snapshot costs about as much as building a system and replaying this many operations
SNAPSHOT_AFTER = 4


def _reach(scope: Scope, path: Sequence[Op], gate: Gate) -> dict[str, Any]:
    """A fresh system after `path`, its own machines observed by `gate` (off meanwhile)."""
    ns = fresh_namespace(scope.build())
    on, gate.on = gate.on, False
    for ex in system_executors(ns["s"])[:3]:
        ex.add_observer(gate)
    for op in path:
        apply(op, ns, audit=False)
    gate.on = on
    return ns


def _apply_counting(
    op: Op, ns: dict[str, Any], scope: Scope, eligible: dict[str, dict[FaultKind, int]]
) -> None:
    """Run the plain `op`, counting (never injecting) the store calls each fault of the
    scope could apply to; ``eligible[op.label]`` gets, per fault that had one, how many
    (a variant whose fault finds no call is the plain op again). If `op` raises, every
    classic variant is tried, and a wild fault's on the calls made until it raised (a
    fault on one call leaves the calls before it as they were)."""
    policy = FaultPolicy({kind: FaultRule(every=NEVER) for kind in scope.faults})
    s: System = ns["s"]
    s.faulty.policy = policy
    try:
        apply(op, ns, audit=False)
    except BaseException:
        eligible[op.label] = {kind: max(1, policy.calls(kind)) for kind in scope.faults}
        for kind in WILD_FAULTS:
            if kind in scope.faults and not policy.calls(kind):
                del eligible[op.label][kind]
        raise
    finally:
        s.faulty.policy = FaultPolicy()
    eligible[op.label] = {kind: policy.calls(kind) for kind in scope.faults if policy.calls(kind)}


# fingerprints of the states this process has audited, per search (a state met again
# through another path is the same state: its audit passed the first time)
_AUDITED: dict[str, set[bytes]] = {}


def expand_state(
    scope: Scope, path: tuple[Op, ...], run: str = ""
) -> tuple[list[Successor[None]], int, Counter[Any]]:
    """Every successor of the state `path` reaches: (children, refused, transition counts).

    Each operation runs on a copy of that state: a `snapshot` of it when the path is
    long, a replay of the path when it is short (cheaper there); the last operation
    runs on the state itself."""
    if run not in _AUDITED:
        _AUDITED.clear()
        _AUDITED[run] = set()
    audited = _AUDITED[run]
    gate = Gate()
    children: list[Successor[None]] = []
    refused = 0
    parent = _reach(scope, path, gate)
    wild = scope.wild
    with observing_globals(gate):
        ops = enabled_ops(parent, scope)
        home = fingerprint(parent, scope)
        faulted = {op.label.rpartition("[")[0] for op in ops if op.fault is not None}
        eligible: dict[str, dict[FaultKind, int]] = {}
        plains: dict[str, Op] = {}
        spare: dict[str, Any] | None = None  # a copy still in the parent's state
        gate.on = True
        k = 0
        while k < len(ops):
            op = ops[k]
            k += 1
            plain = op.label.rpartition("[")[0]
            counted = op.fault is None and (wild or op.label in faulted)
            if op.fault is not None and not op.call and op.fault not in eligible.get(plain, ()):
                continue  # the fault finds no call to apply to: this is the plain op
            if spare is not None:
                ns = spare
            elif k == len(ops) and not (counted and wild) and not (op.call and not op.answer):
                ns = parent
            elif len(path) >= SNAPSHOT_AFTER:
                ns = snapshot(parent)
            else:
                ns = _reach(scope, path, gate)
            spare = None
            try:
                if counted:
                    try:
                        _apply_counting(op, ns, scope, eligible)
                    finally:  # its wild variants run next
                        plains[op.label] = op
                        ops[k:k] = wild_variants(op, eligible.get(op.label, {}))
                elif op.call and not op.answer:
                    OPTIONS[:] = [0]
                    try:
                        apply(op, ns, audit=False)
                    finally:  # its other answers run next
                        ops[k:k] = other_answers(op, plains[plain], OPTIONS[0])
                else:
                    apply(op, ns, audit=False)
                digest = fingerprint(ns, scope)
                if digest not in audited:
                    ns["s"].audit()
                    audited.add(digest)
            except Refused:
                refused += 1
            except Exception as exc:  # a finding: an invariant or a crash of the real code
                children.append(Successor(op, None, f"{type(exc).__name__}: {exc}"))
            else:
                children.append(Successor(op, digest))
                if digest == home and ns is not parent:
                    spare = ns  # a self-loop: the copy is the parent's state still
    return children, refused, gate.counter.counts


def expand_job(
    args: tuple[Scope, tuple[Op, ...], str],
) -> tuple[list[Successor[None]], int, Counter[Any]]:
    """`expand_state` of one job tuple (what a worker pool maps)."""
    return expand_state(*args)
