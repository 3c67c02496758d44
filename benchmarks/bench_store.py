"""Store benchmark: batched offload and load bandwidth through every store backend.

Run ``python benchmarks/bench_store.py`` (``--quick`` for a smoke run; ``--backends
memory,file,redis`` to choose). One batch of
randomly placed pages of a realistic pool (P = 16, 32 layers x 1024 fp16: 1 MiB pages)
goes KV pool -> `MemoryStore` (offload: validate, queue, `progress()`, pop) and back
(load into other slots: validate, queue, start, `progress()`, pop), with every page
checksummed on the way in and verified on the way out. Each figure is a ratio against
plain torch copies of the same bytes measured alternately in the same run:

- ``vs gather``: ``torch.index_select(pages, 0, ids, out=buf)`` (the pool -> buffer
  gather an offload needs at the least) or ``pages.index_copy_(0, ids, buf)`` (torch's
  buffer -> pool scatter; `KVPool.write_pages` copies pages of 16 KiB and more one
  memcpy each, which runs faster than this kernel, so a load can exceed 1.0x);
- ``vs copy_``: ``dst.copy_(src)`` between two contiguous tensors of the same size.

The design target is >= 0.5 of a plain copy.

The file and Redis stores move the same batch through their medium, and each figure is
a ratio against the raw client doing the same I/O on the same bytes, measured
alternately in the same run (design target >= 0.7):

- file store (a fresh directory under ``--dir``, default the system's temporary
  directory, so a real disk): offload = temp file, write, fsync, rename per page and one
  directory fsync, vs. a plain ``write`` + ``fsync`` of each page's bytes into its own
  file; load = read, check header and checksum, write into the slots, vs. a plain
  ``readinto`` of each page file;
- Redis store (a real ``redis-server`` on a free loopback port, started here; skipped
  when it is not installed): offload = pipelined ``SET NX`` of header + page, vs.
  redis-py pipelined ``SET`` of the same page bytes; load = pipelined ``GET``, checks,
  write into the slots, vs. redis-py pipelined ``GET`` of those values.

On a busy 2-core machine torch's OpenMP threads stall each other and every figure,
baselines included, swings by 10x; pass ``--threads 1`` for stable ratios. A benchmark,
not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from unicache_fsm.console import print_table
from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools import KVPool, PagedAllocator
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store import MemoryStore
from unicache_fsm.store.file import FileStore
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing.redis_server import RedisServer, available

__all__ = ["main"]

KV = PoolName.KV


def _paired(
    fn: Callable[[], object],
    baseline: Callable[[], object],
    setup: Callable[[], object],
    repeats: int,
    *,
    baseline_setup: bool = False,
) -> tuple[float, float]:
    """Median seconds of `fn` (after an untimed `setup`) and of `baseline` (after one
    too, with `baseline_setup`), alternately."""
    setup()
    fn()  # warm-up: slabs and staging buffers reach their size
    baseline()
    ours, base = [], []
    for _ in range(repeats):
        setup()
        t0 = time.perf_counter()
        fn()
        ours.append(time.perf_counter() - t0)
        if baseline_setup:
            setup()
        t0 = time.perf_counter()
        baseline()
        base.append(time.perf_counter() - t0)
    return statistics.median(ours), statistics.median(base)


def bench(
    *, page_size: int, num_layers: int, width: int, batch_pages: int, repeats: int
) -> list[tuple[str, float, float, float, float]]:
    """(case, MiB, GB/s, ratio vs gather/scatter, ratio vs contiguous copy_) per case."""
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

    nbytes = batch_pages * pool.page_nbytes
    rows = []
    t, t_gather = _paired(do_offload, gather, evict_all, repeats)
    _, t_copy = _paired(do_offload, contiguous, evict_all, repeats)
    rows.append(("offload (pool -> store)", t, t_gather, t_copy))
    do_offload()
    for name, transfers in (("load (pool <- store)", load), ("load, shuffled keys", load_shuffled)):
        t, t_scatter = _paired(do_load(transfers), scatter, lambda: None, repeats)
        _, t_copy = _paired(do_load(transfers), contiguous, lambda: None, repeats)
        rows.append((name, t, t_scatter, t_copy))
    landed = pool.read_pages(dst).view(batch_pages, -1)  # after the shuffled load
    assert torch.equal(landed, pool.read_pages(src).view(batch_pages, -1)[shuffle])
    store.check_invariants()
    store.close()
    return [(name, nbytes / 2**20, nbytes / t / 1e9, tg / t, tc / t) for name, t, tg, tc in rows]


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
        # what a raw client writes: each page's bytes, already in memory
        pages = self.pool.read_pages(self.src).view(torch.uint8).view(batch_pages, -1)
        self.payloads = [bytes(page.numpy()) for page in pages]

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


def _ratio_rows(
    batch: _Batch,
    store: ExternalStore,
    raw_write: Callable[[], None],
    raw_read: Callable[[], None],
    clear_raw: Callable[[], None],
    repeats: int,
    uncache: Callable[[], None] | None = None,
) -> list[tuple[str, float, float, float, float]]:
    """(operation, MiB, store GB/s, raw GB/s, store / raw) for offload and load; with
    `uncache`, also loads with the bytes dropped from the page cache before each read."""
    do_offload, do_load = batch.through(store)

    def clear() -> None:
        store.evict(batch.keys)
        clear_raw()

    t_off, t_raw_write = _paired(do_offload, raw_write, clear, repeats)
    do_offload()
    raw_write()
    t_load, t_raw_read = _paired(do_load, raw_read, lambda: None, repeats)
    batch.check_landed()
    gb, mib = batch.nbytes / 1e9, batch.nbytes / 2**20
    out = [
        ("offload (pool -> store)", mib, gb / t_off, gb / t_raw_write, t_raw_write / t_off),
        ("load (pool <- store)", mib, gb / t_load, gb / t_raw_read, t_raw_read / t_load),
    ]
    if uncache is not None:
        t_cold, t_raw_cold = _paired(do_load, raw_read, uncache, repeats, baseline_setup=True)
        batch.check_landed()
        label = "load, not in page cache"
        out.append((label, mib, gb / t_cold, gb / t_raw_cold, t_raw_cold / t_cold))
    return out


def bench_file(
    batch: _Batch, directory: Path, repeats: int
) -> list[tuple[str, float, float, float, float]]:
    root = Path(tempfile.mkdtemp(prefix="bench-store-", dir=directory))
    try:
        store = FileStore(root / "store")
        raw = root / "raw"
        raw.mkdir()
        names = [raw / key for key in batch.keys]
        landing = torch.empty((len(names), len(batch.payloads[0])), dtype=torch.uint8)
        rows = [landing[i].numpy().data for i in range(len(names))]  # where reads land

        def raw_write() -> None:  # plain write + fsync of each page into its own file
            for name, payload in zip(names, batch.payloads, strict=True):
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, payload)
                os.fsync(fd)
                os.close(fd)

        def raw_read() -> None:  # plain read of each page file into its own row
            for name, row in zip(names, rows, strict=True):
                with open(name, "rb", buffering=0) as f:
                    f.readinto(row)

        def uncache() -> None:  # drop both sets of files from the page cache
            for path in [*names, *(store.path_of(KV, key) for key in batch.keys)]:
                fd = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)

        def clear_raw() -> None:
            for name in names:
                name.unlink(missing_ok=True)

        out = _ratio_rows(batch, store, raw_write, raw_read, clear_raw, repeats, uncache)
        store.close()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_redis(batch: _Batch, repeats: int) -> list[tuple[str, float, float, float, float]]:
    import redis

    from unicache_fsm.store.redis import RedisStore

    with RedisServer() as server:
        store = RedisStore(server.url)
        client = redis.Redis.from_url(server.url)
        names = [f"raw:{key}" for key in batch.keys]

        def raw_write() -> None:  # redis-py pipelined SET of the same page bytes
            pipe = client.pipeline(transaction=False)
            for name, payload in zip(names, batch.payloads, strict=True):
                pipe.set(name, payload)
            pipe.execute()

        def raw_read() -> None:  # redis-py pipelined GET of those values
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.get(name)
            assert all(v is not None for v in pipe.execute())

        def clear_raw() -> None:
            client.delete(*names)

        rows = _ratio_rows(batch, store, raw_write, raw_read, clear_raw, repeats)
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
    repeats = 3 if args.quick else 9
    print(f"bench_store: torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    print()
    page_kib = shape["page_size"] * shape["num_layers"] * shape["width"] * 2 / 1024
    pages = (
        f"one batch of {shape['batch_pages']} random pages of {page_kib:.0f} KiB "
        f"(P={shape['page_size']}, {shape['num_layers']} layers x {shape['width']} fp16)"
    )
    if "memory" in backends:
        rows = bench(repeats=repeats, **shape)
        print_table(
            f"memory store, {pages}, checksummed",
            ("operation", "MiB", "GB/s", "vs gather/scatter", "vs copy_"),
            [
                (name, f"{mib:.0f}", f"{gbs:.2f}", f"{rg:.2f}x", f"{rc:.2f}x")
                for name, mib, gbs, rg, rc in rows
            ],
        )
    header = ("operation", "MiB", "store GB/s", "raw GB/s", "store / raw")
    io_repeats = 3 if args.quick else 5
    if "file" in backends:
        batch = _Batch(**shape)
        where = args.dir or Path(tempfile.gettempdir())
        rows = bench_file(batch, where, io_repeats)
        print_table(
            f"file store in {where}, {pages}; raw: write + fsync / read of each page file",
            header,
            [(n, f"{m:.0f}", f"{g:.2f}", f"{r:.2f}", f"{x:.2f}x") for n, m, g, r, x in rows],
        )
    if "redis" in backends:
        if available():
            batch = _Batch(**shape)
            rows = bench_redis(batch, io_repeats)
            print_table(
                f"Redis store on loopback, {pages}; raw: redis-py pipelined SET / GET",
                header,
                [(n, f"{m:.0f}", f"{g:.2f}", f"{r:.2f}", f"{x:.2f}x") for n, m, g, r, x in rows],
            )
        else:
            print("Redis store: skipped (redis-server is not installed)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
