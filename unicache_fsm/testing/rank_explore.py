"""Exhaustive exploration of several ranks agreeing on what their stores can restore.

`unicache-fsm explore` (`testing.explore`) searches one rank. The linker's collective
calls (`linker.ranks.intersect_restorable`, `agree`) need every rank inside the call at
once, so this module searches a world of several ranks instead: `RankScope.build` makes
one real `System` per rank (tree, FULL+SWA pools, linker, its own `MemoryStore`), their
linkers joined by a `ThreadRankGroup`. Every state is reached by replaying its operation
path on a fresh world (paths are short; thread ranks cannot be copied mid-flight).

The alphabet (`enabled_rank_ops`), each one operation, a collective one running every
rank's call on its own thread at once (the threads meet at the group's barrier):

- ``compute k`` — every rank computes the key of the document's first k pages
  (`System.compute`), its write-through offload settled (the store runs it, the
  collective `poll_offloads` completes it): one single-rank `explore` already
  interleaves offloads with everything else;
- ``evict`` — memory pressure: every rank's tree evicts every page it can (the trees
  stay identical);
- ``store_evict R kv|swa [tokens]`` — rank R's store alone drops one page it holds (the
  KV or SWA page of that prefix's last page): the stores of the ranks now differ, as
  a store's own eviction makes them differ;
- ``match`` — every rank's `linker.match` of the whole document (plus one token past
  it), the LOOKUP whose restorable boundaries the ranks intersect, then
  `release_request` (collective): a request that looked up and went away.

Checked at every state: each rank's `System.audit` (with ``check_stored`` off: a store
loses pages on purpose and nothing LOOKUPs before the audit), and that the ranks' trees,
loads and offloads are one state (`explore.canonical` of each rank, without its store:
every decision that could differ is agreed). A ``match`` also checks its own outcome,
the rank-agreement invariant: every rank agreed on the same boundary, and it is the
largest that every rank's store could restore (`serving.invariants.
restorable_intersection` on each rank's own LOOKUP answer for the tail, asked of its
store right before the collective call, with the same transfers the linker builds).

`explore_ranks(scope, ...) -> RankReport` runs the breadth-first search (deduplicating
states by a fingerprint of every rank's canonical form, stores included); the first
violation is a shortest one. `RankWorldMachine` is the same alphabet as a Hypothesis
state machine (one rule step is one operation), for comparing shrunk lengths in one
unit.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from unicache_fsm import hashing
from unicache_fsm.linker.ranks import SingleRank, ThreadRankGroup
from unicache_fsm.pools.transfer import LinkerTransferPhase, PoolName
from unicache_fsm.serving.invariants import InvariantViolation, restorable_intersection
from unicache_fsm.serving.system import System
from unicache_fsm.store.faults import FaultPolicy
from unicache_fsm.testing.explore import EXTRA_TOKEN, Scope, canonical, snapshot
from unicache_fsm.testing.search import Successor, breadth_first, summary
from unicache_fsm.tree import EvictParams

__all__ = [
    "RankCounterexample",
    "RankOp",
    "RankReport",
    "RankScope",
    "RankWorldMachine",
    "apply_rank_op",
    "audit_world",
    "copy_world",
    "enabled_rank_ops",
    "explore_ranks",
    "rank_fingerprint",
    "replay_ranks",
]

_TIMEOUT = 10.0  # seconds a rank waits at the barrier for the others
# the harness cannot allocate (every rank alike: their trees are one state)
_REFUSALS = ("the FULL pool cannot hold", "the SWA pool cannot hold")


@attrs.frozen
class RankScope:
    """The tiny multi-rank world explored: `ranks` systems of `pages` FULL (and SWA)
    pages of `page_size` tokens, an SWA window of `window_pages` pages, and one
    document of `doc_pages` pages whose prefixes are the keys."""

    ranks: int = 2
    pages: int = 4
    doc_pages: int = 2
    window_pages: int = 1
    page_size: int = 1

    def __attrs_post_init__(self) -> None:
        for name in ("ranks", "pages", "doc_pages", "window_pages", "page_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"RankScope.{name} must be an int >= 1, got {value!r}"
                raise ValueError(msg)
        if not 2 <= self.ranks <= 4:
            msg = f"RankScope.ranks must be 2..4 (a small world), got {self.ranks}"
            raise ValueError(msg)

    def key(self, pages: int) -> tuple[int, ...]:
        """The document's first `pages` pages."""
        return tuple(100 + t for t in range(pages * self.page_size))

    def page_hashes(self) -> list[str]:
        """The store keys of the document's pages (a chain from the root)."""
        return hashing.page_hashes(self.key(self.doc_pages), self.page_size, None)

    def build(self) -> list[System]:
        """A fresh world: one system per rank, their linkers in one thread group."""
        groups = ThreadRankGroup.create(self.ranks, timeout=_TIMEOUT)
        world = []
        for group in groups:
            s = System.build(
                self.page_size,
                swa=True,
                full_pages=self.pages,
                swa_pages=self.pages,
                window_pages=self.window_pages,
                faults=FaultPolicy(),
                group=group,
            )
            s.check_stored = False  # a rank's store loses pages on purpose
            world.append(s)
        return world

    def one_rank(self) -> Scope:
        """The single-rank `explore.Scope` whose canonical form each rank is compared in."""
        return Scope(
            pages=self.pages,
            requests=1,
            page_size=self.page_size,
            swa=True,
            swa_pages=self.pages,
            window_pages=self.window_pages,
            key_pages=self.doc_pages,
            faults=(),
        )

    def source(self) -> str:
        return (
            f"RankScope(ranks={self.ranks}, pages={self.pages}, doc_pages={self.doc_pages}, "
            f"window_pages={self.window_pages}, page_size={self.page_size})"
        )

    def describe(self) -> str:
        return (
            f"{self.ranks} ranks, {self.pages} pages (P={self.page_size}), FULL+SWA (window "
            f"{self.window_pages} pages), keys: prefixes of a {self.doc_pages}-page document"
        )


# -- operations ---------------------------------------------------------------------------


@attrs.frozen
class RankOp:
    """One operation of the multi-rank world (see the module docstring)."""

    label: str
    kind: str  # compute, evict, store_evict, match
    pages: int = 0  # compute: the key's pages; store_evict: the page's position + 1
    rank: int = -1  # store_evict: the rank whose store drops the page
    pool: PoolName = PoolName.KV  # store_evict: which pool's page


def _together(world: Sequence[System], fn: Callable[[int, System], Any]) -> list[Any]:
    """``fn(rank, system)`` on one thread per rank at once (collective calls meet at
    the group's barrier); the first rank's exception is re-raised after all ended."""
    out: list[Any] = [None] * len(world)
    errors: list[BaseException | None] = [None] * len(world)

    def target(r: int) -> None:
        try:
            out[r] = fn(r, world[r])
        except BaseException as exc:  # re-raised on the caller's thread below
            errors[r] = exc

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(len(world))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_TIMEOUT + 10)
        if t.is_alive():
            msg = "a rank thread hung inside a collective call"
            raise RuntimeError(msg)
    for exc in errors:
        if exc is not None:
            raise exc
    return out


def enabled_rank_ops(world: Sequence[System], scope: RankScope) -> list[RankOp]:
    """Every operation the search may take from this state (see the module docstring)."""
    ops = [RankOp(f"compute {k}", "compute", pages=k) for k in range(1, scope.doc_pages + 1)]
    ops.append(RankOp("evict", "evict"))
    hashes = scope.page_hashes()
    for r, s in enumerate(world):
        for pool in (PoolName.KV, PoolName.SWA):
            for i, h in enumerate(hashes):
                if s.memory.contains(pool, h):
                    label = f"store_evict {r} {pool.value} {list(scope.key(i + 1))}"
                    ops.append(RankOp(label, "store_evict", pages=i + 1, rank=r, pool=pool))
    ops.append(RankOp("match", "match"))
    return ops


def _restorable(s: System, key: Sequence[int]) -> tuple[int, list[int]] | None:
    """(tail pages, this rank's store's LOOKUP answer) for the tail `linker.match` would
    look up for `key` now, asked with the transfers the linker builds; None when the
    linker would not look up (no whole page past the device prefix, or an anchor
    without a hash)."""
    p = s.page_size
    device = s.tree.match_prefix(tuple(key))
    hit = device.prefix_len
    tail = (len(key) - hit) // p
    if tail == 0:
        return None
    prior = device.last_device_node.last_hash() if hit else None
    if hit and prior is None:
        return None
    hashes = hashing.page_hashes(tuple(key[hit : hit + tail * p]), p, prior)
    lookup = LinkerTransferPhase.LOOKUP
    components = s.linker.components
    transfers = [c.build_external_linker_transfer(lookup, None, hashes) for c in components]
    found = s.store.lookup("rank-probe", [t for t in transfers if t is not None])
    return tail, list(found)


def _match(world: Sequence[System], scope: RankScope) -> None:
    key = (*scope.key(scope.doc_pages), EXTRA_TOKEN)
    asked = [_restorable(s, key) for s in world]

    def match(r: int, s: System) -> int:
        m = s.linker.match("m", key)
        hit = 0 if m.load is None else len(m.load.tail_hashes)
        s.linker.release_request("m")
        return hit

    agreed = _together(world, match)
    if len(set(agreed)) != 1:
        raise InvariantViolation("rank agreement", f"the ranks' LOOKUPs agreed on {agreed}")
    if all(a is not None for a in asked):
        tails = {a[0] for a in asked if a is not None}
        assert len(tails) == 1, f"the ranks' trees differ: tails {tails}"
        restorable_intersection([a[1] for a in asked if a is not None], tails.pop(), agreed[0])


def apply_rank_op(op: RankOp, world: Sequence[System], scope: RankScope) -> None:
    """Run `op` on the world (an error is a finding)."""
    if op.kind == "compute":
        key = scope.key(op.pages)
        _together(world, lambda r, s: s.compute(f"c{op.pages}", key))
    elif op.kind == "evict":
        for s in world:
            s.tree.evict(EvictParams(num_tokens=scope.pages * scope.page_size))
    elif op.kind == "store_evict":
        page = scope.page_hashes()[op.pages - 1]
        world[op.rank].store.evict([page], op.pool)
    elif op.kind == "match":
        _match(world, scope)
    else:
        msg = f"unknown rank operation kind {op.kind!r}"
        raise ValueError(msg)


def audit_world(world: Sequence[System], scope: RankScope) -> None:
    """Every rank's audit, and the ranks' trees, loads and offloads one state."""
    one = scope.one_rank()
    forms = set()
    for s in world:
        s.audit()
        form = canonical({"s": s}, one)
        forms.add(repr(form[:8]))  # the tree, loads, offloads, locks: not the store
    if len(forms) != 1:
        raise InvariantViolation("rank agreement", "the ranks' trees or records differ")


def replay_ranks(scope: RankScope, path: Sequence[RankOp]) -> list[System]:
    """A fresh world after `path` (no audits)."""
    world = scope.build()
    for op in path:
        apply_rank_op(op, world, scope)
    return world


def copy_world(world: Sequence[System]) -> list[System]:
    """An independent copy of the world (`explore.snapshot` of every rank's system), its
    linkers joined by a fresh thread group (a barrier cannot be copied)."""
    groups = [s.linker.group for s in world]
    for s in world:
        s.linker.group = SingleRank()  # not copied: replaced below
    try:
        copied: list[System] = snapshot({"s": list(world)})["s"]
    finally:
        for s, group in zip(world, groups, strict=True):
            s.linker.group = group
    for s, group in zip(copied, ThreadRankGroup.create(len(world), timeout=_TIMEOUT), strict=True):
        s.linker.group = group
    return copied


def rank_fingerprint(world: Sequence[System], scope: RankScope) -> bytes:
    """16 bytes standing for every rank's canonical form (its store included), in any
    order of the ranks: ranks are interchangeable (identical systems, the same calls,
    agreement by MIN), so a state and its ranks permuted are one state."""
    one = scope.one_rank()
    text = repr(sorted(repr(canonical({"s": s}, one)) for s in world))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


# -- the search --------------------------------------------------------------------------


@attrs.define
class RankCounterexample:
    """The shortest operation sequence found that breaks an invariant."""

    scope: RankScope
    path: tuple[RankOp, ...]
    error: str

    def __len__(self) -> int:
        return len(self.path)

    def replay(self) -> None:
        """Run the path again on a fresh world, auditing every state (raises the
        violation while the bug is there)."""
        world = self.scope.build()
        audit_world(world, self.scope)
        for op in self.path:
            apply_rank_op(op, world, self.scope)
            audit_world(world, self.scope)


@attrs.define
class RankReport:
    scope: RankScope
    states: int = 0
    transitions: int = 0
    refused: int = 0
    depth: int = 0
    exhausted: bool = False
    seconds: float = 0.0
    violation: RankCounterexample | None = None

    def summary(self) -> str:
        v = self.violation
        text = summary(
            scope=self.scope.describe(),
            states=self.states,
            transitions=self.transitions,
            refused=self.refused,
            depth=self.depth,
            timing=f"{self.seconds:.1f} s",
            violation=None if v is None else (len(v), v.error),
            exhausted=self.exhausted,
        )
        if v is None:
            return text
        return f"{text}\npath           {', '.join(op.label for op in v.path)}"


def explore_ranks(
    scope: RankScope,
    *,
    max_depth: int | None = None,
    minutes: float | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> RankReport:
    """Breadth-first search of every state of the multi-rank world (one process; each
    state is kept with its path until its successors are made, each on a `copy_world`).
    Stops at the first level holding a violation (a shortest one), when no new state
    appears, past `max_depth` operations, or after `minutes`."""
    start = time.perf_counter()
    deadline = None if minutes is None else start + minutes * 60.0
    report = RankReport(scope)
    root = scope.build()
    audit_world(root, scope)
    visited = {rank_fingerprint(root, scope)}

    def successors(parent: list[System]) -> Iterator[Successor[list[System]]]:
        ops = enabled_rank_ops(parent, scope)
        for k, op in enumerate(ops):
            world = parent if k == len(ops) - 1 else copy_world(parent)
            try:
                try:
                    apply_rank_op(op, world, scope)
                except AssertionError as exc:
                    if str(exc).startswith(_REFUSALS):
                        report.refused += 1
                        continue  # the tiny pools cannot serve it: not enabled here
                    raise
                digest = rank_fingerprint(world, scope)
                if digest not in visited:  # a state met before passed its audit
                    audit_world(world, scope)
            except Exception as exc:  # a finding
                yield Successor(op, None, f"{type(exc).__name__}: {exc}")
            else:
                yield Successor(op, digest, state=world)

    def expand(
        entries: Sequence[tuple[tuple[Any, ...], list[System] | None]],
    ) -> Iterator[Iterator[Successor[list[System]]]]:
        for _, parent in entries:
            assert parent is not None
            yield successors(parent)  # lazily: each digest is visited before the next audit

    # a frontier entry keeps its world (the worlds are tiny: no replays)
    out = breadth_first(
        root, visited, expand, max_depth=max_depth, deadline=deadline, progress=progress
    )
    report.depth, report.transitions, report.exhausted = out.depth, out.transitions, out.exhausted
    if out.violation is not None:
        path, error = out.violation
        report.violation = RankCounterexample(scope, path, error)
    report.states = len(visited)
    report.seconds = time.perf_counter() - start
    return report


# -- the same alphabet for Hypothesis ------------------------------------------------------


class RankWorldMachine(RuleBasedStateMachine):
    """The multi-rank world under Hypothesis, in the explorer's alphabet: each step runs
    one operation of `enabled_rank_ops` (drawn by its index in that list, so that
    Hypothesis shrinks towards the operations listed first), and every invariant of
    `audit_world` runs after each step; a step the tiny pools refuse does nothing.
    Pin the world with the class attribute `scope`."""

    scope: ClassVar[RankScope] = RankScope()

    def __init__(self) -> None:
        super().__init__()
        self.world: list[System] = []

    @initialize()
    def setup(self) -> None:
        self.world = type(self).scope.build()

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        scope = type(self).scope
        ops = enabled_rank_ops(self.world, scope)
        op = ops[data.draw(st.integers(0, len(ops) - 1))]
        try:
            apply_rank_op(op, self.world, scope)
        except AssertionError as exc:
            if not str(exc).startswith(_REFUSALS):
                raise  # (every rank refused alike: nothing changed)

    @invariant()
    def audited(self) -> None:
        if self.world:
            audit_world(self.world, type(self).scope)
