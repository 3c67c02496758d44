"""Store benchmark: batched offload and load bandwidth through every store backend.

Run ``python benchmarks/bench_store.py`` (``--quick`` for a smoke run; ``--backends
memory,file,redis`` to choose; ``--rounds N``). One batch of randomly placed pages of a
realistic pool (P = 16, 32 layers x 1024 fp16: 1 MiB pages) goes KV pool -> store
(offload: validate, queue, `progress()`, pop) and back (load into other slots:
validate, queue, start, `progress()`, pop), with every page checksummed on the way in
and verified on the way out.

How it is timed: each figure comes from interleaved rounds. A round runs the store's
operation and its baseline(s) once each (after an untimed setup: evicting what the
last offload stored, dropping the page cache), in an order rotated every round, so the
drift of a shared machine falls on both sides alike. The ratio is baseline time / store
time within one round; the table prints its median over the rounds and its middle half
(first to third quartile) as the spread, and the median bandwidths beside it. Loads of
bytes already in memory (the file store's page cache, Redis) take milliseconds a round
and run three times as many rounds. The file and Redis tables also print ``CPU``: the
same median ratio of this process's CPU time (`time.process_time`: all its threads, user
and system; the Redis server's time is not in it), which moves less than wall time when
other programs share the machine.

The memory-store table times each case right after the one before it in the round.
After each call, torch's OpenMP workers spin on the cores for several milliseconds of
CPU before they sleep (libgomp's default wait policy); whatever runs next on a 2-core
machine shares a core with that spin, while a torch call that runs next finds its
workers awake, so the rotation bills the store for the baselines' spin in most
rounds. ``--primed`` times each case right after an untimed run of the same case
(store after store, gather after gather), so that no case pays for another's spin;
the default stays the order a serving engine sees, where an offload follows torch
calls.

Memory store, against plain torch copies of the same bytes:

- ``vs gather/scatter``: ``torch.index_select(pages, 0, ids, out=buf)`` (the pool ->
  buffer gather an offload needs at the least) or ``pages.index_copy_(0, ids, buf)``
  (torch's buffer -> pool scatter; `KVPool.write_pages` copies pages of 16 KiB and more
  one memcpy each, which can run faster than this kernel, so a load can exceed 1.0x).
  Design target >= 0.8;
- ``vs copy_``: ``dst.copy_(src)`` between two contiguous tensors of the same size.

The file and Redis stores, against the raw client doing the same I/O on the same bytes
(values as long as the store's: header + page). Design target >= 0.7:

- file store (a fresh directory under ``--dir``, default the system's temporary
  directory, so a real disk): offload = temp file, write, fsync, rename per page and one
  directory fsync, vs. ``write`` + ``fsync`` of each value into its own file and one
  directory fsync; load = read, check header and checksum, into the slots, vs. a plain
  read of each file into a buffer. Both sides spread the pages over the same number of
  threads (the store's ``io_threads``, the calling thread taking the first stride), and
  raw reads land at the same distance modulo 4 KiB from the page cache as the store's
  (see `_landing_rows`: some CPUs copy several times slower at some distances);
- Redis store (a fresh ``redis-server`` on a free loopback port: no persistence, no
  memory limit, its allocator purged before every write; skipped when it is not
  installed): offload = pipelined ``SET NX`` of header + page, vs. redis-py pipelined
  ``SET NX`` of values of the same size; load = pipelined ``GET``, checks, into the
  slots, vs. redis-py pipelined ``GET`` of those values. Both sides put as many commands
  in a pipeline as the store does (`PIPELINE_BYTES`: its SETs go out once their values
  reach it, its GETs fetch that much payload, whole pages, at a time).

The memory store moves large CPU pages on as many workers as torch has threads
(`unicache_fsm.store.copier`), so both sides of its ratios use the same number of
threads, whatever ``--threads`` says. On a busy 2-core machine torch's OpenMP threads
stall each other and the torch baselines collapse (a gather at a few percent of its
speed); pass ``--threads 1`` for meaningful memory-store ratios there (`run.py` passes
nothing: torch's default). A benchmark,
not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import torch

from unicache_fsm.console import print_table
from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools import KVPool, PagedAllocator
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store import MemoryStore
from unicache_fsm.store.checksum import COPY_IMPLEMENTATION
from unicache_fsm.store.file import FileStore
from unicache_fsm.store.pageformat import HEADER_SIZE
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing.redis_server import RedisServer, available

__all__ = ["main"]

KV = PoolName.KV


class Rounds:
    """Interleaved timing: every round runs each case once (after its untimed setup),
    in an order rotated by one each round, so drift of a shared machine falls on all
    cases alike; ratios are taken within a round, then summarised across rounds. With
    `primed`, each timed run comes right after an untimed run of the same case (its
    setup before both), so that no case is timed while the one before it still holds
    the machine."""

    def __init__(self, repeats: int, *, primed: bool = False) -> None:
        self.repeats = repeats
        self.primed = primed
        self.cpu: list[list[float]] = []
        """CPU seconds (``time.process_time``: every thread of this process, user and
        system) per round of each case of the last `run`."""

    def run(
        self, cases: Sequence[tuple[Callable[[], object], Callable[[], object]]]
    ) -> list[list[float]]:
        """Seconds per round of each ``(run, setup)`` case, after one untimed warm-up
        round (slabs, staging buffers and connections reach their size); their CPU
        seconds are left in `cpu`."""
        times: list[list[float]] = [[] for _ in cases]
        self.cpu = [[] for _ in cases]
        for r in range(self.repeats + 1):
            for k in range(len(cases)):
                i = (k + r) % len(cases)
                fn, setup = cases[i]
                if self.primed:
                    setup()
                    fn()
                setup()
                c0 = time.process_time()
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                c1 = time.process_time()
                if r:
                    times[i].append(t1 - t0)
                    self.cpu[i].append(c1 - c0)
        return times


@attrs.frozen
class Ratio:
    """A per-round ratio ``baseline time / store time`` summarised: median and the middle
    half of the rounds (first to third quartile)."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, store: Sequence[float], baseline: Sequence[float]) -> Ratio:
        ratios = sorted(b / s for s, b in zip(store, baseline, strict=True))
        if len(ratios) < 4:
            return cls(statistics.median(ratios), ratios[0], ratios[-1])
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        return cls(statistics.median(ratios), q1, q3)

    def __str__(self) -> str:
        return f"{self.median:.2f}x"

    @property
    def spread(self) -> str:
        return f"{self.low:.2f}-{self.high:.2f}"


Row = tuple[str, float, float, float, Ratio, Ratio]
"""(operation, MiB, store GB/s, baseline GB/s, ratio, second ratio: the memory store's
``vs copy_``, the file and Redis stores' CPU-time ratio)."""


def bench(
    *,
    page_size: int,
    num_layers: int,
    width: int,
    batch_pages: int,
    rounds: int,
    primed: bool = False,
) -> list[Row]:
    """Memory store: (operation, MiB, GB/s, gather/scatter GB/s, vs gather/scatter, vs copy_)."""
    p = page_size
    alloc = PagedAllocator(3 * batch_pages * p, p)
    pool = KVPool.for_allocator(alloc, num_layers, width)
    gen = torch.Generator().manual_seed(0)
    pool.data.copy_(torch.randn(pool.data.shape, generator=gen).to(pool.dtype))
    everything = alloc.alloc(3 * batch_pages * p)
    assert everything is not None
    by_page = everything.view(-1, p)
    pick = torch.randperm(by_page.shape[0], generator=gen)
    src = by_page[pick[:batch_pages]].reshape(-1)
    dst = by_page[pick[batch_pages : 2 * batch_pages]].reshape(-1)
    keys = page_hashes(list(range(batch_pages * p)), p)

    store = MemoryStore()
    store.attach({KV: pool})
    offload = [PoolTransfer(KV, src, keys)]
    load = [PoolTransfer(KV, dst, keys)]
    shuffle = torch.randperm(batch_pages, generator=gen).tolist()
    load_shuffled = [PoolTransfer(KV, dst, [keys[i] for i in shuffle])]

    def do_offload() -> None:
        assert store.offload(offload)
        store.progress()
        assert store.pop_completed_offload()

    def do_load(transfers: list[PoolTransfer]) -> Callable[[], None]:
        def run() -> None:
            assert store.load("bench", transfers)
            store.start_loading()
            store.progress()
            assert store.pop_completed_load().success

        return run

    def evict_all() -> None:
        store.evict(keys)

    # baselines over the same bytes
    pages_view = pool.data.view(-1, p, num_layers, width)
    src_ids = src.view(-1, p)[:, 0] // p
    dst_ids = dst.view(-1, p)[:, 0] // p
    buf = torch.empty((batch_pages, p, num_layers, width), dtype=pool.dtype)
    other = torch.empty_like(buf)

    def gather() -> object:
        return torch.index_select(pages_view, 0, src_ids, out=buf)

    def scatter() -> object:
        return pages_view.index_copy_(0, dst_ids, buf)

    def contiguous() -> object:
        return other.copy_(buf)

    def nothing() -> None:
        pass

    nbytes = batch_pages * pool.page_nbytes
    timer = Rounds(rounds, primed=primed)
    out: list[Row] = []
    ours, base, copy = timer.run(
        [(do_offload, evict_all), (gather, nothing), (contiguous, nothing)]
    )
    cases = [("offload (pool -> store)", ours, base, copy)]
    do_offload()
    for name, transfers in (("load (pool <- store)", load), ("load, shuffled keys", load_shuffled)):
        ours, base, copy = timer.run(
            [(do_load(transfers), nothing), (scatter, nothing), (contiguous, nothing)]
        )
        cases.append((name, ours, base, copy))
    do_load(load_shuffled)()  # the baselines ran last in some rounds
    landed = pool.read_pages(dst).view(batch_pages, -1)
    assert torch.equal(landed, pool.read_pages(src).view(batch_pages, -1)[shuffle])
    store.check_invariants()
    store.close()
    gb = nbytes / 1e9
    for name, ours, base, copy in cases:
        t, t_base = statistics.median(ours), statistics.median(base)
        out.append(
            (name, nbytes / 2**20, gb / t, gb / t_base, Ratio.of(ours, base), Ratio.of(ours, copy))
        )
    return out


# -- file and Redis stores vs. their raw clients ---------------------------------------------


class _Batch:
    """One batch of randomly placed pages of a fresh pool, its keys and destinations."""

    def __init__(self, page_size: int, num_layers: int, width: int, batch_pages: int) -> None:
        p = page_size
        alloc = PagedAllocator(3 * batch_pages * p, p)
        self.pool = KVPool.for_allocator(alloc, num_layers, width)
        gen = torch.Generator().manual_seed(1)
        self.pool.data.copy_(torch.randn(self.pool.data.shape, generator=gen).to(self.pool.dtype))
        everything = alloc.alloc(3 * batch_pages * p)
        assert everything is not None
        by_page = everything.view(-1, p)
        pick = torch.randperm(by_page.shape[0], generator=gen)
        self.src = by_page[pick[:batch_pages]].reshape(-1)
        self.dst = by_page[pick[batch_pages : 2 * batch_pages]].reshape(-1)
        self.keys = page_hashes(list(range(batch_pages * p)), p)
        self.nbytes = batch_pages * self.pool.page_nbytes
        # what a raw client writes: values as long as the store's (header + page), each
        # already one buffer in memory
        pages = self.pool.read_pages(self.src).view(torch.uint8).view(batch_pages, -1)
        self.values = [bytes(HEADER_SIZE) + bytes(page.numpy()) for page in pages]

    def through(self, store: ExternalStore) -> tuple[Callable[[], None], Callable[[], None]]:
        """(offload, load) of the whole batch through `store`, each to completion."""
        store.attach({KV: self.pool})
        offload = [PoolTransfer(KV, self.src, self.keys)]
        load = [PoolTransfer(KV, self.dst, self.keys)]

        def do_offload() -> None:
            assert store.offload(offload)
            store.progress()
            assert store.pop_completed_offload()

        def do_load() -> None:
            assert store.load("bench", load)
            store.start_loading()
            store.progress()
            assert store.pop_completed_load().success

        return do_offload, do_load

    def check_landed(self) -> None:
        assert torch.equal(self.pool.read_pages(self.dst), self.pool.read_pages(self.src))


WARM_LOAD = "load (pool <- store)"
WARM_ROUNDS = 3  # warm loads run this many times the rounds of the other figures


def _ratio_rows(
    batch: _Batch,
    store: ExternalStore,
    raw_write: Callable[[], None],
    raw_read: Callable[[], None],
    clear_store: Callable[[], None],
    clear_raw: Callable[[], None],
    rounds: int,
    uncache: tuple[Callable[[], None], Callable[[], None]] | None = None,
) -> list[Row]:
    """(operation, MiB, store GB/s, raw GB/s, store / raw, CPU raw / store) for offload
    and load; with `uncache` (store's files, raw files), also loads with the bytes
    dropped from the page cache before each read. Loads of bytes already in memory (page
    cache, Redis) take milliseconds a round: they run `WARM_ROUNDS` times as many rounds,
    which steadies their median on a shared machine at little cost."""
    do_offload, do_load = batch.through(store)

    def nothing() -> None:
        pass

    cases = [("offload (pool -> store)", [(do_offload, clear_store), (raw_write, clear_raw)])]
    loads = [(do_load, nothing), (raw_read, nothing)]
    cases.append((WARM_LOAD, loads))
    if uncache is not None:
        cold = [(do_load, uncache[0]), (raw_read, uncache[1])]
        cases.append(("load, not in page cache", cold))
    out: list[Row] = []
    gb, mib = batch.nbytes / 1e9, batch.nbytes / 2**20
    for name, pair in cases:
        timer = Rounds(rounds * WARM_ROUNDS if name == WARM_LOAD else rounds)
        ours, raw = timer.run(pair)
        cpu_ours, cpu_raw = timer.cpu
        if name.startswith("offload"):  # what the loads read
            clear_store()
            do_offload()
            clear_raw()
            raw_write()
        else:
            batch.check_landed()
        t, t_raw = statistics.median(ours), statistics.median(raw)
        cpu = Ratio.of(cpu_ours, cpu_raw)
        out.append((name, mib, gb / t, gb / t_raw, Ratio.of(ours, raw), cpu))
    return out


def _striped(pool: ThreadPoolExecutor, fn: Callable[[int], object], n: int, workers: int) -> None:
    """`fn(i)` for i < n on `workers` threads, each a stride of the indices, the first on
    the calling thread and the others on `pool` (as the file store spreads a transfer's
    pages)."""

    def run(w: int) -> None:
        for i in range(w, n, workers):
            fn(i)

    futures = [pool.submit(run, w) for w in range(1, workers)]
    run(0)
    for future in futures:
        future.result()


_PAGE = 4096


def _landing_rows(batch: _Batch, length: int) -> list[memoryview]:
    """A row of `length` bytes per page for raw reads, each placed as the store's reads
    land relative to the file's bytes: the store reads a page's payload (at file offset
    `HEADER_SIZE`) into a pool row, raw reads a whole file (offset 0) into its row, and
    both keep the same distance modulo 4 KiB between the page cache and the destination.
    The kernel's copy to user memory runs several times slower on some CPUs (AMD Zen's
    ``rep movsb``) when the destination sits 0-63 bytes after the source modulo 4 KiB, so
    an accidental placement would skew either side."""
    first = int(batch.dst[0]) // batch.pool.page_size
    store_at = batch.pool.page_bytes()[first].ctypes.data
    distance = (store_at - HEADER_SIZE) % _PAGE
    stride = -(-(length + distance) // _PAGE) * _PAGE + _PAGE
    flat = torch.empty(len(batch.keys) * stride + _PAGE, dtype=torch.uint8).numpy()
    shift = (distance - flat.ctypes.data) % _PAGE
    return [
        flat[shift + i * stride : shift + i * stride + length].data for i in range(len(batch.keys))
    ]


def bench_file(batch: _Batch, directory: Path, rounds: int) -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-store-", dir=directory))
    try:
        store = FileStore(root / "store")
        workers = store.io_threads
        threads = ThreadPoolExecutor(workers - 1, thread_name_prefix="bench-raw-io")
        raw = root / "raw"
        raw.mkdir()
        names = [str(raw / key) for key in batch.keys]
        rows = _landing_rows(batch, len(batch.values[0]))  # where raw reads land
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC

        def write_one(i: int) -> None:  # write + fsync of one page's value into its file
            fd = os.open(names[i], flags, 0o644)
            try:
                view = memoryview(batch.values[i])
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)

        def raw_write() -> None:  # every file durable, the directory too
            _striped(threads, write_one, len(names), workers)
            fd = os.open(raw, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(fd)
            os.close(fd)

        def read_one(i: int) -> None:
            fd = os.open(names[i], os.O_RDONLY | os.O_CLOEXEC)
            try:
                got = os.readv(fd, [rows[i]])
            finally:
                os.close(fd)
            assert got == len(rows[i])

        def raw_read() -> None:  # plain read of each page file into its own row
            _striped(threads, read_one, len(names), workers)

        def drop_cached(paths: Sequence[str | Path]) -> None:
            for path in paths:
                fd = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)

        store_files = [store.path_of(KV, key) for key in batch.keys]

        def clear_store() -> None:
            store.evict(batch.keys)

        def clear_raw() -> None:
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)

        out = _ratio_rows(
            batch,
            store,
            raw_write,
            raw_read,
            clear_store,
            clear_raw,
            rounds,
            (lambda: drop_cached(store_files), lambda: drop_cached(names)),
        )
        store.close()
        threads.shutdown()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_redis(batch: _Batch, rounds: int) -> list[Row]:
    import redis

    from unicache_fsm.store.redis import PIPELINE_BYTES, RedisStore

    with RedisServer() as server:  # fresh, no persistence, no memory limit
        store = RedisStore(server.url)
        client = redis.Redis.from_url(server.url)
        names = [f"raw:{key}" for key in batch.keys]
        # pipelines as long as the store's: its SETs go out once their values reach
        # PIPELINE_BYTES, its GETs fetch PIPELINE_BYTES of payload (whole pages) at a time
        per_set = -(-PIPELINE_BYTES // len(batch.values[0]))
        per_get = max(1, PIPELINE_BYTES // batch.pool.page_nbytes)

        def raw_write() -> None:  # redis-py pipelined SET NX of values of the same size
            for start in range(0, len(names), per_set):
                pipe = client.pipeline(transaction=False)
                for i in range(start, min(start + per_set, len(names))):
                    pipe.set(names[i], batch.values[i], nx=True)
                assert all(pipe.execute())

        def raw_read() -> None:  # redis-py pipelined GET of those values
            for start in range(0, len(names), per_get):
                pipe = client.pipeline(transaction=False)
                for name in names[start : start + per_get]:
                    pipe.get(name)
                assert all(v is not None for v in pipe.execute())

        def settle() -> None:  # the allocator starts each write from the same state
            client.execute_command("MEMORY", "PURGE")  # type: ignore[no-untyped-call]

        def clear_store() -> None:
            store.evict(batch.keys)
            settle()

        def clear_raw() -> None:
            client.delete(*names)
            settle()

        rows = _ratio_rows(batch, store, raw_write, raw_read, clear_store, clear_raw, rounds)
        store.close()
        client.close()
        return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: as set)")
    parser.add_argument(
        "--backends", default="memory,file,redis", help="comma-separated: memory, file, redis"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the file store benchmark writes"
    )
    parser.add_argument("--rounds", type=int, default=0, help="interleaved rounds (0: default)")
    parser.add_argument(
        "--primed",
        action="store_true",
        help="memory store: time each case right after an untimed run of itself",
    )
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - {"memory", "file", "redis"})
    if unknown:
        parser.error(f"unknown backend(s) {unknown}; choose from memory, file, redis")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    shape = {
        "page_size": 16,
        "num_layers": 32,
        "width": 1024,
        "batch_pages": 32 if args.quick else 128,
    }
    rounds = args.rounds or (3 if args.quick else 15)
    print(
        f"bench_store: torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
        f"{rounds} interleaved rounds per figure; ratio = median over rounds of "
        "(baseline time / store time) in the same round, spread = its middle half (q1-q3)"
    )
    print()
    page_kib = shape["page_size"] * shape["num_layers"] * shape["width"] * 2 / 1024
    pages = (
        f"one batch of {shape['batch_pages']} random pages of {page_kib:.0f} KiB "
        f"(P={shape['page_size']}, {shape['num_layers']} layers x {shape['width']} fp16)"
    )
    if "memory" in backends:
        rows = bench(rounds=rounds, primed=args.primed, **shape)
        print_table(
            f"memory store, {pages}, checksummed (copy: {COPY_IMPLEMENTATION})"
            + (", each case primed" if args.primed else ""),
            ("operation", "MiB", "GB/s", "torch GB/s", "vs gather/scatter", "spread", "vs copy_"),
            [
                (n, f"{m:.0f}", f"{g:.2f}", f"{b:.2f}", str(r), r.spread, str(c))
                for n, m, g, b, r, c in rows
            ],
        )
    header = ("operation", "MiB", "store GB/s", "raw GB/s", "store / raw", "spread", "CPU")
    if "file" in backends:
        batch = _Batch(**shape)
        where = args.dir or Path(tempfile.gettempdir())
        rows = bench_file(batch, where, rounds)
        print_table(
            f"file store in {where}, {pages}; raw: write + fsync / read of each page file "
            f"(and one directory fsync), on as many threads as the store's I/O",
            header,
            [
                (n, f"{m:.0f}", f"{g:.2f}", f"{b:.2f}", str(r), r.spread, str(c))
                for n, m, g, b, r, c in rows
            ],
        )
    if "redis" in backends:
        if available():
            batch = _Batch(**shape)
            rows = bench_redis(batch, rounds)
            print_table(
                f"Redis store on loopback, {pages}; raw: redis-py pipelined SET NX / GET "
                "(pipelines as long as the store's)",
                header,
                [
                    (n, f"{m:.0f}", f"{g:.2f}", f"{b:.2f}", str(r), r.spread, str(c))
                    for n, m, g, b, r, c in rows
                ],
            )
        else:
            print("Redis store: skipped (redis-server is not installed)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
