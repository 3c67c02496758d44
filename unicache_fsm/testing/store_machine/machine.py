"""`StoreMachine`: the rules (the protocol's calls) and invariants that fuzz a store.

Hypothesis collects a machine's rules from its class, so they are all here; each rule
makes its calls on the store and hands the answers to the three parts that hold the
machine's state and checks:

- `devices.Devices` — the pools the store reads and writes; truth, poison and freed
  bytes; the checks of what lands in the slots; a broken device write.
- `model.PageModel` — what the store may and must hold per page; the checks of
  LOOKUP, `contains` and `evict` answers.
- `completions.Completions` — the jobs the store owes a completion for; the checks of
  completion counts, batch results and per-layer progress.

The contract (the rules, the model, what is checked) is the package docstring's
(`unicache_fsm.testing.store_machine`).
"""

from __future__ import annotations

from typing import ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from unicache_fsm.pools.transfer import PoolHitPolicy, PoolName, PoolTransfer
from unicache_fsm.store.errors import StoreFaultError
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing.store_machine.completions import (
    Completions,
    PendingLoad,
    PendingOffload,
    check_bool,
    pop_promised,
)
from unicache_fsm.testing.store_machine.devices import Devices, Ident
from unicache_fsm.testing.store_machine.faults import FaultRules
from unicache_fsm.testing.store_machine.model import (
    ANY_POOL,
    CHAINS,
    LOADS,
    Chain,
    LoadTicket,
    PageModel,
)

KV, SWA, MAMBA = PoolName.KV, PoolName.SWA, PoolName.MAMBA


class StoreMachine(FaultRules, RuleBasedStateMachine):
    """Fuzzes the `ExternalStore` that `make_store` returns (see the package docstring).

    Class attributes a subclass may set: `page_sizes`, `pool_names` (KV first; windows
    drawn for pools not attached are ignored), `lossless`, `progress_completes`,
    `pool_pages` (device pages per pool), `num_layers`, `width`, `max_chain_pages`,
    `device_faults`, `host_view`.
    """

    page_sizes: ClassVar[tuple[int, ...]] = (1, 2, 4, 8, 16)
    """Each program draws its page size P from these."""
    pool_names: ClassVar[tuple[PoolName, ...]] = (KV, SWA, MAMBA)
    lossless: ClassVar[bool] = False
    """True: the store never drops, refuses or fails anything on its own (stricter checks)."""
    progress_completes: ClassVar[bool] = True
    """True (the protocol's rule): `progress()` finishes every started batch and queued
    offload. False for a store that holds completions back on purpose (FaultyStore's
    delay_completion)."""
    pool_pages: ClassVar[int] = 512
    device_faults: ClassVar[bool] = False
    """True: the `break_device` rule may make a store's write into a pool fail."""
    host_view: ClassVar[bool] = True
    """False: the pools' `page_bytes()` answers None, so a store moves bytes only through
    `read_page_ids` / `write_page_ids` (layer by layer, for a layer-major load)."""
    num_layers: ClassVar[int] = 2
    width: ClassVar[int] = 4
    max_chain_pages: ClassVar[int] = 8

    chains: Bundle[Chain] = CHAINS
    loads: Bundle[LoadTicket] = LOADS

    def __init__(self) -> None:
        super().__init__()
        self._store: ExternalStore | None = None
        self.page_size = 0
        self.devices = Devices()
        self.model = PageModel()
        self.completions = Completions()
        # the machine's parts under the names it had before they were split out (the
        # very same objects, filled in place)
        self.allocators = self.devices.allocators
        self.kv_pools = self.devices.pools
        self.freed = self.devices.freed
        self.known, self.may, self.stored = self.model.known, self.model.may, self.model.stored
        self.corrupted, self.chains_made = self.model.corrupted, self.model.chains_made
        self.absent_because = self.model.absent_because
        c = self.completions
        self.offloads, self.queued, self.started = c.offloads, c.queued, c.started
        self.orphans, self.done, self.refused = c.orphans, c.done, c.refused
        self.layers_seen = c.layers_seen
        self._offload_number = 0
        self._load_number = 0
        self._lookup_number = 0
        # Calls (not answers, which may vary with a background store's timing) that make
        # start_loading and reset worth a step; they guard those two rules.
        self._load_calls_since_start = 0
        self._calls_since_reset = 0
        self._evict_number = 0

    # -- what a subclass provides ------------------------------------------------------

    def make_store(self) -> ExternalStore:
        """A fresh, unattached store (the machine attaches its pools)."""
        msg = (
            f"{type(self).__name__} must implement make_store(self) -> ExternalStore, "
            "returning a fresh store of the kind under test"
        )
        raise NotImplementedError(msg)

    # -- setup and teardown ------------------------------------------------------------

    @property
    def store(self) -> ExternalStore:
        assert self._store is not None, "the store is opened by the open_store initializer"
        return self._store

    @initialize(page_size=st.runner().flatmap(lambda m: st.sampled_from(m.page_sizes)))
    def open_store(self, page_size: int) -> None:
        """Build the pools for page size `page_size` and attach a fresh store to them."""
        names = self.pool_names
        assert names and names[0] is KV and len(set(names)) == len(names), (
            f"{type(self).__name__}.pool_names = {names!r}: list KV first, each pool once"
        )
        self.page_size = page_size
        self.devices.open(
            names,
            self.pool_pages,
            page_size,
            num_layers=self.num_layers,
            width=self.width,
            host_view=self.host_view,
        )
        self._store = self.make_store()
        self._store.attach(self.devices.pools)

    def teardown(self) -> None:
        if self._store is not None:
            self._store.close()

    # -- rules: offloads -----------------------------------------------------------------

    @precondition(lambda self: self._has_room())
    @rule(
        target=chains,
        parent=st.none() | chains,
        cut=st.integers(0, 8),
        pages=st.lists(st.integers(0, 3), min_size=1, max_size=4).map(tuple),
        swa=st.integers(0, 3),
        mamba=st.integers(0, 2),
        settle=st.booleans(),
    )
    def offload(
        self,
        parent: Chain | None,
        cut: int,
        pages: tuple[int, ...],
        swa: int,
        mamba: int,
        settle: bool,
    ) -> Chain:
        """Offload a chain: KV for every page, a trailing window for SWA / MAMBA; with
        `settle`, then `progress()` and `poll_offloads()` (as a serving loop would)."""
        self._calls_since_reset += 1
        base = parent.pages[: cut % (len(parent.pages) + 1)] if parent is not None else ()
        chain = Chain(self.page_size, (*base, *pages)[: self.max_chain_pages])
        self.model.chains_made.append(chain)
        parts = tuple(
            self.devices.source(pool, keys)
            for pool, keys in self._pool_keys(chain.keys, swa, mamba)
        )
        idents = frozenset((part.pool, key) for part in parts for key in part.keys)
        self.model.known |= idents
        try:
            accepted = self.store.offload(self.devices.transfers(parts))
        except StoreFaultError:
            accepted = False
        check_bool("offload", accepted)
        number = self._offload_number
        self._offload_number += 1
        if accepted:
            self.completions.offloads.append(PendingOffload(number, parts, idents))
            self.model.may |= idents
        else:
            assert not self.lossless, (
                f"offload #{number} of {len(chain.keys)} page(s) was refused, but the store "
                "is lossless (set lossless = False if it may refuse)"
            )
            self.devices.free(parts, f"offload #{number}'s source, refused")
            for ident in idents - self.model.may:
                self.model.absent_because.setdefault(ident, "every offload naming it was refused")
        if settle:  # whatever the answer: what the machine does next must not depend on it
            self.progress()
            self.poll_offloads()
        return chain

    @rule()
    def progress(self) -> None:
        """progress(): every queued offload and started batch is performed (a background
        store's worker is idle), though a store may still hold the completions back."""
        done = self.store.progress()
        self.devices.mend()
        for record in self.completions.offloads:
            record.ran = True
        assert isinstance(done, int) and done >= 0, (
            f"progress() returned {done!r}; expected the number of jobs it saw finish (>= 0)"
        )
        if not self.progress_completes:
            return
        recorded, awaiting = self.store.num_completed_offloads(), len(self.completions.offloads)
        assert recorded == awaiting, (
            f"after progress(), {recorded} offload completion(s) are recorded for "
            f"{awaiting} offload(s) awaiting one: progress() must finish every "
            "queued offload, so a completion was lost (set progress_completes = False "
            "for a store that holds completions back on purpose)"
        )
        self._check_load_count("after progress()", exact=True)

    @rule()
    def poll_offloads(self) -> None:
        """Pop every recorded offload flag; each settles the oldest pending offload."""
        count = self.store.num_completed_offloads()
        self.completions.check_offload_count(count)
        for k in range(count):
            ok = pop_promised("offload", k, count, self.store.pop_completed_offload)
            record = self.completions.offloads.popleft()
            check_bool(f"pop_completed_offload() for offload #{record.number}", ok)
            for part in record.parts:
                wrong = self.devices.wrong_page(part)
                assert wrong is None, (
                    f"the device slots offload #{record.number} reads from were written "
                    f"while it was pending: {part.pool.value} page {wrong}"
                )
            self.devices.free(record.parts, f"offload #{record.number}'s source, its flag popped")
            if ok:
                self.model.stored |= record.idents - record.evicted
            else:
                assert not self.lossless or record.reset, (
                    f"offload #{record.number} completed False, but the store is lossless "
                    "and no reset() came before it finished"
                )

    # -- rules: lookups and loads --------------------------------------------------------

    @rule(chain=chains, start=st.integers(0, 7), swa=st.integers(0, 3), mamba=st.integers(0, 2))
    def lookup(self, chain: Chain, start: int, swa: int, mamba: int) -> None:
        """Look up a chain's tail (from page `start`); the answer must match the model."""
        self._lookup(chain, start, swa, mamba)

    @precondition(lambda self: self._has_room())
    @rule(
        target=loads,
        chain=chains,
        start=st.integers(0, 7),
        count=st.integers(1, 8),
        settle=st.booleans(),
    )
    def load(self, chain: Chain, start: int, count: int, settle: bool) -> LoadTicket:
        """Load `count` KV pages of a chain from page `start` (any run, not only a
        prefix); with `settle`, then `start_loading()`, `progress()` and `poll_loads()`."""
        self._load_calls_since_start += 1
        self._calls_since_reset += 1
        first = start % len(chain.keys)
        keys = chain.keys[first : first + count]
        must = None
        if self.lossless and {(KV, key) for key in keys} <= self.model.stored - self.model.tainted:
            must = "every page of it was stored by a successful offload and not evicted since"
        return self._settled(self._queue_load([(KV, keys)], must), settle)

    @precondition(lambda self: self._has_room())
    @rule(
        target=loads,
        chain=chains,
        start=st.integers(0, 7),
        swa=st.integers(0, 3),
        mamba=st.integers(0, 2),
        pick=st.integers(0, 7),
        settle=st.booleans(),
    )
    def load_restorable(
        self, chain: Chain, start: int, swa: int, mamba: int, pick: int, settle: bool
    ) -> LoadTicket:
        """Look up a tail, then load the pages of one boundary it reported (pick 0: the
        largest), as the linker does: KV up to it, each window's pages just before it;
        `settle` as for `load`."""
        self._load_calls_since_start += 1
        self._calls_since_reset += 1
        tail, windows, found = self._lookup(chain, start, swa, mamba)
        if not found:
            rid = self._next_rid()  # never sent: the bundle's contents must not depend
            self.completions.refused.add(rid)  # on the store's answers (background stores vary)
            return self._settled(LoadTicket(rid), settle)
        boundary = found[-1 - pick % len(found)]
        pool_keys = [(KV, tail[:boundary])]
        pool_keys += [(pool, tail[max(0, boundary - n) : boundary]) for pool, n in windows]
        must = None
        # a tainted page may vanish after LOOKUP: a load running on a background worker
        # reads a corrupt page and drops it with the chain after it
        wanted = {(pool, key) for pool, keys in pool_keys for key in keys}
        if self.lossless and not wanted & self.model.tainted:
            must = f"lookup just reported boundary {boundary}"
        return self._settled(self._queue_load(pool_keys, must), settle)

    @precondition(lambda self: self._load_calls_since_start > 0)
    @rule(settle=st.booleans())
    def start_loading(self, settle: bool) -> None:
        """Start every queued load as one batch; with `settle`, then poll, `progress()`
        and poll again (as a serving loop polls each step, whether the store progressed
        or not)."""
        self._start_loading()
        if settle:
            self.poll_loads()
            self.progress()
            self.poll_loads()

    def _start_loading(self) -> None:
        self._load_calls_since_start = 0
        batch = self.store.start_loading()
        self.completions.started_batch(batch, self.devices, self.store)

    @rule(index=st.integers(0, 7))
    def loaded_layers(self, index: int) -> None:
        """Ask a started batch's per-layer progress, if one awaits its result (see the
        package docstring), and a batch id never started. (No precondition: which batches
        await a result depends on a background store's timing, and a guard must not.)"""
        batches = list(self.completions.started)
        if batches:
            batch = batches[index % len(batches)]
            started = self.completions.started[batch]
            self.completions.check_layers(batch, started, self.devices, self.store, full=False)
        try:
            answer: object = self.store.loaded_layers(-1)
        except LookupError:
            return
        msg = f"loaded_layers(-1) answered {answer!r}; a batch never started is a LookupError"
        raise AssertionError(msg)

    @rule()
    def poll_loads(self) -> None:
        """Pop every recorded batch result and check it (rids, order, bytes)."""
        count = self.store.num_completed_loads()
        self._check_load_count("num_completed_loads()", recorded=count)
        for k in range(count):
            result = pop_promised("load", k, count, self.store.pop_completed_load)
            self.completions.settle_batch(result, self.devices, self.store, lossless=self.lossless)

    @rule(ticket=consumes(loads))
    def cancel_queued_load(self, ticket: LoadTicket) -> None:
        """Cancel a load: True exactly when it is still queued (not started, not done)."""
        rid = ticket.rid
        cancelled = self.store.cancel_queued_load(rid)
        check_bool(f"cancel_queued_load({rid!r})", cancelled)
        record = self.completions.queued.pop(rid, None)
        if record is None:
            if rid in self.completions.refused:
                where = "refused (or never sent)"
            elif rid in self.completions.done:
                where = "finished"
            else:
                where = "started (or failed by a reset)"
            assert not cancelled, (
                f"cancel_queued_load({rid!r}) returned True, but that load is {where}, "
                "not queued; only a queued load can be cancelled"
            )
            return
        assert cancelled, (
            f"cancel_queued_load({rid!r}) returned False, but that load is queued and not "
            "started; a queued load must be cancellable"
        )
        self.completions.done.add(rid)
        self.devices.free(record.parts, f"load {rid!r}'s destination, cancelled")

    # -- rules: eviction, reset (the fault rules: `FaultRules`) ----------------------------

    @rule(
        chain=chains,
        first=st.integers(0, 7),
        count=st.integers(1, 3),
        pool=st.none() | ANY_POOL,
    )
    def evict(self, chain: Chain, first: int, count: int, pool: PoolName | None) -> None:
        """Evict `count` pages of a chain from page `first`, in one pool or all."""
        if pool is not None and pool not in self.devices.pools:
            return  # a pool this machine does not attach
        start = first % len(chain.keys)
        keys = chain.keys[start : start + count]
        pools = self.pool_names if pool is None else (pool,)
        idents = {(name, key) for name in pools for key in keys}
        removed = self.store.evict(list(keys), pool)
        number = self._evict_number
        self._evict_number += 1
        most = len(idents & self.model.may)
        least = len(idents & (self.model.stored - self.model.tainted)) if self.lossless else 0
        assert isinstance(removed, int) and least <= removed <= most, (
            f"evict #{number} of {len(keys)} key(s) ({pool or 'all pools'}) returned "
            f"{removed!r}, but "
            f"{most} of those pages can be in the store"
            + (f" and {least} surely are (the store is lossless)" if self.lossless else "")
        )
        pending = self.completions.evicted(idents)
        self.model.evicted(idents, number, pending)

    @precondition(lambda self: self._calls_since_reset > 0)
    @rule()
    def reset(self) -> None:
        """reset(): every pending job completes (loads as failed); stored pages stay."""
        self._calls_since_reset = 0
        self.store.reset()
        self.devices.mend()
        for record in self.completions.offloads:
            record.reset = record.ran = True  # nothing is queued or in flight afterwards
        for load in self.completions.pending_loads():
            load.clean = False
        self.completions.orphans.update(self.completions.queued)
        self.completions.queued.clear()
        recorded, pending = self.store.num_completed_offloads(), len(self.completions.offloads)
        assert recorded == pending, (
            f"after reset(), {recorded} offload completion(s) are recorded for "
            f"{pending} pending offload(s); reset() must complete every one"
        )
        self._check_load_count("after reset()", exact=True)

    @property
    def tainted(self) -> set[Ident]:
        """The corrupted pages and every page after one in any chain offloaded so far: a
        load that reads a corrupt page drops it and the chain stored after it."""
        return self.model.tainted

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def completions_never_exceed_jobs(self) -> None:
        self.completions.check_offload_count(self.store.num_completed_offloads())
        self._check_load_count("num_completed_loads()")

    @invariant()
    def presence_matches_the_model(self) -> None:
        self.model.check_presence(self.store, lossless=self.lossless)

    @invariant()
    def freed_slots_untouched(self) -> None:
        self.devices.check_freed()

    @invariant()
    def store_books_hold(self) -> None:
        check = getattr(self.store, "check_invariants", None)
        if callable(check):
            check()

    # -- helpers: pools and transfers ----------------------------------------------------

    def _has_room(self) -> bool:
        return self.devices.has_room(self.max_chain_pages)

    def _pool_keys(
        self, keys: tuple[str, ...], swa: int, mamba: int
    ) -> list[tuple[PoolName, tuple[str, ...]]]:
        """KV for every key, then each attached extra pool's trailing window (if any)."""
        out = [(KV, keys)]
        for pool, window in ((SWA, swa), (MAMBA, mamba)):
            if window and pool in self.devices.pools:
                out.append((pool, keys[-window:]))
        return out

    # -- helpers: lookups ----------------------------------------------------------------

    def _lookup(
        self, chain: Chain, start: int, swa: int, mamba: int
    ) -> tuple[tuple[str, ...], list[tuple[PoolName, int]], list[int]]:
        """LOOKUP of a chain's tail; (tail, windows, the boundaries found, checked)."""
        tail = chain.keys[start % len(chain.keys) :]
        windows = [(pool, len(keys)) for pool, keys in self._pool_keys(tail, swa, mamba)[1:]]
        transfers = [PoolTransfer(KV, keys=tail)]
        transfers += [
            PoolTransfer(pool, keys=tail[-n:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
            for pool, n in windows
        ]
        rid = f"lookup-{self._lookup_number}"
        self._lookup_number += 1
        try:
            found = self.store.lookup(rid, transfers)
        except StoreFaultError:
            assert not self.lossless, f"lookup({rid!r}) raised StoreFaultError on a lossless store"
            return tail, windows, []
        self.model.check_boundaries(rid, tail, windows, transfers, found, lossless=self.lossless)
        return tail, windows, list(found)

    # -- helpers: loads ------------------------------------------------------------------

    def _queue_load(
        self, pool_keys: list[tuple[PoolName, tuple[str, ...]]], must: str | None
    ) -> LoadTicket:
        rid = self._next_rid()
        parts = tuple(self.devices.destination(pool, keys) for pool, keys in pool_keys if keys)
        idents = frozenset((part.pool, key) for part in parts for key in part.keys)
        self.model.known |= idents
        try:
            accepted = self.store.load(rid, self.devices.transfers(parts))
        except StoreFaultError:
            accepted = False
        check_bool(f"load({rid!r})", accepted)
        if not accepted:
            self.devices.free(parts, f"load {rid!r}'s destination, refused")
            pages = ", ".join(f"{len(p.keys)} {p.pool.value}" for p in parts)
            assert must is None, (
                f"load({rid!r}) of {pages} page(s) was refused, but {must}; a lossless "
                "store must accept it"
            )
            self.completions.refused.add(rid)
            return LoadTicket(rid)  # a refused load's ticket: cancelling it must say False
        clean = (
            self.lossless
            and idents <= self.model.stored - self.model.tainted
            and not self.devices.armed
        )
        self.completions.queued[rid] = PendingLoad(rid, parts, idents, clean)
        return LoadTicket(rid)

    def _settled(self, ticket: LoadTicket, settle: bool) -> LoadTicket:
        """With `settle`: start_loading, poll_loads, progress, poll_loads (whether or not
        the load was accepted: the guards must not depend on the store's answers)."""
        if settle:
            self._start_loading()
            self.poll_loads()
            self.progress()
            self.poll_loads()
        return ticket

    def _next_rid(self) -> str:
        rid = f"load-{self._load_number}"
        self._load_number += 1
        return rid

    def _check_load_count(self, when: str, *, exact: bool = False, recorded: int = -1) -> None:
        """`Completions.check_load_count` of `recorded` (below 0: of the store's count)."""
        if recorded < 0:
            recorded = self.store.num_completed_loads()
        self.completions.check_load_count(when, recorded, exact=exact)
