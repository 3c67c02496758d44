"""The writer process of the file-store crash test (run in a child process, killed).

`write_until_killed(directory, seed, conn, kill_after)` opens a `FileStore` on
`directory` and offloads chains of pages (bytes fixed by each page's key, so two writers
of one page write identical bytes) until it is killed: prefixes of a few shared documents
and of fresh ones (so there is always something new to write). After each offload that
completed True it sends the chain's keys through `conn`: the parent's record of what was
reported published. With `kill_after` > 0 the process SIGKILLs itself on its `kill_after`-th
file-system step (a write, an fsync, a rename or a directory fsync), so kill points fall
between every pair of steps; with 0 the parent kills it at a random time.
"""

from __future__ import annotations

import os
import random
import signal
from multiprocessing.connection import Connection
from typing import Any

import torch

from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools import KVPool, PagedAllocator
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.file import FileStore

P, LAYERS, WIDTH = 4, 2, 256  # 4 KiB pages
SHARED_DOCS = 8  # documents every writer may write (two writers meet on them)
MAX_PAGES = 12


def chain_keys(doc: int, pages: int) -> list[str]:
    """The page keys of the first `pages` pages of document `doc`."""
    tokens = list(range(doc * 100_000, doc * 100_000 + pages * P))  # doc < 42_000
    return page_hashes(tokens, P)


def truth(key: str) -> torch.Tensor:
    """The bytes every writer stores under `key` (``[P, LAYERS, WIDTH]`` float16)."""
    gen = torch.Generator().manual_seed(int(key[:15], 16))
    return torch.randint(-1000, 1000, (P, LAYERS, WIDTH), generator=gen).to(torch.float16)


def make_pool() -> tuple[PagedAllocator, KVPool]:
    alloc = PagedAllocator(4 * MAX_PAGES * P, P)
    return alloc, KVPool.for_allocator(alloc, LAYERS, WIDTH)


def _arm(kill_after: int) -> None:
    """SIGKILL this process on its `kill_after`-th file-system step."""
    count = [0]

    def step(fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            if count[0] == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)

        return wrapped

    os.write = step(os.write)
    os.fsync = step(os.fsync)
    os.replace = step(os.replace)


def write_until_killed(
    directory: str,
    seed: int,
    conn: Connection,
    kill_after: int,
    *,
    capacity_pages: int | None = None,
    rounds: int = 500,
) -> None:
    """Offload `rounds` chains (or until killed), with `capacity_pages` for the store."""
    torch.set_num_threads(1)
    rng = random.Random(seed)
    store = FileStore(directory, capacity_pages=capacity_pages)
    alloc, pool = make_pool()
    store.attach({PoolName.KV: pool})
    if kill_after:
        _arm(kill_after)
    for _ in range(rounds):
        doc = rng.randrange(SHARED_DOCS) if rng.random() < 0.3 else rng.randrange(40_000)
        keys = chain_keys(doc, rng.randint(1, MAX_PAGES))
        slots = alloc.alloc(len(keys) * P)
        assert slots is not None
        pool.write_pages(slots, torch.cat([truth(k) for k in keys]))
        assert store.offload([PoolTransfer(PoolName.KV, slots, keys)])
        store.progress()
        if store.pop_completed_offload():
            conn.send(keys)
        alloc.free(slots)
    store.close()
