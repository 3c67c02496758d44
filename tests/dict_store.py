"""A store written from scratch, for the kit's own tests (it was the first example).

`DictStore` is a toy `ExternalStore`: page bytes in a plain dict, every job done in
`progress()`. It reuses the library's request validation (`AttachedPools`) and LOOKUP
rules (`restorable_prefix_pages`), so it is short and honest. `DictStoreMachine` is all
it takes to fuzz it: a `StoreMachine` subclass with `make_store`. `LeakyDictStore` has
a planted bug (after `evict`, lookup, load and contains still see the page), which the
kit catches.

Run: ``python tests/dict_store.py [--examples N] [--leaky]`` — exit 0 when the
store passes, 1 with the kit's report when it fails.
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Mapping, Sequence

import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from unicache_fsm.pools.device import PageDevice
from unicache_fsm.pools.transfer import LinkerTransferPhase, PoolName, PoolTransfer
from unicache_fsm.store.errors import NoCompletionError
from unicache_fsm.store.lookup import restorable_prefix_pages
from unicache_fsm.store.protocol import ExternalStore, LoadBatchResult
from unicache_fsm.store.requests import AttachedPools, CheckedTransfer
from unicache_fsm.testing.store_machine import StoreMachine

Job = tuple[CheckedTransfer, ...]
LOAD, OFFLOAD = LinkerTransferPhase.LOAD, LinkerTransferPhase.OFFLOAD


class DictStore:
    """A synchronous `ExternalStore` over a dict of (pool, key) -> page bytes."""

    def __init__(self) -> None:
        self.pages: dict[tuple[PoolName, str], torch.Tensor] = {}
        self._pools = AttachedPools({})
        self._queued: dict[str, Job] = {}
        self._batches: collections.deque[tuple[int, dict[str, Job]]] = collections.deque()
        self._offloads: collections.deque[Job] = collections.deque()
        self._in_flight: set[str] = set()  # started, result not yet popped
        self._load_results: collections.deque[LoadBatchResult] = collections.deque()
        self._offload_results: collections.deque[bool] = collections.deque()
        self._next_batch = 0
        self._layers: dict[int, dict[PoolName, int]] = {}  # batch -> layers landed

    def attach(self, pools: Mapping[PoolName, PageDevice]) -> None:
        self._pools = AttachedPools(pools)

    def _present(self, pool: PoolName, keys: Sequence[str]) -> list[bool]:
        """What lookup, load and contains see as stored."""
        return [(pool, key) in self.pages for key in keys]

    def lookup(self, rid: str, transfers: Sequence[PoolTransfer]) -> list[int]:
        return restorable_prefix_pages(transfers, self._present)

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        job = self._pools.check_data_transfers(transfers, LOAD)
        if rid in self._queued or rid in self._in_flight:
            return False
        if not all(all(self._present(ct.pool, ct.keys)) for ct in job):
            return False
        self._queued[rid] = job
        return True

    def start_loading(self) -> int:
        if not self._queued:
            return -1
        batch, self._next_batch = self._next_batch, self._next_batch + 1
        self._batches.append((batch, dict(self._queued)))
        pools = {ct.pool for job in self._queued.values() for ct in job}
        self._layers[batch] = dict.fromkeys(pools, 0)
        self._in_flight.update(self._queued)
        self._queued.clear()
        return batch

    def loaded_layers(self, batch: int) -> dict[PoolName, int]:
        return dict(self._layers[batch])  # all at once: this store writes whole pages

    def num_completed_loads(self) -> int:
        return len(self._load_results)

    def pop_completed_load(self) -> LoadBatchResult:
        if not self._load_results:
            raise NoCompletionError("no load batch has completed", what="load")
        result = self._load_results.popleft()
        self._in_flight.difference_update(result.rids)
        return result

    def cancel_queued_load(self, rid: str) -> bool:
        return self._queued.pop(rid, None) is not None

    def offload(self, transfers: Sequence[PoolTransfer]) -> bool:
        self._offloads.append(self._pools.check_data_transfers(transfers, OFFLOAD))
        return True

    def num_completed_offloads(self) -> int:
        return len(self._offload_results)

    def pop_completed_offload(self) -> bool:
        if not self._offload_results:
            raise NoCompletionError("no offload has completed", what="offload")
        return self._offload_results.popleft()

    def progress(self) -> int:
        done = len(self._offloads) + len(self._batches)
        while self._offloads:  # offloads first: a queued load already had its pages
            for ct in self._offloads.popleft():
                kv = self._pools.pool(ct.pool, "offload")
                data = kv.read_page_ids(ct.pages).view(-1, kv.page_size, kv.num_layers, kv.width)
                for key, page in zip(ct.keys, data, strict=True):
                    self.pages.setdefault((ct.pool, key), page.clone())  # write-once
            self._offload_results.append(True)
        while self._batches:
            batch, loads = self._batches.popleft()
            landed = self._land(loads)
            if landed:
                for pool in self._layers[batch]:
                    self._layers[batch][pool] = self._pools.pool(pool, "load").num_layers
            self._load_results.append(LoadBatchResult(batch, tuple(loads), landed))
        return done

    def _land(self, loads: dict[str, Job]) -> bool:
        """Write every page of a batch, or nothing if one was evicted since it queued."""
        jobs = [ct for job in loads.values() for ct in job]
        if any((ct.pool, key) not in self.pages for ct in jobs for key in ct.keys):
            return False
        for ct in jobs:
            data = torch.cat([self.pages[(ct.pool, key)] for key in ct.keys])
            self._pools.pool(ct.pool, "load").write_page_ids(ct.pages, data)
        return True

    def evict(self, keys: Sequence[str], pool: PoolName | None = None) -> int:
        names = list(PoolName) if pool is None else [pool]
        return sum(self.pages.pop((p, k), None) is not None for p in names for k in keys)

    def contains(self, pool: PoolName, key: str) -> bool:
        return self._present(pool, [key])[0]

    def reset(self) -> None:
        while self._batches:
            batch, loads = self._batches.popleft()
            self._load_results.append(LoadBatchResult(batch, tuple(loads), False))
        self._offload_results.extend(False for _ in self._offloads)
        self._offloads.clear()
        if self.start_loading() >= 0:  # the queued loads, now a batch: fail it too
            self.reset()

    def close(self) -> None:  # a real store would also refuse every later call
        self.reset()
        self.pages.clear()


class LeakyDictStore(DictStore):
    """A planted bug: an index of stored pages that `evict` forgets to update, so
    lookup, load and contains still see a page whose bytes are gone."""

    def __init__(self) -> None:
        super().__init__()
        self.index: set[tuple[PoolName, str]] = set()

    def progress(self) -> int:
        done = super().progress()
        self.index.update(self.pages)
        return done

    def _present(self, pool: PoolName, keys: Sequence[str]) -> list[bool]:
        return [(pool, key) in self.index for key in keys]


class DictStoreMachine(StoreMachine):
    lossless = True  # nothing is ever dropped, refused or failed on its own

    def make_store(self) -> ExternalStore:
        return DictStore()


class LeakyDictStoreMachine(DictStoreMachine):
    def make_store(self) -> ExternalStore:
        return LeakyDictStore()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=50, help="programs to run")
    parser.add_argument("--leaky", action="store_true", help="fuzz the store with a bug")
    args = parser.parse_args(argv)
    machine = LeakyDictStoreMachine if args.leaky else DictStoreMachine
    bounded = settings(
        max_examples=args.examples, deadline=None, database=None, report_multiple_bugs=False
    )
    name = machine.__name__.removesuffix("Machine")
    try:
        run_state_machine_as_test(machine, settings=bounded)
    except AssertionError as exc:
        print(f"{name} FAILED: {str(exc).splitlines()[0]}")
        return 1
    print(f"{name} passed {args.examples} programs of up to 50 protocol calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
