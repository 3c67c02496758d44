"""What every store backend shares: the protocol's queues and completions, the worker
thread, the chain books that drive capacity eviction from chain ends, bounded staging
and per-layer load progress.

`BaseStore` implements every primitive of `unicache_fsm.store.protocol` (see there for
the contracts) except moving bytes. A backend subclasses it and provides the
``backend_*`` hooks (the store-author's guide, with an example: docs/store-authors.md):

- `backend_present(pool, keys) -> list[bool]` — which pages the backend holds (the
  lock is held; a backend whose pages other processes also write or drop answers from
  the backend itself and reconciles the books with `SharedStore`'s learning).
- `backend_load_batch(batch)` — read, verify and write one started batch into its
  slots (outside the lock), then `finish_load_batch(batch, ok)` under the lock. It
  must complete the batch whatever happens (catch, keep the exception in
  `last_error`, finish it failed). Bytes in transit stay within `staging_bytes`
  (`unicache_fsm.store.staging`): `write_staged(batch, staged, fill)` stages,
  verifies (through the backend's `fill`) and writes a batch, layer-major when it fits
  (`write_layers`, which reports per-layer progress), else chunk by chunk.
- `backend_offload(record)` — `plan_new_pages` + `make_room` under the lock, write the
  pages outside it, then insert them into the books and `finish_offload(record, ok)`
  under the lock; it too must complete whatever happens.
- optionally `backend_check_layout(pools)` (on attach: refuse, `StoreConfigError`, pools
  whose layout contradicts stored pages), `backend_drop(ident, entry)` (release a page's
  bytes when the books remove it; the lock is held), `backend_drop_many(dropped)` (the
  same for the pages one capacity eviction removed, in one call; default: each through
  `backend_drop`), `backend_delete(idents)` (`evict`:
  remove these pages, the number removed; the lock is held), `backend_release()` (on
  close, the lock held, the worker joined).

Options every backend shares (checked by `check_options`, `StoreConfigError` naming
one): `capacity_pages`, `background`, `history`, `staging_bytes` (the bound on host
bytes in transit per load batch or offload; default `DEFAULT_STAGING_BYTES`).

Per-layer progress (`loaded_layers(batch)`): a started batch has a count per pool of its
transfers, 0 when it starts, raised only by `write_layers` as layers land, and set to
every pool's `num_layers` when the batch completes successfully; a failed batch keeps
what actually landed. Counts are kept for batches not yet popped and for the last
`history` popped ones; any other batch is `StoreBatchUnknownError`.

The books (`_pages`: one entry per stored page the store knows, each with its
`parent`, the previous key in its offload's key order): capacity eviction takes least
recently used pages that have no stored children, and a parent whose last child went is
evicted next, so chains shrink from their end and the remaining prefixes stay
restorable. A page's parent is remembered beyond the page's life (a bounded memo: hash
chains never change), so a page stored again at the start of a transfer gets it back; a
page whose parent was never known learns it from a later transfer that passes through
it. Pages pinned by queued or started loads or by queued offloads, and the first page's
parent of the offload being stored, are never evicted for capacity (`evict()` itself
removes what it is told to). `offload` refuses (False) pages that could never fit; an
offload that cannot make room when it runs completes False and publishes nothing.

Completion: synchronous by default (`progress()` performs every started load batch and
queued offload, in submission order); with ``background=True`` a worker thread performs
them as they come and `progress()` waits until it is idle.

Thread safety: every public call may come from any thread; one lock guards the books,
and bytes move outside it, by one thread at a time (the worker, or the caller of
`progress()`).
"""

from __future__ import annotations

import collections
import operator
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import filterfalse, repeat
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import attrs
import torch

from unicache_fsm.copying import deep
from unicache_fsm.pools.device import PageDevice
from unicache_fsm.pools.transfer import (
    LinkerTransferPhase,
    PoolName,
    PoolTransfer,
    check_page_key,
)
from unicache_fsm.store.errors import (
    NoCompletionError,
    StoreBatchUnknownError,
    StoreClosedError,
    StoreConfigError,
    StoreStateError,
    StoreTransferError,
)
from unicache_fsm.store.jobs import (
    LOAD_MACHINE,
    OFFLOAD_MACHINE,
    StoreLoad,
    StoreLoadTrigger,
    StoreOffload,
    StoreOffloadTrigger,
)
from unicache_fsm.store.lookup import lookup_boundaries, split_lookup_transfers
from unicache_fsm.store.protocol import LoadBatchResult
from unicache_fsm.store.requests import AttachedPools, CheckedTransfer
from unicache_fsm.store.staging import (
    DEFAULT_STAGING_BYTES,
    StagedTransfer,
    as_pages,
    check_staging_bytes,
    chunks,
    write_layer_major,
)

__all__ = ["BaseStore", "Ident", "LoadBatch", "NewPages", "PageEntry"]

Ident = tuple[PoolName, str]
"""A stored page: (pool, page key)."""


class PageEntry(Protocol):
    """What the books need of a backend's per-page entry."""

    parent: Ident | None


E = TypeVar("E", bound=PageEntry)
_R = TypeVar("_R")


@attrs.define(slots=True)
class LoadBatch:
    """One started batch of loads."""

    batch: int
    loads: list[StoreLoad]


@attrs.define(slots=True)
class NewPages:
    """One transfer's pages an offload must write: indices into its keys, with parents."""

    transfer: CheckedTransfer
    indices: list[int]
    parents: list[Ident | None]

    @property
    def keys(self) -> list[str]:
        return [self.transfer.keys[i] for i in self.indices]


def check_options(
    capacity_pages: object,
    history: object,
    background: object = False,
    staging_bytes: object = DEFAULT_STAGING_BYTES,
) -> None:
    """The constructor arguments every backend shares (`StoreConfigError` naming one)."""
    check_staging_bytes(staging_bytes)
    if not isinstance(background, bool):
        msg = f"background must be True or False, got {background!r}"
        raise StoreConfigError(msg, argument="background", value=background)
    if capacity_pages is not None and (
        isinstance(capacity_pages, bool)
        or not isinstance(capacity_pages, int)
        or capacity_pages < 1
    ):
        msg = f"capacity_pages must be None (unbounded) or an int >= 1, got {capacity_pages!r}"
        raise StoreConfigError(msg, argument="capacity_pages", value=capacity_pages)
    if isinstance(history, bool) or not isinstance(history, int) or history < 0:
        msg = f"history must be an int >= 0 (finished records kept), got {history!r}"
        raise StoreConfigError(msg, argument="history", value=history)


#: the longest wait a store accepts (a lock, a server's reply): any wait a store makes
#: is bounded, and a socket timeout must fit the platform's time_t
MAX_WAIT_SECONDS = 86_400.0


def check_seconds(argument: str, value: object) -> float:
    """A wait in seconds, above 0 and at most `MAX_WAIT_SECONDS`, as a float;
    `StoreConfigError` naming `argument` for anything else (a bool, nan, inf, an int
    too large for a float, a string)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    # compared before `float()`: an int too large for a float is refused, not an overflow
    if not (number and 0 < value <= MAX_WAIT_SECONDS):  # type: ignore[operator]
        msg = (
            f"{argument} must be a number of seconds above 0 and at most "
            f"{MAX_WAIT_SECONDS:g}, got {value!r}"
        )
        raise StoreConfigError(msg, argument=argument, value=value)
    return float(value)  # type: ignore[arg-type]


class BaseStore(Generic[E]):
    """The shared half of every store backend; see the module docstring."""

    worker_name: ClassVar[str] = "unicache-store"

    def __init__(
        self,
        *,
        capacity_pages: int | None = None,
        background: bool = False,
        history: int = 256,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
    ) -> None:
        check_options(capacity_pages, history, background, staging_bytes)
        self.capacity_pages = capacity_pages
        self.staging_bytes = staging_bytes
        # per-layer progress of started batches (until popped), then of the last
        # `history` popped ones: batch -> {pool: leading layers in every slot}
        self._layers: dict[int, dict[PoolName, int]] = {}
        self._layers_done: collections.OrderedDict[int, dict[PoolName, int]] = (
            collections.OrderedDict()
        )
        self._layers_kept = history
        # host staging for bytes in transit, reused across jobs, never grown past the
        # budget (but to one page when a page alone is larger); only the thread that
        # performs jobs uses it
        self._staging = torch.empty(0, dtype=torch.uint8)
        self.background = background
        self.last_error: BaseException | None = None
        # `with self._lock` is `with self._cond` (the condition's own lock) without the
        # condition's Python-level __enter__/__exit__ on every call
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._performing = threading.Lock()  # one thread moves bytes at a time
        self._pools = AttachedPools({})
        self._pages: dict[Ident, E] = {}
        self._children: collections.Counter[Ident] = collections.Counter()
        # a page's parent is a fact about its key (hash chains never change): remembered
        # beyond the page's life, so a page stored again at the start of a transfer
        # gets its parent back (bounded; the oldest facts go first)
        self._parents: collections.OrderedDict[Ident, Ident] = collections.OrderedDict()
        self._parents_limit = max(4096, 4 * (capacity_pages or 0))
        # evictable pages (no stored children), least recently used first
        self._leaves: collections.OrderedDict[Ident, None] = collections.OrderedDict()
        self._pins: collections.Counter[Ident] = collections.Counter()
        self._offload_pins: dict[int, list[Ident]] = {}  # queued offload -> its pins
        self._queued: dict[str, StoreLoad] = {}
        self._in_flight: set[str] = set()
        self._jobs: collections.deque[LoadBatch | StoreOffload] = collections.deque()
        self._busy = False
        self._load_results: collections.deque[LoadBatchResult] = collections.deque()
        self._offload_results: collections.deque[bool] = collections.deque()
        self._history: collections.deque[StoreLoad | StoreOffload] = collections.deque(
            maxlen=history
        )
        self._next_batch = 0
        self._next_offload = 0
        self._closed = False
        self._worker: threading.Thread | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy of the books and pages with fresh locks (a search snapshots a whole
        system this way); a store with a background worker cannot be copied."""
        if self._worker is not None:
            msg = f"{type(self).__name__} with a background worker cannot be copied"
            raise TypeError(msg)
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            if name == "_lock":
                continue  # made with `_cond`, below
            if name == "_cond":
                new._lock = threading.Lock()
                new._cond = threading.Condition(new._lock)
            elif name == "_performing":
                new._performing = threading.Lock()
            elif name == "_staging":
                new._staging = torch.empty(0, dtype=torch.uint8)
            else:
                setattr(new, name, deep(value, memo))
        return new

    def start_worker(self) -> None:
        """Start the background worker (subclasses call it last in ``__init__``)."""
        if self.background and self._worker is None:
            self._worker = threading.Thread(target=self._work, name=self.worker_name, daemon=True)
            self._worker.start()

    # -- what a backend provides ---------------------------------------------------------

    def backend_present(self, pool: PoolName, keys: Sequence[str]) -> list[bool]:
        """Which of `keys` the backend holds for `pool`, in order (the lock is held;
        called by `lookup`, `load` and `contains`)."""
        raise NotImplementedError

    def backend_load_batch(self, batch: LoadBatch) -> None:
        """Perform one started batch (called without the lock, by the one thread that
        performs jobs): read and verify its pages, write them into its transfers'
        slots (`write_layers` for a batch staged whole; never more than
        `staging_bytes` of host staging at once), then `finish_load_batch(batch, ok)`
        under the lock. It always finishes the batch: an exception is kept in
        `last_error` and the batch finished failed."""
        raise NotImplementedError

    def backend_offload(self, record: StoreOffload) -> None:
        """Perform one queued offload (without the lock, by the one thread that performs
        jobs): choose its new pages and make room (`plan_new_pages`, `make_room`, under
        the lock), read and write them (within `staging_bytes`), insert them into the
        books and `finish_offload(record, ok)` under the lock; ok only when every new
        page is stored. It always finishes the offload, as `backend_load_batch` does."""
        raise NotImplementedError

    def backend_check_layout(self, pools: AttachedPools) -> None:
        """On `attach`: refuse (`StoreConfigError`, nothing changed) page devices whose
        layout contradicts stored pages (the lock is held). Default: accept."""

    def backend_drop(self, ident: Ident, entry: E) -> None:
        """Release the bytes of a page the books just removed (capacity eviction, a
        rejected page; the lock is held). Default: nothing to release."""

    def backend_drop_many(self, dropped: list[tuple[Ident, E]]) -> None:
        """`backend_drop` of each (ident, entry) of `dropped`, the pages one capacity
        eviction just removed from the books, in order (the lock is held); a backend
        may release them in one call. Default: `backend_drop` of each."""
        for ident, entry in dropped:
            self.backend_drop(ident, entry)

    def backend_delete(self, idents: list[Ident]) -> int:
        """`evict()`: remove these pages, the books' and the backend's; the number
        removed (the lock is held). Default: the books' pages, through `backend_drop`."""
        removed = 0
        for ident in idents:
            if ident in self._pages:
                self._remove(ident)
                removed += 1
        return removed

    def backend_release(self) -> None:
        """Release the backend's resources at `close()` (the lock is held, the worker
        joined, every job finished). Default: nothing to release."""

    # -- protocol: setup and lookup ------------------------------------------------------

    def attach(self, pools: Mapping[PoolName, PageDevice]) -> None:
        attached = AttachedPools(pools)
        with self._lock:
            if self._closed:
                self._check_open("attach")
            if self._queued or self._jobs or self._busy or self._in_flight:
                msg = (
                    "attach: loads or offloads are queued or in flight; re-attach only when "
                    "the store is idle (reset() fails pending work; then pop every result)"
                )
                raise StoreStateError(msg, operation="attach")
            self.backend_check_layout(attached)
            self._pools = attached

    def lookup(self, rid: str, transfers: Sequence[PoolTransfer]) -> list[int]:
        kv, others = split_lookup_transfers(transfers)
        with self._lock:
            if self._closed:
                self._check_open("lookup")
            pools = (kv, *others)
            for t in pools:
                self._pools.pool(t.name, "lookup")
            found = list(lookup_boundaries(kv, others, self.backend_present))
            if found:
                anchors = kv.keys[: found[-1]]
                for t in pools:
                    self._touch(zip(repeat(t.name), anchors))
            return found

    # -- protocol: loads -----------------------------------------------------------------

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        with self._lock:
            if self._closed:
                self._check_open("load")
            checked = self._pools.check_data_transfers(transfers, LinkerTransferPhase.LOAD)
            if rid in self._queued or rid in self._in_flight:
                return False
            present = self.backend_present
            for ct in checked:
                if not all(present(ct.pool, ct.keys)):
                    return False
            idents = _idents(checked)
            record = StoreLoad(rid, checked)
            LOAD_MACHINE.initialize(record)
            self._queued[rid] = record
            self._pins.update(idents)
            self._touch(idents)
            return True

    def start_loading(self) -> int:
        with self._lock:
            if self._closed:
                self._check_open("start_loading")
            if not self._queued:
                return -1
            batch = LoadBatch(self._next_batch, list(self._queued.values()))
            self._next_batch += 1
            self._queued.clear()
            for record in batch.loads:
                record.batch = batch.batch
                LOAD_MACHINE.fire(record, StoreLoadTrigger.START)
                self._in_flight.add(record.rid)
            self._layers[batch.batch] = dict.fromkeys(_pools_of(batch.loads), 0)
            self._jobs.append(batch)
            self._cond.notify_all()
            return batch.batch

    def num_completed_loads(self) -> int:
        with self._lock:
            if self._closed:
                self._check_open("num_completed_loads")
            return len(self._load_results)

    def pop_completed_load(self) -> LoadBatchResult:
        with self._lock:
            if self._closed:
                self._check_open("pop_completed_load")
            result = self._pop_completed(self._load_results, "load")
            self._in_flight.difference_update(result.rids)
            counts = self._layers.pop(result.batch, None)
            if counts is not None and self._layers_kept:
                self._layers_done[result.batch] = counts
                while len(self._layers_done) > self._layers_kept:
                    self._layers_done.popitem(last=False)
            return result

    def loaded_layers(self, batch: int) -> dict[PoolName, int]:
        """For a started batch, how many leading layers of each of its pools are written
        into every slot of the batch (see the module docstring)."""
        with self._lock:
            if self._closed:
                self._check_open("loaded_layers")
            key: object = batch
            counts = None
            if isinstance(key, int) and not isinstance(key, bool):
                counts = self._layers.get(batch)
                if counts is None:
                    counts = self._layers_done.get(batch)
            if counts is None:
                msg = (
                    f"loaded_layers: batch {batch!r} was never started by this store (or "
                    f"was popped more than {self._layers_kept} batches ago)"
                )
                raise StoreBatchUnknownError(msg, batch=batch)
            return dict(counts)

    def cancel_queued_load(self, rid: str) -> bool:
        with self._lock:
            if self._closed:
                self._check_open("cancel_queued_load")
            record = self._queued.pop(rid, None)
            if record is None:
                return False
            LOAD_MACHINE.fire(record, StoreLoadTrigger.CANCEL)
            self._unpin(record)
            self._history.append(record)
            return True

    # -- protocol: offloads --------------------------------------------------------------

    def offload(self, transfers: Sequence[PoolTransfer]) -> bool:
        with self._lock:
            if self._closed:
                self._check_open("offload")
            checked = self._pools.check_data_transfers(transfers, LinkerTransferPhase.OFFLOAD)
            named = _idents(checked)
            if self.capacity_pages is not None:
                # the distinct pages it names that the store lacks (tested against the
                # books one by one: `set - dict.keys()` would walk every stored page)
                new = set(filterfalse(self._pages.__contains__, named))
                if len(new) > self.capacity_pages:
                    return False  # could never fit, even in an empty store
            record = StoreOffload(self._next_offload, checked)
            self._next_offload += 1
            OFFLOAD_MACHINE.initialize(record)
            # the pages it names (and the parent of its first page) stay until it runs: a
            # held page it links to must not be evicted for another offload's room in
            # between (that would punch a hole in the chain)
            pins = named
            pins += [
                parent
                for ct in checked
                if ct.keys and (parent := self._parents.get((ct.pool, ct.keys[0]))) is not None
            ]
            self._offload_pins[record.seq] = pins
            self._pins.update(pins)
            self._jobs.append(record)
            self._cond.notify_all()
            return True

    def num_completed_offloads(self) -> int:
        with self._lock:
            if self._closed:
                self._check_open("num_completed_offloads")
            return len(self._offload_results)

    def pop_completed_offload(self) -> bool:
        with self._lock:
            if self._closed:
                self._check_open("pop_completed_offload")
            return self._pop_completed(self._offload_results, "offload")

    @staticmethod
    def _pop_completed(results: collections.deque[_R], what: str) -> _R:
        """The oldest completion of `results` (call under the lock); `NoCompletionError`
        naming `what` ("load" / "offload") when there is none."""
        if not results:
            msg = f"pop_completed_{what}: no {what} has completed; check num_completed_{what}s()"
            raise NoCompletionError(msg, what=what)
        return results.popleft()

    # -- protocol: driving, eviction, lifecycle ------------------------------------------

    def progress(self) -> int:
        if self.background:
            with self._lock:
                if self._closed:
                    self._check_open("progress")
                outstanding = len(self._jobs) + int(self._busy)
                while self._jobs or self._busy:
                    self._cond.wait()
                return outstanding
        done = 0
        with self._performing:
            while True:
                with self._lock:
                    if self._closed:
                        self._check_open("progress")
                    if not self._jobs:
                        return done
                    job = self._jobs.popleft()
                    self._busy = True
                try:
                    self._run(job)
                finally:
                    with self._lock:
                        self._busy = False
                        self._cond.notify_all()
                done += 1

    def evict(self, keys: Sequence[str], pool: PoolName | None = None) -> int:
        if isinstance(keys, str):
            msg = f"evict: pass a sequence of page keys, not one string {keys!r}"
            raise StoreTransferError(msg, pool=pool)
        keys = [check_page_key(k) for k in keys]
        which: object = pool
        if which is not None and not isinstance(which, PoolName):
            msg = f"evict: pool must be a PoolName or None (all pools), got {pool!r}"
            raise StoreTransferError(msg, pool=pool)
        pools = list(PoolName) if pool is None else [pool]
        with self._lock:
            if self._closed:
                self._check_open("evict")
            return self.backend_delete(
                [(name, key) for name in pools for key in dict.fromkeys(keys)]
            )

    def contains(self, pool: PoolName, key: str) -> bool:
        check_page_key(key)
        which: object = pool
        if not isinstance(which, PoolName):
            msg = f"contains: pool must be a PoolName, got {pool!r}"
            raise StoreTransferError(msg, pool=pool)
        with self._lock:
            if self._closed:
                self._check_open("contains")
            return self.backend_present(pool, [key])[0]

    def reset(self) -> None:
        with self._lock:
            if self._closed:
                self._check_open("reset")
            self._quiesce()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._quiesce()
            self._closed = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join()
        with self._lock:
            self.backend_release()
            self._pages.clear()
            self._children.clear()
            self._parents.clear()
            self._leaves.clear()
            self._pins.clear()
            self._offload_pins.clear()

    # -- inspection ----------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        """Pages in the books (for a shared backend: the pages this store knows of)."""
        with self._lock:
            return len(self._pages)

    def stored_keys(self, pool: PoolName) -> list[str]:
        """The keys in the books for `pool`, in no particular order."""
        with self._lock:
            return [k for (p, k) in self._pages if p is pool]

    def chain_books(self) -> tuple[tuple[Any, ...], tuple[Ident, ...], tuple[Ident, ...]]:
        """The books that steer capacity eviction and dropping a chain, as plain values
        (state-space exploration compares them): every page with its chain parent
        (sorted), the chain ends in the order capacity eviction takes them, and the
        pages whose parent is remembered (sorted). Reads only."""
        with self._lock:
            pages = tuple(sorted((i, e.parent) for i, e in self._pages.items()))
            return pages, tuple(self._leaves), tuple(sorted(self._parents))

    def recent_jobs(self) -> list[StoreLoad | StoreOffload]:
        """Finished (final-state) store-side records, oldest first (bounded history)."""
        with self._lock:
            return list(self._history)

    def check_invariants(self) -> None:
        """Raise AssertionError if the store's books disagree with each other."""
        with self._lock:
            if self.capacity_pages is not None:
                assert len(self._pages) <= self.capacity_pages, "over capacity"
            # counted in C (`Counter(iterable)` over a C-level attribute getter): every
            # count is positive, so the leaves are the pages no entry names as parent
            children = collections.Counter(map(_PARENT, self._pages.values()))
            children.pop(None, None)
            assert _same_counts(children, self._children), "children counts drifted"
            assert self._leaves.keys() == self._pages.keys() - children.keys(), "leaf set drifted"
            if not self._queued and not self._jobs:
                # idle (the usual case between steps): nothing queued or started pins a
                # page, so the books below must be empty, which is what they assert then
                if not self._busy:
                    assert not self._offload_pins, "offload pins drifted"
                    assert not any(n > 0 for n in self._pins.values()), "pins drifted"
                return
            pinned = collections.Counter(
                (ct.pool, k)
                for record in (*self._queued.values(), *self._started_loads())
                for ct in record.transfers
                for k in ct.keys
            )
            queued_offloads = {job.seq for job in self._jobs if isinstance(job, StoreOffload)}
            if not self._busy:
                assert set(self._offload_pins) == queued_offloads, "offload pins drifted"
            for idents in self._offload_pins.values():
                pinned.update(idents)
            if not self._busy:  # a job being performed holds pins outside these books
                held = {k: n for k, n in self._pins.items() if n > 0}  # `+pins`
                assert _same_counts(pinned, held), "pins drifted"
            assert not (set(self._queued) & self._in_flight), "rid both queued and started"

    # -- internals: bookkeeping (caller holds the lock) ----------------------------------

    def _check_open(self, operation: str) -> None:
        if self._closed:
            msg = f"{operation}: the store is closed; create a new store"
            raise StoreClosedError(msg, operation=operation)

    def _started_loads(self) -> list[StoreLoad]:
        return [r for job in self._jobs if isinstance(job, LoadBatch) for r in job.loads]

    def _touch(self, idents: Iterable[Ident]) -> None:
        leaves = self._leaves
        for ident in idents:
            if ident in leaves:
                leaves.move_to_end(ident)

    def _unpin(self, record: StoreLoad) -> None:
        for ct in record.transfers:
            self._release_pins(zip(repeat(ct.pool), ct.keys))

    def _unpin_offload(self, record: StoreOffload) -> None:
        self._release_pins(self._offload_pins.pop(record.seq, ()))

    def _release_pins(self, idents: Iterable[Ident]) -> None:
        pins = self._pins
        for ident in idents:
            left = pins[ident] - 1
            if left > 0:
                pins[ident] = left
            else:
                pins.pop(ident, None)  # (a Counter's own __delitem__ is a Python call)

    def _remember_parent(self, ident: Ident, parent: Ident) -> None:
        memo = self._parents
        memo[ident] = parent
        memo.move_to_end(ident)
        while len(memo) > self._parents_limit:
            memo.popitem(last=False)

    def _insert(self, ident: Ident, entry: E) -> None:
        self._pages[ident] = entry
        parent = entry.parent
        children = self._children
        if parent is not None:
            self._remember_parent(ident, parent)
            # (`get`: a Counter's own lookup of a missing key is a Python `__missing__`)
            children[parent] = children.get(parent, 0) + 1
            self._leaves.pop(parent, None)
        if not children.get(ident):
            self._leaves[ident] = None

    def _insert_many(self, pool: PoolName, keys: Iterable[str], entries: Iterable[E]) -> None:
        """`_insert((pool, key), entry)` of each pair, in order, in one call (an offload
        stores its pages this way): the same books, without two calls per page. The
        parent memo is trimmed once at the end, which leaves the same facts as trimming
        after each page (the oldest go first either way)."""
        pages, children, leaves, memo = self._pages, self._children, self._leaves, self._parents
        for ident, entry in zip(zip(repeat(pool), keys), entries, strict=True):
            pages[ident] = entry
            parent = entry.parent
            if parent is not None:
                memo[ident] = parent
                memo.move_to_end(ident)
                children[parent] = children.get(parent, 0) + 1
                leaves.pop(parent, None)
            if not children.get(ident):
                leaves[ident] = None
        limit = self._parents_limit
        while len(memo) > limit:
            memo.popitem(last=False)

    def _link(self, ident: Ident, entry: E, parent: Ident) -> None:
        """A held page stored as a chain start (its parent was not in the transfer that
        stored it) learns its parent from a later transfer that passes through it."""
        entry.parent = parent
        self._remember_parent(ident, parent)
        self._children[parent] = self._children.get(parent, 0) + 1
        self._leaves.pop(parent, None)

    def _remove(self, ident: Ident) -> None:
        self.backend_drop(ident, self._unlink(ident))

    def _unlink(self, ident: Ident) -> E:
        """Remove a stored page from the books (not its bytes); its entry."""
        entry = self._pages.pop(ident)
        leaves = self._leaves
        leaves.pop(ident, None)
        parent = entry.parent
        if parent is None:
            return entry
        children = self._children
        left = children.get(parent, 0) - 1
        if left > 0:
            children[parent] = left
            return entry
        children.pop(parent, None)
        if parent in self._pages:
            # the parent is next in line: chains shrink from their end
            leaves[parent] = None
            leaves.move_to_end(parent, last=False)
        return entry

    def _descendants(self, idents: Iterable[Ident]) -> list[Ident]:
        """Every page stored after `idents` in their chains (descendants by parent link),
        nearest first; a page that failed verification takes these with it, since LOOKUP
        could never restore past it."""
        found: list[Ident] = []
        frontier = set(idents)
        seen = set(frontier)
        while frontier:
            below = {i for i, e in self._pages.items() if e.parent in frontier} - seen
            found += sorted(below)
            seen |= below
            frontier = below
        return found

    def _evict_lru(self, count: int, protect: set[Ident]) -> int:
        """Remove up to `count` unprotected, unpinned leaves, least recently used first
        (a parent left childless is next in line), their bytes released in one
        `backend_drop_many`; the number removed."""
        dropped: list[tuple[Ident, E]] = []
        skipped: list[Ident] = []
        leaves, pins, unlink = self._leaves, self._pins, self._unlink
        while len(dropped) < count and leaves:
            ident, _ = leaves.popitem(last=False)
            if ident in protect or pins.get(ident):
                skipped.append(ident)
                continue
            dropped.append((ident, unlink(ident)))
        for ident in reversed(skipped):
            leaves[ident] = None
            leaves.move_to_end(ident, last=False)
        if dropped:
            self.backend_drop_many(dropped)
        return len(dropped)

    def plan_new_pages(self, record: StoreOffload) -> tuple[list[NewPages], set[Ident]]:
        """Per transfer, the pages the store lacks (write-once: the others are skipped),
        each with its parent; and the pages the offload names that are already stored
        (touched, and protected from the room-making that follows)."""
        chosen: list[NewPages] = []
        protect: set[Ident] = set()
        for ct in record.transfers:
            seen: set[str] = set()
            new: list[int] = []
            parents: list[Ident | None] = []
            for i, key in enumerate(ct.keys):
                ident = (ct.pool, key)
                held = self._pages.get(ident)
                if held is not None:
                    protect.add(ident)
                    if i and held.parent is None and ct.keys[i - 1] != key:
                        self._link(ident, held, (ct.pool, ct.keys[i - 1]))
                elif key not in seen:
                    new.append(i)
                    parent = (ct.pool, ct.keys[i - 1]) if i else self._parents.get(ident)
                    if parent is not None and not i:
                        protect.add(parent)  # room must not be made by evicting it
                    parents.append(parent)
                seen.add(key)
            chosen.append(NewPages(ct, new, parents))
        self._touch(protect)
        return chosen, protect

    def make_room(self, total: int, protect: set[Ident]) -> bool:
        """Evict for capacity so that `total` new pages fit; False when they cannot."""
        if self.capacity_pages is None:
            return True
        over = len(self._pages) + total - self.capacity_pages
        return not (over > 0 and self._evict_lru(over, protect) < over)

    def finish_offload(self, record: StoreOffload, ok: bool) -> None:
        self._unpin_offload(record)
        OFFLOAD_MACHINE.fire(record, StoreOffloadTrigger.FINISH, ok)
        self._offload_results.append(ok)
        self._history.append(record)

    def staging(self, nbytes: int) -> torch.Tensor:
        """A flat uint8 host buffer of `nbytes` (callers keep `nbytes` within
        `staging_bytes`, or one page), reused: the next call may overwrite it. Only the
        thread performing a job calls it."""
        if self._staging.numel() < nbytes:
            grown = min(max(nbytes, 2 * self._staging.numel()), max(nbytes, self.staging_bytes))
            self._staging = torch.empty(grown, dtype=torch.uint8)
        return self._staging[:nbytes]

    def write_staged(
        self,
        batch: LoadBatch,
        staged: Sequence[tuple[CheckedTransfer, PageDevice]],
        fill: Callable[[CheckedTransfer, PageDevice, range, torch.Tensor], bool],
    ) -> bool:
        """Load `staged` transfers of `batch` through host staging, within
        `staging_bytes`: ``fill(ct, device, pages, buf)`` reads and verifies pages
        `pages` (a range of the transfer's keys) into `buf` (``[len(pages),
        page_nbytes]`` uint8) and answers whether every one checked out. When the whole
        batch fits the budget, every transfer is filled (all verified, none stops the
        others) and, only if all checked out, written layer-major (`write_layers`);
        otherwise each chunk is filled and written with every layer before the next,
        stopping at the first that fails. True when everything was written."""
        total = sum(len(ct.keys) * device.page_nbytes for ct, device in staged)
        if total <= self.staging_bytes:
            flat, at, ok, parts = self.staging(total), 0, True, []
            for ct, device in staged:
                size = len(ct.keys) * device.page_nbytes
                buf = flat[at : at + size].view(len(ct.keys), device.page_nbytes)
                at += size
                ok = fill(ct, device, range(len(ct.keys)), buf) and ok
                parts.append(StagedTransfer(ct.pool, device, ct.pages, as_pages(buf, device)))
            if ok:
                self.write_layers(batch, parts)
            return ok
        for ct, device in staged:
            for piece in chunks(len(ct.keys), device.page_nbytes, self.staging_bytes):
                buf = self.staging(len(piece) * device.page_nbytes).view(len(piece), -1)
                if not fill(ct, device, piece, buf):
                    return False
                device.write_page_ids(ct.pages[piece.start : piece.stop], as_pages(buf, device))
        return True

    def write_layers(self, batch: LoadBatch, parts: Sequence[StagedTransfer]) -> None:
        """Write a batch's verified, staged transfers layer-major (outside the lock),
        raising its `loaded_layers` under the lock as each layer lands everywhere."""
        with self._lock:
            counts = self._layers.get(batch.batch)

        def landed(now: dict[PoolName, int]) -> None:
            with self._lock:
                if counts is not None:
                    for pool, n in now.items():
                        if n > counts.get(pool, 0):
                            counts[pool] = n

        write_layer_major(parts, landed)

    def finish_load_batch(self, batch: LoadBatch, ok: bool) -> None:
        """Complete a performed batch (the lock is held): every record finishes with
        verdict `ok`, its pins go, its result is queued; on success every pool of the
        batch reports all its layers loaded."""
        if ok:
            counts = self._layers.get(batch.batch)
            if counts is not None:
                for pool in counts:
                    counts[pool] = self._pools.pool(pool, "load").num_layers
        for record in batch.loads:
            LOAD_MACHINE.fire(record, StoreLoadTrigger.FINISH, ok)
            self._finish_load_books(record)
        rids = tuple(map(_RID, batch.loads))
        self._load_results.append(LoadBatchResult(batch.batch, rids, ok))

    def _finish_load_books(self, record: StoreLoad) -> None:
        self._unpin(record)  # the rid stays in flight until its result is popped
        self._history.append(record)

    def _quiesce(self) -> None:
        """Fail everything queued or started (the lock is held; waits for a busy job)."""
        jobs = list(self._jobs)
        self._jobs.clear()
        while self._busy:
            self._cond.wait()
        for job in jobs:
            if isinstance(job, LoadBatch):
                for record in job.loads:
                    LOAD_MACHINE.fire(record, StoreLoadTrigger.ABANDON)
                    self._finish_load_books(record)
                rids = tuple(map(_RID, job.loads))
                self._load_results.append(LoadBatchResult(job.batch, rids, False))
            else:
                OFFLOAD_MACHINE.fire(job, StoreOffloadTrigger.ABANDON)
                self._unpin_offload(job)
                self._offload_results.append(False)
                self._history.append(job)
        if self._queued:
            batch = self._next_batch
            self._next_batch += 1
            records = list(self._queued.values())
            self._queued.clear()
            for record in records:
                record.batch = batch
                LOAD_MACHINE.fire(record, StoreLoadTrigger.ABANDON)
                self._finish_load_books(record)
                self._in_flight.add(record.rid)
            self._layers[batch] = dict.fromkeys(_pools_of(records), 0)
            rids = tuple(map(_RID, records))
            self._load_results.append(LoadBatchResult(batch, rids, False))

    # -- internals: performing jobs ------------------------------------------------------

    def _work(self) -> None:
        """The background worker: perform jobs in submission order until closed."""
        while True:
            with self._lock:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                self._run(job)
            finally:
                with self._lock:
                    self._busy = False
                    self._cond.notify_all()

    def _run(self, job: LoadBatch | StoreOffload) -> None:
        if isinstance(job, LoadBatch):
            self.backend_load_batch(job)
        else:
            self.backend_offload(job)


def _same_counts(a: Mapping[Any, int], b: Mapping[Any, int]) -> bool:
    """`Counter(a) == Counter(b)` (a missing key counts 0) by one dict comparison of
    the non-zero counts (`Counter.__eq__` is a Python loop over both); two dicts equal
    as plain dicts (C-level `dict.__eq__`, the usual case) answer without filtering."""
    if isinstance(a, dict) and isinstance(b, dict) and dict.__eq__(a, b) is True:
        return True
    return {k: n for k, n in a.items() if n} == {k: n for k, n in b.items() if n}


def _pools_of(records: Iterable[StoreLoad]) -> list[PoolName]:
    """The pools the records' transfers name, in first-seen order."""
    return list(dict.fromkeys(ct.pool for record in records for ct in record.transfers))


def _idents(checked: Sequence[CheckedTransfer]) -> list[Ident]:
    """Every (pool, key) the transfers name, in order (a comprehension: for a request's
    few pages it costs less than pairing them with zip/repeat)."""
    return [(ct.pool, k) for ct in checked for k in ct.keys]


#: a load record's rid, read in C
_RID = operator.attrgetter("rid")

#: an entry's chain parent (`Entry.parent`), read in C
_PARENT = operator.attrgetter("parent")
