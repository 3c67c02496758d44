"""A Hypothesis state machine that fuzzes any `ExternalStore` beside a simple model.

Subclass `StoreMachine`, implement `make_store()` (a fresh, unattached store), and let
pytest collect its `TestCase`::

    from unicache_fsm.store.protocol import ExternalStore
    from unicache_fsm.testing.profiles import load_profile
    from unicache_fsm.testing.store_machine import StoreMachine

    load_profile()  # dev / ci / fuzz from UNICACHE_FSM_PROFILE (default ci); a conftest.py
                    # usually does this, before any `TestCase` is read

    class MyStoreMachine(StoreMachine):
        lossless = True  # my store never drops, refuses or fails anything on its own

        def make_store(self) -> ExternalStore:
            return MyStore()

    TestMyStore = MyStoreMachine.TestCase  # its settings come from the loaded profile

In a script, ``hypothesis.stateful.run_state_machine_as_test(MyStoreMachine,
settings=...)`` runs it. A failure raises `AssertionError` naming the page, the call
and the rule broken, and Hypothesis prints the shortest program it found, one protocol
call per line (``state.offload(...)``, ``state.lookup(...)``): a pasteable reproduction.

The rules are the protocol's calls (`unicache_fsm.store.protocol`), driven on real CPU
`KVPool` pools (one per name in `pool_names`, page size drawn by `open_store`):

- `offload` — a chain of pages (the first pages of a parent chain, then new ones) is
  written into fresh device slots with its *truth* bytes (a fixed function of pool and
  key) and offloaded: KV for every page, SWA / MAMBA for a trailing window;
- `progress`; `poll_offloads` — pop every recorded offload flag, oldest first;
- `lookup` — a chain's tail, with a TRAILING_PAGES window for each extra pool;
- `load` (any run of a chain's KV pages) and `load_restorable` (a lookup, then a load
  of one boundary it reported, with its windows, as the linker does) — the destination
  slots hold `POISON` first;
- `start_loading`, `poll_loads`, `cancel_queued_load` (of a ticket that may by then be
  queued, started, finished or refused);
- `loaded_layers` — the per-layer progress of a started batch (also asked of every
  batch as it starts, and again when its result is popped, before its slots are freed);
- `evict` (pages of a chain; one pool or all), `reset`;
- `corrupt_page` — only when the subclass overrides `corrupt(store, pool, key)`;
- `break_device` — only with ``device_faults = True``: the next store write into a
  pool (after `after` more) raises `DeviceFault` (a GPU copy that failed); loads pending
  until it is disarmed, by the next `progress()` or `reset()`, may then fail, and must
  report only layers that landed.

`offload`, `load`, `load_restorable` and `start_loading` take a `settle` flag: then
they also run `progress()` and poll (loads: poll, progress, poll), as a serving loop
would, so that most programs reach completions (the plain interleavings stay reachable
with ``settle=False``).

The model, per page ``(pool, key)``: *may* — could be in the store (an accepted offload
named it and the test has not evicted it since, or evicted it while an accepted offload
of it had not yet run: no `progress()` or `reset()` since); *stored* — a successful
offload stored it and the test has not evicted it since (the store may still have
dropped it on its own, unless `lossless`); *tainted* — `corrupt` flipped its bytes (at
any time), or it follows such a page in a chain (a load that reads a corrupt page drops
it and the chain after it).

What is checked, in the rules and after every step (invariants):

- completions: one flag per accepted offload, FIFO; one result per started batch, FIFO,
  listing exactly its loads; `reset()` completes every pending job (queued loads fail);
  never more completions recorded than jobs pending; with `progress_completes` (the
  protocol's rule), after `progress()` every queued offload and started batch has its
  completion — a lost completion is caught there;
- bytes: a batch reported successful wrote exactly the truth bytes into every slot of
  every load in it (a page the store lost or skipped still shows the poison); offload
  source slots are never written;
- LOOKUP: boundaries ascending, distinct, within ``1..n``, and each one restorable by the
  rules of `unicache_fsm.store.lookup` applied to *may* (a boundary over a page the test
  evicted, or never offloaded, is a lie); `contains` is False off *may*; `evict`
  removes no more pages than *may* holds; `cancel_queued_load` is True exactly for a
  queued load;
- `lossless = True` (the store never drops, refuses or fails on its own) adds: every
  offload is accepted and succeeds; lookups report at least the rules applied to
  *stored*; `contains` is True on *stored*; `evict` removes every *stored* page named;
  a load of *stored* pages (or of a boundary a lookup just reported) is accepted, and
  its batch lands unless the test evicted, corrupted or reset under it;
- per-layer progress (`loaded_layers`): a dict of attached pools to ints in
  ``0..num_layers``; never below an earlier answer for the batch; every layer it
  reports holds the page's truth bytes in every slot of every load of the batch for
  that pool, whenever asked (a store that reports a layer before writing it shows the
  poison there), a failed batch included; a successful batch reports every layer of
  each of its pools (asked right after its result is popped: a store answers for at
  least the last batch popped); a batch id never started (-1) is a `LookupError`;
- the store's own ``check_invariants()``, when it has one;
- slots given back: every slot the machine freed (a load's or an offload's once its
  completion was popped or it was cancelled, a refused job's at once) holds `FREED`
  until the machine allocates it again — a store whose completion (or count of
  completions) runs ahead of its writes, so that a caller frees slots it still writes
  into, shows there; a count the store cannot back with a pop, and a completion of the
  wrong shape (rids that are not a tuple of str, a batch id that is not an int), are
  named as such.

A store may raise `StoreFaultError` from `lookup`, `load` or `offload` (a failing
backend): the machine treats it as the linker does — a miss, a refusal. A store with a
worker thread answers differently from run to run; the machine draws nothing from the
store's answers (a refused load still yields a ticket, and the guards count calls, not
results), so Hypothesis can fuzz it too. Keep ``pool_pages`` above
``stateful_step_count * max_chain_pages`` so that the room guard never closes.

To draw more per program (a fault policy, a capacity), override the initializer under
the same name and call the base one::

    @initialize(page_size=st.sampled_from((1, 4)), policy=fault_policies())
    def open_store(self, page_size: int, policy: FaultPolicy) -> None:
        self.policy = policy  # make_store wraps its store in FaultyStore(store, policy)
        super().open_store(page_size)

`MemoryStoreMachine` is the reference subclass (the embedded `MemoryStore`, with a
capacity small enough that it evicts on its own).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import attrs
import torch
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

from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.transfer import PoolHitPolicy, PoolName, PoolTransfer
from unicache_fsm.store.errors import NoCompletionError, StoreFaultError
from unicache_fsm.store.lookup import restorable_prefix_pages
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import ExternalStore, LoadBatchResult

__all__ = ["POISON", "Chain", "DeviceFault", "LoadTicket", "MemoryStoreMachine", "StoreMachine"]

T = TypeVar("T")
KV, SWA, MAMBA = PoolName.KV, PoolName.SWA, PoolName.MAMBA
Ident = tuple[PoolName, str]

POISON = 2048.0
"""Written into every load destination first; truth bytes are integers in (-1000, 1000)."""

FREED = -4096.0
"""Written into every slot the machine frees (a popped completion's, a refused job's): a
store that still writes into slots it gave back shows there."""

_TRUTH_BOUND = 1000
# Built, not sampled: Hypothesis prints a str-mixin enum member with its angle-bracket
# repr, but an object from `builds` as the call that made it: ``ComponentType('swa')``
# (`PoolName` is the same enum).
_POOL_NAMES = st.builds(PoolName, st.sampled_from([name.value for name in PoolName]))
_POOL_INDEX = {name: i for i, name in enumerate(PoolName)}


class DeviceFault(UnicacheFsmError, RuntimeError):
    """A store's write into the machine's pools failed on purpose (`break_device`)."""


class _BreakablePool(KVPool):
    """A KVPool whose store writes can be made to fail: with `fail_after` = n, the
    write after n more raises `DeviceFault` (then it is disarmed). The machine's own
    writes (`write_pages`) neither count nor fail. With `host_view` False it hides its
    memory from the host, as a GPU or SGLang's per-layer buffers do."""

    __slots__ = ("fail_after", "host_view")

    def __init__(self, *args: object, host_view: bool = True, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fail_after: int | None = None
        self.host_view = host_view

    def page_bytes(self) -> Any:
        """The pool's pages in place, or None when the machine hides them (`host_view`
        False: stores then move bytes only through reads and per-layer writes)."""
        return super().page_bytes() if self.host_view else None

    def write_page_ids(
        self, pages: torch.Tensor, data: torch.Tensor, *, layers: slice | None = None
    ) -> None:
        left = self.fail_after
        if left is not None:
            self.fail_after = left - 1 if left else None
            if not left:
                msg = f"pool {self.name!r}: the device write failed (break_device)"
                raise DeviceFault(msg)
        super().write_page_ids(pages, data, layers=layers)

    def write_pages(self, slots: torch.Tensor, data: torch.Tensor) -> None:
        armed, self.fail_after = self.fail_after, None
        try:
            super().write_pages(slots, data)
        finally:
            self.fail_after = armed


@attrs.frozen
class Chain:
    """A chain of whole pages (a bundle value): page i is `page_size` copies of token
    ``pages[i]``; `keys` are their page hashes, chained from no namespace."""

    page_size: int
    pages: tuple[int, ...]
    keys: tuple[str, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(page_hashes(self.tokens, self.page_size)))

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(v for v in self.pages for _ in range(self.page_size))


@attrs.frozen
class LoadTicket:
    """The rid of a load the machine asked for (a bundle value): by now it may be queued,
    started, finished, or refused (or never sent, when a lookup found nothing)."""

    rid: str


@attrs.define(eq=False)
class _Part:
    """One pool's share of a test transfer: its keys and the device slots they use."""

    pool: PoolName
    keys: tuple[str, ...]
    slots: torch.Tensor = attrs.field(repr=False)


@attrs.define(eq=False)
class _Offload:
    """An accepted offload awaiting its flag; `evicted`: pages the test evicted meanwhile."""

    number: int
    parts: tuple[_Part, ...]
    idents: frozenset[Ident]
    evicted: set[Ident] = attrs.field(factory=set)
    ran: bool = False  # a progress() came since: the store has performed it (or failed it)
    reset: bool = False  # a reset() may fail it


@attrs.define(eq=False)
class _Load:
    """An accepted load; `clean`: a lossless store must land it (see the module doc)."""

    rid: str
    parts: tuple[_Part, ...]
    idents: frozenset[Ident]
    clean: bool


def _short(ident: Ident) -> str:
    return f"({ident[0].value}, {ident[1][:12]}...)"


class StoreMachine(RuleBasedStateMachine):
    """Fuzzes the `ExternalStore` that `make_store` returns; see the module docstring.

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

    chains: Bundle[Chain] = Bundle("chains")
    loads: Bundle[LoadTicket] = Bundle("loads")

    def __init__(self) -> None:
        super().__init__()
        self._store: ExternalStore | None = None
        self.page_size = 0
        self.allocators: dict[PoolName, PagedAllocator] = {}
        self.kv_pools: dict[PoolName, _BreakablePool] = {}
        self.known: set[Ident] = set()  # every page the test named to the store
        self.may: set[Ident] = set()
        self.stored: set[Ident] = set()
        self.corrupted: set[Ident] = set()  # pages `corrupt` ever flipped
        self.chains_made: list[Chain] = []
        self.absent_because: dict[Ident, str] = {}
        self.offloads: collections.deque[_Offload] = collections.deque()
        self.queued: dict[str, _Load] = {}
        self.started: dict[int, list[_Load]] = {}  # start order
        self.orphans: dict[str, _Load] = {}  # queued at a reset: a failed result is due
        self.done: set[str] = set()  # rids whose result was popped, or cancelled
        self.refused: set[str] = set()  # rids of tickets the store never accepted
        self.layers_seen: dict[int, dict[PoolName, int]] = {}  # batch -> last progress
        self._armed = False  # break_device came, and no progress() or reset() since
        self._truth_pages: dict[Ident, torch.Tensor] = {}
        self._offload_number = 0
        self._load_number = 0
        self._lookup_number = 0
        # Calls (not answers, which may vary with a background store's timing) that make
        # start_loading and reset worth a step; they guard those two rules.
        self._load_calls_since_start = 0
        self._calls_since_reset = 0
        self._evict_number = 0
        # pages the machine freed, by pool: first slot -> why (kept until allocated again),
        # and their slots as one tensor (rebuilt only after a change: checked every step)
        self.freed: dict[PoolName, dict[int, str]] = {}
        self._freed_slots: dict[PoolName, torch.Tensor] = {}

    # -- what a subclass provides ------------------------------------------------------

    def make_store(self) -> ExternalStore:
        """A fresh, unattached store (the machine attaches its pools)."""
        msg = (
            f"{type(self).__name__} must implement make_store(self) -> ExternalStore, "
            "returning a fresh store of the kind under test"
        )
        raise NotImplementedError(msg)

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        """Flip bytes of a stored page. Override it to enable the `corrupt_page` rule."""
        msg = f"{type(self).__name__} does not override corrupt(store, pool, key)"
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
        self.allocators = {
            name: PagedAllocator(self.pool_pages * page_size, page_size, name=name.value)
            for name in names
        }
        self.kv_pools = {
            name: _BreakablePool(
                alloc.size,
                page_size,
                self.num_layers,
                self.width,
                name=alloc.name,
                host_view=self.host_view,
            )
            for name, alloc in self.allocators.items()
        }
        self._store = self.make_store()
        self._store.attach(self.kv_pools)

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
        self.chains_made.append(chain)
        parts = tuple(
            self._source(pool, keys) for pool, keys in self._pool_keys(chain.keys, swa, mamba)
        )
        idents = frozenset((part.pool, key) for part in parts for key in part.keys)
        self.known |= idents
        try:
            accepted = self.store.offload(self._transfers(parts))
        except StoreFaultError:
            accepted = False
        self._check_bool("offload", accepted)
        number = self._offload_number
        self._offload_number += 1
        if accepted:
            self.offloads.append(_Offload(number, parts, idents))
            self.may |= idents
        else:
            assert not self.lossless, (
                f"offload #{number} of {len(chain.keys)} page(s) was refused, but the store "
                "is lossless (set lossless = False if it may refuse)"
            )
            self._free(parts, f"offload #{number}'s source, refused")
            for ident in idents - self.may:
                self.absent_because.setdefault(ident, "every offload naming it was refused")
        if settle:  # whatever the answer: what the machine does next must not depend on it
            self.progress()
            self.poll_offloads()
        return chain

    @rule()
    def progress(self) -> None:
        """progress(): every queued offload and started batch is performed (a background
        store's worker is idle), though a store may still hold the completions back."""
        done = self.store.progress()
        self._mend_device()
        for record in self.offloads:
            record.ran = True
        assert isinstance(done, int) and done >= 0, (
            f"progress() returned {done!r}; expected the number of jobs it saw finish (>= 0)"
        )
        if not self.progress_completes:
            return
        recorded = self.store.num_completed_offloads()
        assert recorded == len(self.offloads), (
            f"after progress(), {recorded} offload completion(s) are recorded for "
            f"{len(self.offloads)} offload(s) awaiting one: progress() must finish every "
            "queued offload, so a completion was lost (set progress_completes = False "
            "for a store that holds completions back on purpose)"
        )
        self._check_load_count("after progress()", exact=True)

    @rule()
    def poll_offloads(self) -> None:
        """Pop every recorded offload flag; each settles the oldest pending offload."""
        count = self.store.num_completed_offloads()
        self._check_offload_count(count)
        for k in range(count):
            ok = self._pop("offload", k, count, self.store.pop_completed_offload)
            record = self.offloads.popleft()
            self._check_bool(f"pop_completed_offload() for offload #{record.number}", ok)
            for part in record.parts:
                wrong = self._wrong_page(part)
                assert wrong is None, (
                    f"the device slots offload #{record.number} reads from were written "
                    f"while it was pending: {part.pool.value} page {wrong}"
                )
            self._free(record.parts, f"offload #{record.number}'s source, its flag popped")
            if ok:
                self.stored |= record.idents - record.evicted
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
        if self.lossless and {(KV, key) for key in keys} <= self.stored - self.tainted:
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
            self.refused.add(rid)  # on the store's answers (background stores vary)
            return self._settled(LoadTicket(rid), settle)
        boundary = found[-1 - pick % len(found)]
        pool_keys = [(KV, tail[:boundary])]
        pool_keys += [(pool, tail[max(0, boundary - n) : boundary]) for pool, n in windows]
        must = None
        # a tainted page may vanish after LOOKUP: a load running on a background worker
        # reads a corrupt page and drops it with the chain after it
        wanted = {(pool, key) for pool, keys in pool_keys for key in keys}
        if self.lossless and not wanted & self.tainted:
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
        assert isinstance(batch, int) and not isinstance(batch, bool), (
            f"start_loading() returned {batch!r}; expected an int batch id (or -1)"
        )
        if not self.queued:
            assert batch == -1, f"start_loading() returned {batch} with no load queued: want -1"
            return
        rids = tuple(self.queued)
        assert batch >= 0, (
            f"start_loading() returned {batch} with loads {rids} queued; expected a batch id"
        )
        assert batch not in self.started, (
            f"start_loading() returned batch id {batch}, which an earlier batch still uses"
        )
        self.started[batch] = list(self.queued.values())
        self.queued.clear()
        self._check_layers(batch, self.started[batch], full=False)

    @rule(index=st.integers(0, 7))
    def loaded_layers(self, index: int) -> None:
        """Ask a started batch's per-layer progress, if one awaits its result (see the
        module docstring), and a batch id never started. (No precondition: which batches
        await a result depends on a background store's timing, and a guard must not.)"""
        batches = list(self.started)
        if batches:
            batch = batches[index % len(batches)]
            self._check_layers(batch, self.started[batch], full=False)
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
            self._settle_batch(self._pop("load", k, count, self.store.pop_completed_load))

    @rule(ticket=consumes(loads))
    def cancel_queued_load(self, ticket: LoadTicket) -> None:
        """Cancel a load: True exactly when it is still queued (not started, not done)."""
        rid = ticket.rid
        cancelled = self.store.cancel_queued_load(rid)
        self._check_bool(f"cancel_queued_load({rid!r})", cancelled)
        record = self.queued.pop(rid, None)
        if record is None:
            if rid in self.refused:
                where = "refused (or never sent)"
            elif rid in self.done:
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
        self.done.add(rid)
        self._free(record.parts, f"load {rid!r}'s destination, cancelled")

    # -- rules: eviction, reset, corruption ----------------------------------------------

    @rule(
        chain=chains,
        first=st.integers(0, 7),
        count=st.integers(1, 3),
        pool=st.none() | _POOL_NAMES,
    )
    def evict(self, chain: Chain, first: int, count: int, pool: PoolName | None) -> None:
        """Evict `count` pages of a chain from page `first`, in one pool or all."""
        if pool is not None and pool not in self.kv_pools:
            return  # a pool this machine does not attach
        start = first % len(chain.keys)
        keys = chain.keys[start : start + count]
        pools = self.pool_names if pool is None else (pool,)
        idents = {(name, key) for name in pools for key in keys}
        removed = self.store.evict(list(keys), pool)
        number = self._evict_number
        self._evict_number += 1
        most = len(idents & self.may)
        least = len(idents & (self.stored - self.tainted)) if self.lossless else 0
        assert isinstance(removed, int) and least <= removed <= most, (
            f"evict #{number} of {len(keys)} key(s) ({pool or 'all pools'}) returned "
            f"{removed!r}, but "
            f"{most} of those pages can be in the store"
            + (f" and {least} surely are (the store is lossless)" if self.lossless else "")
        )
        pending = {ident for rec in self.offloads if not rec.ran for ident in rec.idents}
        for record in self.offloads:
            record.evicted |= idents & record.idents  # its success will not cover them
        for ident in idents:
            self.stored.discard(ident)  # (a corrupted page stays in `corrupted`: a load
            # may already have dropped the chain after it, which this evict cannot undo)
            if ident not in pending:
                self.may.discard(ident)
                self.absent_because[ident] = (
                    f"the test evicted it (evict #{number}), after every offload of it the "
                    "store accepted had run"
                )
        self._disturb(idents)

    @precondition(lambda self: self._calls_since_reset > 0)
    @rule()
    def reset(self) -> None:
        """reset(): every pending job completes (loads as failed); stored pages stay."""
        self._calls_since_reset = 0
        self.store.reset()
        self._mend_device()
        for record in self.offloads:
            record.reset = record.ran = True  # nothing is queued or in flight afterwards
        for load in self._pending_loads():
            load.clean = False
        self.orphans.update(self.queued)
        self.queued.clear()
        recorded = self.store.num_completed_offloads()
        assert recorded == len(self.offloads), (
            f"after reset(), {recorded} offload completion(s) are recorded for "
            f"{len(self.offloads)} pending offload(s); reset() must complete every one"
        )
        self._check_load_count("after reset()", exact=True)

    @precondition(lambda self: self.device_faults and not self._armed)
    @rule(pool=_POOL_NAMES, after=st.integers(0, 3))
    def break_device(self, pool: PoolName, after: int) -> None:
        """The store's write into `pool` after `after` more fails (`DeviceFault`)."""
        self._armed = True  # (until mended: whether the store used it is its timing's)
        if pool in self.kv_pools:
            self.kv_pools[pool].fail_after = after
        for load in self._pending_loads():
            load.clean = False

    def _mend_device(self) -> None:
        self._armed = False
        for pool in self.kv_pools.values():
            pool.fail_after = None

    @precondition(lambda self: type(self).corrupt is not StoreMachine.corrupt)
    @rule(chain=chains, index=st.integers(0, 7), pool=_POOL_NAMES)
    def corrupt_page(self, chain: Chain, index: int, pool: PoolName) -> None:
        """Flip the bytes of a stored page (only when the subclass overrides `corrupt`)."""
        key = chain.keys[index % len(chain.keys)]
        if pool not in self.kv_pools or not self.store.contains(pool, key):
            return
        self.corrupt(self.store, pool, key)
        self.corrupted.add((pool, key))
        self._disturb(self.tainted)

    @property
    def tainted(self) -> set[Ident]:
        """The corrupted pages and every page after one in any chain offloaded so far: a
        load that reads a corrupt page drops it and the chain stored after it."""
        out = set(self.corrupted)
        for pool, key in self.corrupted:
            for chain in self.chains_made:
                if key in chain.keys:
                    out |= {(pool, k) for k in chain.keys[chain.keys.index(key) :]}
        return out

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def completions_never_exceed_jobs(self) -> None:
        self._check_offload_count(self.store.num_completed_offloads())
        self._check_load_count("num_completed_loads()")

    @invariant()
    def presence_matches_the_model(self) -> None:
        for ident in sorted(self.known):
            if ident not in self.may:
                assert not self.store.contains(*ident), (
                    f"contains{_short(ident)} is True, but that page cannot be in the "
                    f"store: {self._absent_reason(ident)}"
                )
            elif self.lossless and ident in self.stored and ident not in self.tainted:
                assert self.store.contains(*ident), (
                    f"contains{_short(ident)} is False, but a successful offload stored it "
                    "and the test has not evicted it since; the store is lossless, so it "
                    "lost the page"
                )

    @invariant()
    def freed_slots_untouched(self) -> None:
        p = self.page_size
        for pool, pages in self.freed.items():
            if not pages:
                continue
            slots = self._freed_slots.get(pool)
            if slots is None:
                firsts = torch.tensor(sorted(pages), dtype=torch.int64)
                slots = self._freed_slots[pool] = (firsts[:, None] + torch.arange(p)).flatten()
            rows = self.kv_pools[pool].read_pages(slots).view(len(pages), -1)
            touched = ~(rows == FREED).all(1)
            if bool(touched.any()):
                first = int(slots[int(touched.nonzero()[0, 0]) * p])
                raise AssertionError(
                    f"{pool.value} slots {first}..{first + p - 1} were written after the "
                    f"machine freed them ({pages[first]}): the store still writes into "
                    "slots it gave back (its completion, or its count of completions, ran "
                    "ahead of its work)"
                )

    @invariant()
    def store_books_hold(self) -> None:
        check = getattr(self.store, "check_invariants", None)
        if callable(check):
            check()

    # -- helpers: pools and transfers ----------------------------------------------------

    def _has_room(self) -> bool:
        need = self.max_chain_pages * self.page_size
        return all(alloc.available_size() >= need for alloc in self.allocators.values())

    def _pool_keys(
        self, keys: tuple[str, ...], swa: int, mamba: int
    ) -> list[tuple[PoolName, tuple[str, ...]]]:
        """KV for every key, then each attached extra pool's trailing window (if any)."""
        out = [(KV, keys)]
        for pool, window in ((SWA, swa), (MAMBA, mamba)):
            if window and pool in self.kv_pools:
                out.append((pool, keys[-window:]))
        return out

    def _transfers(self, parts: tuple[_Part, ...]) -> list[PoolTransfer]:
        return [
            PoolTransfer(
                part.pool,
                part.slots,
                part.keys,
                PoolHitPolicy.ALL_PAGES if part.pool is KV else PoolHitPolicy.TRAILING_PAGES,
            )
            for part in parts
        ]

    def _alloc(self, pool: PoolName, pages: int) -> torch.Tensor:
        slots = self.allocators[pool].alloc(pages * self.page_size)
        assert slots is not None, "the _has_room precondition keeps a chain's worth free"
        freed = self.freed.get(pool)
        if freed:
            for first in slots[:: self.page_size].tolist():
                freed.pop(first, None)
            self._freed_slots.pop(pool, None)
        return slots

    def _free(self, parts: tuple[_Part, ...], why: str) -> None:
        """Give `parts`' slots back, marked `FREED` (checked by `freed_slots_untouched`)."""
        for part in parts:
            self.kv_pools[part.pool].fill_pages(part.slots, FREED)
            self.allocators[part.pool].free(part.slots)
            freed = self.freed.setdefault(part.pool, {})
            for first in part.slots[:: self.page_size].tolist():
                freed[first] = why
            self._freed_slots.pop(part.pool, None)

    def _pop(self, what: str, k: int, count: int, pop: Callable[[], T]) -> T:
        """The `k`-th of `count` pops the store's count promised (`what`: load or offload)."""
        try:
            return pop()
        except NoCompletionError as exc:
            msg = (
                f"num_completed_{what}s() said {count}, but pop number {k + 1} found no "
                f"completion ({exc}): a count the store cannot back with a completion"
            )
            raise AssertionError(msg) from exc

    def _truth(self, ident: Ident) -> torch.Tensor:
        """The bytes of page `ident`: integers in (-1000, 1000), fixed by pool and key."""
        page = self._truth_pages.get(ident)
        if page is None:
            pool, key = ident
            gen = torch.Generator().manual_seed(int(key[:15], 16) * 4 + _POOL_INDEX[pool])
            shape = (self.page_size, self.num_layers, self.width)
            values = torch.randint(-_TRUTH_BOUND + 1, _TRUTH_BOUND, shape, generator=gen)
            page = self._truth_pages[ident] = values.to(self.kv_pools[pool].dtype)
        return page

    def _source(self, pool: PoolName, keys: tuple[str, ...]) -> _Part:
        slots = self._alloc(pool, len(keys))
        self.kv_pools[pool].write_pages(slots, torch.cat([self._truth((pool, k)) for k in keys]))
        return _Part(pool, keys, slots)

    def _destination(self, pool: PoolName, keys: tuple[str, ...]) -> _Part:
        slots = self._alloc(pool, len(keys))
        kv = self.kv_pools[pool]
        poison = torch.full((slots.numel(), kv.num_layers, kv.width), POISON, dtype=kv.dtype)
        kv.write_pages(slots, poison)
        return _Part(pool, keys, slots)

    def _wrong_page(self, part: _Part) -> str | None:
        """None when `part`'s slots hold its truth bytes, else which page is wrong, how."""
        n, p = len(part.keys), self.page_size
        got = self.kv_pools[part.pool].read_pages(part.slots).view(n, p, -1)
        want = torch.stack([self._truth((part.pool, k)) for k in part.keys]).view(n, p, -1)
        same = (got == want).flatten(1).all(1)
        if bool(same.all()):
            return None
        i = int((~same).nonzero()[0, 0])
        where = f"{i} (key {part.keys[i][:12]}...)"
        page = got[i]
        if bool((page == POISON).all()):
            return f"{where} still holds the poison: the store never wrote it"
        twins = [j for j in range(n) if bool((page == want[j]).all())]
        if twins:
            return f"{where} holds the bytes of page {twins[0]} of the same transfer"
        for other in self.kv_pools:
            theirs = self._truth((other, part.keys[i])).view(p, -1)
            if other is not part.pool and bool((page == theirs).all()):
                return f"{where} holds this key's {other.value} page"
        return f"{where} holds bytes that are not this page's"

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
        self._check_boundaries(rid, tail, windows, transfers, found)
        return tail, windows, list(found)

    def _check_boundaries(
        self,
        rid: str,
        tail: tuple[str, ...],
        windows: list[tuple[PoolName, int]],
        transfers: list[PoolTransfer],
        found: object,
    ) -> None:
        n = len(tail)
        assert (
            isinstance(found, list)
            and all(isinstance(b, int) and not isinstance(b, bool) for b in found)
            and found == sorted(set(found))
            and all(1 <= b <= n for b in found)
        ), (
            f"lookup({rid!r}) of a {n}-page tail returned {found!r}; expected a list of "
            f"distinct ascending prefix lengths within 1..{n}"
        )
        may = restorable_prefix_pages(transfers, self._present(self.may))
        for boundary in found:
            if boundary in may:
                continue
            needed = [(KV, key) for key in tail[:boundary]]
            needed += [
                (pool, key) for pool, w in windows for key in tail[max(0, boundary - w) : boundary]
            ]
            gone = next(ident for ident in needed if ident not in self.may)
            raise AssertionError(
                f"lookup({rid!r}) reported prefix {boundary} of a {n}-page tail as "
                f"restorable, but page {tail.index(gone[1])} of the tail {_short(gone)} "
                f"cannot be in the store: {self._absent_reason(gone)}"
            )
        if self.lossless:
            surely = restorable_prefix_pages(transfers, self._present(self.stored - self.tainted))
            missing = sorted(set(surely) - set(found))
            assert not missing, (
                f"lookup({rid!r}) returned {found}, missing restorable prefix(es) {missing}: "
                "every page up to them was stored by a successful offload and not evicted "
                "since, and the store is lossless"
            )

    @staticmethod
    def _present(pages: set[Ident]) -> Callable[[PoolName, Sequence[str]], list[bool]]:
        def present(pool: PoolName, keys: Sequence[str]) -> list[bool]:
            return [(pool, key) in pages for key in keys]

        return present

    def _absent_reason(self, ident: Ident) -> str:
        return self.absent_because.get(ident, "the test never offloaded it")

    # -- helpers: loads ------------------------------------------------------------------

    def _queue_load(
        self, pool_keys: list[tuple[PoolName, tuple[str, ...]]], must: str | None
    ) -> LoadTicket:
        rid = self._next_rid()
        parts = tuple(self._destination(pool, keys) for pool, keys in pool_keys if keys)
        idents = frozenset((part.pool, key) for part in parts for key in part.keys)
        self.known |= idents
        try:
            accepted = self.store.load(rid, self._transfers(parts))
        except StoreFaultError:
            accepted = False
        self._check_bool(f"load({rid!r})", accepted)
        if not accepted:
            self._free(parts, f"load {rid!r}'s destination, refused")
            pages = ", ".join(f"{len(p.keys)} {p.pool.value}" for p in parts)
            assert must is None, (
                f"load({rid!r}) of {pages} page(s) was refused, but {must}; a lossless "
                "store must accept it"
            )
            self.refused.add(rid)
            return LoadTicket(rid)  # a refused load's ticket: cancelling it must say False
        clean = self.lossless and idents <= self.stored - self.tainted and not self._armed
        self.queued[rid] = _Load(rid, parts, idents, clean)
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

    def _pending_loads(self) -> list[_Load]:
        started = [load for batch in self.started.values() for load in batch]
        return [*self.queued.values(), *started]

    def _disturb(self, idents: set[Ident]) -> None:
        for load in self._pending_loads():
            if load.idents & idents:
                load.clean = False

    def _settle_batch(self, result: LoadBatchResult) -> None:
        assert (
            isinstance(result, LoadBatchResult)
            and isinstance(result.batch, int)
            and not isinstance(result.batch, bool)
            and isinstance(result.rids, tuple)
            and all(isinstance(rid, str) for rid in result.rids)
        ), (
            f"pop_completed_load() returned {result!r}; expected a LoadBatchResult with an "
            "int batch id and a tuple of the batch's rids (str)"
        )
        batch, rids, success = result.batch, tuple(result.rids), result.success
        self._check_bool(f"the success of load batch {batch}", success)
        assert len(set(rids)) == len(rids), f"load batch {batch} lists a rid twice: {rids}"
        if batch in self.started:
            oldest = next(iter(self.started))
            assert batch == oldest, (
                f"load batch {batch} completed before batch {oldest}, which started first; "
                "load results are FIFO"
            )
            loads = self.started.pop(batch)
            expected = tuple(load.rid for load in loads)
            assert sorted(rids) == sorted(expected), (
                f"load batch {batch} reports rids {rids}, but the batch holds {expected}"
            )
            started = True
        else:
            stray = [rid for rid in rids if rid not in self.orphans]
            assert rids and not stray, (
                f"pop_completed_load() returned batch {batch} with rids {rids}: no such "
                f"batch is awaiting its result, and {stray or 'no rid'} was queued at a reset"
            )
            assert not success, (
                f"load batch {batch} (loads {rids}, queued when reset() came) reported "
                "success; reset() must fail every queued load"
            )
            loads = [self.orphans.pop(rid) for rid in rids]
            started = False
        if success:
            for load in loads:
                for part in load.parts:
                    wrong = self._wrong_page(part)
                    assert wrong is None, (
                        f"load batch {batch} reported success, but load {load.rid!r} "
                        f"{part.pool.value} page {wrong}"
                    )
        else:
            assert not (self.lossless and all(load.clean for load in loads)), (
                f"load batch {batch} ({rids}) failed, but every page of it was stored by a "
                "successful offload and nothing evicted, corrupted or reset it since; the "
                "store is lossless"
            )
        if started:  # (a batch of loads queued at a reset was never started)
            self._check_layers(batch, loads, full=success is True)
            self.layers_seen.pop(batch, None)
        for load in loads:
            self.done.add(load.rid)
            self._free(load.parts, f"load {load.rid!r}'s destination, batch {batch} popped")

    # -- helpers: per-layer progress -----------------------------------------------------

    def _check_layers(self, batch: int, loads: list[_Load], *, full: bool) -> None:
        """`loaded_layers(batch)`, checked: its form, monotonic, every layer it reports in
        the slots; with `full` (the batch succeeded), every layer of each of its pools."""
        counts: object = self.store.loaded_layers(batch)
        assert isinstance(counts, dict) and all(
            isinstance(pool, PoolName)
            and pool in self.kv_pools
            and isinstance(n, int)
            and not isinstance(n, bool)
            and 0 <= n <= self.num_layers
            for pool, n in counts.items()
        ), (
            f"loaded_layers({batch}) returned {counts!r}; expected a dict of attached pools "
            f"to layer counts in 0..{self.num_layers}"
        )
        seen = self.layers_seen.setdefault(batch, {})
        for pool, before in seen.items():
            assert counts.get(pool, 0) >= before, (
                f"loaded_layers({batch}) reports {counts.get(pool, 0)} {pool.value} layer(s) "
                f"after reporting {before}: progress never goes back"
            )
        seen.update(counts)
        for load in loads:
            for part in load.parts:
                landed = counts.get(part.pool, 0)
                if full:
                    assert landed == self.num_layers, (
                        f"load batch {batch} succeeded, but loaded_layers({batch}) reports "
                        f"{landed} of {self.num_layers} {part.pool.value} layer(s)"
                    )
                wrong = self._wrong_layers(part, landed) if landed else None
                assert wrong is None, (
                    f"loaded_layers({batch}) reports {landed} {part.pool.value} layer(s) "
                    f"landed, but load {load.rid!r} {wrong}"
                )

    def _wrong_layers(self, part: _Part, layers: int) -> str | None:
        """None when the first `layers` layers of `part`'s slots hold its truth bytes,
        else which page and layer is wrong."""
        n, p = len(part.keys), self.page_size
        got = self.kv_pools[part.pool].read_pages(part.slots).view(n, p, self.num_layers, -1)
        want = torch.stack([self._truth((part.pool, k)) for k in part.keys])
        same = (got[:, :, :layers] == want[:, :, :layers]).all(3).all(1)  # [page, layer]
        if bool(same.all()):
            return None
        page, layer = (int(i) for i in (~same).nonzero()[0])
        poisoned = bool((got[page, :, layer] == POISON).all())
        how = "still holds the poison: not written yet" if poisoned else "holds other bytes"
        return f"page {page} (key {part.keys[page][:12]}...) layer {layer} {how}"

    # -- helpers: completion counts ------------------------------------------------------

    def _check_offload_count(self, recorded: int) -> None:
        assert 0 <= recorded <= len(self.offloads), (
            f"num_completed_offloads() is {recorded}, but only {len(self.offloads)} "
            "accepted offload(s) await a flag: a completion was duplicated (or a refused "
            "offload completed)"
        )

    def _check_load_count(self, when: str, *, exact: bool = False, recorded: int = -1) -> None:
        """Recorded batch results vs. what awaits one: each started batch, plus the loads
        queued at a reset (reported in one or more failed batches)."""
        if recorded < 0:
            recorded = self.store.num_completed_loads()
        most = len(self.started) + len(self.orphans)
        least = len(self.started) + bool(self.orphans) if exact else 0
        assert least <= recorded <= most, (
            f"{when}: {recorded} load batch result(s) are recorded, but {len(self.started)} "
            f"started batch(es) and {len(self.orphans)} load(s) failed by a reset await "
            + (
                "theirs: a result was lost"
                if recorded < least
                else "theirs: a result was duplicated"
            )
        )

    @staticmethod
    def _check_bool(what: str, value: object) -> None:
        assert isinstance(value, bool), f"{what} returned {value!r}; expected a bool"


class MemoryStoreMachine(StoreMachine):
    """The reference subclass: the embedded `MemoryStore`, with `capacity_pages` small
    enough that it evicts on its own (so it is not lossless); corruption flips a stored
    page's first 8 bytes through `MemoryStore.stored_bytes`."""

    capacity_pages: ClassVar[int | None] = 24
    background: ClassVar[bool] = False
    device_faults = True

    def make_store(self) -> ExternalStore:
        return MemoryStore(capacity_pages=self.capacity_pages, background=self.background)

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        assert isinstance(store, MemoryStore)
        view = store.stored_bytes(pool, key)
        assert view is not None, "corrupt_page checks contains() first"
        view[:8] ^= 0xFF

    @invariant()
    def no_swallowed_error(self) -> None:
        store = self.store
        assert isinstance(store, MemoryStore)
        error = store.last_error
        assert error is None or isinstance(error, DeviceFault), f"the store swallowed {error!r}"
