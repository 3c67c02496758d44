"""A store's answers, checked: every call the linker makes, with each fault contained.

The linker talks to its store only through a `CheckedStore`. Any exception from a call
(not only `StoreFaultError`: a `ConnectionError`, a `KeyError`, a closed store's
`StoreClosedError`, ...) and any answer the protocol does not allow is a *fault of that
call*: it is reported to `on_fault(operation, error)` — a `StoreProtocolError` naming
the call and the value for a malformed answer, the exception itself otherwise — and
the call answers what a refusal would. Nothing is raised at the caller.

Primitives (the protocol's, in call order, each with its answer on a fault):

- `lookup(rid, transfers, num_pages) -> list[int] | None` — the restorable boundaries
  inside ``1..num_pages``; None on a fault (an exception, or not a list of ints).
  Boundaries outside ``1..num_pages`` are dropped (reported as a protocol error), so
  every rank treats them as not restorable.
- `load(rid, transfers) -> bool` — True only for a real ``True``.
- `start_loading() -> int | None` — the batch id (>= 0) or -1; None on a fault (the
  caller cannot tell whether anything started).
- `num_completed_loads() -> int | None` — a count >= 0; None on a fault.
- `pop_completed_load() -> LoadBatchResult | None` — a result with an int batch, a
  tuple of str rids and a real bool verdict; None on a fault (the store may or may not
  have consumed a completion: the caller cannot tell which batch, if any, ended).
- `loaded_layers(batch, num_layers, previous=None) -> dict[PoolName, int] | None` —
  the store's per-layer progress of a started batch, checked: a mapping of attached
  pools (`num_layers`: each pool's layer count) to ints in ``0..num_layers[pool]``, no
  pool below its count in `previous` (the last checked answer for the batch; a pool
  missing from the answer counts 0). None on a fault (an exception, a non-int, a count
  over the pool's layers, a decrease): the caller keeps what it knew and trusts no
  layer beyond it.
- `cancel_queued_load(rid) -> bool | None` — the store's bool; None on a fault (the
  store may still hold the load).
- `offload(transfers) -> bool | None` — the store's bool; False when the store raised
  its own error (a conforming store's call that raises changed nothing); None when the
  reply was lost (`LOST_REPLY`: a timeout or a broken connection) or is not a bool:
  the store may have queued the offload and read its slots later.
- `num_completed_offloads() -> int | None`, `pop_completed_offload() -> bool | None` —
  as for loads: None on a fault (which offload, if any, completed is unknown).

A count is checked for its type only: how many completions can be in flight is the
caller's to know. `bounded(operation, count, limit)` caps a count at that (the rest is
a fault), and `drain(count, pop, limit)` empties the store's completions after a reset
in bounded time and returns what it popped (a store that undercounts leaves some
behind: the caller owes them still).
- `progress() -> int | None` — the jobs it saw finish; None on a fault.
- `reset() -> bool` — False when the store's reset raised.

Only `Exception` is contained; `KeyboardInterrupt` and `SystemExit` pass through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.errors import StoreProtocolError
from unicache_fsm.store.protocol import ExternalStore, LoadBatchResult

__all__ = ["CheckedStore", "FaultHandler"]

_T = TypeVar("_T")

#: ``on_fault(operation, error)``: called once per faulty call.
FaultHandler = Callable[[str, BaseException], None]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _all_ints(values: list[object] | tuple[object, ...]) -> bool:
    """`_is_int` of every value: plain ints in one C-level pass, else one by one."""
    return set(map(type, values)) <= _INT or all(_is_int(v) for v in values)


_INT = frozenset({int})

#: exceptions that lose a reply rather than carry the store's own error: the call may
#: have done its work
LOST_REPLY = (TimeoutError, ConnectionError)

#: how often `drain` asks again for a completion count the store failed to give
DRAIN_ASKS = 32


class CheckedStore:
    """`store` with every answer checked and every fault reported; see the module docstring."""

    __slots__ = ("on_fault", "store")

    def __init__(self, store: ExternalStore, on_fault: FaultHandler) -> None:
        self.store = store
        self.on_fault = on_fault

    def _protocol(self, operation: str, value: object, expected: str) -> None:
        msg = f"{operation}: the store answered {value!r}; the protocol expects {expected}"
        self.on_fault(operation, StoreProtocolError(msg, operation=operation, value=value))

    # -- loads -----------------------------------------------------------------------------
    def lookup(
        self, rid: str, transfers: Sequence[PoolTransfer], num_pages: int
    ) -> list[int] | None:
        try:
            found: object = self.store.lookup(rid, transfers)
        except Exception as exc:
            self.on_fault("lookup", exc)
            return None
        if not isinstance(found, (list, tuple)) or not _all_ints(found):
            self._protocol("lookup", found, "a list of int page counts")
            return None
        inside = [b for b in found if 1 <= b <= num_pages]
        if len(inside) != len(found):
            self._protocol("lookup", found, f"boundaries inside 1..{num_pages}")
        return inside

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        try:
            queued: object = self.store.load(rid, transfers)
        except Exception as exc:
            self.on_fault("load", exc)
            return False
        if not isinstance(queued, bool):
            self._protocol("load", queued, "a bool")
            return False
        return queued

    def start_loading(self) -> int | None:
        try:
            batch: object = self.store.start_loading()
        except Exception as exc:
            self.on_fault("start_loading", exc)
            return None
        if not _is_int(batch) or batch < -1:  # type: ignore[operator]
            self._protocol("start_loading", batch, "a batch id >= 0, or -1")
            return None
        assert isinstance(batch, int)
        return batch

    def num_completed_loads(self) -> int | None:
        return self._count("num_completed_loads", self.store.num_completed_loads)

    def pop_completed_load(self) -> LoadBatchResult | None:
        try:
            result: object = self.store.pop_completed_load()
        except Exception as exc:
            self.on_fault("pop_completed_load", exc)
            return None
        if (
            not isinstance(result, LoadBatchResult)
            or not _is_int(result.batch)
            or not isinstance(result.success, bool)
            or not isinstance(result.rids, (tuple, list))
            or not all(isinstance(rid, str) for rid in result.rids)
        ):
            self._protocol(
                "pop_completed_load",
                result,
                "a LoadBatchResult with an int batch, a tuple of str rids and a bool",
            )
            return None
        rids: object = result.rids
        if isinstance(rids, list):  # a list where the protocol says tuple: the same rids
            return LoadBatchResult(result.batch, tuple(rids), result.success)
        return result

    def loaded_layers(
        self,
        batch: int,
        num_layers: Mapping[PoolName, int],
        previous: Mapping[PoolName, int] | None = None,
    ) -> dict[PoolName, int] | None:
        try:
            counts: object = self.store.loaded_layers(batch)
        except Exception as exc:
            self.on_fault("loaded_layers", exc)
            return None
        expected = f"a dict of attached pools to layer counts within {dict(num_layers)}"
        # read as a plain dict (a subclass's own items() is not run) of plain ints
        pairs = list(dict.items(counts)) if isinstance(counts, dict) else None
        if pairs is None or not all(
            isinstance(pool, PoolName)
            and type(n) is int
            and pool in num_layers
            and 0 <= n <= num_layers[pool]
            for pool, n in pairs
        ):
            self._protocol("loaded_layers", counts, expected)
            return None
        checked: dict[PoolName, int] = dict(pairs)
        before = previous or {}
        if any(checked.get(pool, 0) < n for pool, n in before.items()):
            self._protocol("loaded_layers", counts, f"no count below the last answer {before}")
            return None
        return checked

    def cancel_queued_load(self, rid: str) -> bool | None:
        try:
            cancelled: object = self.store.cancel_queued_load(rid)
        except Exception as exc:
            self.on_fault("cancel_queued_load", exc)
            return None
        if not isinstance(cancelled, bool):
            self._protocol("cancel_queued_load", cancelled, "a bool")
            return None
        return cancelled

    # -- offloads --------------------------------------------------------------------------
    def offload(self, transfers: Sequence[PoolTransfer]) -> bool | None:
        try:
            queued: object = self.store.offload(transfers)
        except LOST_REPLY as exc:  # the reply, not the store, failed: it may be queued
            self.on_fault("offload", exc)
            return None
        except Exception as exc:  # the store's own error: it changed nothing
            self.on_fault("offload", exc)
            return False
        if not isinstance(queued, bool):
            self._protocol("offload", queued, "a bool")
            return None
        return queued

    def num_completed_offloads(self) -> int | None:
        return self._count("num_completed_offloads", self.store.num_completed_offloads)

    def pop_completed_offload(self) -> bool | None:
        try:
            success: object = self.store.pop_completed_offload()
        except Exception as exc:
            self.on_fault("pop_completed_offload", exc)
            return None
        if not isinstance(success, bool):
            self._protocol("pop_completed_offload", success, "a bool")
            return None
        return success

    # -- lifecycle -------------------------------------------------------------------------
    def progress(self) -> int | None:
        return self._count("progress", self.store.progress)

    def reset(self) -> bool:
        try:
            self.store.reset()
        except Exception as exc:
            self.on_fault("reset", exc)
            return False
        return True

    # -- completion counts a caller can trust --------------------------------------------
    def bounded(self, operation: str, count: int | None, limit: int) -> int:
        """A checked completion `count` (None: a fault, 0) capped at `limit`, what the
        caller knows can be in flight; a count above it is a fault of `operation`."""
        if count is None:
            return 0
        if count > limit:
            msg = (
                f"{operation}: the store reports {count} completions, but at most {limit} "
                "can be in flight; the rest are not backed by any job"
            )
            self.on_fault(operation, StoreProtocolError(msg, operation=operation, value=count))
            return limit
        return count

    def drain(self, count: Callable[[], int | None], pop: Callable[[], _T], limit: int) -> list[_T]:
        """Pop what the store still holds after a reset: at most `limit` pops and
        `DRAIN_ASKS` counts asked, whatever it reports (more is a fault of reset).
        Returns the answers popped, faulty ones (None) included."""
        popped: list[_T] = []
        for _ in range(DRAIN_ASKS):
            n = count()
            if n is None:
                continue
            if n == 0 or len(popped) >= limit:
                break
            n = self.bounded("reset", len(popped) + n, limit) - len(popped)
            popped.extend(pop() for _ in range(n))  # consumed, whatever it answers
        return popped

    def _count(self, operation: str, call: Callable[[], int]) -> int | None:
        try:
            count: object = call()
        except Exception as exc:
            self.on_fault(operation, exc)
            return None
        if not _is_int(count) or count < 0:  # type: ignore[operator]
            self._protocol(operation, count, "an int >= 0")
            return None
        assert isinstance(count, int)
        return count
