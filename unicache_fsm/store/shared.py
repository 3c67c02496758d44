"""The half of the persistent stores (file, Redis) that does not depend on the medium.

`SharedStore` is a `BaseStore` whose pages live outside the process, in the
`unicache_fsm.store.pageformat` format, where other processes may add and remove them.
A medium (`FileStore`, `RedisStore`, or yours: docs/store-authors.md) provides four
calls, each run by one thread at a time (they may raise; a failing call fails its job,
or raises `StoreFaultError` from a synchronous protocol call):

- `medium_exists(pool, keys) -> list[bool]` — which pages the medium holds now;
- `medium_write(pool, pages)` — make each ``(key, header, payload)`` durable and visible,
  atomically per page, skipping keys already held (write-once); return only when all are;
- `medium_read(pool, keys, rows) -> list[PageRead | None]` — read each page's payload into
  its row (`rows[i]`, a writable byte `memoryview` of the page's length) and return its
  header with the `page_checksum` of the bytes read (None: the page is missing); a page
  whose value is not one whole page raises `TornPage`;
- `medium_erase(pool, keys) -> int` — delete pages; the number that existed.

What `SharedStore` does with them:

- LOOKUP, `load` and `contains` ask the medium (`medium_exists`), not the books, then reconcile
  the books: pages another process wrote are learnt (parent: the previous key of the
  same request, or the parent the store remembers for the first key), pages another
  process removed are forgotten; a page learnt as a chain start gets its parent when
  an offload or a later request names it. `capacity_pages` bounds the pages this store
  knows: learning a page beyond it evicts (`medium_erase`) from chain ends, least recently
  used first (`_shrink`; a medium may first reconcile all its books there). A medium
  that can see all of its pages at once (the file store) makes the bound hold for the
  whole namespace; see there.
- OFFLOAD: the books are first reconciled with the medium for the offload's keys (so a
  page someone removed is written again, not skipped); the new pages (write-once,
  chosen and made room for under the lock as in `BaseStore`) are read from the page
  device (large pages of a device the host views in place: as views, no copy; others
  through host staging, a chunk of at most `staging_bytes` at a time, each chunk
  written before the next is read), checksummed, and written with their headers; the
  offload completes True only when `medium_write` returned for all of them.
- LOAD: every page is read and its header (key, pool, length) and checksum checked.
  Large pages of a device the host views in place are read straight into their
  reserved slots and checked there (no staging copy; a bad page then fails the batch
  with unchecked bytes left in the load's own reserved slots, which the protocol lets
  the caller free; such a transfer's layers count as landed when the batch completes).
  Other pages are read into host staging: the whole batch when it fits
  `staging_bytes`, all checked, then written layer-major (`write_layers`, so
  `loaded_layers` rises layer by layer), else chunk by chunk, each checked, then
  written with every layer. A bad page (a wrong header or checksum, or one the medium
  cannot read: `TornPage`) is deleted together with the chain stored after it (LOOKUP
  could never restore past it); a missing page fails the batch and is forgotten.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from unicache_fsm.pools.device import PageDevice
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.base import BaseStore, Ident, LoadBatch, NewPages
from unicache_fsm.store.checksum import page_checksum
from unicache_fsm.store.errors import StoreConfigError, StoreError
from unicache_fsm.store.jobs import OFFLOAD_MACHINE, StoreOffload, StoreOffloadTrigger
from unicache_fsm.store.pageformat import PageRecord, encode_header
from unicache_fsm.store.requests import AttachedPools, CheckedTransfer
from unicache_fsm.store.staging import chunks, read_checksummed

__all__ = ["KnownPage", "PageRead", "PageWrite", "SharedStore", "TornPage"]

PageWrite = tuple[str, bytes, memoryview]
"""One page to write: its key, its header, its payload."""

PageRead = tuple[PageRecord, int]
"""One page read: its header, and the checksum of the payload bytes as read."""


class TornPage(StoreError):
    """A medium's value for `key` cannot be served as one whole page: torn, partial,
    foreign, or unreadable (a directory or special file, a value of another type,
    permission denied). The shared store catches it and drops the page with the chain
    stored after it."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


@attrs.define(slots=True)
class KnownPage:
    """A page in the books: its parent, its length, and whether it is already gone from
    the medium (then forgetting it deletes nothing)."""

    parent: Ident | None
    nbytes: int
    gone: bool = False


class SharedStore(BaseStore[KnownPage]):
    """Pages in a medium other processes share; see the module docstring."""

    # -- what a medium provides ----------------------------------------------------------

    def medium_exists(self, pool: PoolName, keys: Sequence[str]) -> list[bool]:
        raise NotImplementedError

    def medium_write(self, pool: PoolName, pages: Sequence[PageWrite]) -> None:
        raise NotImplementedError

    def medium_read(
        self, pool: PoolName, keys: Sequence[str], rows: Sequence[memoryview]
    ) -> list[PageRead | None]:
        raise NotImplementedError

    def medium_erase(self, pool: PoolName, keys: Sequence[str]) -> int:
        raise NotImplementedError

    # -- BaseStore hooks -----------------------------------------------------------------

    def backend_check_layout(self, pools: AttachedPools) -> None:
        for name, pool in pools.items():
            held = sum(
                1 for (p, _), e in self._pages.items() if p is name and e.nbytes != pool.page_nbytes
            )
            if held:
                msg = (
                    f"attach: pool {name} has {pool.page_nbytes}-byte pages but this store "
                    f"holds {held} page(s) of another length for it in its namespace; use "
                    "another namespace (one per model and KV layout)"
                )
                raise StoreConfigError(msg, argument="pools", value=name)

    def backend_present(self, pool: PoolName, keys: Sequence[str]) -> list[bool]:
        flags = self.medium_exists(pool, keys)
        nbytes = self._page_nbytes(pool)
        learnt: set[Ident] = set()
        for i, (key, flag) in enumerate(zip(keys, flags, strict=True)):
            ident = (pool, key)
            known = ident in self._pages
            if flag and not known and nbytes:
                parent = (pool, keys[i - 1]) if i else self._parents.get(ident)
                self._learn(ident, KnownPage(parent, nbytes))
                learnt.add(ident)
            elif known and not flag:
                self._forget(ident)
        if learnt and self._over():
            self._shrink(learnt)  # capacity: a page evicted here is no longer present
            flags = [f and (pool, k) in self._pages for k, f in zip(keys, flags, strict=True)]
        return flags

    def backend_drop(self, ident: Ident, entry: KnownPage) -> None:
        self.backend_drop_many([(ident, entry)])

    def backend_drop_many(self, dropped: list[tuple[Ident, KnownPage]]) -> None:
        """One `medium_erase` per pool for the pages still on the medium."""
        by_pool: dict[PoolName, list[str]] = {}
        for (pool, key), entry in dropped:
            if not entry.gone:
                by_pool.setdefault(pool, []).append(key)
        for pool, keys in by_pool.items():
            try:
                self.medium_erase(pool, keys)
            except Exception as exc:  # capacity eviction: the medium may bound itself
                self.last_error = exc

    def backend_delete(self, idents: list[Ident]) -> int:
        removed = 0
        by_pool: dict[PoolName, list[str]] = {}
        for pool, key in idents:
            by_pool.setdefault(pool, []).append(key)
        for pool, keys in by_pool.items():
            removed += self.medium_erase(pool, keys)
            for key in keys:
                self._forget((pool, key))
        return removed

    # -- books ---------------------------------------------------------------------------

    def _learn(self, ident: Ident, entry: KnownPage) -> None:
        """Put a page the medium holds into the books; a page already there that was
        learnt as a chain start (say by `contains` while its offload was writing it)
        takes the parent this entry knows, so capacity eviction keeps the chain whole."""
        held = self._pages.get(ident)
        if held is None:
            self._insert(ident, entry)
        elif held.parent is None and entry.parent is not None and entry.parent != ident:
            self._link(ident, held, entry.parent)

    def _over(self) -> bool:
        return self.capacity_pages is not None and len(self._pages) > self.capacity_pages

    def _shrink(self, protect: set[Ident]) -> None:
        """The books hold more than `capacity_pages` (pages other processes wrote): evict
        from chain ends, least recently used first, until they fit; pinned pages stay,
        and `protect` (the pages just learnt) goes only if nothing else can."""
        assert self.capacity_pages is not None
        over = len(self._pages) - self.capacity_pages
        if over > 0:
            over -= self._evict_lru(over, protect)
        if over > 0:
            self._evict_lru(over, set())

    def _forget(self, ident: Ident) -> None:
        entry = self._pages.get(ident)
        if entry is not None:
            entry.gone = True
            self._remove(ident)

    def _page_nbytes(self, pool: PoolName) -> int:
        try:
            return self._pools.pool(pool, "lookup").page_nbytes
        except LookupError:
            return 0

    # -- offloads ------------------------------------------------------------------------

    def backend_offload(self, record: StoreOffload) -> None:
        with self._lock:
            OFFLOAD_MACHINE.fire(record, StoreOffloadTrigger.START)
            try:
                for ct in record.transfers:  # write-once skips what the medium holds now,
                    self.backend_present(ct.pool, ct.keys)  # not what the books last saw
                fresh = True
            except Exception as exc:  # the medium failed: so does the offload
                self.last_error = exc
                fresh = False
            chosen, protect = self.plan_new_pages(record)
            fits = fresh and self.make_room(sum(len(c.indices) for c in chosen), protect)
            pools = [self._pools.pool(c.transfer.pool, "offload") for c in chosen]
        written: list[tuple[Ident, KnownPage]] = []
        ok = fits
        if fits:
            try:
                for new, pool in zip(chosen, pools, strict=True):
                    self._write_new(new, pool, written)
            except Exception as exc:  # the offload must complete whatever went wrong
                self.last_error = exc
                ok = False
        with self._lock:
            for ident, known in written:
                self._learn(ident, known)  # a LOOKUP may have found it meanwhile
            if self._over():
                self._shrink({ident for ident, _ in written})
            self.finish_offload(record, ok)

    def _offload_failed(self, record: StoreOffload, exc: Exception) -> None:
        """Complete `record` failed without touching the medium, which could not be used
        (the lock is held); `exc` says why."""
        self.last_error = exc
        OFFLOAD_MACHINE.fire(record, StoreOffloadTrigger.START)
        self.finish_offload(record, False)

    def _write_new(
        self, new: NewPages, pool: PageDevice, written: list[tuple[Ident, KnownPage]]
    ) -> None:
        """Write one transfer's new pages with their headers: pages the host views in
        place straight from the device, others read through host staging, a chunk of
        at most `staging_bytes` at a time (each chunk written before the next is read)."""
        if not new.indices:
            return
        ct, n, nbytes = new.transfer, len(new.indices), pool.page_nbytes
        ids = ct.pages if n == len(ct.keys) else ct.pages[torch.tensor(new.indices)]
        views = _page_views(ids.tolist(), pool)
        for piece in [range(n)] if views is not None else chunks(n, nbytes, self.staging_bytes):
            if views is not None:
                data, sums = views, [page_checksum(page) for page in views]
            else:
                data, sums = self._read_device(pool, ids[piece.start : piece.stop])
            pages: list[PageWrite] = []
            for row, i in zip(piece, new.indices[piece.start : piece.stop], strict=True):
                page = data[row - piece.start]
                parent = new.parents[row]
                header = encode_header(
                    ct.keys[i],
                    parent[1] if parent else None,
                    ct.pool,
                    nbytes,
                    sums[row - piece.start],
                )
                pages.append((ct.keys[i], header, page))
            self.medium_write(ct.pool, pages)
            written.extend(
                ((ct.pool, ct.keys[i]), KnownPage(new.parents[row], nbytes))
                for row, i in zip(piece, new.indices[piece.start : piece.stop], strict=True)
            )

    def _read_device(
        self, pool: PageDevice, ids: torch.Tensor
    ) -> tuple[list[memoryview], list[int]]:
        """Pages `ids` of `pool` read into host staging, one byte view per page, and
        their checksums (`read_checksummed`: one pass where the device offers it)."""
        buf = self.staging(ids.numel() * pool.page_nbytes).view(ids.numel(), -1)
        sums = read_checksummed(pool, ids, buf)
        return [row.data for row in buf.numpy()], sums

    # -- loads ---------------------------------------------------------------------------

    def backend_load_batch(self, batch: LoadBatch) -> None:
        with self._lock:
            plan = [
                (ct, self._pools.pool(ct.pool, "load"))
                for record in batch.loads
                for ct in record.transfers
            ]
        missing: list[Ident] = []
        corrupt: list[Ident] = []
        try:
            ok = self._load(batch, plan, missing, corrupt)
        except Exception as exc:  # the batch must complete whatever went wrong
            self.last_error = exc
            ok = False
        with self._lock:
            for ident in missing:
                self._forget(ident)
            if corrupt:
                try:
                    # never offered again, nor the chain after it (LOOKUP stops there)
                    self.backend_delete([*corrupt, *reversed(self._descendants(corrupt))])
                except Exception as exc:
                    self.last_error = exc
            self.finish_load_batch(batch, ok)

    def _load(
        self,
        batch: LoadBatch,
        plan: list[tuple[CheckedTransfer, PageDevice]],
        missing: list[Ident],
        corrupt: list[Ident],
    ) -> bool:
        """Read, check and write a batch; False when a page was missing or bad (nothing
        was written outside the batch's own reserved slots). Large pages of a device
        the host views in place are read straight into their slots; the others go
        through `write_staged`: the whole batch when it fits `staging_bytes` (all read
        and checked, then written layer-major), else chunk by chunk."""
        staged: list[tuple[CheckedTransfer, PageDevice]] = []
        for ct, pool in plan:
            if not ct.keys:
                continue
            views = _page_views(ct.pages.tolist(), pool)
            if views is None:
                staged.append((ct, pool))
            elif not self._read_checked(ct.pool, ct.keys, views, pool, missing, corrupt):
                return False

        def fill(ct: CheckedTransfer, pool: PageDevice, pages: range, buf: torch.Tensor) -> bool:
            rows = [row.data for row in buf.numpy()]
            keys = ct.keys[pages.start : pages.stop]
            return self._read_checked(ct.pool, keys, rows, pool, missing, corrupt)

        return self.write_staged(batch, staged, fill)

    def _read_checked(
        self,
        name: PoolName,
        keys: Sequence[str],
        rows: Sequence[memoryview],
        pool: PageDevice,
        missing: list[Ident],
        corrupt: list[Ident],
    ) -> bool:
        """Read pages `keys` into `rows` and check each header and checksum; False on
        a missing page (added to `missing`) or a bad one (to `corrupt`)."""
        try:
            reads = self.medium_read(name, keys, rows)
        except TornPage as torn:
            corrupt.append((name, torn.key))
            return False
        bad: list[Ident] = []
        for key, read in zip(keys, reads, strict=True):
            if read is None:
                missing.append((name, key))
                return False
            record, got = read
            if record.key != key or record.pool is not name or record.nbytes != pool.page_nbytes:
                corrupt.append((name, key))
                return False
            if record.checksum != got:
                bad.append((name, key))
        corrupt.extend(bad)
        return not bad


_VIEW_BYTES = 64 << 10  # pages at least this large are read in place, not gathered


def _page_views(pages: list[int], pool: PageDevice) -> list[memoryview] | None:
    """Each page of `pool` as a byte `memoryview` of the pool itself, when pages are large
    and the pool is on the CPU (reading or writing them in place saves a copy); None
    otherwise (small pages move faster gathered in one op)."""
    nbytes = pool.page_nbytes
    if pool.device.type != "cpu" or nbytes < _VIEW_BYTES or nbytes % 8:
        return None
    rows = pool.page_bytes()
    if rows is None:  # memory the host cannot view in place
        return None
    return [rows[page].data for page in pages]
