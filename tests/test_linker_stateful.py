"""A Hypothesis state machine over the linker: requests, loads, offloads, evictions and
store faults interleaved at random, with the harness's audit as the invariant.

Rules are the scheduler's moves (compute, begin a load, step the store, complete,
release, evict in the tree or in the store, reset); preconditions keep them legal.
Injected faults come from a seeded `FaultPolicy` over every `FaultKind`.
"""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.faults import FaultKind, FaultPolicy, FaultRule
from unicache_fsm.testing.system import Request, System, kv_bytes
from unicache_fsm.tree import EvictParams

DOCS = 3
MAX_PAGES = 8
MAX_OPEN = 3


class LinkerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s: System | None = None
        self.open: dict[str, Request] = {}
        self.next_rid = 0
        self.policy = FaultPolicy()

    # -- setup -----------------------------------------------------------------------------
    @initialize(
        p=st.sampled_from([1, 4]),
        swa=st.booleans(),
        rate=st.sampled_from([0.0, 0.1, 0.25]),
        seed=st.integers(0, 2**16),
    )
    def setup(self, p: int, swa: bool, rate: float, seed: int) -> None:
        rules = {k: FaultRule(probability=rate) for k in FaultKind} if rate else {}
        self.policy = FaultPolicy(rules, seed=seed, delay_steps=2)
        self.s = System.build(p, swa=swa, faults=FaultPolicy())
        self.s.faulty.policy = self.policy

    @property
    def sys(self) -> System:
        assert self.s is not None
        return self.s

    def key(self, doc: int, pages: int, extra: int) -> tuple[int, ...]:
        p = self.sys.page_size
        base = tuple(range(1000 * (doc + 1), 1000 * (doc + 1) + MAX_PAGES * p))
        return base[: pages * p] + tuple(range(50, 50 + extra))

    def rid(self, what: str) -> str:
        self.next_rid += 1
        return f"{what}{self.next_rid}"

    def reverify(self) -> None:
        """Demote what the store lost (looked up with faults off, so it can tell)."""
        s = self.sys
        s.faulty.policy = FaultPolicy()
        for node in s.stored_nodes():
            s.linker.verify_stored(node)
        s.faulty.policy = self.policy

    # -- rules -----------------------------------------------------------------------------
    @rule(
        doc=st.integers(0, DOCS - 1),
        pages=st.integers(1, MAX_PAGES),
        settle=st.booleans(),
    )
    def compute(self, doc: int, pages: int, settle: bool) -> None:
        self.sys.compute(self.rid("c"), self.key(doc, pages, 0), settle=settle)
        self.reverify()

    @precondition(lambda self: len(self.open) < MAX_OPEN)
    @rule(doc=st.integers(0, DOCS - 1), pages=st.integers(1, MAX_PAGES), extra=st.integers(0, 3))
    def begin(self, doc: int, pages: int, extra: int) -> None:
        rid = self.rid("r")
        self.open[rid] = self.sys.begin(rid, self.key(doc, pages, extra))
        self.reverify()  # an injected evict_after_lookup loses a stored page

    @rule()
    def step(self) -> None:
        s = self.sys
        s.linker.start_loading()
        s.store.progress()
        s.finish_loads()
        s.linker.poll_offloads()
        self.reverify()  # the store may have lost a page an offload just published

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.open)))
        req = self.open[rid]
        if req.load is not None and req.load.state.startswith("prepared"):
            return  # still in flight: a later step ends it
        self.sys.complete(req)
        del self.open[rid]
        assert req.slots is not None
        assert torch.equal(self.sys.full_bytes(req.slots), kv_bytes(self.sys.aligned(req.key), 0))
        self.reverify()

    @precondition(lambda self: bool(self.open))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.open)))
        self.sys.linker.release_request(rid)

    @rule(pages=st.integers(1, 2 * MAX_PAGES), swa_pages=st.integers(0, MAX_PAGES))
    def evict_tree(self, pages: int, swa_pages: int) -> None:
        s = self.sys
        p = s.page_size
        s.tree.evict(
            EvictParams(num_tokens=pages * p, swa_num_tokens=swa_pages * p if s.swa else 0)
        )

    @rule(data=st.data())
    def evict_store(self, data: st.DataObject) -> None:
        keys = sorted(self.sys.memory.stored_keys(data.draw(st.sampled_from(list(self.pools())))))
        if not keys:
            return
        lost = data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
        self.sys.store.evict(lost)
        self.reverify()

    def pools(self) -> list[PoolName]:
        return [PoolName.KV, PoolName.SWA] if self.sys.swa else [PoolName.KV]

    @rule(doc=st.integers(0, DOCS - 1), pages=st.integers(1, MAX_PAGES - 1))
    def split_by_match(self, doc: int, pages: int) -> None:
        p = self.sys.page_size
        self.sys.tree.match_prefix(self.key(doc, pages, 0) + tuple(range(7, 7 + p)))

    @rule()
    def reset(self) -> None:
        s = self.sys
        s.linker.reset()

    # -- invariant and teardown ------------------------------------------------------------
    @invariant()
    def audited(self) -> None:
        if self.s is not None:
            self.s.audit()

    def teardown(self) -> None:
        if self.s is None:
            return
        s = self.s
        s.faulty.policy = self.policy = FaultPolicy()
        for _ in range(20):
            if not s.in_flight():
                break
            self.step()
        for req in list(self.open.values()):
            s.complete(req)
        s.drive(max_steps=20)
        s.assert_quiet()


LinkerMachine.TestCase.settings = settings(LinkerMachine.TestCase.settings, stateful_step_count=30)
TestLinkerMachine = LinkerMachine.TestCase
