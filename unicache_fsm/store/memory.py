"""The embedded in-memory store: the default `ExternalStore`, in process, on CPU memory.

`MemoryStore(*, capacity_pages=None, background=False, history=256)` implements every
primitive of `unicache_fsm.store.protocol` (see there for the contracts) and adds:

- Page bytes per (pool, key) in one growable CPU slab per pool (rows of one page), each
  with a `PageHeader(key, pool, nbytes, checksum)`. The checksum is a 64-bit linear hash
  (the page's 64-bit words dotted with fixed odd pseudo-random weights, mod 2**64: any
  change of one word, and almost any reordering, changes it), computed for a whole
  transfer in one vectorised op. A load verifies header and checksum of every page
  before writing it; a mismatch fails the batch (corrupt data is never written silently).
- Write-once keys: an offload skips pages whose key the store already holds.
- Optional capacity (pages, across pools). Each stored page remembers its parent (the
  previous key in its offload's key order); capacity eviction takes least recently used
  pages that have no stored children, and a parent whose last child went is evicted
  next, so chains shrink from their end and the remaining prefixes stay restorable.
  Pages pinned by queued or started loads, and pages of the offload being stored, are
  never evicted for capacity (`evict()` itself removes what it is told to). `offload`
  refuses (False) pages that could never fit; an offload that cannot make room when it
  runs completes False and publishes nothing.
- Completion: synchronous by default (`progress()` performs every started load batch
  and queued offload, in submission order); with ``background=True`` a worker thread
  performs them as they come and `progress()` waits until it is idle.
- Data moves in batches: one `read_pages` (into the slab itself when the new rows are
  contiguous) per offload transfer and one `write_pages` per load transfer.
- Inspection for tests and invariants: `num_pages`, `stored_bytes(pool, key)` (a live
  uint8 view; writing through it corrupts the page), `recent_jobs()` (finished store-side
  records, newest last), `check_invariants()`, `last_error`.

Thread safety: every public call may come from any thread; one lock guards the store's
books, and bytes move outside it, by one thread at a time (the worker, or the caller of
`progress()`).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Mapping, Sequence

import attrs
import torch

from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.transfer import (
    LinkerTransferPhase,
    PoolName,
    PoolTransfer,
    check_page_key,
)
from unicache_fsm.store.errors import (
    NoCompletionError,
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

__all__ = ["MemoryStore", "PageHeader"]

_Ident = tuple[PoolName, str]
_CHECKSUM_SEED = 0x5EED_CAC4E


@attrs.frozen
class PageHeader:
    """What the store knows about one stored page, verified on every read."""

    key: str
    pool: PoolName
    nbytes: int
    checksum: int


@attrs.define(slots=True)
class _Entry:
    header: PageHeader
    row: int
    parent: _Ident | None


@attrs.define(slots=True)
class _LoadBatch:
    batch: int
    loads: list[StoreLoad]


class _Slab:
    """One pool's stored pages: rows of `page_nbytes` bytes in one growable uint8 tensor.

    Only the thread performing jobs writes rows or grows the slab; the store's lock
    guards `free` (which rows hold no page).
    """

    __slots__ = ("data", "free", "page_nbytes", "staging", "weights")

    def __init__(self, page_nbytes: int) -> None:
        self.page_nbytes = page_nbytes
        self.data = torch.empty((0, page_nbytes), dtype=torch.uint8)
        self.free = torch.zeros(0, dtype=torch.bool)
        self.staging = torch.empty((0, page_nbytes), dtype=torch.uint8)
        words = page_nbytes // 8 if page_nbytes % 8 == 0 else page_nbytes
        gen = torch.Generator().manual_seed(_CHECKSUM_SEED)
        self.weights = torch.randint(-(2**62), 2**62, (words,), generator=gen) | 1

    def reserve(self, n: int) -> torch.Tensor:
        """`n` free rows (ascending, contiguous when such a run exists), now taken."""
        free = self.free
        if int(free.sum()) < n:
            self._grow(n)
            free = self.free
        counts = torch.cat((torch.zeros(1, dtype=torch.int64), free.cumsum(0)))
        runs = torch.nonzero(counts[n:] - counts[:-n] == n)
        if runs.numel():
            start = int(runs[0, 0])
            rows = torch.arange(start, start + n, dtype=torch.int64)
        else:
            rows = torch.nonzero(free).view(-1)[:n]
        free[rows] = False
        return rows

    def release(self, rows: Iterable[int]) -> None:
        self.free[torch.tensor(list(rows), dtype=torch.int64)] = True

    def _grow(self, n: int) -> None:
        old = self.data.shape[0]
        new = max(2 * old, old + n, 16)
        data = torch.empty((new, self.page_nbytes), dtype=torch.uint8)
        data[:old].copy_(self.data)
        free = torch.ones(new, dtype=torch.bool)
        free[:old] = self.free
        self.data, self.free = data, free

    def rows_of(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The bytes of `rows` (``[n, page_nbytes]``) and the order they come in.

        When the rows form one contiguous run in any order, the bytes are a view of the
        run (no copy) and `order` says which of `rows` each view row is (``rows[order]``);
        otherwise they are gathered into a staging buffer in the order given (None).
        """
        n = rows.numel()
        ascending, order = torch.sort(rows)
        start = int(ascending[0])
        if int(ascending[-1]) - start == n - 1 and bool((ascending.diff() == 1).all()):
            return self.data[start : start + n], order
        if self.staging.shape[0] < n:
            size = max(n, 2 * self.staging.shape[0])
            self.staging = torch.empty((size, self.page_nbytes), dtype=torch.uint8)
        out = self.staging[:n]
        torch.index_select(self.data, 0, rows, out=out)
        return out, None

    def checksums(self, pages: torch.Tensor) -> torch.Tensor:
        """One 64-bit checksum per row of `pages` (``[n, page_nbytes]`` uint8, CPU)."""
        if self.page_nbytes % 8 == 0 and pages.is_contiguous():
            words = pages.view(torch.int64)
        else:
            words = pages.to(torch.int64)
        return torch.mv(words, self.weights)


@attrs.define(slots=True)
class _OffloadPart:
    """One transfer's new pages, planned under the lock and copied outside it."""

    pool: KVPool
    name: PoolName
    slab: _Slab
    slots: torch.Tensor
    keys: list[str]
    parents: list[_Ident | None]
    rows: torch.Tensor
    checksums: list[int] = attrs.field(factory=list)


class MemoryStore:
    """The embedded in-memory `ExternalStore`; see the module docstring."""

    def __init__(
        self, *, capacity_pages: int | None = None, background: bool = False, history: int = 256
    ) -> None:
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
        self.capacity_pages = capacity_pages
        self.background = bool(background)
        self.last_error: BaseException | None = None
        self._cond = threading.Condition(threading.Lock())
        self._performing = threading.Lock()  # one thread moves bytes at a time
        self._pools = AttachedPools({})
        self._slabs: dict[PoolName, _Slab] = {}
        self._pages: dict[_Ident, _Entry] = {}
        self._children: collections.Counter[_Ident] = collections.Counter()
        # evictable pages (no stored children), least recently used first
        self._leaves: collections.OrderedDict[_Ident, None] = collections.OrderedDict()
        self._pins: collections.Counter[_Ident] = collections.Counter()
        self._queued: dict[str, StoreLoad] = {}
        self._in_flight: set[str] = set()
        self._jobs: collections.deque[_LoadBatch | StoreOffload] = collections.deque()
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
        if self.background:
            self._worker = threading.Thread(
                target=self._work, name="unicache-memory-store", daemon=True
            )
            self._worker.start()

    def __repr__(self) -> str:
        return (
            f"MemoryStore(capacity_pages={self.capacity_pages!r}, background={self.background!r})"
        )

    # -- protocol: setup and lookup ------------------------------------------------------

    def attach(self, pools: Mapping[PoolName, KVPool]) -> None:
        attached = AttachedPools(pools)
        with self._cond:
            self._check_open("attach")
            if self._queued or self._jobs or self._busy or self._in_flight:
                msg = (
                    "attach: loads or offloads are queued or in flight; re-attach only when "
                    "the store is idle (reset() fails pending work; then pop every result)"
                )
                raise StoreStateError(msg, operation="attach")
            for name, pool in attached.items():
                slab = self._slabs.get(name)
                if slab is not None and slab.page_nbytes != pool.page_nbytes:
                    held = sum(1 for ident in self._pages if ident[0] is name)
                    if held:
                        msg = (
                            f"attach: pool {name} has {pool.page_nbytes}-byte pages but the "
                            f"store holds {held} page(s) of {slab.page_nbytes} bytes for it; "
                            "attach a pool with the same layout, or evict those pages first"
                        )
                        raise StoreConfigError(msg, argument="pools", value=name)
                    del self._slabs[name]
            self._pools = attached

    def lookup(self, rid: str, transfers: Sequence[PoolTransfer]) -> list[int]:
        kv, others = split_lookup_transfers(transfers)
        with self._cond:
            self._check_open("lookup")
            for t in (kv, *others):
                self._pools.pool(t.name, "lookup")
            pages = self._pages
            found = list(
                lookup_boundaries(kv, others, lambda pool, keys: [(pool, k) in pages for k in keys])
            )
            if found:
                for t in (kv, *others):
                    self._touch((t.name, k) for k in kv.keys[: found[-1]])
            return found

    # -- protocol: loads -----------------------------------------------------------------

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        with self._cond:
            self._check_open("load")
            checked = self._pools.check_data_transfers(transfers, LinkerTransferPhase.LOAD)
            if rid in self._queued or rid in self._in_flight:
                return False
            idents = [(ct.pool, k) for ct in checked for k in ct.keys]
            if any(ident not in self._pages for ident in idents):
                return False
            record = StoreLoad(rid, checked)
            LOAD_MACHINE.initialize(record)
            self._queued[rid] = record
            self._pins.update(idents)
            self._touch(idents)
            return True

    def start_loading(self) -> int:
        with self._cond:
            self._check_open("start_loading")
            if not self._queued:
                return -1
            batch = _LoadBatch(self._next_batch, list(self._queued.values()))
            self._next_batch += 1
            self._queued.clear()
            for record in batch.loads:
                record.batch = batch.batch
                LOAD_MACHINE.fire(record, StoreLoadTrigger.START)
                self._in_flight.add(record.rid)
            self._jobs.append(batch)
            self._cond.notify_all()
            return batch.batch

    def num_completed_loads(self) -> int:
        with self._cond:
            self._check_open("num_completed_loads")
            return len(self._load_results)

    def pop_completed_load(self) -> LoadBatchResult:
        with self._cond:
            self._check_open("pop_completed_load")
            if not self._load_results:
                msg = "pop_completed_load: no load batch has completed; check num_completed_loads()"
                raise NoCompletionError(msg, what="load")
            result = self._load_results.popleft()
            self._in_flight.difference_update(result.rids)
            return result

    def cancel_queued_load(self, rid: str) -> bool:
        with self._cond:
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
        with self._cond:
            self._check_open("offload")
            checked = self._pools.check_data_transfers(transfers, LinkerTransferPhase.OFFLOAD)
            if self.capacity_pages is not None:
                new = {(ct.pool, k) for ct in checked for k in ct.keys} - self._pages.keys()
                if len(new) > self.capacity_pages:
                    return False  # could never fit, even in an empty store
            record = StoreOffload(self._next_offload, checked)
            self._next_offload += 1
            OFFLOAD_MACHINE.initialize(record)
            self._jobs.append(record)
            self._cond.notify_all()
            return True

    def num_completed_offloads(self) -> int:
        with self._cond:
            self._check_open("num_completed_offloads")
            return len(self._offload_results)

    def pop_completed_offload(self) -> bool:
        with self._cond:
            self._check_open("pop_completed_offload")
            if not self._offload_results:
                msg = (
                    "pop_completed_offload: no offload has completed; "
                    "check num_completed_offloads()"
                )
                raise NoCompletionError(msg, what="offload")
            return self._offload_results.popleft()

    # -- protocol: driving, eviction, lifecycle ------------------------------------------

    def progress(self) -> int:
        if self.background:
            with self._cond:
                self._check_open("progress")
                outstanding = len(self._jobs) + int(self._busy)
                while self._jobs or self._busy:
                    self._cond.wait()
                return outstanding
        done = 0
        with self._performing:
            while True:
                with self._cond:
                    self._check_open("progress")
                    if not self._jobs:
                        return done
                    job = self._jobs.popleft()
                    self._busy = True
                try:
                    self._run(job)
                finally:
                    with self._cond:
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
        with self._cond:
            self._check_open("evict")
            removed = 0
            for name in pools:
                for key in keys:
                    if (name, key) in self._pages:
                        self._remove((name, key))
                        removed += 1
            return removed

    def contains(self, pool: PoolName, key: str) -> bool:
        with self._cond:
            self._check_open("contains")
            return (pool, key) in self._pages

    def reset(self) -> None:
        with self._cond:
            self._check_open("reset")
            self._quiesce()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._quiesce()
            self._closed = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join()
        with self._cond:
            self._pages.clear()
            self._slabs.clear()
            self._children.clear()
            self._leaves.clear()
            self._pins.clear()

    # -- inspection ----------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        """Pages stored, across pools."""
        with self._cond:
            return len(self._pages)

    def stored_keys(self, pool: PoolName) -> list[str]:
        """The keys stored for `pool`, in no particular order."""
        with self._cond:
            return [k for (p, k) in self._pages if p is pool]

    def header(self, pool: PoolName, key: str) -> PageHeader | None:
        with self._cond:
            entry = self._pages.get((pool, key))
            return None if entry is None else entry.header

    def stored_bytes(self, pool: PoolName, key: str) -> torch.Tensor | None:
        """A live uint8 view of a stored page (None if absent); writes corrupt the page.

        The view stays live until the store grows its slab for that pool (an offload).
        """
        with self._cond:
            entry = self._pages.get((pool, key))
            if entry is None:
                return None
            return self._slabs[pool].data[entry.row]

    def recent_jobs(self) -> list[StoreLoad | StoreOffload]:
        """Finished (final-state) store-side records, oldest first (bounded history)."""
        with self._cond:
            return list(self._history)

    def check_invariants(self) -> None:
        """Raise AssertionError if the store's books disagree with each other."""
        with self._cond:
            if self.capacity_pages is not None:
                assert len(self._pages) <= self.capacity_pages, "over capacity"
            rows: dict[PoolName, set[int]] = collections.defaultdict(set)
            children: collections.Counter[_Ident] = collections.Counter()
            for ident, entry in self._pages.items():
                assert entry.header.pool is ident[0] and entry.header.key == ident[1]
                assert entry.row not in rows[ident[0]], f"row {entry.row} shared"
                rows[ident[0]].add(entry.row)
                assert not bool(self._slabs[ident[0]].free[entry.row]), f"{ident} on free row"
                if entry.parent is not None:
                    children[entry.parent] += 1
            assert children == self._children, "children counts drifted"
            leaves = {i for i in self._pages if not children.get(i)}
            assert leaves == set(self._leaves), "leaf set drifted"
            pinned = collections.Counter(
                (ct.pool, k)
                for record in (*self._queued.values(), *self._started_loads())
                for ct in record.transfers
                for k in ct.keys
            )
            if not self._busy:  # a job being performed holds pins outside these books
                assert pinned == +self._pins, "pins drifted"
            assert not (set(self._queued) & self._in_flight), "rid both queued and started"

    # -- internals: bookkeeping (caller holds the lock) ----------------------------------

    def _check_open(self, operation: str) -> None:
        if self._closed:
            msg = f"{operation}: the store is closed; create a new store"
            raise StoreClosedError(msg, operation=operation)

    def _started_loads(self) -> list[StoreLoad]:
        return [r for job in self._jobs if isinstance(job, _LoadBatch) for r in job.loads]

    def _touch(self, idents: Iterable[_Ident]) -> None:
        leaves = self._leaves
        for ident in idents:
            if ident in leaves:
                leaves.move_to_end(ident)

    def _unpin(self, record: StoreLoad) -> None:
        pins = self._pins
        for ct in record.transfers:
            for key in ct.keys:
                ident = (ct.pool, key)
                left = pins[ident] - 1
                if left > 0:
                    pins[ident] = left
                else:
                    del pins[ident]

    def _insert(self, ident: _Ident, entry: _Entry) -> None:
        self._pages[ident] = entry
        parent = entry.parent
        if parent is not None:
            self._children[parent] += 1
            self._leaves.pop(parent, None)
        if not self._children.get(ident):
            self._leaves[ident] = None

    def _remove(self, ident: _Ident) -> None:
        entry = self._pages.pop(ident)
        self._slabs[ident[0]].release([entry.row])
        self._leaves.pop(ident, None)
        parent = entry.parent
        if parent is None:
            return
        left = self._children[parent] - 1
        if left > 0:
            self._children[parent] = left
            return
        del self._children[parent]
        if parent in self._pages:
            # the parent is next in line: chains shrink from their end
            self._leaves[parent] = None
            self._leaves.move_to_end(parent, last=False)

    def _evict_lru(self, count: int, protect: set[_Ident]) -> int:
        evicted = 0
        skipped: list[_Ident] = []
        while evicted < count and self._leaves:
            ident, _ = self._leaves.popitem(last=False)
            if ident in protect or self._pins.get(ident):
                skipped.append(ident)
                continue
            self._remove(ident)
            evicted += 1
        for ident in reversed(skipped):
            self._leaves[ident] = None
            self._leaves.move_to_end(ident, last=False)
        return evicted

    def _finish_load_batch(self, batch: _LoadBatch, ok: bool) -> None:
        for record in batch.loads:
            LOAD_MACHINE.fire(record, StoreLoadTrigger.FINISH, ok)
            self._finish_load_books(record)
        rids = tuple(r.rid for r in batch.loads)
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
            if isinstance(job, _LoadBatch):
                for record in job.loads:
                    LOAD_MACHINE.fire(record, StoreLoadTrigger.ABANDON)
                    self._finish_load_books(record)
                rids = tuple(r.rid for r in job.loads)
                self._load_results.append(LoadBatchResult(job.batch, rids, False))
            else:
                OFFLOAD_MACHINE.fire(job, StoreOffloadTrigger.ABANDON)
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
            rids = tuple(r.rid for r in records)
            self._load_results.append(LoadBatchResult(batch, rids, False))

    # -- internals: performing jobs ------------------------------------------------------

    def _work(self) -> None:
        """The background worker: perform jobs in submission order until closed."""
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _run(self, job: _LoadBatch | StoreOffload) -> None:
        if isinstance(job, _LoadBatch):
            self._run_load_batch(job)
        else:
            self._run_offload(job)

    def _run_load_batch(self, batch: _LoadBatch) -> None:
        with self._cond:
            plan = []
            for record in batch.loads:
                for ct in record.transfers:
                    entries = [self._pages.get((ct.pool, k)) for k in ct.keys]
                    pool = self._pools.pool(ct.pool, "load")
                    plan.append((ct, entries, self._slabs.get(ct.pool), pool))
        ok = True
        try:
            for ct, entries, slab, pool in plan:
                if not ct.keys:
                    continue
                if slab is None or any(e is None for e in entries):
                    ok = False  # a page was evicted since the load was queued
                    continue
                present = [e for e in entries if e is not None]
                if not self._copy_out(ct, present, slab, pool):
                    ok = False
        except Exception as exc:  # the batch must complete whatever went wrong
            self.last_error = exc
            ok = False
        with self._cond:
            self._finish_load_batch(batch, ok)

    @staticmethod
    def _copy_out(ct: CheckedTransfer, entries: list[_Entry], slab: _Slab, pool: KVPool) -> bool:
        """Verify and write one transfer's pages; False (nothing written) on a bad page."""
        for key, entry in zip(ct.keys, entries, strict=True):
            h = entry.header
            if h.key != key or h.pool is not ct.pool or h.nbytes != pool.page_nbytes:
                return False
        rows = torch.tensor([e.row for e in entries], dtype=torch.int64)
        data, order = slab.rows_of(rows)
        expected = torch.tensor([e.header.checksum for e in entries], dtype=torch.int64)
        slots = ct.slots
        if order is not None:  # the bytes come in row order: send each page where it goes
            expected = expected[order]
            slots = slots.view(-1, pool.page_size).index_select(0, order).view(-1)
        if not torch.equal(slab.checksums(data), expected):
            return False
        n = len(entries) * pool.page_size
        pages = data.view(pool.dtype).view(n, pool.num_layers, pool.width)
        pool.write_pages(slots, pages.to(pool.device))
        return True

    def _run_offload(self, record: StoreOffload) -> None:
        with self._cond:
            OFFLOAD_MACHINE.fire(record, StoreOffloadTrigger.START)
            parts = self._plan_offload(record)
        ok = parts is not None
        if parts is not None:
            try:
                for part in parts:
                    self._copy_in(part)
            except Exception as exc:  # the offload must complete whatever went wrong
                self.last_error = exc
                ok = False
        with self._cond:
            if parts is not None:
                for part in parts:
                    if ok:
                        for key, parent, row, checksum in zip(
                            part.keys, part.parents, part.rows.tolist(), part.checksums, strict=True
                        ):
                            header = PageHeader(key, part.name, part.slab.page_nbytes, checksum)
                            self._insert((part.name, key), _Entry(header, row, parent))
                    elif part.keys:
                        part.slab.release(part.rows.tolist())
            OFFLOAD_MACHINE.fire(record, StoreOffloadTrigger.FINISH, ok)
            self._offload_results.append(ok)
            self._history.append(record)

    def _plan_offload(self, record: StoreOffload) -> list[_OffloadPart] | None:
        """Choose the new pages, make room, reserve rows; None when they cannot fit."""
        chosen: list[tuple[CheckedTransfer, list[int], list[_Ident | None]]] = []
        protect: set[_Ident] = set()
        total = 0
        for ct in record.transfers:
            seen: set[str] = set()
            new: list[int] = []
            parents: list[_Ident | None] = []
            for i, key in enumerate(ct.keys):
                ident = (ct.pool, key)
                if ident in self._pages:
                    protect.add(ident)
                elif key not in seen:
                    new.append(i)
                    parents.append((ct.pool, ct.keys[i - 1]) if i else None)
                seen.add(key)
            chosen.append((ct, new, parents))
            total += len(new)
        self._touch(protect)
        if self.capacity_pages is not None:
            over = len(self._pages) + total - self.capacity_pages
            if over > 0 and self._evict_lru(over, protect) < over:
                return None
        parts: list[_OffloadPart] = []
        for ct, new, parents in chosen:
            pool = self._pools.pool(ct.pool, "offload")
            slab = self._slabs.get(ct.pool)
            if slab is None:
                slab = self._slabs[ct.pool] = _Slab(pool.page_nbytes)
            p = pool.page_size
            if len(new) == len(ct.keys):
                slots = ct.slots
            else:
                index = torch.tensor(new, dtype=torch.int64)
                slots = ct.slots.view(-1, p).index_select(0, index).view(-1)
            rows = slab.reserve(len(new)) if new else torch.empty(0, dtype=torch.int64)
            keys = [ct.keys[i] for i in new]
            parts.append(_OffloadPart(pool, ct.pool, slab, slots, keys, parents, rows))
        return parts

    @staticmethod
    def _copy_in(part: _OffloadPart) -> None:
        """Read one transfer's new pages into their reserved rows and checksum them."""
        n = len(part.keys)
        if n == 0:
            return
        pool, slab, rows = part.pool, part.slab, part.rows
        start = int(rows[0])
        contiguous = int(rows[-1]) - start == n - 1
        if contiguous and pool.device.type == "cpu":
            dest = slab.data[start : start + n]
            shape = (n * pool.page_size, pool.num_layers, pool.width)
            pool.read_pages(part.slots, out=dest.view(pool.dtype).view(shape))
            data = dest
        else:
            got = pool.read_pages(part.slots).to("cpu")
            data = got.view(torch.uint8).reshape(n, slab.page_nbytes)
            slab.data.index_copy_(0, rows, data)
        part.checksums = slab.checksums(data).tolist()
