"""The embedded in-memory store: the default `ExternalStore`, in process, on CPU memory.

`MemoryStore(*, capacity_pages=None, background=False, history=256,
staging_bytes=64 MiB, copy_threads=None)`
implements every primitive of `unicache_fsm.store.protocol` (see there for the contracts)
and adds:

- Page bytes per (pool, key) in one growable CPU slab per pool (rows of one page), each
  with the fields of a `PageHeader(key, pool, nbytes, checksum)` (kept in the page's
  book entry; `header(pool, key)` answers them as one). The checksum is the one every store
  uses, `unicache_fsm.store.checksum.page_checksum` (XXH3-64 of the page's bytes, read
  in place: one pass, no copy). A load verifies header and checksum of every page (the
  checksum of large CPU pages as they land in the load's own slots, below); a mismatch
  fails the batch (corrupt data is never committed) and drops the bad page and the
  chain stored after it, so LOOKUP stops reporting them and the next request
  recomputes instead of loading them again (`rejected_pages` counts the drops).
- Write-once keys: an offload skips pages whose key the store already holds.
- Optional capacity (pages, across pools), evicted from chain ends; queues, completions
  (synchronous, or a worker thread with ``background=True``) and thread safety: the
  shared half of every backend, `unicache_fsm.store.base.BaseStore` (see there).
- Data moves between the slabs and any page device (`unicache_fsm.pools.device`).
  Offload: a device whose pages the host views in place (`page_bytes()`, a CPU
  `KVPool`) has its pages copied into their rows and checksummed as they land, in one
  call (`checksum.copy_checksums`, native where built); any other device is read with
  `read_page_ids` a chunk of at most `staging_bytes` at a time (a CPU device straight
  into the new pages' rows when they are one run, checksummed there, in the same pass
  where the device offers `read_checksummed`; else through host staging, copied into
  the rows as they are checksummed). Load: every header is
  checked first; then the pages are copied into host staging and checksummed as they
  land, the whole batch at once when it fits `staging_bytes` (every page verified,
  then written layer-major with `write_layers`, so `loaded_layers` rises layer by
  layer), else chunk by chunk (each verified, then written with every layer). Pages
  of at least `PAGE_BY_PAGE_BYTES` of a device the host views in place go page by
  page, straight between its pages and the slab's rows, on a `PageCopier`
  (`unicache_fsm.store.copier`) of `copy_threads` workers (None: as many as
  `torch.get_num_threads()`, like torch's own copies; its threads are joined by
  `close()`): checksummed piece by piece while in cache, so a bad page fails the
  transfer after bytes landed in the load's own reserved slots (the protocol allows
  it: a failed load's caller frees them), and such a transfer's layers count as landed
  only when the batch completes.
- Inspection for tests and invariants: `num_pages`, `stored_bytes(pool, key)` (a live
  uint8 view; writing through it corrupts the page), `recent_jobs()` (finished store-side
  records, newest last), `check_invariants()`, `last_error`.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Iterable, Sequence
from typing import Any, cast

import attrs
import torch

from unicache_fsm.pools.device import PageDevice
from unicache_fsm.pools.kv import PAGE_BY_PAGE_BYTES
from unicache_fsm.pools.slots import int64_tensor
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.base import BaseStore, Ident, LoadBatch
from unicache_fsm.store.checksum import copy_checksums, page_checksums
from unicache_fsm.store.copier import PageCopier, check_threads
from unicache_fsm.store.errors import StoreConfigError, StoreFaultError
from unicache_fsm.store.jobs import OFFLOAD_MACHINE, StoreOffload, StoreOffloadTrigger
from unicache_fsm.store.requests import AttachedPools, CheckedTransfer
from unicache_fsm.store.staging import (
    DEFAULT_STAGING_BYTES,
    StagedTransfer,
    as_pages,
    chunks,
    read_checksummed,
    read_staged,
    written_checksums,
)

__all__ = ["MemoryStore", "PageHeader"]

_Ident = Ident

# a stored page's header fields and its row, read in C over many entries
_KEY = operator.attrgetter("key")
_POOL = operator.attrgetter("pool")
_NBYTES = operator.attrgetter("nbytes")
_CHECKSUM = operator.attrgetter("checksum")
_ROW = operator.attrgetter("row")
_INDICES = operator.attrgetter("indices")


@attrs.frozen
class PageHeader:
    """What the store knows about one stored page, verified on every read."""

    key: str
    pool: PoolName
    nbytes: int
    checksum: int


@attrs.define(slots=True, eq=False)
class _Entry:
    """One stored page in the books: its header's fields (verified on every read; the
    `PageHeader` that `MemoryStore.header` answers is built from them on request, not
    kept per page), its slab row and its chain parent. Compared by identity."""

    key: str
    pool: PoolName
    nbytes: int
    checksum: int
    row: int
    parent: _Ident | None

    @property
    def header(self) -> PageHeader:
        return PageHeader(self.key, self.pool, self.nbytes, self.checksum)


#: Address space a slab reserves when it first grows (and at least its size after):
#: the rows are a view of one buffer this large, so a growth within it copies nothing.
#: An untouched row costs no memory (the allocator maps it lazily), so this is virtual
#: size, not resident memory; only a slab outgrowing it copies its rows (into twice).
SLAB_RESERVE_BYTES = 64 << 20


class _Slab:
    """One pool's stored pages: rows of `page_nbytes` bytes in one growable uint8 tensor.

    Which rows are free is a bytearray (1 = free), searched with `bytearray.find`: a
    reservation costs a C-level scan, not a few tensor ops over the whole slab. Only the
    thread performing jobs writes rows or grows the slab; the store's lock guards `free`.

    `data` (the rows in use by the books: stored or free) is a view of the first rows of
    `_buffer`, which reserves `SLAB_RESERVE_BYTES` of address space up front: growing
    `data` within it is a new view (the rows stay where they are, nothing is copied);
    only outgrowing the buffer moves the rows into a new one. `array` is `data` as a
    NumPy array over the same memory, renewed with `data` (the copies read and write it).
    """

    __slots__ = (
        "_buffer",
        "array",
        "data",
        "free",
        "num_free",
        "page_nbytes",
    )

    def __init__(self, page_nbytes: int) -> None:
        self.page_nbytes = page_nbytes
        self._buffer = torch.empty((0, page_nbytes), dtype=torch.uint8)
        self.data = self._buffer
        self.array = self.data.numpy()  # `data` as NumPy (the same memory), kept in step
        self.free = bytearray()
        self.num_free = 0

    def __deepcopy__(self, memo: dict[int, Any]) -> _Slab:
        """A copy of the rows in use and no reserve (a search snapshots stores often: the
        untouched reserve would be copied, and so touched, or at least allocated, per
        copy); the copy reserves when it first grows (`_grow`)."""
        new = _Slab.__new__(_Slab)
        memo[id(self)] = new
        new.page_nbytes = self.page_nbytes
        new._buffer = self.data.clone(memory_format=torch.contiguous_format)
        new.data = new._buffer
        new.array = new.data.numpy()
        new.free = bytearray(self.free)
        new.num_free = self.num_free
        return new

    def reserve(self, n: int) -> list[int]:
        """`n` free rows (ascending, contiguous when such a run exists), now taken."""
        if n <= 0:
            return []
        if self.num_free < n:
            self._grow(n)
        free = self.free
        start = free.find(b"\x01" * n)
        if start >= 0:
            rows = list(range(start, start + n))
        else:
            rows = []
            at = free.find(1)
            while len(rows) < n:  # num_free >= n: every find succeeds
                rows.append(at)
                at = free.find(1, at + 1)
        for r in rows:
            free[r] = 0
        self.num_free -= n
        return rows

    def release(self, rows: Iterable[int]) -> None:
        free = self.free
        for r in rows:
            if not free[r]:
                free[r] = 1
                self.num_free += 1

    def _grow(self, n: int) -> None:
        old = self.data.shape[0]
        new = max(2 * old, old + n, 16)
        if new > self._buffer.shape[0]:  # outgrown (or the first growth): a new buffer
            reserve = max(2 * self._buffer.shape[0], SLAB_RESERVE_BYTES // self.page_nbytes)
            buffer = torch.empty((max(new, reserve), self.page_nbytes), dtype=torch.uint8)
            buffer[:old].copy_(self.data)
            self._buffer = buffer
        self.data = self._buffer[:new]
        self.array = self.data.numpy()
        self.free += b"\x01" * (new - old)
        self.num_free += new - old


def _bad_headers(ct: CheckedTransfer, entries: list[_Entry], pool: PageDevice) -> list[int]:
    """The indices of pages whose header does not match the transfer (key, pool, page
    length); checked for all pages at once in C, the culprits named one by one."""
    if (
        tuple(map(_KEY, entries)) == ct.keys
        and set(map(_POOL, entries)) == {ct.pool}
        and set(map(_NBYTES, entries)) == {pool.page_nbytes}
    ):
        return []
    return [
        i
        for i, (key, h) in enumerate(zip(ct.keys, entries, strict=True))
        if h.key != key or h.pool is not ct.pool or h.nbytes != pool.page_nbytes
    ]


def _in_place(
    staged: list[tuple[CheckedTransfer, list[_Entry], _Slab, PageDevice]], budget: int
) -> list[torch.Tensor] | None:
    """Each transfer's slab rows as one view, when every transfer's device lives on the
    host and its pages lie in one ascending run of rows (the usual case: a node's pages
    are stored together), and the batch fits `budget` bytes (as a staged batch must, to
    be written whole: a larger one moves chunk by chunk); else None."""
    if sum(len(held) * slab.page_nbytes for _, held, slab, _ in staged) > budget:
        return None
    views = []
    for _, held, slab, pool in staged:
        first = held[0].row
        if pool.device.type != "cpu" or [e.row - first for e in held] != list(range(len(held))):
            return None
        views.append(slab.data[first : first + len(held)])
    return views


def _stage(buf: torch.Tensor, entries: list[_Entry], slab: _Slab) -> list[int]:
    """Copy the entries' rows into `buf` (``[n, page_nbytes]`` uint8), checksumming them
    as they land; the indices of those whose checksum does not match."""
    got = copy_checksums(
        buf.numpy(), list(range(len(entries))), slab.array, list(map(_ROW, entries))
    )
    return _mismatched(got, entries)


def _mismatched(got: list[int], entries: list[_Entry]) -> list[int]:
    """The indices of the entries whose stored checksum is not the one in `got`."""
    if got == list(map(_CHECKSUM, entries)):
        return []
    return [i for i, (g, e) in enumerate(zip(got, entries, strict=True)) if g != e.checksum]


@attrs.define(slots=True)
class _OffloadPart:
    """One transfer's new pages, planned under the lock and copied outside it."""

    pool: PageDevice
    name: PoolName
    slab: _Slab
    pages: torch.Tensor  # device page ids of the transfer's keys, in order
    indices: list[int]  # which of them are new (`keys` are theirs), in order
    keys: list[str]
    parents: list[_Ident | None]
    rows: list[int]
    checksums: list[int] = attrs.field(factory=list)

    def page_list(self) -> list[int]:
        """The device page ids of `keys` as a list (selected from one `tolist()` of
        the transfer's ids: no index tensor, no `index_select`)."""
        ids: list[int] = self.pages.tolist()
        if len(self.indices) == len(ids):
            return ids
        return [ids[i] for i in self.indices]

    def page_tensor(self) -> torch.Tensor:
        """The device page ids of `keys` as a tensor on the pool's device."""
        if len(self.indices) == self.pages.numel():
            return self.pages
        return self.pages.index_select(0, int64_tensor(self.indices, self.pages.device))


class MemoryStore(BaseStore["_Entry"]):
    """The embedded in-memory `ExternalStore`; see the module docstring."""

    worker_name = "unicache-memory-store"

    def __init__(
        self,
        *,
        capacity_pages: int | None = None,
        background: bool = False,
        history: int = 256,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        copy_threads: int | None = None,
    ) -> None:
        check_threads(copy_threads, "copy_threads")
        super().__init__(
            capacity_pages=capacity_pages,
            background=background,
            history=history,
            staging_bytes=staging_bytes,
        )
        self._copier = PageCopier(copy_threads)
        self.rejected_pages = 0  # pages dropped because they failed verification
        self._rejected: list[tuple[_Ident, _Entry]] = []  # entries that failed verification
        self._slabs: dict[PoolName, _Slab] = {}
        self.start_worker()

    def __repr__(self) -> str:
        return (
            f"MemoryStore(capacity_pages={self.capacity_pages!r}, background={self.background!r}, "
            f"copy_threads={self._copier.threads!r})"
        )

    # -- backend hooks -----------------------------------------------------------------

    def backend_check_layout(self, pools: AttachedPools) -> None:
        for name, pool in pools.items():
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

    def backend_present(self, pool: PoolName, keys: Sequence[str]) -> list[bool]:
        pages = self._pages
        return [(pool, k) in pages for k in keys]

    def backend_drop(self, ident: _Ident, entry: _Entry) -> None:
        self._slabs[ident[0]].release((entry.row,))

    def backend_drop_many(self, dropped: list[tuple[_Ident, _Entry]]) -> None:
        rows: dict[PoolName, list[int]] = {}
        for (pool, _), entry in dropped:
            rows.setdefault(pool, []).append(entry.row)
        for pool, taken in rows.items():
            self._slabs[pool].release(taken)

    def backend_release(self) -> None:
        self._slabs.clear()
        self._copier.close()  # idle: close() waited for the job in progress

    # -- inspection ----------------------------------------------------------------------

    def header(self, pool: PoolName, key: str) -> PageHeader | None:
        with self._lock:
            entry = self._pages.get((pool, key))
            return None if entry is None else entry.header

    def stored_bytes(self, pool: PoolName, key: str) -> torch.Tensor | None:
        """A live uint8 view of a stored page (None if absent); writes corrupt the page.

        The view stays live until the store grows its slab for that pool (an offload).
        """
        with self._lock:
            entry = self._pages.get((pool, key))
            if entry is None:
                return None
            return self._slabs[pool].data[entry.row]

    def check_invariants(self) -> None:
        """Raise AssertionError if the store's books disagree with each other."""
        super().check_invariants()
        with self._lock:
            rows: dict[PoolName, set[int]] = collections.defaultdict(set)
            slabs = self._slabs
            for ident, entry in self._pages.items():
                pool, row = ident[0], entry.row
                assert entry.pool is pool and entry.key == ident[1]
                taken = rows[pool]
                assert row not in taken, f"row {row} shared"
                taken.add(row)
                assert not slabs[pool].free[row], f"{ident} on free row"
            kept = [(i, e) for i, e in self._rejected if self._pages.get(i) is e]
            assert not kept, f"{len(kept)} page(s) failed verification but are still stored"
            self._rejected.clear()

    # -- internals: performing jobs ------------------------------------------------------

    def backend_load_batch(self, batch: LoadBatch) -> None:
        with self._lock:
            plan = []
            for record in batch.loads:
                for ct in record.transfers:
                    entries = [self._pages.get((ct.pool, k)) for k in ct.keys]
                    pool = self._pools.pool(ct.pool, "load")
                    plan.append((ct, entries, self._slabs.get(ct.pool), pool))
        rejected: list[tuple[_Ident, _Entry]] = []
        try:
            ok = self._load(batch, plan, rejected)
        except Exception as exc:  # the batch must complete whatever went wrong
            self.last_error = exc
            ok = False
        with self._lock:
            for ident, entry in rejected:
                self._rejected.append((ident, entry))  # checked by check_invariants
                self._drop_rejected(ident, entry)
            self.finish_load_batch(batch, ok)

    def _load(
        self,
        batch: LoadBatch,
        plan: list[tuple[CheckedTransfer, list[_Entry | None], _Slab | None, PageDevice]],
        rejected: list[tuple[_Ident, _Entry]],
    ) -> bool:
        """Verify and write a batch's pages; False when one was missing or bad (`rejected`
        gets the bad ones). Every header is checked before a byte moves. Large pages
        of a device the host views in place go straight into their slots, checksummed
        as they land (a bad one fails the batch with bytes in the load's own reserved
        slots, which a failed load's caller frees); the others are staged: the whole
        batch when it fits `staging_bytes` (every page verified, then written
        layer-major), else chunk by chunk (each verified, then written whole)."""
        work: list[tuple[CheckedTransfer, list[_Entry], _Slab, PageDevice]] = []
        ok = True
        for ct, entries, rows, pool in plan:
            if not ct.keys:
                continue
            if rows is None or None in entries:  # (entries compare by identity)
                ok = False  # a page was evicted since the load was queued
                continue
            present = cast("list[_Entry]", entries)  # (none is None: tested above)
            bad = _bad_headers(ct, present, pool)
            rejected += [((ct.pool, ct.keys[i]), present[i]) for i in bad]
            ok = ok and not bad
            work.append((ct, present, rows, pool))
        if not ok:
            return False
        staged: list[tuple[CheckedTransfer, list[_Entry], _Slab, PageDevice]] = []
        for ct, held, slab, pool in work:
            if pool.page_bytes() is None or slab.page_nbytes < PAGE_BY_PAGE_BYTES:
                staged.append((ct, held, slab, pool))
                continue
            got = self._copier.copy_checksummed(
                pool.page_bytes(), ct.pages.tolist(), slab.array, [e.row for e in held]
            )
            bad = _mismatched(got, held)
            rejected += [((ct.pool, ct.keys[i]), held[i]) for i in bad]
            ok = ok and not bad
        if not ok:
            return False
        in_place = _in_place(staged, self.staging_bytes)
        if in_place is not None:
            return self._load_in_place(batch, staged, in_place, rejected)
        found = {id(ct): (held, slab) for ct, held, slab, _ in staged}

        def fill(ct: CheckedTransfer, _: PageDevice, pages: range, buf: torch.Tensor) -> bool:
            held, slab = found[id(ct)]
            some = held[pages.start : pages.stop]
            bad = _stage(buf, some, slab)
            rejected.extend(((ct.pool, ct.keys[pages[i]]), some[i]) for i in bad)
            return not bad

        return self.write_staged(batch, [(ct, pool) for ct, _, _, pool in staged], fill)

    def _load_in_place(
        self,
        batch: LoadBatch,
        staged: list[tuple[CheckedTransfer, list[_Entry], _Slab, PageDevice]],
        views: list[torch.Tensor],
        rejected: list[tuple[_Ident, _Entry]],
    ) -> bool:
        """Load transfers whose pages are one run of slab rows each, for host devices,
        straight from the rows (no staging copy). Devices that offer `write_checksummed`
        take every page with all its layers, checksummed as it is written (one pass; a
        mismatch fails the batch with bytes only in its own reserved slots, as a failed
        load may leave them, and the mismatched rows are hashed again: a row that checks
        out stays, and the batch's error is a `StoreFaultError` naming the device, which
        wrote or hashed other bytes; only a bad row is dropped); otherwise every page is
        verified where it lies, then, only if all checked out, written layer-major. The
        rows cannot change meanwhile: the batch's pages are pinned (no capacity
        eviction), pages are write-once, and bytes move by one thread at a time, so no
        offload refills a row now (an explicit `evict` frees a row only for a later
        offload's bytes)."""
        # (a member that is None is not offered, as `staging.read_checksummed` reads it)
        one_pass = all(
            getattr(pool, "write_checksummed", None) is not None for _, _, _, pool in staged
        )
        ok, parts, lied = True, [], []
        for (ct, held, _, pool), view in zip(staged, views, strict=True):
            data = as_pages(view, pool)
            got = written_checksums(pool, ct.pages, data) if one_pass else page_checksums(view)
            bad = _mismatched(got, held)
            ok = ok and not bad
            if one_pass and bad:
                # the device's word against the rows': a row that, hashed here, still
                # matches its checksum is good (the device wrote or hashed other bytes:
                # the batch fails, the page stays); only a bad row is dropped
                still = _mismatched(page_checksums(view[bad]), [held[i] for i in bad])
                lied += [(pool.name, ct.keys[i]) for j, i in enumerate(bad) if j not in still]
                bad = [bad[j] for j in still]
            rejected += [((ct.pool, ct.keys[i]), held[i]) for i in bad]
            parts.append(StagedTransfer(ct.pool, pool, ct.pages, data))
        if lied:
            name, key = lied[0]
            msg = (
                f"load: page device {name!r} answered write_checksummed with checksums of "
                f"other bytes than the store's for {len(lied)} page(s), first {key!r} (the "
                "store's rows check out: the pages stay)"
            )
            raise StoreFaultError(msg, operation="load")
        if ok and not one_pass:
            self.write_layers(batch, parts)
        return ok

    def _drop_rejected(self, ident: _Ident, entry: _Entry) -> None:
        """A page failed its verification: drop it and the chain stored after it (its
        descendants by parent link), so LOOKUP stops reporting what cannot be loaded.

        Only the entry that was read: a page re-stored meanwhile is a new entry (lock held).
        """
        if self._pages.get(ident) is not entry:
            return
        self.rejected_pages += 1
        doomed = [ident, *self._descendants([ident])]
        for gone in reversed(doomed):  # the chain's end first: parents stay consistent
            if gone in self._pages:
                self._remove(gone)

    def backend_offload(self, record: StoreOffload) -> None:
        with self._lock:
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
        with self._lock:
            if parts is not None:
                for part in parts:
                    if ok:
                        name, nbytes = part.name, part.slab.page_nbytes
                        entries = [
                            _Entry(key, name, nbytes, checksum, row, parent)
                            for key, parent, row, checksum in zip(
                                part.keys, part.parents, part.rows, part.checksums, strict=True
                            )
                        ]
                        self._insert_many(name, part.keys, entries)
                    elif part.keys:
                        part.slab.release(part.rows)
            self.finish_offload(record, ok)

    def _plan_offload(self, record: StoreOffload) -> list[_OffloadPart] | None:
        """Choose the new pages, make room, reserve rows; None when they cannot fit."""
        chosen, protect = self.plan_new_pages(record)
        if not self.make_room(sum(map(len, map(_INDICES, chosen))), protect):
            return None
        parts: list[_OffloadPart] = []
        for c in chosen:
            ct, new, parents = c.transfer, c.indices, c.parents
            pool = self._pools.pool(ct.pool, "offload")
            slab = self._slabs.get(ct.pool)
            if slab is None:
                slab = self._slabs[ct.pool] = _Slab(pool.page_nbytes)
            # page ids validated when the store accepted the offload (the new ones are
            # selected where they are copied, in the form that copy reads)
            rows = slab.reserve(len(new))
            keys = [ct.keys[i] for i in new]
            parts.append(_OffloadPart(pool, ct.pool, slab, ct.pages, new, keys, parents, rows))
        return parts

    def _copy_in(self, part: _OffloadPart) -> None:
        """Read one transfer's new pages into their reserved rows and checksum them."""
        n = len(part.keys)
        if n == 0:
            return
        pool, slab, rows = part.pool, part.slab, part.rows
        src, dst = pool.page_bytes(), slab.array
        if src is not None:
            if slab.page_nbytes >= PAGE_BY_PAGE_BYTES:
                # large CPU pages: each copied into its row and checksummed piece by
                # piece while in cache (a second pass would read it from memory), on
                # the copier's workers
                part.checksums = self._copier.copy_checksummed(dst, rows, src, part.page_list())
                return
            # small CPU pages: copied into their rows and checksummed as they land, in
            # one call (native where built)
            part.checksums = copy_checksums(dst, rows, src, part.page_list())
            return
        # else read in chunks within the staging budget; on a CPU device, with the rows
        # one ascending run, straight into them and checksummed in place (no staging
        # buffer, no second copy)
        ids, nbytes, sums = part.page_tensor(), slab.page_nbytes, []
        direct = pool.device.type == "cpu" and rows[-1] - rows[0] == n - 1
        for piece in chunks(n, nbytes, self.staging_bytes):
            into = rows[piece.start : piece.stop]
            if direct:
                buf = slab.data[into[0] : into[-1] + 1]
                sums += read_checksummed(pool, ids[piece.start : piece.stop], buf)
                continue
            buf = self.staging(len(piece) * nbytes).view(len(piece), nbytes)
            read_staged(pool, ids[piece.start : piece.stop], buf)
            sums += copy_checksums(dst, into, buf.numpy(), list(range(len(piece))))
        part.checksums = sums
