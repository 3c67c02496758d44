"""Page copies spread over threads: `PageCopier`, how the memory store moves and checks
the large pages of a CPU pool.

`PageCopier(threads=None)` works on pages that are rows of 2-D uint8 NumPy arrays (a
store's slab, a CPU pool's `page_bytes()`), named by row index:

- `copy_checksummed(dst, dst_rows, src, src_rows) -> list[int]` — ``dst[dst_rows[i]] =
  src[src_rows[i]]`` for every i, returning each page's `page_checksum`, taken of the
  bytes as they land (`unicache_fsm.store.checksum.copy_checksums`, a chunk of pages in
  one call: native code, stripe by stripe, where the extension is built; else piece by
  piece): one pass over memory for both. An offload checksums what it stores this way;
  a load compares what lands in its slots with the stored checksums.
- `close()` — join the pool threads (a second call is a no-op). A closed copier still
  works, on the calling thread alone.

Threads: a call cuts its pages into chunks of about `CHUNK_BYTES`; the calling thread
and up to ``workers - 1`` pool threads each take the next chunk until none is left, so a
thread slowed by a busy machine does less and none waits for a fixed share. ``workers``
is `threads`, or, when that is None, `torch.get_num_threads()` at the call (as many
workers as torch's own copies use; one torch thread, one worker); a call of fewer than
`PARALLEL_BYTES` bytes, or of one chunk, runs on the calling thread alone. The native
copy, NumPy's copy and XXH3 release the GIL while they run, so the workers move bytes at
the same time. Rows of one call must be inside their arrays and must not overlap (every
destination row once, none sharing memory with a source row: compared by address, a row
by the span from its first byte to its last, so two views of one buffer are caught
whatever their offsets), else `ValueError` naming them, before anything is written.

Failures: an exception in any worker stops the others before their next chunk; the
call returns only once every worker has stopped, and raises the exception (the calling
thread's own first, else the first pool thread's). Destination rows may then be partly
written; nothing else is touched. A `close()` that shuts the pool down while a call is
handing it chunks does not fail the call: its calling thread does the chunks left.

Lifetime: the pool's threads start on the first call that uses them and serve later
calls; a call wanting more workers than the pool has replaces it (the old one is idle
and joined). `close()` joins them; a copier dropped unclosed lets them exit when it is
garbage-collected (`ThreadPoolExecutor`'s own rule). A process forked after the pool
started gets a pool of its own on its first call (the parent's threads are not in it).
Only one call runs at a time (the store moves bytes on one thread at a time); `close()`
may come from any thread. A deep copy is a fresh copier with the same `threads` and no
threads of its own.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from unicache_fsm.store.checksum import copy_checksums
from unicache_fsm.store.errors import StoreConfigError

__all__ = ["CHUNK_BYTES", "PARALLEL_BYTES", "PageCopier", "check_threads"]

#: bytes a worker takes at a time (whole pages, at least one)
CHUNK_BYTES = 1 << 20
#: calls moving fewer bytes than this run on the calling thread (a hand-off to a pool
#: thread costs tens of microseconds on a busy machine)
PARALLEL_BYTES = 4 << 20


def check_threads(value: object, argument: str) -> int | None:
    """`value` as a worker count: None (torch's thread count) or an int >= 1, else
    `StoreConfigError` naming `argument`."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        msg = f"{argument} must be None (torch's thread count) or an int >= 1, got {value!r}"
        raise StoreConfigError(msg, argument=argument, value=value)
    return value


class _Stop:
    """Shared by the workers of one call: the next chunk to take, and whether to stop."""

    __slots__ = ("lock", "next", "stop")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next = 0
        self.stop = False


class PageCopier:
    """Copies and checksums of large pages on several threads; see the module docstring."""

    def __init__(self, threads: int | None = None) -> None:
        self.threads = check_threads(threads, "threads")
        self._lock = threading.Lock()  # guards `_pool` and `_closed`
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._pid = 0  # the process that started `_pool`
        self._closed = False

    def __repr__(self) -> str:
        return f"PageCopier(threads={self.threads!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> PageCopier:
        new = PageCopier(self.threads)
        memo[id(self)] = new
        return new

    # -- the operation ------------------------------------------------------------

    def copy_checksummed(
        self, dst: Any, dst_rows: Sequence[int], src: Any, src_rows: Sequence[int]
    ) -> list[int]:
        """``dst[dst_rows[i]] = src[src_rows[i]]`` for each i; the pages' checksums."""
        n = _check_pair(dst, dst_rows, src, src_rows)
        sums = [0] * n

        def work(start: int, stop: int) -> None:
            sums[start:stop] = copy_checksums(dst, dst_rows[start:stop], src, src_rows[start:stop])

        self._each_chunk(n, src.shape[1], work)
        return sums

    def close(self) -> None:
        """Join the pool's threads; later calls run on the calling thread alone."""
        with self._lock:
            pool, self._pool, self._pool_size = self._pool, None, 0
            self._closed = True
        if pool is not None:
            pool.shutdown(wait=True)

    # -- internals -----------------------------------------------------------------------

    def workers(self, nbytes: int, chunks: int) -> int:
        """How many workers a call of `nbytes` bytes in `chunks` chunks uses."""
        if nbytes < PARALLEL_BYTES or self._closed:
            return 1
        wanted = self.threads if self.threads is not None else torch.get_num_threads()
        return max(1, min(wanted, chunks))

    def _each_chunk(self, n: int, page_nbytes: int, work: Callable[[int, int], None]) -> None:
        """`work(start, stop)` over chunks of ``range(n)`` on the workers, each chunk once."""
        if n == 0:
            return
        per = max(1, CHUNK_BYTES // max(1, page_nbytes))
        chunks = -(-n // per)
        workers = self.workers(n * page_nbytes, chunks)
        pool = self._pool_for(workers - 1) if workers > 1 else None
        if pool is None:
            work(0, n)
            return
        shared = _Stop()

        def run() -> None:
            try:
                while not shared.stop:
                    with shared.lock:
                        k = shared.next
                        shared.next = k + 1
                    if k >= chunks:
                        return
                    work(k * per, min(n, (k + 1) * per))
            except BaseException:
                shared.stop = True
                raise

        futures: list[concurrent.futures.Future[None]] = []
        try:
            for _ in range(workers - 1):
                try:
                    futures.append(pool.submit(run))
                except RuntimeError:  # `close()` from another thread shut the pool down:
                    break  # the threads already started and this one do the rest
            run()
        except BaseException:
            shared.stop = True  # (a failed submit too: the others stop early)
            raise
        finally:
            concurrent.futures.wait(futures)  # no worker runs on after the call
        for future in futures:  # in submission order: the first pool thread's exception
            future.result()

    def _pool_for(self, extra: int) -> concurrent.futures.ThreadPoolExecutor | None:
        """A pool of at least `extra` threads (None once closed: run serially). In a
        process forked from the one that started the pool, a new pool: the old one's
        threads did not survive the fork, and work handed to it would wait forever."""
        with self._lock:
            if self._closed:
                return None
            if self._pool is not None and self._pid != os.getpid():
                self._pool, self._pool_size = None, 0  # (its threads are the parent's)
            if self._pool is not None and self._pool_size >= extra:
                return self._pool
            old, self._pool_size = self._pool, extra
            self._pool = concurrent.futures.ThreadPoolExecutor(
                extra, thread_name_prefix="unicache-page-copy"
            )
            self._pid = os.getpid()
            pool = self._pool
        if old is not None:
            old.shutdown(wait=True)  # idle: only one call runs at a time
        return pool


def _check_pair(dst: Any, dst_rows: Sequence[int], src: Any, src_rows: Sequence[int]) -> int:
    """The number of pages of a copy (ValueError when the two sides disagree, a row is
    outside its array, a destination row repeats or shares memory with a source row)."""
    if len(dst_rows) != len(src_rows) or dst.shape[1] != src.shape[1]:
        msg = (
            f"page copy: {len(src_rows)} source row(s) of {src.shape[1]} bytes into "
            f"{len(dst_rows)} destination row(s) of {dst.shape[1]} bytes"
        )
        raise ValueError(msg)
    for side, pages, rows in (("destination", dst, dst_rows), ("source", src, src_rows)):
        outside = [r for r in rows if not 0 <= r < pages.shape[0]]
        if outside:  # (NumPy would wrap a negative row onto the end, silently)
            msg = f"page copy: {side} row(s) {outside[:8]} outside 0 .. {pages.shape[0] - 1}"
            raise ValueError(msg)
    seen = set(dst_rows)
    if len(seen) != len(dst_rows):
        twice = sorted({r for r in dst_rows if dst_rows.count(r) > 1})
        msg = f"page copy: destination row(s) {twice[:8]} named more than once"
        raise ValueError(msg)
    if np.may_share_memory(dst, src):
        met = _rows_sharing_memory(dst, dst_rows, src, src_rows)
        if met:
            pairs = ", ".join(f"{d} with {s}" for d, s in met[:8])
            msg = (
                f"page copy: destination row(s) share memory with source row(s) "
                f"(destination with source: {pairs})"
            )
            raise ValueError(msg)
    return len(src_rows)


def _row_spans(pages: Any, rows: Sequence[int]) -> tuple[Any, Any]:
    """The byte addresses ``[lo, hi)`` spanned by each named row of the 2-D array
    `pages` (rows inside it), from its first byte to its last whatever the strides."""
    at = pages.__array_interface__["data"][0] + np.asarray(rows, dtype=np.int64) * pages.strides[0]
    extent = (pages.shape[1] - 1) * pages.strides[1]
    return at + min(0, extent), at + max(0, extent) + pages.itemsize


def _rows_sharing_memory(
    dst: Any, dst_rows: Sequence[int], src: Any, src_rows: Sequence[int]
) -> list[tuple[int, int]]:
    """(destination row, source row) pairs whose bytes overlap in memory, by address:
    the arrays may be different views of one buffer (a row index of one is then not
    the same memory as that index of the other). Rows of one array span equal lengths,
    so the source row starting last before a destination row ends is the one to test."""
    if len(dst_rows) == 0 or len(src_rows) == 0 or dst.shape[1] == 0:
        return []
    dst_lo, dst_hi = _row_spans(dst, dst_rows)
    src_lo, src_hi = _row_spans(src, src_rows)
    order = np.argsort(src_lo, kind="stable")
    src_lo, src_hi = src_lo[order], src_hi[order]
    k = np.searchsorted(src_lo, dst_hi, side="left") - 1
    hit = (k >= 0) & (src_hi[np.maximum(k, 0)] > dst_lo)
    return [(dst_rows[i], src_rows[order[k[i]]]) for i in np.flatnonzero(hit).tolist()]
