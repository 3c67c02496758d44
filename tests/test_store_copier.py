"""`PageCopier` and the memory store's threaded page paths: copies on several workers
land the same bytes and checksums as one thread; a bad page in any chunk fails its load,
with no slot written outside the load's own and nothing else lost; an exception on a pool thread
fails the offload or load it belongs to (``last_error`` set) and leaves the store
working; `close()` joins the threads. An offload's checksum is the one of the bytes as
they landed in the store, piece by piece on the Python path (these two tests turn the
native copy off, which hashes each stripe from the register it stores): stored bytes
changed right after their piece was hashed fail the load of their page, and a pool page
changed between a piece's copy and its hash leaves a page stored as copied, which loads
whole.

The store contract runs once more (`TestMemoryStoreThreadedCopies`) with every call
threaded and every page a chunk of its own (`PARALLEL_BYTES` and `CHUNK_BYTES`
patched down), so its small transfers take the threaded paths too.
"""

from __future__ import annotations

import copy
import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import xxhash

import test_store_memory
from test_store_memory import KV, Rig, kv_lookup, load_now, offload_now
from unicache_fsm.pools.transfer import PoolTransfer
from unicache_fsm.store import MemoryStore, StoreConfigError
from unicache_fsm.store import checksum as checksum_module
from unicache_fsm.store import copier as copier_module
from unicache_fsm.store.checksum import PIECE_BYTES, copy_checksum, page_checksum
from unicache_fsm.store.copier import CHUNK_BYTES, PARALLEL_BYTES, PageCopier

POOL_THREAD = "unicache-page-copy"


def _copy_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(POOL_THREAD)}


def _rows(n: int, nbytes: int, seed: int) -> Any:
    gen = np.random.default_rng(seed)
    return gen.integers(0, 256, size=(n, nbytes), dtype=np.uint8)


# -- copy_checksum ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n", [0, 1, 4095, PIECE_BYTES - 1, PIECE_BYTES, PIECE_BYTES + 1, 3 * PIECE_BYTES + 17]
)
def test_copy_checksum_copies_and_equals_page_checksum(n: int) -> None:
    src = _rows(1, n, n)[0]
    dst = np.zeros_like(src)
    got = copy_checksum(dst, src)
    assert np.array_equal(dst, src)
    assert got == page_checksum(torch.from_numpy(src))


def test_copy_checksum_refuses_unequal_lengths() -> None:
    src = _rows(1, 64, 0)[0]
    dst = np.zeros(63, dtype=np.uint8)
    with pytest.raises(ValueError, match="63"):
        copy_checksum(dst, src)
    assert not dst.any()


# -- PageCopier on its own -----------------------------------------------------------------

PAGE = 256 << 10  # 4 pages a chunk
PAGES = 24  # 6 MiB: above PARALLEL_BYTES, 6 chunks


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threaded_calls_equal_one_thread(threads: int) -> None:
    src = _rows(2 * PAGES, PAGE, 1)
    picked = np.random.default_rng(2).permutation(2 * PAGES)[:PAGES].tolist()
    serial = [page_checksum(torch.from_numpy(src[p])) for p in picked]
    copier = PageCopier(threads)
    try:
        assert PAGES * PAGE >= PARALLEL_BYTES and PAGE < CHUNK_BYTES  # threaded, chunked
        assert copier.workers(PAGES * PAGE, 6) == threads
        dst = np.zeros((PAGES + 8, PAGE), dtype=np.uint8)
        rows = [r + 8 for r in range(PAGES)][::-1]  # not the first rows, reversed
        assert copier.copy_checksummed(dst, rows, src, picked) == serial
        assert np.array_equal(dst[rows], src[picked]) and not dst[:8].any()
    finally:
        copier.close()


def test_workers_follow_torch_threads_and_stay_serial_for_small_calls() -> None:
    copier = PageCopier()
    before = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert copier.workers(PARALLEL_BYTES, 100) == n
        assert copier.workers(PARALLEL_BYTES, 2) == 2  # never more workers than chunks
        assert copier.workers(PARALLEL_BYTES - 1, 100) == 1
    finally:
        torch.set_num_threads(before)
    assert PageCopier(4).workers(PARALLEL_BYTES, 100) == 4


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_thread_counts_are_typed_errors(bad: object) -> None:
    with pytest.raises(StoreConfigError, match="threads"):
        PageCopier(bad)  # type: ignore[arg-type]
    with pytest.raises(StoreConfigError, match="copy_threads") as info:
        MemoryStore(copy_threads=bad)  # type: ignore[arg-type]
    assert info.value.argument == "copy_threads" and info.value.value is bad


def test_refuses_rows_of_unequal_counts_or_lengths() -> None:
    copier = PageCopier(1)
    src, dst = _rows(4, 64, 3), np.zeros((4, 64), dtype=np.uint8)
    with pytest.raises(ValueError, match="3 source"):
        copier.copy_checksummed(dst, [0, 1], src, [0, 1, 2])
    with pytest.raises(ValueError, match="32 bytes"):
        copier.copy_checksummed(np.zeros((4, 32), dtype=np.uint8), [0], src, [0])
    assert not dst.any()


def _fail_on_pool_thread(
    monkeypatch: pytest.MonkeyPatch, name: str, error: BaseException
) -> threading.Barrier:
    """Patch the copier's `name` so that both workers take a chunk, then the pool
    thread's first call raises `error` (the calling thread's calls run normally)."""
    real = getattr(copier_module, name)
    meet = threading.Barrier(2, timeout=30)
    met: set[int] = set()

    def patched(*args: Any) -> Any:
        me = threading.get_ident()
        if me not in met:
            met.add(me)
            meet.wait()  # both workers are inside a chunk
        if threading.current_thread().name.startswith(POOL_THREAD):
            raise error
        return real(*args)

    monkeypatch.setattr(copier_module, name, patched)
    return meet


def test_an_exception_on_a_pool_thread_is_raised_by_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = _rows(PAGES, PAGE, 4)
    dst = np.zeros_like(src)
    copier = PageCopier(2)
    _fail_on_pool_thread(monkeypatch, "copy_checksums", RuntimeError("boom on a pool thread"))
    with pytest.raises(RuntimeError, match="boom on a pool thread"):
        copier.copy_checksummed(dst, list(range(PAGES)), src, list(range(PAGES)))
    monkeypatch.undo()
    # no worker runs on after the call: the copier works again, with the same threads
    threads = _copy_threads()
    assert copier.copy_checksummed(dst, list(range(PAGES)), src, list(range(PAGES))) == [
        page_checksum(torch.from_numpy(row)) for row in src
    ]
    assert np.array_equal(dst, src)
    assert _copy_threads() == threads
    copier.close()


def test_close_joins_the_threads_and_later_calls_run_serially() -> None:
    before = _copy_threads()
    copier = PageCopier(3)
    src = _rows(PAGES, PAGE, 5)
    copier.copy_checksummed(np.zeros_like(src), list(range(PAGES)), src, list(range(PAGES)))
    mine = _copy_threads() - before
    # at most threads - 1 pool threads (the caller is a worker too); fewer when one
    # finished its share before the next was handed out, and was reused
    assert 1 <= len(mine) <= 2
    copier.close()
    assert not any(t.is_alive() for t in mine)
    copier.close()  # a second close is a no-op
    assert copier.workers(PAGES * PAGE, 6) == 1
    dst = np.zeros_like(src)
    assert copier.copy_checksummed(dst, [0], src, [3]) == [page_checksum(torch.from_numpy(src[3]))]
    assert not (_copy_threads() - before)


def test_a_deep_copy_is_a_fresh_copier_with_no_threads() -> None:
    copier = PageCopier(2)
    src = _rows(PAGES, PAGE, 6)
    dst = np.zeros_like(src)
    copier.copy_checksummed(dst, list(range(PAGES)), src, list(range(PAGES)))
    twin = copy.deepcopy(copier)
    assert twin is not copier and twin.threads == 2
    copier.close()
    assert twin.copy_checksummed(dst, [0, 1], src, [0, 1]) == copier.copy_checksummed(
        dst, [0, 1], src, [0, 1]
    )
    twin.close()


# -- the memory store's threaded paths ------------------------------------------------------


class BigRig(Rig):
    """A `Rig` with 256 KiB pages (P=4, 2 layers x 16384 fp16), room for three batches."""

    WIDTH = 16384

    def __init__(self) -> None:
        super().__init__(pages=3 * PAGES + 4)


@pytest.fixture
def big() -> BigRig:
    return BigRig()


def _store(rig: Rig, threads: int) -> MemoryStore:
    store = MemoryStore(copy_threads=threads)
    store.attach(rig.pools)
    return store


def test_threaded_store_keeps_the_bytes_and_checksums_of_one_thread(big: BigRig) -> None:
    keys, src = big.chain(PAGES), big.fill(KV, PAGES)
    one, three = _store(big, 1), _store(big, 3)
    for store in (one, three):
        assert offload_now(store, [PoolTransfer(KV, src, keys)])
    assert [one.header(KV, k) for k in keys] == [three.header(KV, k) for k in keys]
    for store in (one, three):
        dst = big.alloc(KV, PAGES)
        shuffled = torch.randperm(PAGES, generator=torch.Generator().manual_seed(7)).tolist()
        assert load_now(store, "r", [PoolTransfer(KV, dst, [keys[i] for i in shuffled])])
        for j, i in enumerate(shuffled):
            assert torch.equal(big.page(KV, dst, j), big.page(KV, src, i))
        store.check_invariants()
        assert store.last_error is None
        store.close()


@pytest.mark.parametrize("bad", [0, 5, 13, PAGES - 1])  # first page, inside chunks, last
def test_a_bad_page_in_any_chunk_fails_the_load_and_loses_nothing_else(
    big: BigRig, bad: int
) -> None:
    keys, src = big.chain(PAGES), big.fill(KV, PAGES)
    store = _store(big, 2)
    assert offload_now(store, [PoolTransfer(KV, src, keys)])
    view = store.stored_bytes(KV, keys[bad])
    assert view is not None
    view[PAGE // 2] ^= 0x01  # one bit, in the page's middle
    dst = big.alloc(KV, PAGES)
    before = big.pools[KV].data.clone()
    assert not load_now(store, "bad", [PoolTransfer(KV, dst, keys)])
    # pages land as they are checked: only the load's own reserved slots may change
    # (the protocol lets a failed load leave bytes there; its caller frees them)
    outside = torch.ones(before.shape[0], dtype=torch.bool)
    outside[dst] = False
    assert torch.equal(big.pools[KV].data[outside], before[outside])
    assert store.rejected_pages == 1
    assert store.lookup("again", kv_lookup(keys)) == list(range(1, bad + 1))
    assert [store.contains(KV, k) for k in keys] == [i < bad for i in range(PAGES)]
    if bad:  # what is left loads whole
        assert load_now(store, "good", [PoolTransfer(KV, dst[: bad * big.P], keys[:bad])])
        assert torch.equal(big.read(KV, dst[: bad * big.P]), big.read(KV, src[: bad * big.P]))
    store.check_invariants()
    assert store.last_error is None
    store.close()


def test_an_exception_on_a_pool_thread_fails_only_its_offload(
    big: BigRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, src = big.chain(PAGES), big.fill(KV, PAGES)
    store = _store(big, 2)
    error = RuntimeError("offload worker failed")
    _fail_on_pool_thread(monkeypatch, "copy_checksums", error)
    assert not offload_now(store, [PoolTransfer(KV, src, keys)])
    assert store.last_error is error
    assert store.num_pages == 0 and not any(store.contains(KV, k) for k in keys)
    store.check_invariants()  # its reserved rows went back
    monkeypatch.undo()
    assert offload_now(store, [PoolTransfer(KV, src, keys)])
    dst = big.alloc(KV, PAGES)
    assert load_now(store, "r", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(big.read(KV, dst), big.read(KV, src))
    store.close()


def test_an_exception_on_a_pool_thread_fails_its_load_and_drops_nothing(
    big: BigRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, src = big.chain(PAGES), big.fill(KV, PAGES)
    store = _store(big, 2)
    assert offload_now(store, [PoolTransfer(KV, src, keys)])
    error = RuntimeError("load worker failed")
    _fail_on_pool_thread(monkeypatch, "copy_checksums", error)
    dst = big.alloc(KV, PAGES)
    before = big.pools[KV].data.clone()
    assert not load_now(store, "r", [PoolTransfer(KV, dst, keys)])
    assert store.last_error is error
    outside = torch.ones(before.shape[0], dtype=torch.bool)
    outside[dst] = False  # only the load's own reserved slots may have changed
    assert torch.equal(big.pools[KV].data[outside], before[outside])
    assert store.rejected_pages == 0 and all(store.contains(KV, k) for k in keys)
    monkeypatch.undo()
    assert load_now(store, "again", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(big.read(KV, dst), big.read(KV, src))
    store.check_invariants()
    store.close()


def test_close_joins_the_stores_copy_threads(big: BigRig) -> None:
    before = _copy_threads()
    store = _store(big, 3)
    keys, src = big.chain(PAGES), big.fill(KV, PAGES)
    assert offload_now(store, [PoolTransfer(KV, src, keys)])
    mine = _copy_threads() - before
    assert mine  # the offload ran on pool threads
    twin_rig, twin = copy.deepcopy((big, store))  # a snapshot (its own pools) shares no threads
    store.close()
    assert not any(t.is_alive() for t in mine)
    dst = twin_rig.alloc(KV, PAGES)
    assert load_now(twin, "r", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(twin_rig.read(KV, dst), big.read(KV, src))
    twin.close()
    assert not (_copy_threads() - before)


# -- what an offload's checksum covers: the bytes that landed, piece by piece ------------


# (The native copy hashes each stripe from the register it stores, so no byte can change
# between the two; these tests pin the same contract on the Python path, the one whose
# copy and hash are two steps.)


class PieceRig(Rig):
    """A `Rig` whose pages are three `PIECE_BYTES` pieces (P=4, 2 layers, fp16)."""

    WIDTH = 3 * PIECE_BYTES // (Rig.P * Rig.LAYERS * 2)

    def __init__(self) -> None:
        super().__init__(pages=16)


class _Hooked:
    """Stands in for the `xxhash` module inside `unicache_fsm.store.checksum`: its
    streaming XXH3 states call ``before(page, piece, buffer)`` and ``after(...)``
    around each piece they hash (`buffer`: the piece's landed bytes; `page`: how many
    states were made before this one, the page's place in a one-worker call)."""

    def __init__(self, before: Callable[..., None], after: Callable[..., None]) -> None:
        self.before, self.after = before, after
        self.pages = 0

    def xxh3_64(self) -> _HookedState:
        self.pages += 1
        return _HookedState(self, self.pages - 1)


class _HookedState:
    def __init__(self, hooks: _Hooked, page: int) -> None:
        self.hooks, self.page, self.pieces = hooks, page, 0
        self.state = xxhash.xxh3_64()

    def update(self, buffer: memoryview) -> None:
        self.hooks.before(self.page, self.pieces, buffer)
        self.state.update(buffer)
        self.hooks.after(self.page, self.pieces, buffer)
        self.pieces += 1

    def intdigest(self) -> int:
        return self.state.intdigest()


def _nothing(*_: object) -> None:
    pass


@pytest.mark.parametrize("threads", [1, 3])
def test_stored_bytes_changed_after_their_piece_was_hashed_are_caught_on_load(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """A stored piece corrupted right after it was hashed, while the rest of its page (and
    other pages) are still being copied, fails the load of that page, as corruption of
    stored bytes always did: the checksum is the one of the bytes as they landed."""
    rig = PieceRig()
    n = 6
    keys, src = rig.chain(n), rig.fill(KV, n)
    assert rig.pools[KV].page_nbytes == 3 * PIECE_BYTES
    store = _store(rig, threads)
    done = threading.Lock()

    def corrupt(page: int, piece: int, buffer: memoryview) -> None:
        if piece == 0 and done.acquire(blocking=False):  # the first piece hashed, once
            buffer[7] ^= 0x01

    monkeypatch.setattr(checksum_module, "NATIVE_COPY", False)  # the piece-by-piece path
    monkeypatch.setattr(checksum_module, "xxhash", _Hooked(_nothing, corrupt))
    assert offload_now(store, [PoolTransfer(KV, src, keys)])
    monkeypatch.undo()
    stored = [store.stored_bytes(KV, k) for k in keys]
    sources = rig.read(KV, src).view(torch.uint8).view(n, -1)
    changed = [i for i, row in enumerate(stored) if not torch.equal(row, sources[i])]
    assert len(changed) == 1  # one stored page differs from its source: the corrupted one
    bad = changed[0]
    dst = rig.alloc(KV, n)
    assert not load_now(store, "r", [PoolTransfer(KV, dst, keys)])
    assert store.rejected_pages == 1
    assert [store.contains(KV, k) for k in keys] == [i < bad for i in range(n)]
    if bad:  # the pages before it still load whole
        assert load_now(store, "ok", [PoolTransfer(KV, dst[: bad * rig.P], keys[:bad])])
        assert torch.equal(rig.read(KV, dst[: bad * rig.P]), rig.read(KV, src[: bad * rig.P]))
    store.check_invariants()
    store.close()


def test_a_source_changed_between_a_pieces_copy_and_its_hash_is_stored_as_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checksum is taken of the bytes that landed in the store, not of the pool page
    read again: a pool page written (against the protocol) between the copy of a piece and
    its hash leaves the store a page whose checksum matches what it holds, which loads
    whole, as copied."""
    rig = PieceRig()
    n = 4
    keys, src = rig.chain(n), rig.fill(KV, n)
    before = rig.read(KV, src).clone()
    pool = rig.pools[KV]
    page_rows = pool.page_bytes()
    first = [int(s) // rig.P for s in src[:: rig.P]]  # pool page id of each page
    store = _store(rig, 1)

    def overwrite_source(page: int, piece: int, buffer: memoryview) -> None:
        if page == 2 and piece == 1:  # the piece landed, not hashed yet: its source changes
            page_rows[first[page], piece * PIECE_BYTES : (piece + 1) * PIECE_BYTES] ^= 0xFF

    monkeypatch.setattr(checksum_module, "NATIVE_COPY", False)  # the piece-by-piece path
    monkeypatch.setattr(checksum_module, "xxhash", _Hooked(overwrite_source, _nothing))
    assert offload_now(store, [PoolTransfer(KV, src, keys)])
    monkeypatch.undo()
    assert not torch.equal(rig.read(KV, src), before)  # the pool page did change
    dst = rig.alloc(KV, n)
    assert load_now(store, "r", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), before)  # what was copied, checked whole
    assert store.rejected_pages == 0
    store.check_invariants()
    store.close()


# -- the contract, every call threaded -----------------------------------------------------


class TestMemoryStoreThreadedCopies(test_store_memory.TestMemoryStoreLargePages):
    """The store contract with large pages, three copy workers, every call threaded and
    every page a chunk of its own."""

    copy_threads = 3

    @pytest.fixture(autouse=True)
    def _every_call_threaded(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(copier_module, "PARALLEL_BYTES", 0)
        monkeypatch.setattr(copier_module, "CHUNK_BYTES", 1)


# -- rows of two views of one buffer ------------------------------------------------------


def _shifted_views() -> tuple[Any, Any, Any]:
    """A buffer of 10 rows (row k full of byte k), and two views of it one row apart:
    destination row i is buffer row i, source row i is buffer row i + 1."""
    base = np.repeat(np.arange(10, dtype=np.uint8), 256).reshape(10, 256)
    return base, base[:-1], base[1:]


@pytest.mark.parametrize("native", [True, False], ids=["native-if-built", "python"])
@pytest.mark.parametrize(
    ("dst_rows", "src_rows", "named"),
    [
        ([3], [2], "3 with 2"),  # buffer row 3 onto itself
        ([2, 7], [4, 1], "2 with 1"),  # buffer row 2 written, then read for row 7
    ],
)
def test_refuses_rows_of_views_that_share_memory(
    monkeypatch: pytest.MonkeyPatch,
    native: bool,
    dst_rows: list[int],
    src_rows: list[int],
    named: str,
) -> None:
    """Rows compared by address, not by index: two views of one buffer at different
    offsets name one buffer row by different indices. Refused on both paths, with the
    pair named, before any byte moves (the native copy refused only a pair whose own
    rows overlapped, after earlier chunks had landed; the Python path copied in order,
    so a later page read what an earlier one wrote)."""
    monkeypatch.setattr(checksum_module, "NATIVE_COPY", native and checksum_module.NATIVE_COPY)
    base, dst, src = _shifted_views()
    before = base.copy()
    with pytest.raises(ValueError, match=f"share memory.*{named}"):
        PageCopier(1).copy_checksummed(dst, dst_rows, src, src_rows)
    assert np.array_equal(base, before)


@pytest.mark.parametrize("native", [True, False], ids=["native-if-built", "python"])
def test_copies_rows_of_views_that_do_not_share_memory(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """Same indices, different memory: destination row 1 (buffer row 1) from source row
    1 (buffer row 2) is a copy, not a row onto itself."""
    monkeypatch.setattr(checksum_module, "NATIVE_COPY", native and checksum_module.NATIVE_COPY)
    base, dst, src = _shifted_views()
    sums = PageCopier(1).copy_checksummed(dst, [1, 0], src, [1, 8])
    assert base[:, 0].tolist() == [9, 2, 2, 3, 4, 5, 6, 7, 8, 9]
    assert sums == [page_checksum(bytes([2]) * 256), page_checksum(bytes([9]) * 256)]


def test_refuses_views_sharing_memory_before_any_chunk_lands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two workers, a chunk a page: the refusal comes before the first chunk is copied
    (the native copy's own check refused the second chunk after the first had landed)."""
    monkeypatch.setattr(copier_module, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(copier_module, "CHUNK_BYTES", 256)
    base, dst, src = _shifted_views()
    before = base.copy()
    copier = PageCopier(2)
    with pytest.raises(ValueError) as info:
        copier.copy_checksummed(dst, [0, 3], src, [4, 2])  # buffer row 3 onto itself
    copier.close()
    assert np.array_equal(base, before)
    assert "share memory" in str(info.value) and "3 with 2" in str(info.value)


def test_a_forked_child_copies_with_threads_of_its_own() -> None:
    """A copier whose pool started before a fork works in the child (with a pool of its
    own) instead of handing chunks to threads the child does not have and waiting."""
    copier = PageCopier(2)
    src = _rows(PAGES, PAGE, 7)
    rows = list(range(PAGES))
    want = copier.copy_checksummed(np.zeros_like(src), rows, src, rows)

    def child(answer: Any) -> None:
        dst = np.zeros_like(src)
        got = copier.copy_checksummed(dst, rows, src, rows)
        answer.put(got == want and bool(np.array_equal(dst, src)))

    ctx = multiprocessing.get_context("fork")
    answer = ctx.Queue()
    proc = ctx.Process(target=child, args=(answer,))
    proc.start()
    try:
        assert answer.get(timeout=60) is True
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    copier.close()
