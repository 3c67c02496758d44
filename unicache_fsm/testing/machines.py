"""`SystemMachine`: a Hypothesis state machine over tree + linker + store + host tier.

Rules are a scheduler's moves and the world's events — requests computing (from their
device prefix, or from scratch, replacing SWA tombstones) or loading prefixes, the
store progressing (or not, while the scheduler polls), loads landing or failing,
completing, releasing, evicting (device, SWA, host), backing up and loading back from
the host tier, the store losing or corrupting pages, LOOKUPs that demote stale stored
flags, resets — plus one rule that fires arbitrary triggers at a shadow of an arbitrary
live machine and checks that the engine either allows each or raises exactly
`IllegalTransitionError`.

A request may leave its matched prefix unpinned (`begin(lock=False)`) and LOAD later
(`prepare`), so other requests' inserts, evictions and host load-backs run inside the
match -> load_back gap. The store may raise arbitrary exception types and answer
ill-typed values on every call the linker makes (`FaultKind.RAISE_ERROR`,
`FaultKind.GARBAGE_ANSWER`), and lie about its work (`store.faults.LYING`: completion
counts over or under the truth, malformed completions, replies lost after the work was
done, batch ids never started), besides the classic faults, with capacity-limited and
unbounded stores.

Preconditions mirror guards; every invariant of `serving.invariants` runs after every
step (`System.audit`) without any LOOKUP first (stale stored flags stay as the linker
left them: "stored pages landed" is checked against what the store acknowledged;
"store chains whole" while only capacity removed pages); the teardown drains
everything and checks that nothing is left locked or in flight.

Its rules are declared with `testing.walk` (`move`, `setup_move`, `check`): Hypothesis
runs them as usual, and ``walk.fuzz(SystemMachine, seed=...)`` (what ``unicache-fsm
fuzz`` runs) walks them with choices from a seeded `random.Random`. Use it as is
(``TestSystem = SystemMachine.TestCase``), pin a configuration with the class
attributes, or put your own store backend in the whole system::

    class MyStoreInSystem(SystemMachine):
        def make_store(self) -> ExternalStore:
            return MyStore(capacity_pages=self.capacity_pages)  # drawn per run

    TestMyStoreInSystem = MyStoreInSystem.TestCase

The system contains a store's faults: a store that keeps answering for pages it evicted
(its lookups promise pages its loads then fail) only makes requests recompute, so no
system invariant breaks. A subclass that overrides `make_store` therefore gets the store
contract too: its `TestCase` holds two tests, ``test_in_the_system`` (this machine) and
``test_store_contract`` (`store_contract()`: `StoreMachine` on a store from the same
`make_store`, built with ``capacity_pages`` None), so a store that breaks the protocol
fails whichever machine its author picked. ``walk.fuzz`` drives this machine only.

Class attributes: `page_sizes`, `swa_choices`, `fault_rates`, `store_capacities` (each
run draws one of each), `swa_checkpoints` (with SWA, each run draws its SWA checkpoint
interval in pages, `tree.swa_checkpoints`; 0 is off, SGLang 0.5.23's retention),
`fault_kinds` (the kinds injected at the drawn rate; every one but `NOT_YET_CONTAINED`
by default, `MISBEHAVIOUR`'s at half of it), `host_pages` (0 turns the host tier off);
`walk_config` names those a walk's reproduction pins. Every transition any run takes is
counted in the class's `coverage` (a `TransitionCounter`), for coverage reports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from unicache_fsm.fsm.errors import GuardRejectedError, IllegalTransitionError
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.spec import MachineSpec
from unicache_fsm.fsm.trace import TransitionCounter
from unicache_fsm.linker.load import ExternalLoad, LoadState
from unicache_fsm.linker.offload import PendingOffload
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.serving.kv import kv_bytes, same_kv
from unicache_fsm.serving.request import Request
from unicache_fsm.serving.system import System
from unicache_fsm.store import jobs
from unicache_fsm.store.faults import MISBEHAVIOUR, FaultKind, FaultPolicy, FaultRule
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing.store_machine import StoreMachine
from unicache_fsm.testing.walk import (
    DATA,
    Bools,
    Ints,
    OneOf,
    check,
    choose,
    choose_bool,
    choose_int,
    choose_some,
    move,
    setup_move,
)
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.params import EvictParams

__all__ = ["NOT_YET_CONTAINED", "SystemMachine"]

#: Lies of the store (`store.faults.LYING`) the linker does not contain yet, left out of
#: the default `fault_kinds` until it does. Empty: the linker contains every lie, so
#: fuzzing injects them all by default.
NOT_YET_CONTAINED: frozenset[FaultKind] = frozenset()

DOCS = 3
MAX_PAGES = 8
MAX_OPEN = 3
HUGE_TOKENS = 10**9


def _live(m: SystemMachine) -> bool:
    return m.s is not None


def _room(m: SystemMachine) -> bool:
    return m.s is not None and len(m.open) < MAX_OPEN


def _any_open(m: SystemMachine) -> bool:
    return bool(m.open)


def _any_load(m: SystemMachine) -> bool:
    return m.s is not None and bool(m.s.linker.loads)


def _memory_store(m: SystemMachine) -> bool:
    return m.s is not None and isinstance(m.s.backend, MemoryStore)


def _host(m: SystemMachine) -> bool:
    return m.s is not None and type(m).host_pages > 0


class _NoopHandler:
    """A handler whose callbacks do nothing and whose guards pass a real True argument:
    for firing arbitrary triggers at shadow records safely."""

    def __init__(self, spec: MachineSpec) -> None:
        guards = {n for t in spec.transitions for n in (*t.conditions, *t.unless)}
        for name in spec.callback_names():
            setattr(self, name, self._guard if name in guards else self._noop)

    @staticmethod
    def _guard(model: object, *args: object, **kwargs: object) -> bool:
        return bool(args) and args[0] is True

    @staticmethod
    def _noop(model: object, *args: object, **kwargs: object) -> None:
        return None


class _WithStoreContract:
    """`SystemMachine.TestCase`: Hypothesis's test case for the machine, plus
    ``test_store_contract`` when the class brings its own store (`make_store`
    overridden). One test case class per machine class, built on first access."""

    def __init__(self) -> None:
        self._made: dict[type, type] = {}

    def __get__(self, obj: object, owner: type[SystemMachine]) -> Any:
        made = self._made.get(owner)
        if made is None:
            made = self._made[owner] = self._build(owner)
        return made

    @staticmethod
    def _build(owner: type[SystemMachine]) -> type:
        base: Any = RuleBasedStateMachine.__dict__["TestCase"].__get__(None, owner)
        found = owner.store_contract()
        if found is None:
            return base  # type: ignore[no-any-return]
        contract: type[StoreMachine] = found

        class SystemTestCase(base):  # type: ignore[misc]
            def test_in_the_system(self) -> None:
                """The store inside the whole system (the machine's rules)."""
                self.runTest()

            def test_store_contract(self) -> None:
                """The same store alone against the protocol's model (`StoreMachine`)."""
                run_state_machine_as_test(contract, settings=self.settings)

        SystemTestCase.__name__ = base.__name__
        SystemTestCase.__qualname__ = base.__qualname__
        SystemTestCase.__module__ = owner.__module__
        return SystemTestCase


class SystemMachine(RuleBasedStateMachine):
    """The whole system — tree, pools, linker, a store, a host tier — under random
    operation, with every invariant of `serving.invariants` checked after each step and
    a drained, quiet system at teardown.

    Subclass it to pin a configuration (the class attributes) or to put your own store
    in the loop (`make_store`); a subclass with its own store is also checked against
    the store contract (`store_contract`, run by its `TestCase`). Rules, faults and
    what each check means are in the module docstring.
    """

    page_sizes: ClassVar[tuple[int, ...]] = (1, 4)
    swa_choices: ClassVar[tuple[bool, ...]] = (False, True)
    swa_checkpoints: ClassVar[tuple[int, ...]] = (0, 1, 2)
    fault_rates: ClassVar[tuple[float, ...]] = (0.0, 0.1, 0.25)
    host_pages: ClassVar[int] = 12
    store_capacities: ClassVar[tuple[int | None, ...]] = (None, 24, 6)
    fault_kinds: ClassVar[tuple[FaultKind, ...]] = tuple(  # injected at the drawn rate
        k for k in FaultKind if k not in NOT_YET_CONTAINED
    )
    # the configuration a walk's reproduction pins (`testing.walk.reproduction`)
    walk_config: ClassVar[tuple[str, ...]] = (
        "page_sizes",
        "swa_choices",
        "swa_checkpoints",
        "fault_rates",
        "host_pages",
        "store_capacities",
        "fault_kinds",
    )
    coverage: ClassVar[TransitionCounter] = TransitionCounter()
    steps: ClassVar[int] = 0  # rule steps run by this class (each one audited)
    TestCase = _WithStoreContract()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.coverage = TransitionCounter()  # each class counts its own runs
        cls.steps = 0

    def __init__(self) -> None:
        super().__init__()
        self.s: System | None = None
        self.open: dict[str, Request] = {}
        self.next_rid = 0
        self.policy = FaultPolicy()
        self.capacity_pages: int | None = None  # drawn from store_capacities per run
        self._observed: list[Executor] = []
        self._shadows: dict[int, Executor] = {}

    # -- hooks for users -------------------------------------------------------------
    def make_store(self) -> ExternalStore | None:
        """The store backend under test; None means the embedded `MemoryStore`. A store
        that can bound itself should take `self.capacity_pages` (drawn for the run; the
        stored-pages invariant is checked only when it is None)."""
        return None

    @classmethod
    def store_contract(cls) -> type[StoreMachine] | None:
        """`StoreMachine` over the stores this class's `make_store` returns (called on
        a fresh instance, `capacity_pages` None), or None when the class keeps the
        embedded `MemoryStore` (the kit checks that one itself)."""
        if cls.make_store is SystemMachine.make_store:
            return None
        system_cls = cls

        class StoreContract(StoreMachine):
            def make_store(self) -> ExternalStore:
                store = system_cls().make_store()
                if store is None:
                    msg = f"{system_cls.__name__}.make_store() returned None"
                    raise TypeError(msg)
                return store

        StoreContract.__name__ = f"{cls.__name__}StoreContract"
        StoreContract.__qualname__ = f"{cls.__qualname__}.StoreContract"
        return StoreContract

    # -- setup -----------------------------------------------------------------------
    @setup_move(data=DATA)
    def setup(self, data: Any) -> None:
        cls = type(self)
        p = choose(data, cls.page_sizes, "page_size")
        swa = choose(data, cls.swa_choices, "swa")
        rate = choose(data, cls.fault_rates, "fault_rate")
        seed = choose_int(data, 0, 2**16, "seed")
        capacity = choose(data, cls.store_capacities, "capacity_pages")
        checkpoint = choose(data, cls.swa_checkpoints, "swa_checkpoint") if swa else 0
        rules = (  # misbehaviour (wild and lying kinds: most calls are eligible) is rarer
            {
                k: FaultRule(probability=rate / 2 if k in MISBEHAVIOUR else rate)
                for k in cls.fault_kinds
            }
            if rate
            else {}
        )
        self.policy = FaultPolicy(rules, seed=seed, delay_steps=2)
        self.capacity_pages = capacity
        backend = self.make_store()
        self.s = System.build(
            p,
            swa=swa,
            faults=FaultPolicy(),
            host_pages=cls.host_pages,
            capacity_pages=capacity,
            store_factory=(lambda: backend) if backend is not None else None,
            swa_checkpoint=checkpoint,
        )
        self.s.faulty.policy = self.policy
        # "stored" may be stale (the store drops pages on its own, and nothing LOOKUPs
        # before the audit): the audit checks what the store acknowledged instead, and
        # that chains stay whole until a rule or fault punches a hole on purpose
        self.s.check_stored = False
        self.s.check_chains = True
        self._observed = [
            self.s.tree.residency.executor,
            self.s.linker.load_machine,
            self.s.linker.offload_machine,
            jobs.LOAD_MACHINE,
            jobs.OFFLOAD_MACHINE,
        ]
        for ex in self._observed:
            ex.add_observer(cls.coverage)

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

    def punched(self) -> None:
        """Pages were removed from the middle of chains on purpose: stop checking that
        chains stay whole (capacity eviction alone never does that)."""
        self.sys.check_chains = False

    def after_store_call(self) -> None:
        if self.policy.injected[FaultKind.EVICT_AFTER_LOOKUP]:
            self.punched()

    def nodes(self, want: str) -> list[TreeNode]:
        """Tree nodes by id: ``resident``, ``evicted`` or ``backed`` (resident, backed up)."""
        picks: dict[str, Callable[[TreeNode], bool]] = {
            "resident": lambda n: n.device_resident,
            "evicted": lambda n: n.evicted,
            "backed": lambda n: n.device_resident and n.backuped,
        }
        pick = picks[want]
        return sorted((n for n in self.sys.tree.nodes() if pick(n)), key=lambda n: n.id)

    # -- requests --------------------------------------------------------------------
    @move(
        when=_live,
        doc=Ints(0, DOCS - 1),
        pages=Ints(1, MAX_PAGES),
        settle=Bools(),
        from_scratch=Bools(),
    )
    def compute(self, doc: int, pages: int, settle: bool, from_scratch: bool) -> None:
        """A request computes a prefix (from its device prefix, or from scratch: its
        insert offers fresh slots for every page and replaces unlocked tombstones)."""
        key = self.key(doc, pages, 0)
        self.sys.compute(self.rid("c"), key, settle=settle, from_scratch=from_scratch)
        self.after_store_call()

    @move(
        when=_room,
        doc=Ints(0, DOCS - 1),
        pages=Ints(1, MAX_PAGES),
        extra=Ints(0, 3),
        prepare=Bools(),
        pin=Bools(),
    )
    def begin(self, doc: int, pages: int, extra: int, prepare: bool, pin: bool) -> None:
        """LOOKUP (and, with `prepare`, LOAD + PREPARE a hit) for a new request; without
        `pin` nothing locks its matched prefix until its load does."""
        rid = self.rid("r")
        key = self.key(doc, pages, extra)
        self.open[rid] = self.sys.begin(rid, key, load=prepare, lock=pin)
        self.after_store_call()

    @move(
        when=_room,
        doc=Ints(0, DOCS - 1),
        pages=Ints(2, MAX_PAGES),
        tail=Ints(1, 3),
        meddle=OneOf(("reload", "refill", "evict_swa", "evict", "nothing")),
    )
    def gap(self, doc: int, pages: int, tail: int, meddle: str) -> None:
        """The match -> load_back gap, unpinned: a prefix on the device with its tail in
        the store; a request matches it; before its LOAD another request meddles with
        the prefix (it is backed up, evicted and loaded back into other slots; computed
        again from scratch, replacing SWA tombstones; its SWA window or itself evicted);
        then the LOAD: it must re-check the prefix, not build on what it matched."""
        s = self.sys
        p = s.page_size
        head = max(1, pages - tail)
        key = self.key(doc, pages, 0)
        s.compute(self.rid("c"), key[: head * p], settle=True)
        s.compute(self.rid("c"), key, settle=True)
        s.tree.evict(EvictParams(num_tokens=(pages - head) * p))  # the tail: store only
        rid = self.rid("r")
        req = self.open[rid] = s.begin(rid, key, load=False, lock=False)
        anchor = req.match.device.last_device_node if req.match is not None else None
        if meddle == "reload" and anchor is not None and anchor is not s.tree.root:
            if type(self).host_pages and not anchor.backuped:
                s.tree.backup(anchor)
            s.tree.evict(EvictParams(num_tokens=HUGE_TOKENS))
            s.compute(self.rid("c"), self.key((doc + 1) % DOCS, head, 0), offload=False)
            if anchor.evicted:
                s.tree.load_back(anchor)
        elif meddle == "refill":
            s.compute(self.rid("c"), key[: head * p], from_scratch=True, swa_boundary=0)
        elif meddle == "evict_swa":
            s.tree.evict(EvictParams(swa_num_tokens=HUGE_TOKENS))
        elif meddle == "evict":
            s.tree.evict(EvictParams(num_tokens=head * p))
        if req.load is not None:
            req.prepared = s.linker.load_back(req.load)
            if req.prepared:
                s.poison_reserved(req.load)
        self.after_store_call()

    @move(when=_any_open, data=DATA)
    def prepare(self, data: Any) -> None:
        """LOAD + PREPARE a request's idle load, after whatever ran since its match."""
        idle = sorted(
            rid
            for rid, req in self.open.items()
            if req.load is not None and req.load.state == LoadState.IDLE
        )
        if idle:
            req = self.open[choose(data, idle)]
            assert req.load is not None
            req.prepared = self.sys.linker.load_back(req.load)
            if req.prepared:
                self.sys.poison_reserved(req.load)

    @move(when=_live, data=DATA)
    def verify(self, data: Any) -> None:
        """LOOKUP a stored path (faults on): demote what the store lost."""
        stored = sorted(self.sys.stored_nodes(), key=lambda n: n.id)
        if stored:
            self.sys.linker.verify_stored(choose(data, stored))
            self.after_store_call()

    @move(when=_memory_store, data=DATA)
    def corrupt_store_page(self, data: Any) -> None:
        """Flip bytes of a page the memory store holds (a bad disk, a bad copy)."""
        s = self.sys
        held = sorted(
            (pool, h)
            for n in s.tree.nodes()
            for h in (n.hashes or ())
            for pool in ((PoolName.KV, PoolName.SWA) if s.swa else (PoolName.KV,))
            if s.memory.contains(pool, h)
        )
        if held:
            pool, key = choose(data, held)
            view = s.memory.stored_bytes(pool, key)
            assert view is not None
            view[:8] ^= 0xFF

    @move(when=_room, doc=Ints(0, DOCS - 1), pages=Ints(1, MAX_PAGES))
    def revisit(self, doc: int, pages: int) -> None:
        """A prefix is computed and offloaded, memory pressure evicts it, and a new
        request for it finds it in the store: the path every external load takes."""
        s = self.sys
        s.compute(self.rid("c"), self.key(doc, pages, 0), settle=True)
        s.tree.evict(EvictParams(num_tokens=pages * s.page_size))
        rid = self.rid("r")
        self.open[rid] = s.begin(rid, self.key(doc, pages, 1))
        self.after_store_call()

    @move(when=_live)
    def start_only(self) -> None:
        """Start the queued loads and stop there (a reset may now meet a started batch)."""
        self.sys.linker.start_loading()

    @move(when=_live)
    def step(self) -> None:
        s = self.sys
        s.linker.start_loading()
        s.store.progress()
        s.finish_loads()
        s.linker.poll_offloads()
        self.after_store_call()

    @move(when=_live)
    def poll_only(self) -> None:
        """A scheduler step in which the store made no progress: take the completions
        it reports now (a lying store may report work it is still doing)."""
        s = self.sys
        s.finish_loads()
        s.linker.poll_offloads()
        self.after_store_call()

    @move(when=_any_open, data=DATA)
    def complete(self, data: Any) -> None:
        rid = choose(data, sorted(self.open))
        req = self.open[rid]
        if req.load is not None and req.load.in_flight and req.load.awaited:
            return  # a later step ends it
        self.sys.complete(req)
        del self.open[rid]
        assert req.slots is not None
        assert same_kv(self.sys.full_bytes(req.slots), kv_bytes(self.sys.aligned(req.key), 0))
        self.after_store_call()

    @move(when=_any_open, data=DATA)
    def release(self, data: Any) -> None:
        rid = choose(data, sorted(self.open))
        self.sys.linker.release_request(rid)

    # -- memory pressure and the store losing pages ------------------------------------
    @move(when=_live, pages=Ints(1, 2 * MAX_PAGES), swa_pages=Ints(0, MAX_PAGES))
    def evict_tree(self, pages: int, swa_pages: int) -> None:
        p = self.sys.page_size
        self.sys.tree.evict(EvictParams(num_tokens=pages * p, swa_num_tokens=swa_pages * p))

    @move(when=_live, data=DATA)
    def evict_store(self, data: Any) -> None:
        nodes = [n for n in self.sys.tree.nodes() if n.hashes]
        if not nodes:
            return
        node = choose(data, sorted(nodes, key=lambda n: n.id))
        assert node.hashes is not None
        lost = choose_some(data, node.hashes, 1, 2)
        pool = choose(data, [PoolName.KV, PoolName.SWA] if self.sys.swa else [PoolName.KV])
        self.sys.store.evict(lost, pool)
        self.punched()

    @move(when=_any_load, data=DATA)
    def lose_loading_page(self, data: Any) -> None:
        """The store loses a page a queued or started load is about to read."""
        loads = [ld for ld in self.sys.linker.loads.values() if ld.in_flight]
        if loads:
            load = choose(data, loads)
            self.sys.store.evict([choose(data, load.tail_hashes)])
            self.punched()

    @move(when=_live, doc=Ints(0, DOCS - 1), pages=Ints(1, MAX_PAGES - 1))
    def split_by_match(self, doc: int, pages: int) -> None:
        p = self.sys.page_size
        self.sys.tree.match_prefix(self.key(doc, pages, 0) + tuple(range(7, 7 + p)))

    @move(when=_live)
    def reset(self) -> None:
        self.sys.linker.reset()

    # -- the host tier ---------------------------------------------------------------
    @move(when=_host, data=DATA)
    def backup(self, data: Any) -> None:
        candidates = [n for n in self.nodes("resident") if not n.backuped]
        if candidates:
            self.sys.tree.backup(choose(data, candidates))

    @move(when=_host, data=DATA)
    def load_back(self, data: Any) -> None:
        evicted = self.nodes("evicted")
        if evicted:
            self.sys.tree.load_back(choose(data, evicted))

    @move(when=_host, data=DATA)
    def drop_backup(self, data: Any) -> None:
        leaves = [
            n for n in self.nodes("backed") if not any(c.backuped for c in n.children.values())
        ]
        if leaves:
            self.sys.tree.drop_backup(choose(data, leaves))

    @move(when=_host, pages=Ints(1, MAX_PAGES))
    def evict_host(self, pages: int) -> None:
        self.sys.tree.evict_host(pages * self.sys.page_size)

    # -- any trigger, any machine ----------------------------------------------------
    @move(when=_live, data=DATA)
    def fire_anything(self, data: Any) -> None:
        """Fire arbitrary triggers (1 to 3 in a row, each with an arbitrary argument) at
        a shadow of an arbitrary live model (or a fresh store-side job record): each time
        the engine allows it (maybe vetoed by a guard) or raises exactly
        IllegalTransitionError. A row of triggers reaches the states a live model passes
        through within one call (a load is ``landed`` only between LAND and COMMIT; a
        synchronous store's offload is ``started`` only inside `progress`)."""
        s = self.sys
        by_machine: list[tuple[Executor, list[Any]]] = [
            (s.tree.residency.executor, list(s.tree.nodes())),
            (s.linker.load_machine, list(s.linker.loads.values())),
            (s.linker.offload_machine, [r for r in s.linker.offloads if r is not None]),
            # a store's own jobs live inside it: fresh records, from their initial state
            (jobs.LOAD_MACHINE, [jobs.StoreLoad("shadow", ())]),
            (jobs.OFFLOAD_MACHINE, [jobs.StoreOffload(-1, ())]),
        ]
        by_machine = [(ex, models) for ex, models in by_machine if models]
        real, models = choose(data, by_machine)  # machine first: loads are few
        model = choose(data, models)
        ex = self._shadow_executor(real)
        if isinstance(model, (jobs.StoreLoad, jobs.StoreOffload)):
            shadow = model
            ex.initialize(shadow)
        else:
            shadow = self._shadow(model)
            ex.initialize(shadow, like=model)
        for _ in range(choose_int(data, 1, 3, "triggers")):
            trigger = choose(data, ex.spec.triggers())
            arg = choose_bool(data, "argument")
            before = ex.state_of(shadow)
            allowed = trigger in ex.allowed_triggers(shadow)
            try:
                ex.fire(shadow, trigger, arg)
            except GuardRejectedError:
                assert allowed, f"{trigger} vetoed by a guard but not allowed from {before}"
                assert ex.state_of(shadow) == before, "a vetoed trigger changed the state"
            except IllegalTransitionError as exc:
                assert type(exc) is IllegalTransitionError and not allowed, exc
            else:
                assert allowed, f"{trigger} fired from {before} though not allowed"

    def _shadow_executor(self, ex: Executor) -> Executor:
        """`ex` itself when its model holds no callbacks (tree nodes), else a twin bound
        to a handler that does nothing (the records' handler is the real linker)."""
        if ex.handler is None:
            return ex
        twin = self._shadows.get(id(ex))
        if twin is None:
            twin = type(ex)(ex.spec, ex.model_cls, handler=_NoopHandler(ex.spec))
            twin.add_observer(type(self).coverage)  # as `ex` would count it
            self._shadows[id(ex)] = twin
        return twin

    @staticmethod
    def _shadow(model: Any) -> Any:
        if isinstance(model, TreeNode):
            return TreeNode(id=-model.id, key=model.key, start=model.start, parent=None)
        assert isinstance(model, (ExternalLoad, PendingOffload))
        return attrs.evolve(model)

    # -- invariants and teardown -----------------------------------------------------
    @check()
    def audited(self) -> None:
        if self.s is not None:
            type(self).steps += 1
            self.s.audit()

    def teardown(self) -> None:
        if self.s is None:
            return
        s = self.s
        try:
            s.faulty.policy = self.policy = FaultPolicy()
            for _ in range(20):
                if not s.in_flight():
                    break
                self.step()
            for req in list(self.open.values()):
                if req.load is not None and req.load.state == LoadState.IDLE:
                    s.linker.release_request(req.rid)
                s.complete(req)
            self.open.clear()
            s.drive(max_steps=20)
            s.assert_quiet()
        finally:
            for ex in self._observed:
                ex.remove_observer(type(self).coverage)
