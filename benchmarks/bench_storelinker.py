"""`StoreLinker` on SGLang 0.5.23's own KV buffers: its memory, and its page moves.

Run under a python that imports SGLang 0.5.23 (the differential suite's venv,
``scripts/sglang_env.sh``) and this checkout: ``python benchmarks/bench_storelinker.py
[--quick]``. From ``benchmarks/run.py`` (any python) it re-runs itself under
``$SGLANG_VENV``'s python, or says it was skipped.

One SGLang `MHATokenToKVPool` (bf16, page 16; ``--layers`` layers of 8 KV heads x 128:
by default 32, the KV layout of an 8B model such as Llama-3-8B, 128 KiB of K and V per
token; 2048 tokens, 1024 with ``--quick``) served by
``StoreLinker.from_store(MemoryStore(staging_bytes=one node), ...)``. Printed side by
side:

- memory: the bytes of SGLang's buffers, the bytes of tensors the linker keeps of its
  own after the moves (`footprint.owned_tensors`: views of SGLang's buffers are not its
  own; the store's pages are the store's), and the staging budget;
- throughput of whole-node moves (``pages`` pages per node, every layer):
  - ``offload``: ``linker.offload`` + ``num_completed_offloads`` + ``pop`` (the store
    gathers the pages from every layer into its page format, checksums and files them)
    against a raw torch gather of the same pages (``index_select`` of the page rows of
    every layer's K and V buffer);
  - ``load``: ``linker.load`` + ``start_layer_wise_loading`` + ``finish`` (the store
    verifies the pages and scatters them into the slots, layer by layer) against a raw
    torch scatter of the same bytes (``index_copy_`` into every layer's buffers);
  - the page device alone (`LayerBuffers.read_page_ids` / `write_page_ids`, the
    transposition into the store's page format, no store) against the same baselines.

Each move runs interleaved with its baselines, round by round; a ratio is the median
over rounds of the baseline's time over the linker's in the same round (1.0: as fast
as the raw copy). Nothing is asserted. Two baselines: ``raw``, torch's gather/scatter
allocating its result (its far side is reused memory, in cache); ``raw, ring``, the
same into (out of) preallocated memory the size of the store's (4 nodes, used in turn),
where a store keeps what it gathers. The store runs at its capacity (4 nodes) once
warm, as a serving store does: an offload evicts the oldest node and refills its rows.

On a CPU pool the linker's moves are native (`checksum.gather_pages` /
`scatter_pages`): an offload fills each page from every layer's K and V rows in a
scratch that stays in cache (runs of tokens of at most 512 KiB for larger pages), then
stores it into the store's row and hashes it (XXH3-64) in one pass, with streaming
stores; a load from the memory store hashes each stored page, then copies its rows
into the slots while it is in cache. With torch at more than one thread, a move shares
its pages among torch's own OpenMP threads (`unicache_fsm.store.team`), as torch's
gather spreads over them; the last line printed names who ran them.

Measured on 2 cores (1-minute load 0.5 to 0.95: little else running), three runs each,
32 layers (a node: 16 pages of 2 MiB, 32 MiB):

- torch's default threads (2): offload 1.17x, 1.12x, 1.33x of ``raw`` (1.11x, 1.02x,
  1.00x of ``raw, ring``; the offload at 11.3-13.4 GiB/s); load 1.95x, 1.64x, 1.35x
  (1.94x, 1.62x, 1.37x); the page device's read 1.05x-1.73x (0.98x-1.44x), its write
  2.7x-3.4x.
- ``--threads 1``: offload 1.13x, 1.13x, 1.12x (1.04x, 1.04x, 1.03x; 6.4-7.9 GiB/s);
  load 1.35x, 1.33x, 1.29x (the same against the ring); the page device's read
  0.86x-0.98x (0.81x-0.95x: without a checksum a page is written in place, token by
  token, not through a scratch).

With ``--layers 8`` (a node of 8 MiB) the same per-page bookkeeping moves a quarter of
the bytes, two runs each: torch's threads, offload 0.53x and 0.73x (0.53x, 0.59x), load
2.22x and 2.04x, the page device's read 1.09x; ``--threads 1``, offload 0.75x and 0.82x
(0.73x, 0.78x), load 1.92x and 1.44x. There the linker's and the store's Python (checks
of the transfers, the slot gate, planning, capacity eviction of 16 pages, the books,
the verdict) bounds the offload: about 0.17 ms per offload with its data in cache and
0.29 ms right after an 8 MiB copy has evicted it (measured with the native move stubbed
out), against 0.5-1.0 ms for the move itself.

Before the moves used torch's team, two threads of their own lost to it: torch's
OpenMP threads spin on their cores for milliseconds after each parallel region, so a
second thread started right after a torch op waited for a core (8 layers: the page
device's read ran at 5.5-6.4 GiB/s split over two threads of its own, 11.4 on one;
handed to torch's team, 15.6-17.3). When another process keeps the second core busy,
every split move waits at its end for the descheduled team thread, as torch's own ops
do: with a second process busy, one run at 8 layers timed torch's gather at 0.06 GiB/s
and the offload at 0.95 GiB/s (``--threads 1`` avoids splitting).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _elsewhere(argv: list[str]) -> int:
    """Re-run under the SGLang venv's python, or say why not."""
    py = Path(os.environ.get("SGLANG_VENV", REPO / ".venv-sglang")) / "bin" / "python"
    if not py.exists():
        print("skipped: needs SGLang 0.5.23 ($SGLANG_VENV or .venv-sglang: scripts/sglang_env.sh)")
        return 0
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    cmd = [str(py), "-W", "ignore", str(Path(__file__).resolve()), *argv]
    return subprocess.run(cmd, env=env, check=False).returncode


def _paired(
    fn: Callable[[], None], bases: list[Callable[[], None]], rounds: int
) -> tuple[float, list[float], list[float]]:
    """Median times of `fn` and of each baseline, run interleaved round by round, and
    the median over rounds of each baseline's time over `fn`'s in the same round (a
    paired ratio: a slow spell of the machine slows both sides of a round)."""
    ours: list[float] = []
    theirs: list[list[float]] = [[] for _ in bases]
    for _ in range(rounds):
        for times, base in zip(theirs, bases, strict=True):
            t0 = time.perf_counter()
            base()
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fn()
        ours.append(time.perf_counter() - t0)
    ratios = [
        statistics.median(t / o for t, o in zip(times, ours, strict=True)) for times in theirs
    ]
    return statistics.median(ours), [statistics.median(t) for t in theirs], ratios


def run(quick: bool, layers: int = 32) -> int:
    logging.disable(logging.WARNING)
    import torch
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from unicache_fsm.integrations.sglang import StoreLinker
    from unicache_fsm.integrations.sglang.footprint import owned_bytes, owned_tensors
    from unicache_fsm.pools.transfer import PoolName as OurPool
    from unicache_fsm.store import MemoryStore, team
    from unicache_fsm.store.protocol import ExternalStore

    page, heads, dim = 16, 8, 128
    tokens = 1024 if quick else 2048
    node_pages = 16  # one node: 256 tokens (32 MiB of K and V with 32 layers)
    rounds = 7 if quick else 31
    staging = node_pages * page * layers * 2 * heads * dim * 2  # one node, bf16
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page))
    kv = MHATokenToKVPool(
        size=tokens,
        page_size=page,
        dtype=torch.bfloat16,
        head_num=heads,
        head_dim=dim,
        layer_num=layers,
        device="cpu",
        enable_memory_saver=False,
    )
    gen = torch.Generator().manual_seed(0)
    for buf in [*kv.k_buffer, *kv.v_buffer]:
        buf.copy_(torch.randn(buf.shape, generator=gen).to(torch.bfloat16))
    # at capacity (4 nodes) once warm, as a serving store runs: an offload evicts the
    # oldest node and refills its rows (a store still growing writes fresh memory, and
    # pays the kernel's first-touch faults the raw gather's reused buffers do not)
    store = MemoryStore(staging_bytes=staging, capacity_pages=4 * node_pages)
    linker = StoreLinker.from_store(store, {PoolName.KV: kv})
    buffers = [*kv.k_buffer, *kv.v_buffer]
    pool_bytes = sum(t.nbytes for t in buffers)

    src_pages = torch.arange(1, 1 + node_pages)
    dst_pages = torch.arange(1 + node_pages, 1 + 2 * node_pages)
    src = (src_pages[:, None] * page + torch.arange(page)).reshape(-1)
    dst = (dst_pages[:, None] * page + torch.arange(page)).reshape(-1)
    k_rows = [b.view(tokens // page + 1, -1) for b in kv.k_buffer]
    v_rows = [b.view(tokens // page + 1, -1) for b in kv.v_buffer]
    gathered: list[Any] = []
    counter = iter(range(10**9))

    def raw_gather() -> None:
        gathered[:] = [r.index_select(0, src_pages) for r in [*k_rows, *v_rows]]

    def raw_scatter() -> None:
        for r, g in zip([*k_rows, *v_rows], gathered, strict=True):
            r.index_copy_(0, dst_pages, g)

    # the same raw moves with the far side in memory the size of the store's (4 nodes,
    # used in turn): a store keeps what it gathers, so its rows are not in cache
    ring = [[torch.empty_like(r[:node_pages]) for r in [*k_rows, *v_rows]] for _ in range(4)]
    turn = iter(range(10**9))

    def raw_gather_ring() -> None:
        for r, out in zip([*k_rows, *v_rows], ring[next(turn) % 4], strict=True):
            torch.index_select(r, 0, src_pages, out=out)

    def raw_scatter_ring() -> None:
        for r, g in zip([*k_rows, *v_rows], ring[next(turn) % 4], strict=True):
            r.index_copy_(0, dst_pages, g)

    def keys() -> list[str]:
        n = next(counter)
        return [f"{n:032x}{i:032x}" for i in range(node_pages)]

    # each offload's transfer made beforehand: SGLang builds it, not the linker
    fresh = [
        PoolTransfer(name=PoolName.KV, device_indices=src, keys=keys()) for _ in range(rounds + 8)
    ]
    stored: list[list[str]] = []

    def offload() -> None:
        t = fresh.pop()
        assert linker.offload([t])
        assert linker.num_completed_offloads() == 1 and linker.pop_completed_offload()
        stored.append(t.keys)

    def load() -> None:
        t = PoolTransfer(name=PoolName.KV, device_indices=dst, keys=list(stored[-1]))
        assert linker.load("bench", [t])
        index = linker.start_layer_wise_loading()
        assert linker.finish_layer_wise_loading(index)

    device = linker.buffers[OurPool.KV]
    shape = (node_pages * page, layers, device.width)
    staged: list[Any] = [torch.zeros(shape, dtype=device.dtype)]

    def device_read() -> None:  # into memory it reuses, as a store's rows
        device.allow("read", src_pages)
        device.read_page_ids(src_pages, out=staged[0])
        device.revoke("read", src_pages)

    def device_write() -> None:
        device.allow("write", dst_pages)
        device.write_page_ids(dst_pages, staged[0])
        device.revoke("write", dst_pages)

    offload()  # warm up every path once
    raw_gather()
    for _ in range(4):
        raw_gather_ring()
    rows = []
    moved = node_pages * device.page_nbytes
    for name, fn, bases in (
        ("offload (store)", offload, [raw_gather, raw_gather_ring]),
        ("load (store)", load, [raw_scatter, raw_scatter_ring]),
        ("page device read", device_read, [raw_gather, raw_gather_ring]),
        ("page device write", device_write, [raw_scatter, raw_scatter_ring]),
    ):
        fn()
        ours, theirs, ratios = _paired(fn, bases, rounds)
        rows.append((name, moved / ours / 2**30, [moved / t / 2**30 for t in theirs], ratios))
    assert all(torch.equal(kv.k_buffer[i][dst], kv.k_buffer[i][src]) for i in range(layers))

    own = owned_tensors(linker, beside=buffers, skip=(ExternalStore,))
    mib = pool_bytes / 2**20
    print(f"SGLang pool: {tokens} tokens, page {page}, {layers} layers, bf16: {mib:.1f} MiB")
    print(f"{'memory':<30}{'bytes':>14}")
    print(f"{'SGLang K/V buffers':<30}{pool_bytes:>14,}")
    print(f"{'linker-owned tensors':<30}{owned_bytes(own):>14,}   ({len(own)} tensors)")
    print(f"{'largest linker-owned tensor':<30}{max((t.nbytes for t in own), default=0):>14,}")
    print(f"{'staging budget (store)':<30}{staging:>14,}")
    print()
    print(f"node: {node_pages} pages, {moved / 2**20:.1f} MiB; medians of {rounds} rounds")
    print(
        "raw: torch index_select / index_copy_ with the far side reused (in cache); "
        "raw, ring: the far side 4 nodes of memory used in turn, as a store's rows"
    )
    head = ("move", "linker GiB/s", "raw GiB/s", "ratio", "raw, ring GiB/s", "ratio")
    print(f"{head[0]:<20}{head[1]:>14}{head[2]:>11}{head[3]:>7}{head[4]:>17}{head[5]:>7}")
    for name, ours_gbs, (raw, ring_gbs), (ratio, ring_ratio) in rows:
        print(
            f"{name:<20}{ours_gbs:>14.2f}{raw:>11.2f}{ratio:>7.2f}{ring_gbs:>17.2f}{ring_ratio:>7.2f}"
        )
    loads = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"torch threads: {torch.get_num_threads()}; load average: {loads}")
    print(f"the linker's moves split over: {team.RUNTIME}")
    linker.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller pool, fewer rounds")
    parser.add_argument(
        "--layers", type=int, default=32, help="layers of the model (32: an 8B model's)"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)"
    )
    args = parser.parse_args(argv)
    try:
        import unicache_fsm.integrations.sglang  # noqa: F401
    except ImportError:
        return _elsewhere(argv)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    return run(args.quick, args.layers)


if __name__ == "__main__":
    sys.exit(main())
