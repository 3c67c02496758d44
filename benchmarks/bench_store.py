"""Store benchmark: batched offload and load bandwidth through the memory store.

Run ``python benchmarks/bench_store.py`` (``--quick`` for a smoke run). One batch of
randomly placed pages of a realistic pool (P = 16, 32 layers x 1024 fp16: 1 MiB pages)
goes KV pool -> `MemoryStore` (offload: validate, queue, `progress()`, pop) and back
(load into other slots: validate, queue, start, `progress()`, pop), with every page
checksummed on the way in and verified on the way out. Each figure is a ratio against
plain torch copies of the same bytes measured alternately in the same run:

- ``vs gather``: ``torch.index_select(pages, 0, ids, out=buf)`` (the pool -> buffer
  gather an offload needs at the least) or ``pages.index_copy_(0, ids, buf)`` (the
  buffer -> pool scatter a load needs at the least);
- ``vs copy_``: ``dst.copy_(src)`` between two contiguous tensors of the same size.

The design target is >= 0.5 of a plain copy. On a busy 2-core machine torch's OpenMP
threads stall each other and every figure, baselines included, swings by 10x; pass
``--threads 1`` for stable ratios. A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools import KVPool, PagedAllocator
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store import MemoryStore

__all__ = ["main"]

KV = PoolName.KV


def _paired(
    fn: Callable[[], object],
    baseline: Callable[[], object],
    setup: Callable[[], object],
    repeats: int,
) -> tuple[float, float]:
    """Median seconds of `fn` (after an untimed `setup`) and of `baseline`, alternately."""
    setup()
    fn()  # warm-up: slabs and staging buffers reach their size
    baseline()
    ours, base = [], []
    for _ in range(repeats):
        setup()
        t0 = time.perf_counter()
        fn()
        ours.append(time.perf_counter() - t0)
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


def _print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(title)
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: as set)")
    args = parser.parse_args(argv)
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
    rows = bench(repeats=repeats, **shape)
    page_kib = shape["page_size"] * shape["num_layers"] * shape["width"] * 2 / 1024
    _print_table(
        f"memory store, one batch of {shape['batch_pages']} random pages of {page_kib:.0f} KiB "
        f"(P={shape['page_size']}, {shape['num_layers']} layers x {shape['width']} fp16), "
        "checksummed",
        ("operation", "MiB", "GB/s", "vs gather/scatter", "vs copy_"),
        [
            (name, f"{mib:.0f}", f"{gbs:.2f}", f"{rg:.2f}x", f"{rc:.2f}x")
            for name, mib, gbs, rg, rc in rows
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
