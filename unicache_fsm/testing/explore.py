"""Exhaustive small-scope exploration of the real system (``unicache-fsm explore``).

Hypothesis samples the system's behaviours; this module enumerates them. Starting from
a fresh `System` (the kit's real tree, pools, linker, `MemoryStore` inside a
`FaultyStore`, machines) built for a tiny `Scope`, it runs a breadth-first search over
every interleaving of an alphabet of operations, checks every invariant of the kit
(`System.audit`) at every state it reaches, and reports the shortest operation sequence
that breaks one, printed as a runnable pytest test.

The alphabet (`enabled_ops`): per request, its `begin` (LOOKUP: match and lock the device
prefix), `load_back` (LOAD + PREPARE), `release` (the request goes away mid-load) and
`complete` (use the committed load or recompute, insert, offload write-through); per
request key, `compute` (insert computed KV, offload write-through); the linker's
`start` (a load batch), the store's `progress`, `finish` (land/commit/abort loads),
`poll` (offload completions); `evict` of one FULL (and one SWA) page; `store_evict` of
a stored node's last page and `store_lose` of a loading page (each followed by the
LOOKUP that demotes what the store lost); `reset`; and with a host tier `backup` and
`host_load`. Each store fault of the `Scope` is one more variant of every operation
that makes the call it applies to, injected on exactly that call (`inject`); so "the
store refuses this load" and "this batch fails midway" are choices the search takes,
not dice. The wild faults, `RAISE_ERROR` and `GARBAGE_ANSWER`, may hit any call the
linker makes: their variants of an operation are one per eligible call it makes (the
first, the second, ...) and per option the store picks from there (`GARBAGE_ANSWER`:
each wrong answer that call has, a ``"false"`` verdict, None, a foreign batch, ...;
`RAISE_ERROR`: two, since the linker contains every exception type alike and only a
cancel that did or did not reach the store differs). The lying store's faults
(`store.faults.LYING`: a completion count one over or under the truth, a malformed
completion, a reply lost after the work was done, a batch id never started) are
variants the same way, one per call they apply to (and per malformed form of a
completion): "the store said this batch was done while it was still writing" is a
state the search reaches on purpose. An operation that the tiny pools
cannot serve (the harness cannot allocate) is not enabled there.

Scope options add operations (each off by default, so a scope without them keeps its
states): ``unpinned``, per request a `begin` that leaves its matched prefix unpinned
until its LOAD (what other operations do to the prefix in that gap, the LOAD must
notice); ``corrupt``, per stored node a `corrupt` of its last KV page in the store;
``store_pages``, a store of that many pages that evicts for room from chain ends (the
audit then checks that the store's chains stay whole, until an operation removes a
page from a chain's middle on purpose); ``unrelated``, a `compute u` of a one-page key
whose first page no request shares, not offloaded (another prefix that takes the slots
evictions free, so that a prefix evicted and loaded back lands in other slots).
``swa_checkpoint`` (K pages, 0 off) adds no operation but changes what every compute
keeps: the SWA window ending at every K-page checkpoint too (`tree.swa_checkpoints`).

States are canonicalised (`canonical`): the tree's shape and keys, each node's
residency, locks, hash/backup/offload marks, the relative order of its last access,
and its FULL / SWA / host slots renamed in order of first appearance (slots are opaque
handles, so free-list order is not part of a state); every load's state, anchor, the
device prefix it matched (in the same slot names: an anchor moved into other slots
since is another state), reserved slots and batch; the offload records; the harness's
requests and locks; the store's contents and its in-flight work
(`FaultyStore.pending`); with a capacity store or corruption, the store's chain books
(`BaseStore.chain_books`: parents, eviction order, remembered parents) and which pages
are corrupt, and with a capacity store what the chain audit has learnt to exempt
(`System.chain_exemptions`). A state is kept as a 16-byte BLAKE2b fingerprint of that
form, so memory grows with 16 bytes per state plus the current and next frontier.

Reaching a state: a frontier entry is its operation path. A worker replays the path
once on a fresh `System` (without the audits, which passed the first time), then runs
each enabled operation on a `snapshot` of that state (``copy.deepcopy`` of the system
and the requests together: compiled executors rebind their steps to the copied
handler, a store copies its books with fresh locks), the last operation on the state
itself; below `_SNAPSHOT_AFTER` operations a replay is cheaper than a copy and is used
instead. An operation whose successor has the parent's own fingerprint (a self-loop:
an eviction with nothing to evict, a `finish` with nothing landed; about half of all
operations) leaves a copy that is the parent's state still, and the next operation runs
on it instead of a fresh copy (exact for the same reason deduplication is: states of one
fingerprint are one state). The copy itself is ``copy.deepcopy``'s semantics with fast
paths (`unicache_fsm.copying.deep`, which the store's and the allocator's copy hooks use
for their fields too): containers, project classes without copy hooks of their own, and
tensors (each storage cloned once, every tensor on it, views included, rebuilt at its
offset and strides). Every successor of one state is independent, so a level's frontier
is split across worker processes (``workers``; by default one per core): each returns
fingerprints, the main process deduplicates.

Reductions, each exact for this system: hit counts are recorded only up to the
write-through threshold (1), past which they change nothing; when every request asks
for the same key (``key_pages=1``) the fingerprint is the least over the orders of the
requests (a state and its mirror image are one state); a fault variant whose fault
finds no store call to apply to (counted, not injected, while the plain operation runs)
is the plain operation and is not taken again (a wild fault's variants are made from
those counts, and its further answers from the options its first answer saw: none is
refused); and a worker audits a fingerprint once
(the same state met through another path passed its audit already). A lookup whose
store evicts after answering (``evict_after_lookup``) is followed by the LOOKUP that
demotes what the store lost, as ``store_evict`` is.

Coverage: the transitions each new operation fires (not the replays) are counted per
machine, as `unicache-fsm fuzz --coverage` writes them (`Coverage`).

Entry points: `explore(scope, ...) -> Report`; `Report.summary()`;
`Counterexample.as_test()` (a pytest module) and `Counterexample.diagrams()` (each
machine the path touched, in Mermaid, its arrows labelled with how often the path took
them and its last state highlighted). Helpers the printed tests use: `inject`,
`node_at`, `reverify`, `corrupt`.

This module searches one rank. The linker's collective calls (`intersect_restorable`,
`agree`) need every rank inside the call at once: `testing.rank_explore` searches a
world of several ranks (one system each, collective calls on thread ranks).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import multiprocessing
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import torch

from unicache_fsm.copying import deep
from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.diagram import render_mermaid
from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.fsm.executor import Executor, ExecutorBase
from unicache_fsm.fsm.spec import MachineSpec
from unicache_fsm.fsm.trace import TransitionCounter
from unicache_fsm.linker.load import ExternalLoad, LoadState
from unicache_fsm.pools.transfer import ComponentType, PoolName
from unicache_fsm.serving.request import Request
from unicache_fsm.serving.system import System
from unicache_fsm.store import jobs
from unicache_fsm.store.checksum import page_checksum
from unicache_fsm.store.faults import LYING, FaultKind, FaultPolicy, FaultRule
from unicache_fsm.testing.search import Successor, breadth_first, summary
from unicache_fsm.tree import EvictParams
from unicache_fsm.tree.node import TreeNode

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

FULL, SWA = ComponentType.FULL, ComponentType.SWA
EXTRA_TOKEN = 7  # a request asks for its key plus one token past it (a partial page)
_REFUSALS = ("the FULL pool cannot hold", "the SWA pool cannot hold")

# which fault kinds apply to which operation's calls
_LOOKUP_FAULTS = (FaultKind.FAIL_LOOKUP, FaultKind.EVICT_AFTER_LOOKUP)
_LOAD_FAULTS = (FaultKind.REFUSE_LOAD,)
_BATCH_FAULTS = (FaultKind.FAIL_BATCH_BEFORE_START, FaultKind.FAIL_BATCH_MIDWAY)
_OFFLOAD_FAULTS = (FaultKind.REFUSE_OFFLOAD, FaultKind.FAIL_OFFLOAD)
_PROGRESS_FAULTS = (FaultKind.DELAY_COMPLETION,)
_LOSING_FAULTS = (FaultKind.EVICT_AFTER_LOOKUP,)  # the store drops pages itself
# the faults that may hit any call the linker makes, each on one call of the search's
# choosing, answering the option it chooses (`inject`): how many options are explored
# (RAISE_ERROR: the linker contains every exception type alike, so two options cover the
# one choice that matters, a cancel that reached the store or not; GARBAGE_ANSWER: the
# longest list of wrong answers a call has). The lying store's kinds (`LYING`) hit the
# calls they apply to the same way, one call of the search's choosing at a time (a count
# of completions, a pop, a call whose reply is lost, a start), with every malformed form
# of a completion (MALFORMED_COMPLETION: the longest list a pop has)
_WILD_FAULTS = {
    FaultKind.RAISE_ERROR: 2,
    FaultKind.GARBAGE_ANSWER: 6,
    FaultKind.OVERCOUNT_COMPLETIONS: 1,
    FaultKind.UNDERCOUNT_COMPLETIONS: 1,
    FaultKind.MALFORMED_COMPLETION: 6,
    FaultKind.LOST_REPLY: 1,
    FaultKind.UNKNOWN_BATCH: 1,
}
assert set(_WILD_FAULTS) == {FaultKind.RAISE_ERROR, FaultKind.GARBAGE_ANSWER, *LYING}
# the faults after which no LOOKUP can be trusted to tell what the store still holds
_UNTRUSTED = (FaultKind.RAISE_ERROR, FaultKind.GARBAGE_ANSWER)


# -- scope -------------------------------------------------------------------------------


@attrs.frozen
class Scope:
    """The tiny configuration explored: pools, requests, keys, host tier, faults.

    Request ``i`` asks for ``key_pages`` pages: the first page is shared by every request
    (so paths split), the rest are its own. `faults` lists the store faults the search
    may inject (each on one call of its choosing).
    """

    pages: int = 4
    requests: int = 2
    page_size: int = 1
    swa: bool = True
    swa_pages: int = 4
    window_pages: int = 1
    key_pages: int = 2
    host_pages: int = 0
    faults: tuple[FaultKind, ...] = tuple(FaultKind)
    unpinned: bool = False
    corrupt: bool = False
    store_pages: int = 0
    unrelated: bool = False
    swa_checkpoint: int = 0

    def __attrs_post_init__(self) -> None:
        for name in ("pages", "requests", "page_size", "key_pages", "swa_pages", "window_pages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"Scope.{name} must be an int >= 1, got {value!r}"
                raise ValueError(msg)
        for name in ("host_pages", "store_pages", "swa_checkpoint"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                msg = f"Scope.{name} must be an int >= 0, got {value!r}"
                raise ValueError(msg)
        for name in ("unpinned", "corrupt", "unrelated"):
            if not isinstance(getattr(self, name), bool):
                msg = f"Scope.{name} must be a bool, got {getattr(self, name)!r}"
                raise ValueError(msg)
        if self.requests > 9:
            msg = f"Scope.requests must be at most 9 (a small scope), got {self.requests}"
            raise ValueError(msg)

    @property
    def symmetric(self) -> bool:
        """Whether every request asks for the same key (so requests are interchangeable)."""
        return self.key_pages == 1 and self.requests <= 3

    def key(self, i: int) -> tuple[int, ...]:
        p = self.page_size
        tokens = [100 + t for t in range(p)]
        for j in range(1, self.key_pages):
            tokens += [1000 * (i + 1) + 10 * j + t for t in range(p)]
        return tuple(tokens)

    @property
    def unrelated_key(self) -> tuple[int, ...]:
        """The one-page key `compute u` computes (with `unrelated`): a first page no
        request's key shares."""
        return tuple(200 + t for t in range(self.page_size))

    def build(self) -> System:
        """A fresh system of this scope, with an (inactive) fault wrapper.

        With a store of `store_pages` pages (which drops pages for room on its own, and
        nothing LOOKUPs before an audit), or with faults that raise or answer garbage (a
        LOOKUP that should demote what the store lost may fail), the audit checks the
        pages the store acknowledged, not those it still holds (`System.check_stored`);
        with a capacity store, also that its chains stay whole (`System.check_chains`,
        until an operation removes a page from a chain's middle on purpose)."""
        s = System.build(
            self.page_size,
            swa=self.swa,
            full_pages=self.pages,
            swa_pages=self.swa_pages,
            window_pages=self.window_pages,
            faults=FaultPolicy(),
            host_pages=self.host_pages,
            capacity_pages=self.store_pages or None,
            swa_checkpoint=self.swa_checkpoint,
        )
        if self.store_pages or any(kind in self.faults for kind in _UNTRUSTED):
            s.check_stored = False
        if self.store_pages:
            s.check_chains = True
        return s

    @property
    def wild(self) -> bool:
        """Whether a fault of the scope hits one call of the search's choosing (it may
        raise or answer garbage on any call, or lie about its work)."""
        return any(kind in self.faults for kind in _WILD_FAULTS)

    def source(self) -> str:
        """This scope as a Python expression."""
        kinds = ", ".join(f"FaultKind.{k.name}" for k in self.faults)
        faults = f"({kinds},)" if len(self.faults) == 1 else f"({kinds})"
        return (
            f"Scope(pages={self.pages}, requests={self.requests}, "
            f"page_size={self.page_size}, swa={self.swa}, swa_pages={self.swa_pages}, "
            f"window_pages={self.window_pages}, key_pages={self.key_pages}, "
            f"host_pages={self.host_pages}, faults={faults}{self._options()})"
        )

    def _options(self) -> str:
        """The options that add operations, as keyword arguments (those switched on)."""
        parts = [f", {name}=True" for name in ("unpinned", "corrupt") if getattr(self, name)]
        if self.store_pages:
            parts.append(f", store_pages={self.store_pages}")
        if self.unrelated:
            parts.append(", unrelated=True")
        if self.swa_checkpoint:
            parts.append(f", swa_checkpoint={self.swa_checkpoint}")
        return "".join(parts)

    def describe(self) -> str:
        faults = ",".join(k.value for k in self.faults) or "none"
        kind = f"FULL+SWA (window {self.window_pages} pages)" if self.swa else "FULL only"
        if self.swa and self.swa_checkpoint:
            kind += f", SWA checkpoints every {self.swa_checkpoint} pages"
        extra = "".join(
            [
                ", unpinned matches" if self.unpinned else "",
                ", corrupt pages" if self.corrupt else "",
                f", store of {self.store_pages} pages" if self.store_pages else "",
                ", an unrelated key" if self.unrelated else "",
            ]
        )
        return (
            f"{self.pages} pages (P={self.page_size}), {self.requests} requests of "
            f"{self.key_pages} pages, {kind}, "
            f"host {self.host_pages} pages, faults {faults}{extra}"
        )


# -- helpers the operations (and the printed tests) use -----------------------------------


@contextlib.contextmanager
def inject(s: System, kind: FaultKind, *, call: int = 0, answer: int = 0) -> Iterator[None]:
    """Inject `kind` on every eligible store call inside the block (one call, in practice);
    with `call` (>= 1) on the `call`-th eligible call only, where the store's every pick
    among wrong answers (or exception types) takes option number `answer`."""
    one = _OneCall(kind, call, answer) if call else None
    s.faulty.policy = one or FaultPolicy({kind: FaultRule(every=1)}, delay_steps=1)
    try:
        yield
    finally:
        s.faulty.policy = FaultPolicy()
        if one is not None:
            _OPTIONS[:] = [one.options]


# how many options the last `inject(call=...)` block's faulted call had to pick from (the
# fewest over its picks; 0: it picked nothing), so that the search takes each of them
_OPTIONS: list[int] = [0]


class _NoSuchAnswer(BaseException):
    """The faulted call has fewer options than `inject`'s `answer`: the variant does not
    exist. A `BaseException`, so that the linker's containment of store faults (which
    takes every `Exception`) lets it through to `apply`, which refuses the operation."""


class _OneCall(FaultPolicy):
    """Fires `kind` on its `call`-th eligible call only; every pick takes option `answer`."""

    __slots__ = ("answer", "call", "kind", "options")

    def __init__(self, kind: FaultKind, call: int, answer: int) -> None:
        super().__init__({kind: FaultRule(every=_NEVER)}, delay_steps=1)
        self.kind, self.call, self.answer = kind, call, answer
        self.options = 0

    def roll(self, kind: FaultKind) -> bool:
        super().roll(kind)  # counts the eligible call (never fires)
        hit = kind is self.kind and self.calls(kind) == self.call
        if hit:
            self.injected[kind] += 1
        return hit

    def pick(self, options: Sequence[object]) -> object:
        self.options = min(self.options or len(options), len(options))
        if self.answer >= len(options):
            msg = f"{self.kind.value}: this call has {len(options)} options, not {self.answer + 1}"
            raise _NoSuchAnswer(msg)
        return options[self.answer]


def corrupt(s: System, key: str) -> None:
    """Flip the first bytes of the KV page `key` the memory store holds (a bad disk)."""
    view = s.memory.stored_bytes(PoolName.KV, key)
    assert view is not None, f"the store holds no KV page {key!r}"
    view[:8] ^= 0xFF


def reverify(s: System) -> None:
    """The LOOKUP that demotes every stored node the store lost pages of."""
    for node in s.stored_nodes():
        s.linker.verify_stored(node)


def node_at(s: System, tokens: Sequence[int]) -> TreeNode:
    """The tree node whose path from the root spells exactly `tokens`."""
    want = tuple(tokens)
    for node in s.tree.nodes():
        if node.end == len(want) and _path_key(node) == want:
            return node
    msg = f"no tree node ends at {want}"
    raise LookupError(msg)


def _path_key(node: TreeNode) -> tuple[int, ...]:
    key: tuple[int, ...] = ()
    for n in node.path_from_root():
        key += tuple(n.key)
    return key


# -- operations -------------------------------------------------------------------------


@attrs.frozen
class Op:
    """One operation: a label for reports and the Python statement that performs it
    (run with ``s``, the system, and ``r0, r1, ...``, the requests, in scope)."""

    label: str
    code: str
    fault: FaultKind | None = None  # a variant: the fault injected on the plain op's call
    call: int = 0  # a wild fault's variant: the eligible call it hits (1, 2, ...)
    answer: int = 0  # ... and the option each of the store's picks takes there


_COMPILED: dict[str, Any] = {}


def _faulted(op: Op, kinds: Sequence[FaultKind], scope: Scope) -> list[Op]:
    """`op`, and one variant per fault of the scope that applies to its calls."""
    out = [op]
    for kind in kinds:
        if kind in scope.faults:
            code = f"with inject(s, FaultKind.{kind.name}):\n    " + op.code.replace("\n", "\n    ")
            if kind in _LOSING_FAULTS:
                code += _punched(scope)
                if "reverify(s)" not in op.code:
                    code += "\nreverify(s)"  # the LOOKUP that demotes what the store lost
            out.append(Op(f"{op.label}[{kind.value}]", code, kind))
    return out


def _punched(scope: Scope) -> str:
    """With a capacity store: the statement that stops the audit checking that chains
    stay whole (a page was removed from a chain's middle on purpose), else nothing."""
    return "\ns.check_chains = False" if scope.store_pages else ""


def _wild(op: Op, calls: dict[FaultKind, int]) -> list[Op]:
    """The variants of the plain `op` for the wild faults of the scope: one per eligible
    call it made (`calls`, counted while it ran), each answering its first option (the
    others follow from `_answers` once the call showed how many it has)."""
    return [
        _wild_variant(op, kind, call, 0)
        for kind in _WILD_FAULTS
        for call in range(1, calls.get(kind, 0) + 1)
    ]


def _answers(variant: Op, plain: Op, options: int) -> list[Op]:
    """The other answers of a wild `variant` (its first answer ran and saw `options`),
    up to the number `_WILD_FAULTS` explores for its kind."""
    assert variant.fault is not None
    top = min(options, _WILD_FAULTS[variant.fault])
    return [_wild_variant(plain, variant.fault, variant.call, j) for j in range(1, top)]


def _wild_variant(op: Op, kind: FaultKind, call: int, answer: int) -> Op:
    args = f"FaultKind.{kind.name}, call={call}, answer={answer}"
    code = f"with inject(s, {args}):\n    " + op.code.replace("\n", "\n    ")
    return Op(f"{op.label}[{kind.value}@{call}#{answer}]", code, kind, call, answer)


def _requests(ns: dict[str, Any], scope: Scope) -> list[tuple[int, Request | None]]:
    return [(i, ns.get(f"r{i}")) for i in range(scope.requests)]


def enabled_ops(ns: dict[str, Any], scope: Scope) -> list[Op]:
    """Every operation the search may take from the state in `ns` (see the module doc)."""
    s: System = ns["s"]
    lk = s.linker
    ops: list[Op] = []
    for i, req in _requests(ns, scope):
        key = scope.key(i)
        compute = Op(f"compute {i}", f"s.compute('c{i}', {key}, settle=False)")
        ops += _faulted(compute, _OFFLOAD_FAULTS, scope)
        if req is None:
            begin = Op(f"begin {i}", f"r{i} = s.begin('r{i}', {(*key, EXTRA_TOKEN)}, load=False)")
            ops += _faulted(begin, _LOOKUP_FAULTS, scope)
            if scope.unpinned:  # nothing pins the matched prefix until the LOAD
                code = f"r{i} = s.begin('r{i}', {(*key, EXTRA_TOKEN)}, load=False, lock=False)"
                ops += _faulted(Op(f"begin {i} unpinned", code), _LOOKUP_FAULTS, scope)
            continue
        if req.rid not in s.requests:
            continue  # completed
        load = req.load
        if load is not None and load.state == LoadState.IDLE and not req.prepared:
            lb = Op(f"load_back {i}", f"r{i}.prepared = s.linker.load_back(r{i}.load)")
            ops += _faulted(lb, _LOAD_FAULTS, scope)
        if load is not None and load.in_flight and load.abort_pending is None:
            ops.append(Op(f"release {i}", f"s.linker.release_request('r{i}')"))
            ops.append(
                Op(
                    f"store_lose {i}",
                    f"s.store.evict([r{i}.load.tail_hashes[-1]]){_punched(scope)}\nreverify(s)",
                )
            )
        if load is None or not load.in_flight:
            complete = Op(f"complete {i}", f"s.complete(r{i}, settle=False)")
            ops += _faulted(complete, _OFFLOAD_FAULTS, scope)
    if any(ld.state == LoadState.QUEUED for ld in lk.loads.values()):
        ops += _faulted(Op("start", "s.linker.start_loading()"), _BATCH_FAULTS, scope)
    if s.in_flight():
        ops += _faulted(Op("progress", "s.store.progress()"), _PROGRESS_FAULTS, scope)
        ops.append(Op("finish", "s.finish_loads()\nreverify(s)"))
    if lk.offloads:
        ops.append(Op("poll", "s.linker.poll_offloads()\nreverify(s)"))
    if scope.unrelated:  # another prefix, not offloaded: it takes what evictions freed
        ops.append(Op("compute u", f"s.compute('cu', {scope.unrelated_key}, offload=False)"))
    p = scope.page_size
    ops.append(Op("evict", f"s.tree.evict(EvictParams(num_tokens={p}))"))
    if scope.swa:
        ops.append(Op("evict_swa", f"s.tree.evict(EvictParams(swa_num_tokens={p}))"))
    for node in sorted(s.stored_nodes(), key=_path_key):
        path = _path_key(node)
        last = f"node_at(s, {path}).hashes[-1]"
        ops.append(
            Op(
                f"store_evict {list(path)}",
                f"s.store.evict([{last}]){_punched(scope)}\nreverify(s)",
            )
        )
        if scope.corrupt and node.hashes and s.memory.contains(PoolName.KV, node.hashes[-1]):
            ops.append(Op(f"corrupt {list(path)}", f"corrupt(s, {last})"))
    if lk.busy() or lk.loads:
        ops.append(Op("reset", "s.linker.reset()"))
    if scope.host_pages:
        for node in sorted(s.tree.nodes(), key=_path_key):
            if node is s.tree.root:
                continue
            path = _path_key(node)
            if node.device_resident and not node.backuped and not node.offloading:
                ops.append(Op(f"backup {list(path)}", f"s.tree.backup(node_at(s, {path}))"))
            if node.evicted and node.backuped:
                ops.append(Op(f"host_load {list(path)}", f"s.tree.load_back(node_at(s, {path}))"))
    return ops


def _namespace(s: System) -> dict[str, Any]:
    return {
        "s": s,
        "EvictParams": EvictParams,
        "FaultKind": FaultKind,
        "inject": inject,
        "node_at": node_at,
        "reverify": reverify,
        "corrupt": corrupt,
    }


def _run(op: Op, ns: dict[str, Any]) -> None:
    code = _COMPILED.get(op.code)
    if code is None:
        code = _COMPILED[op.code] = compile(op.code, f"<op {op.label}>", "exec")
    exec(code, ns)  # the operation's statement, the same text the printed test runs


class Refused(UnicacheFsmError):
    """The tiny pools cannot serve the operation: it is not enabled in that state."""


def apply(op: Op, ns: dict[str, Any], *, audit: bool = True) -> None:
    """Run `op` on the system in `ns`, then (with `audit`) check every invariant.

    Raises `Refused` when the harness cannot allocate; any other exception is a finding.
    """
    try:
        _run(op, ns)
    except AssertionError as exc:
        if str(exc).startswith(_REFUSALS):
            raise Refused(str(exc)) from exc
        raise
    except _NoSuchAnswer as exc:  # a wild fault's answer the call does not have
        raise Refused(str(exc)) from exc
    if audit:
        ns["s"].audit()


def replay(scope: Scope, path: Sequence[Op]) -> dict[str, Any]:
    """A fresh system of `scope` after `path` (no audits: the path was checked)."""
    ns = _namespace(scope.build())
    for op in path:
        apply(op, ns, audit=False)
    return ns


_STATE_NAMES = re.compile(r"s|r[0-9]+")


def snapshot(ns: dict[str, Any]) -> dict[str, Any]:
    """An independent copy of the state in `ns` (the system and the requests, deep-copied
    together; the helpers shared), so that each successor of a state is reached without
    replaying its path. The copy's machines keep the original's observers.

    The copy is ``copy.deepcopy``'s, made faster by `unicache_fsm.copying.deep`."""
    out = dict(ns)
    state = {k: v for k, v in ns.items() if _STATE_NAMES.fullmatch(k)}
    out.update(deep(state, {}))
    return out


# -- canonical form -----------------------------------------------------------------------


class _Renamer:
    """Slot numbers renamed in order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[int, int] = {}

    def __call__(self, t: torch.Tensor | None) -> tuple[int, ...] | None:
        if t is None:
            return None
        names = self.names
        return tuple(names.setdefault(x, len(names)) for x in t.tolist())


def canonical(
    ns: dict[str, Any], scope: Scope, order: Sequence[int] | None = None
) -> tuple[Any, ...]:
    """The state of the system in `ns`, free of ids, counters, clocks and slot numbers.

    `order` renames the requests (request ``i`` is written as ``order[i]``); only a
    renaming of requests that ask for the same key gives an equivalent state.
    """
    s: System = ns["s"]
    names = {f"r{i}": f"r{j}" for i, j in enumerate(order or range(scope.requests))}

    def rn(rid: str) -> str:
        return names.get(rid, rid)

    lk = s.linker
    full, swa, host = _Renamer(), _Renamer(), _Renamer()
    index: dict[int, int] = {}
    nodes: list[TreeNode] = []

    def walk(node: TreeNode) -> None:
        index[id(node)] = len(nodes)
        nodes.append(node)
        for key in sorted(node.children, key=repr):
            walk(node.children[key])

    walk(s.tree.root)

    def ref(node: TreeNode | None) -> Any:
        if node is None:
            return None
        at = index.get(id(node))
        return at if at is not None else ("detached", _path_key(node), node.residency)

    tickets = {id(rec.ticket): i for i, rec in enumerate(lk.offloads) if rec is not None}
    stamps = {v: i for i, v in enumerate(sorted({n.last_access for n in nodes}))}
    tree = tuple(
        (
            tuple(n.key),
            ref(n.parent),
            n.namespace,
            n.residency,
            n.lock_ref,
            min(n.hit_count, 1),  # the system's write-through threshold is 1
            stamps[n.last_access],
            n.hashes is not None,
            full(n.slots(FULL)),
            swa(n.slots(SWA)),
            host(n.host),
            None
            if n.pending_offload is None
            else (tickets.get(id(n.pending_offload), -1), n.pending_offload.finished),
        )
        for n in nodes
    )

    seqs = {ld.seq: i for i, ld in enumerate(sorted(lk.loads.values(), key=lambda x: x.seq))}

    def load_form(ld: ExternalLoad) -> Any:
        return (
            rn(ld.rid),
            ld.state,
            ref(ld.anchor),
            len(ld.key),
            len(ld.tail_hashes),
            ld.batch >= 0,
            seqs.get(ld.seq, -1),
            ld.settled,
            ld.abort_reason,
            ld.abort_pending,
            ref(ld.endpoint),
            # the device prefix it matched, in the tree's slot names: an anchor moved into
            # other slots since (backed up, evicted, loaded back) is another state
            full(ld.device_prefix),
            tuple(
                (t.name, (swa if t.name is PoolName.SWA else full)(t.device_indices))
                for t in ld.transfers
            ),
            tuple((t.name, len(t.keys)) for t in ld.committed),
            full(ld.slots),
        )

    loads = tuple(load_form(lk.loads[r]) for r in sorted(lk.loads, key=rn))
    draining = tuple(load_form(ld) for ld in lk.draining)
    held = tuple(sorted(rn(ld.rid) for ld in lk.held.values()))
    batches = tuple(tuple(rn(ld.rid) for ld in b.loads) for b in lk.batches)
    offloads = tuple(
        None
        if rec is None
        else (
            rec.state,
            tuple(ref(n) for n in rec.ticket.publish),
            ref(rec.ticket.anchor),
            rec.chain_pages,
            len(rec.transfers),
        )
        for rec in lk.offloads
    )
    requests: list[Any] = [None] * scope.requests
    for i, req in _requests(ns, scope):
        at = int(rn(f"r{i}")[1:])
        if req is None:
            requests[at] = None
        elif req.rid not in s.requests:
            requests[at] = "done"
        else:
            requests[at] = (
                ref(req.lock),
                req.prepared,
                None if req.load is None else load_form(req.load),
                req.match is not None and req.match.load is req.load,
            )
    locks = tuple(sorted(repr(ref(n)) for n in s.locks))
    pools = [PoolName.KV, PoolName.SWA] if scope.swa else [PoolName.KV]
    store = tuple(tuple(sorted(s.memory.stored_keys(pool))) for pool in pools)
    work: Any = s.faulty.pending()  # (queued rids, started batches, offloads)
    queued, batched, offloading = work
    pending = (
        tuple(rn(r) for r in queued),
        tuple((tuple(rn(r) for r in rids), *rest) for rids, *rest in batched),
        offloading,
    )
    form: tuple[Any, ...] = (
        tree,
        loads,
        draining,
        held,
        batches,
        offloads,
        tuple(requests),
        locks,
        store,
        pending,
        s.allocator.available_size(),
    )
    if scope.corrupt or scope.store_pages:  # what steers capacity eviction and drops
        form += (s.memory.chain_books(),)
    if scope.corrupt:
        bad = tuple(
            (pool, key)
            for pool in pools
            for key in sorted(s.memory.stored_keys(pool))
            if _corrupted(s, pool, key)
        )
        form += (bad,)
    if scope.store_pages:  # the audit's own history (what `check_chains` exempts)
        form += (s.check_chains, *(tuple(sorted(x)) for x in s.chain_exemptions()))
    return form


def _corrupted(s: System, pool: PoolName, key: str) -> bool:
    header = s.memory.header(pool, key)
    view = s.memory.stored_bytes(pool, key)
    assert header is not None and view is not None
    return page_checksum(view) != header.checksum


def fingerprint(ns: dict[str, Any], scope: Scope) -> bytes:
    """16 bytes that stand for the state's canonical form; when every request asks for
    the same key (``key_pages=1``), the least over both orders of the requests (a state
    and its mirror image, the requests' roles swapped, are one state)."""
    forms = [repr(canonical(ns, scope))]
    if scope.symmetric:
        for order in itertools.permutations(range(scope.requests)):
            if list(order) != sorted(order):
                forms.append(repr(canonical(ns, scope, order)))
    return hashlib.blake2b(min(forms).encode(), digest_size=16).digest()


# -- coverage during one operation --------------------------------------------------------


def _executors(s: System) -> list[Executor]:
    return [
        s.tree.residency.executor,
        s.linker.load_machine,
        s.linker.offload_machine,
        jobs.LOAD_MACHINE,
        jobs.OFFLOAD_MACHINE,
    ]


@contextlib.contextmanager
def _observing(s: System, observer: Callable[..., None]) -> Iterator[None]:
    executors = _executors(s)
    for ex in executors:
        ex.add_observer(observer)
    try:
        yield
    finally:
        for ex in executors:
            ex.remove_observer(observer)


@contextlib.contextmanager
def _observing_globals(observer: Callable[..., None]) -> Iterator[None]:
    """Observe the store's job machines (module-level executors, shared by all systems)."""
    executors = [jobs.LOAD_MACHINE, jobs.OFFLOAD_MACHINE]
    for ex in executors:
        ex.add_observer(observer)
    try:
        yield
    finally:
        for ex in executors:
            ex.remove_observer(observer)


# -- one expansion (runs in a worker) -----------------------------------------------------


class _Gate:
    """An observer that counts transitions only while `on` (not during a replay)."""

    def __init__(self) -> None:
        self.counter = TransitionCounter()
        self.on = False

    def __call__(self, ex: ExecutorBase, model: Any, source: str, trigger: str, dest: str) -> None:
        if self.on:
            self.counter(ex, model, source, trigger, dest)


# a snapshot costs about as much as building a system and replaying this many operations
_SNAPSHOT_AFTER = 4


def _reach(scope: Scope, path: Sequence[Op], gate: _Gate) -> dict[str, Any]:
    """A fresh system after `path`, its own machines observed by `gate` (off meanwhile)."""
    ns = _namespace(scope.build())
    on, gate.on = gate.on, False
    for ex in _executors(ns["s"])[:3]:
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
    policy = FaultPolicy({kind: FaultRule(every=_NEVER) for kind in scope.faults})
    s: System = ns["s"]
    s.faulty.policy = policy
    try:
        apply(op, ns, audit=False)
    except BaseException:
        eligible[op.label] = {kind: max(1, policy.calls(kind)) for kind in scope.faults}
        for kind in _WILD_FAULTS:
            if kind in scope.faults and not policy.calls(kind):
                del eligible[op.label][kind]
        raise
    finally:
        s.faulty.policy = FaultPolicy()
    eligible[op.label] = {kind: policy.calls(kind) for kind in scope.faults if policy.calls(kind)}


_NEVER = 2**62  # a period no search reaches: the rule counts calls but never fires


# fingerprints of the states this process has audited, per search (a state met again
# through another path is the same state: its audit passed the first time)
_AUDITED: dict[str, set[bytes]] = {}
_RUNS = itertools.count()


def _expand(
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
    gate = _Gate()
    children: list[Successor[None]] = []
    refused = 0
    parent = _reach(scope, path, gate)
    wild = scope.wild
    with _observing_globals(gate):
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
            elif len(path) >= _SNAPSHOT_AFTER:
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
                        ops[k:k] = _wild(op, eligible.get(op.label, {}))
                elif op.call and not op.answer:
                    _OPTIONS[:] = [0]
                    try:
                        apply(op, ns, audit=False)
                    finally:  # its other answers run next
                        ops[k:k] = _answers(op, plains[plain], _OPTIONS[0])
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


def _expand_star(
    args: tuple[Scope, tuple[Op, ...], str],
) -> tuple[list[Successor[None]], int, Counter[Any]]:
    return _expand(*args)


# -- the report ----------------------------------------------------------------------------


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

        ns = _namespace(self.scope.build())
        with _observing(ns["s"], observe):
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


@attrs.define
class Report:
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


def explore(
    scope: Scope,
    *,
    max_depth: int | None = None,
    minutes: float | None = None,
    workers: int | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> Report:
    """Breadth-first search of every state `scope` can reach (see the module docstring).

    Stops at the first level holding a violation (the reported one is the first found
    at that depth, so no shorter one exists), when no new state appears (exhausted),
    past `max_depth` operations, or after `minutes`. `workers` (default: one per core,
    at most 2 on a small machine) expand a level's states in parallel. `progress` is
    called after each level with (depth, states, frontier size).
    """
    if workers is None:
        workers = max(1, min(os.cpu_count() or 1, 4))
    if workers < 1:
        msg = f"workers must be >= 1, got {workers}"
        raise ValueError(msg)
    start = time.perf_counter()
    deadline = None if minutes is None else start + minutes * 60.0
    report = Report(scope, workers=workers)
    run = f"{os.getpid()}-{next(_RUNS)}"
    counts: Counter[Any] = Counter()
    root = _namespace(scope.build())
    root["s"].audit()
    visited = {fingerprint(root, scope)}
    pool = _pool(workers)

    def expand(entries: Sequence[tuple[tuple[Any, ...], None]]) -> Iterator[list[Successor[None]]]:
        jobs_ = [(scope, path, run) for path, _ in entries]
        if pool is None:
            results: Any = map(_expand_star, jobs_)
        else:
            chunk = max(1, len(jobs_) // (8 * workers))
            results = pool.imap(_expand_star, jobs_, chunksize=chunk)
        for children, refused, level_counts in results:
            counts.update(level_counts)
            report.refused += refused
            yield children

    try:
        out = breadth_first(
            None, visited, expand, max_depth=max_depth, deadline=deadline, progress=progress
        )
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    report.depth, report.transitions, report.exhausted = out.depth, out.transitions, out.exhausted
    if out.violation is not None:
        path, error = out.violation
        report.violation = Counterexample(scope, path, error)
    report.states = len(visited)
    report.seconds = time.perf_counter() - start
    report.coverage = Coverage.from_counter(_counter_of(counts))
    return report


def _counter_of(counts: Counter[Any]) -> TransitionCounter:
    counter = TransitionCounter()
    counter.counts.update(counts)
    return counter


def _pool(workers: int) -> Any:
    if workers == 1:
        return None
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method).Pool(workers)
