"""Pool benchmarks: allocator throughput and KV page-move bandwidth against a plain copy.

Run ``python benchmarks/bench_pools.py`` (``--quick`` for a smoke run, ``--device cuda``
on a GPU machine). Prints two tables, every figure measured in this process:

1. alloc + free of a batch of 1, 64 and 4,096 pages (P = 1 and 16): pages/s.
2. `read_pages`, `write_pages`, host backup (D->H) and restore (H->D) of a batch of
   randomly placed pages: GB/s, the ratio against ``dst.copy_(src)`` of a contiguous
   tensor of the same bytes (the design target is >= 0.5), and the ratio against
   torch's own gather / scatter of the same pages (`index_select` / `index_copy_` of
   page rows by page id; a host copy is one gather, a device<->host copy of the
   batch, and one scatter; design target >= 0.8). Each ratio is the median of runs
   alternating with its baseline.

A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from unicache_fsm.console import print_table
from unicache_fsm.pools import HostKVPool, KVPool, PagedAllocator

__all__ = ["main"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of `fn` over `repeats` runs, after one warm-up run."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_alloc_free(
    device: torch.device, batches: Sequence[int], page_sizes: Sequence[int], budget_s: float
) -> list[tuple[int, int, float, float]]:
    """(P, batch pages, microseconds per alloc+free, pages/s) per configuration."""
    rows = []
    for p in page_sizes:
        for batch in batches:
            a = PagedAllocator(2 * batch * p, p, device=device)

            def cycle(a: PagedAllocator = a, n: int = batch * p) -> None:
                slots = a.alloc(n)
                assert slots is not None
                a.free(slots)

            # Calibrate the loop length to the time budget, then time whole loops.
            single = max(_median_seconds(cycle, device, 5), 1e-7)
            loops = max(1, int(budget_s / 5 / single))

            def many(cycle: Callable[[], None] = cycle, loops: int = loops) -> None:
                for _ in range(loops):
                    cycle()

            per_cycle = _median_seconds(many, device, 5) / loops
            rows.append((p, batch, per_cycle * 1e6, batch / per_cycle))
    return rows


def bench_bandwidth(
    device: torch.device,
    *,
    page_size: int,
    num_layers: int,
    width: int,
    pool_pages: int,
    batch_pages: int,
    repeats: int,
) -> list[tuple[str, float, float, float, float]]:
    """(operation, MiB moved, GB/s, ratio to a plain copy of the same bytes, ratio to
    torch's gather / scatter of the same pages)."""
    alloc = PagedAllocator(pool_pages * page_size, page_size, device=device)
    kv = KVPool.for_allocator(alloc, num_layers, width)
    host = HostKVPool.for_device_pool(kv, pool_pages * page_size)
    host_alloc = PagedAllocator(pool_pages * page_size, page_size, name="host")
    everything = alloc.alloc(pool_pages * page_size)
    host_everything = host_alloc.alloc(pool_pages * page_size)
    assert everything is not None
    assert host_everything is not None
    gen = torch.Generator().manual_seed(0)

    def random_pages(slots: torch.Tensor) -> torch.Tensor:
        pages = slots.view(-1, page_size)
        pick = torch.randperm(pages.shape[0], generator=gen)[:batch_pages]
        return pages[pick.to(slots.device)].reshape(-1)

    slots = random_pages(everything)
    host_slots = random_pages(host_everything)
    kv.data.copy_(torch.randn(kv.data.shape, generator=gen).to(kv.dtype))
    rows_dev = kv.read_pages(slots)
    out = torch.empty_like(rows_dev)
    nbytes = rows_dev.nbytes

    # Baselines: a plain copy of the same bytes between contiguous tensors.
    src_dev, dst_dev = rows_dev.clone(), torch.empty_like(rows_dev)
    pin = host.is_pinned
    dst_host = torch.empty(rows_dev.shape, dtype=kv.dtype, pin_memory=pin)
    src_host = torch.empty(rows_dev.shape, dtype=kv.dtype, pin_memory=pin)
    src_host.copy_(rows_dev)

    def copy_dev() -> object:
        return dst_dev.copy_(src_dev)

    def copy_d2h() -> object:
        return dst_host.copy_(src_dev)

    def copy_h2d() -> object:
        return dst_dev.copy_(src_host, non_blocking=pin)

    # Torch's own gather / scatter of the same pages (page rows, page ids): the
    # design target's baseline (>= 0.8).
    dev_rows, host_rows = kv.data.view(pool_pages + 1, -1), host.data.view(pool_pages + 1, -1)
    dev_ids, host_ids = slots.view(-1, page_size)[:, 0] // page_size, host_slots[::page_size]
    host_ids = host_ids // page_size
    flat_out, flat_in = out.view(batch_pages, -1), rows_dev.view(batch_pages, -1)
    staging = torch.empty_like(flat_out, device="cpu", pin_memory=pin)

    def gather_dev() -> object:
        return torch.index_select(dev_rows, 0, dev_ids, out=flat_out)

    def scatter_dev() -> object:
        return dev_rows.index_copy_(0, dev_ids, flat_in)

    def gather_scatter_d2h() -> object:
        staging.copy_(dev_rows.index_select(0, dev_ids))
        return host_rows.index_copy_(0, host_ids, staging)

    def gather_scatter_h2d() -> object:
        torch.index_select(host_rows, 0, host_ids, out=staging)
        return dev_rows.index_copy_(0, dev_ids, staging.to(device, non_blocking=pin))

    cases: list[tuple[str, Callable[[], object], Callable[[], object], Callable[[], object]]] = [
        ("read_pages", lambda: kv.read_pages(slots, out=out), copy_dev, gather_dev),
        ("write_pages", lambda: kv.write_pages(slots, rows_dev), copy_dev, scatter_dev),
        (
            "host backup (D->H)",
            lambda: host.backup_from(kv, slots, host_slots),
            copy_d2h,
            gather_scatter_d2h,
        ),
        (
            "host restore (H->D)",
            lambda: host.restore_to(kv, host_slots, slots),
            copy_h2d,
            gather_scatter_h2d,
        ),
    ]
    results = []
    for name, fn, baseline, torch_way in cases:
        t, t_base = _paired_median_seconds(fn, baseline, device, repeats)
        t_again, t_torch = _paired_median_seconds(fn, torch_way, device, repeats)
        results.append((name, nbytes / 2**20, nbytes / t / 1e9, t_base / t, t_torch / t_again))
    return results


def _paired_median_seconds(
    fn: Callable[[], object], baseline: Callable[[], object], device: torch.device, repeats: int
) -> tuple[float, float]:
    """Median times of `fn` and `baseline`, run alternately so both see the same machine."""
    ours, base = [], []
    for _ in range(repeats):
        ours.append(_median_seconds(fn, device, 1))
        base.append(_median_seconds(baseline, device, 1))
    return statistics.median(ours), statistics.median(base)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_pools: --device cuda asked for but CUDA is not available", file=sys.stderr)
        return 2

    quick = args.quick
    threads = torch.get_num_threads()
    print(f"bench_pools: torch {torch.__version__}, device {device}, {threads} CPU threads")
    print()

    alloc_rows = bench_alloc_free(
        device, batches=(1, 64, 4096), page_sizes=(1, 16), budget_s=0.05 if quick else 0.5
    )
    print_table(
        "alloc + free of one batch (vectorised; no Python loop per page)",
        ("P", "batch pages", "us / alloc+free", "pages/s"),
        [(str(p), str(b), f"{us:,.1f}", f"{rate:,.0f}") for p, b, us, rate in alloc_rows],
    )

    shape = {
        "page_size": 16,
        "num_layers": 8,
        "width": 1024,
        "pool_pages": 256 if quick else 1024,
        "batch_pages": 128 if quick else 256,
    }
    bw_rows = bench_bandwidth(device, repeats=5 if quick else 15, **shape)
    page_kib = shape["page_size"] * shape["num_layers"] * shape["width"] * 2 / 1024
    print_table(
        f"page moves, {shape['batch_pages']} random pages of {page_kib:.0f} KiB "
        f"(P={shape['page_size']}, {shape['num_layers']} layers x {shape['width']} fp16)",
        ("operation", "MiB", "GB/s", "vs plain copy", "vs torch gather/scatter"),
        [
            (name, f"{mib:.0f}", f"{gbs:.2f}", f"{ratio:.2f}x", f"{vs_torch:.2f}x")
            for name, mib, gbs, ratio, vs_torch in bw_rows
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
