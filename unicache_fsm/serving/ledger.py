"""`StoreLedger`: what a store acknowledged, seen from between the linker and the store.

The invariant "no node claims KV that never landed" cannot be checked by asking the
store what it holds now: a store drops pages on its own (capacity, corruption, a test's
evictions), and a LOOKUP that demotes the tree's stale "stored" flags would hide a
linker that published what the store never took. The ledger wraps the store the linker
talks to and records, per pool, every page key the store *acknowledged*:

- an offload whose completion popped as a real ``True`` (completions are FIFO over the
  offloads `offload` accepted with a real ``True``);
- the pages of a load batch whose completion popped as a real ``True`` (the store read
  them: they were there).

A pop that raises or answers anything else consumed its completion and acknowledged
nothing (the protocol's rule, which `FaultyStore` follows). Every other call is
forwarded as is. `landed(pool, key)` answers whether the store ever acknowledged it;
`landed_loads` counts, per rid, the successful batch completions that named the load.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from itertools import chain, repeat

from unicache_fsm.pools.device import PageDevice
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.errors import NoCompletionError
from unicache_fsm.store.protocol import ExternalStore, LoadBatchResult

__all__ = ["StoreLedger"]

#: the page keys a call named, per pool: (pool, keys) pairs, kept as the call's own
#: tuples and expanded into `acknowledged` only when the store acknowledges them
_Keys = tuple[tuple[PoolName, tuple[str, ...]], ...]


def _keys(transfers: Sequence[PoolTransfer]) -> _Keys:
    return tuple((t.name, tuple(t.keys)) for t in transfers)  # (a tuple stays itself)


class StoreLedger:
    """An `ExternalStore` that forwards to `inner` and records what it acknowledged."""

    def __init__(self, inner: ExternalStore) -> None:
        self.inner = inner
        self.acknowledged: set[tuple[PoolName, str]] = set()
        # loads (by rid) that a successful batch completion named, and how often
        self.landed_loads: Counter[str] = Counter()
        self._offloads: deque[_Keys] = deque()
        self._queued: dict[str, _Keys] = {}
        self._batches: dict[int, _Keys] = {}

    def __repr__(self) -> str:
        return f"StoreLedger({self.inner!r})"

    def landed(self, pool: PoolName, key: str) -> bool:
        """Whether the store ever acknowledged holding page `key` of `pool`."""
        return (pool, key) in self.acknowledged

    # -- recorded --------------------------------------------------------------------------
    def offload(self, transfers: Sequence[PoolTransfer]) -> bool:
        accepted = self.inner.offload(transfers)
        if accepted is True:
            self._offloads.append(_keys(transfers))
        return accepted

    def _acknowledge(self, keys: _Keys) -> None:
        for pool, named in keys:
            self.acknowledged.update(zip(repeat(pool), named))

    def pop_completed_offload(self) -> bool:
        keys: _Keys = self._offloads.popleft() if self._offloads else ()
        try:
            success = self.inner.pop_completed_offload()
        except NoCompletionError:
            self._offloads.appendleft(keys)  # nothing was consumed
            raise
        # (any other exception: consumed, the answer lost, nothing acknowledged)
        if success is True:
            self._acknowledge(keys)
        return success

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        accepted = self.inner.load(rid, transfers)
        if accepted is True:
            self._queued[rid] = _keys(transfers)
        return accepted

    def cancel_queued_load(self, rid: str) -> bool:
        cancelled = self.inner.cancel_queued_load(rid)
        if cancelled is True:
            self._queued.pop(rid, None)
        return cancelled

    def start_loading(self) -> int:
        batch = self.inner.start_loading()
        if isinstance(batch, int) and batch >= 0:
            self._batches[batch] = tuple(chain.from_iterable(self._queued.values()))
            self._queued.clear()
        return batch

    def pop_completed_load(self) -> LoadBatchResult:
        result = self.inner.pop_completed_load()
        if isinstance(result, LoadBatchResult):
            keys = self._batches.pop(result.batch, ())
            if result.success is True:
                self._acknowledge(keys)
                self.landed_loads.update(result.rids)
        return result

    def reset(self) -> None:
        self.inner.reset()
        self._queued.clear()  # they complete failed (under batch ids of the store's own)

    # -- forwarded -------------------------------------------------------------------------
    def attach(self, pools: Mapping[PoolName, PageDevice]) -> None:
        self.inner.attach(pools)

    def lookup(self, rid: str, transfers: Sequence[PoolTransfer]) -> list[int]:
        return self.inner.lookup(rid, transfers)

    def loaded_layers(self, batch: int) -> dict[PoolName, int]:
        return self.inner.loaded_layers(batch)

    def num_completed_loads(self) -> int:
        return self.inner.num_completed_loads()

    def num_completed_offloads(self) -> int:
        return self.inner.num_completed_offloads()

    def progress(self) -> int:
        return self.inner.progress()

    def evict(self, keys: Sequence[str], pool: PoolName | None = None) -> int:
        return self.inner.evict(keys, pool)

    def contains(self, pool: PoolName, key: str) -> bool:
        return self.inner.contains(pool, key)

    def close(self) -> None:
        self.inner.close()
