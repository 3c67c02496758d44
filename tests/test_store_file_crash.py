"""Writers of a `FileStore` killed with SIGKILL at random points, then the directory
reopened: nothing torn is kept or served, every page LOOKUP reports reads back
byte-exact, and every offload reported published is still there.

Each kill point runs one or two writer processes (`crash_writer`) on one directory; a
writer is killed by the test at a random time, or kills itself on a random file-system
step (a write, an fsync, a rename, a directory fsync). The writers are real processes
(forked from a forkserver that has torch loaded) and the kills are real SIGKILLs; the
directory is on the disk's temporary directory. A SIGKILL does not lose the page cache,
so what this proves is atomicity and recovery, not fsync's durability (the order of
fsyncs and renames is pinned by ``test_a_page_is_renamed_into_place_only_after...`` in
test_store_file.py).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from crash_writer import P, make_pool, truth, write_until_killed
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.file import FileStore

KILL_POINTS = 54
KV = PoolName.KV


def _collect(conn: Connection, published: list[list[str]]) -> None:
    while True:
        try:
            if not conn.poll():
                return
            published.append(conn.recv())
        except (EOFError, OSError):
            return


def _check_directory(directory: Path, published: list[list[str]], verified: set[str]) -> int:
    """Reopen the directory and check it; returns the temporaries recovery deleted.

    Pages are immutable once renamed into place, so each page's bytes are read back
    once (`verified` holds those already read); the published chains are looked up and
    their presence checked on every reopening."""
    store = FileStore(directory)
    assert store.recovered.discarded == (), (
        f"a killed writer left torn pages under their final names: {store.recovered.discarded}"
    )
    folder = directory / "default" / "kv"
    names = os.listdir(folder)
    leftovers = [n for n in names if n.endswith(".tmp")]
    assert not leftovers, f"temporaries of dead writers survived reopening: {leftovers}"
    alloc, pool = make_pool()
    store.attach({KV: pool})
    for keys in published:  # every offload reported published is still whole
        found = store.lookup("published", [PoolTransfer(KV, keys=keys)])
        assert found and found[-1] == len(keys), f"a published chain of {len(keys)} lost pages"
    fresh = sorted(set(names) - verified)
    for start in range(0, len(fresh), 32):  # every page LOOKUP can report reads back exact
        keys = fresh[start : start + 32]
        assert store.lookup("fresh", [PoolTransfer(KV, keys=keys[:1])]) == [1]
        slots = alloc.alloc(len(keys) * P)
        assert slots is not None
        assert store.load("fresh", [PoolTransfer(KV, slots, keys)])
        store.start_loading()
        store.progress()
        assert store.pop_completed_load().success, "a page on disk failed its checks"
        want = torch.cat([truth(k) for k in keys])
        assert torch.equal(pool.read_pages(slots), want), "a page's bytes differ"
        alloc.free(slots)
        verified.update(keys)
    temporaries = store.recovered.temporaries
    store.close()
    return temporaries


def test_writers_killed_at_random_points_leave_a_consistent_directory(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "crash_writer"])
    rng = random.Random(20261130)
    directory = tmp_path / "store"
    FileStore(directory).close()
    published: list[list[str]] = []
    verified: set[str] = set()
    self_kills = timed_kills = cleaned = 0
    for point in range(KILL_POINTS):
        writers = []
        for w in range(1 if point % 3 else 2):  # every third point: two writers at once
            kill_after = rng.randint(1, 120) if (point + w) % 2 else 0
            ours, theirs = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=write_until_killed,
                args=(str(directory), rng.randrange(2**31), theirs, kill_after),
            )
            proc.start()
            theirs.close()
            writers.append((proc, ours, kill_after))
        deadline = time.monotonic() + rng.uniform(0.02, 0.3)
        for proc, conn, kill_after in writers:
            while proc.is_alive() and (kill_after or time.monotonic() < deadline):
                _collect(conn, published)
                proc.join(0.01)
                if kill_after and time.monotonic() > deadline + 5:
                    break  # its step count was never reached: kill it from here
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                timed_kills += 1
            proc.join()
            _collect(conn, published)
            conn.close()
            if proc.exitcode == -signal.SIGKILL and kill_after:
                self_kills += 1
            assert proc.exitcode in (-signal.SIGKILL, 0), proc.exitcode
        cleaned += _check_directory(directory, published, verified)
    assert self_kills + timed_kills >= 50, (self_kills, timed_kills)
    assert self_kills >= 15 and timed_kills >= 15, (self_kills, timed_kills)
    assert len(published) >= 20 and len(verified) >= 100, (len(published), len(verified))
    assert cleaned > 0, "no kill ever landed mid-write: the kill points are not random enough"


def test_two_writer_processes_keep_the_namespace_within_capacity(tmp_path: Path) -> None:
    """Two processes with the same `capacity_pages` offload overlapping chains into one
    directory at once (evicting each other's pages): the namespace never ends above the
    limit, and every page left reads back byte-exact."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "crash_writer"])
    directory = tmp_path / "store"
    FileStore(directory).close()
    capacity = 30
    published: list[list[str]] = []
    writers = []
    for seed in (1, 2):
        ours, theirs = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=write_until_killed,
            args=(str(directory), seed, theirs, 0),
            kwargs={"capacity_pages": capacity, "rounds": 40},
        )
        proc.start()
        theirs.close()
        writers.append((proc, ours))
    for proc, conn in writers:
        deadline = time.monotonic() + 300
        while proc.is_alive() and time.monotonic() < deadline:
            _collect(conn, published)
            proc.join(0.05)
        _collect(conn, published)
        conn.close()
        assert proc.exitcode == 0, f"a writer failed or hung: exit code {proc.exitcode}"
    assert len(published) >= 40  # both wrote (a chain longer than the limit is refused)
    pages = [n for n in os.listdir(directory / "default" / "kv") if not n.startswith(".")]
    assert 0 < len(pages) <= capacity, f"{len(pages)} pages in a namespace capped at {capacity}"
    _check_directory(directory, [], set())  # every page left is whole and exact
