"""What the store owes the machine: the jobs it accepted, and the checks of every
completion it reports.

- `PendingOffload`, `PendingLoad` — an accepted offload awaiting its flag; an accepted
  load awaiting its batch's result (``clean``: a lossless store must land it).
- `Completions` — the pending work, FIFO: offloads; loads queued, started (by batch) or
  queued at a reset (orphans, owed a failed result); rids done or refused; each
  batch's last per-layer progress. Its checks: `started` (a batch id from
  `start_loading()`), `settle_batch` (a popped batch result: form, FIFO order, its rids,
  its bytes, its layers), `check_layers` (`loaded_layers(batch)`: form, monotonic,
  every layer it reports landed in the slots), `check_offload_count` /
  `check_load_count` (never more completions recorded than jobs pending; none lost).
- `check_bool(what, value)` — a protocol answer that must be a bool.
- `pop_promised(what, k, count, pop)` — the k-th of the `count` pops a count promised.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TypeVar

import attrs

from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.errors import NoCompletionError
from unicache_fsm.store.protocol import ExternalStore, LoadBatchResult
from unicache_fsm.testing.store_machine.devices import Devices, Ident, Part

T = TypeVar("T")


@attrs.define(eq=False)
class PendingOffload:
    """An accepted offload awaiting its flag; `evicted`: pages the test evicted meanwhile."""

    number: int
    parts: tuple[Part, ...]
    idents: frozenset[Ident]
    evicted: set[Ident] = attrs.field(factory=set)
    ran: bool = False  # a progress() came since: the store has performed it (or failed it)
    reset: bool = False  # a reset() may fail it


@attrs.define(eq=False)
class PendingLoad:
    """An accepted load; `clean`: a lossless store must land it (its pages were stored by
    a successful offload and nothing evicted, corrupted, reset or broke them since)."""

    rid: str
    parts: tuple[Part, ...]
    idents: frozenset[Ident]
    clean: bool


def check_bool(what: str, value: object) -> None:
    """`what` (a protocol call) answered `value`, which must be a bool."""
    assert isinstance(value, bool), f"{what} returned {value!r}; expected a bool"


def pop_promised(what: str, k: int, count: int, pop: Callable[[], T]) -> T:
    """The `k`-th of `count` pops the store's count promised (`what`: load or offload)."""
    try:
        return pop()
    except NoCompletionError as exc:
        msg = (
            f"num_completed_{what}s() said {count}, but pop number {k + 1} found no "
            f"completion ({exc}): a count the store cannot back with a completion"
        )
        raise AssertionError(msg) from exc


class Completions:
    """The jobs the store accepted and owes a completion for (see the module docstring)."""

    def __init__(self) -> None:
        self.offloads: collections.deque[PendingOffload] = collections.deque()
        self.queued: dict[str, PendingLoad] = {}
        self.started: dict[int, list[PendingLoad]] = {}  # start order
        self.orphans: dict[str, PendingLoad] = {}  # queued at a reset: a failed result is due
        self.done: set[str] = set()  # rids whose result was popped, or cancelled
        self.refused: set[str] = set()  # rids of tickets the store never accepted
        self.layers_seen: dict[int, dict[PoolName, int]] = {}  # batch -> last progress

    def pending_loads(self) -> list[PendingLoad]:
        """Every load queued or started, not yet settled."""
        started = [load for batch in self.started.values() for load in batch]
        return [*self.queued.values(), *started]

    def disturb(self, idents: set[Ident]) -> None:
        """Something happened to `idents`: no pending load naming one is clean any more."""
        for load in self.pending_loads():
            if load.idents & idents:
                load.clean = False

    def evicted(self, idents: set[Ident]) -> set[Ident]:
        """The test evicted `idents`: no pending offload's success covers them, no load
        naming one is clean. Returns those a pending offload that has not run yet names
        (they may still land)."""
        pending = {ident for rec in self.offloads if not rec.ran for ident in rec.idents}
        for record in self.offloads:
            record.evicted |= idents & record.idents  # its success will not cover them
        self.disturb(idents)
        return pending

    # -- checks of the store's answers ---------------------------------------------------

    def started_batch(self, batch: object, devices: Devices, store: ExternalStore) -> None:
        """`start_loading()` answered `batch`: -1 with nothing queued, else a fresh batch id
        that now holds every queued load (its per-layer progress checked at once)."""
        assert isinstance(batch, int) and not isinstance(batch, bool), (
            f"start_loading() returned {batch!r}; expected an int batch id (or -1)"
        )
        if not self.queued:
            assert batch == -1, f"start_loading() returned {batch} with no load queued: want -1"
            return
        rids = tuple(self.queued)
        assert batch >= 0, (
            f"start_loading() returned {batch} with loads {rids} queued; expected a batch id"
        )
        assert batch not in self.started, (
            f"start_loading() returned batch id {batch}, which an earlier batch still uses"
        )
        self.started[batch] = list(self.queued.values())
        self.queued.clear()
        self.check_layers(batch, self.started[batch], devices, store, full=False)

    def settle_batch(
        self, result: object, devices: Devices, store: ExternalStore, *, lossless: bool
    ) -> None:
        """A batch result the store popped: its form, its order (FIFO), its rids, the
        bytes of a success, the layers it reports; then its loads are done, their slots
        given back."""
        assert (
            isinstance(result, LoadBatchResult)
            and isinstance(result.batch, int)
            and not isinstance(result.batch, bool)
            and isinstance(result.rids, tuple)
            and all(isinstance(rid, str) for rid in result.rids)
        ), (
            f"pop_completed_load() returned {result!r}; expected a LoadBatchResult with an "
            "int batch id and a tuple of the batch's rids (str)"
        )
        batch, rids, success = result.batch, tuple(result.rids), result.success
        check_bool(f"the success of load batch {batch}", success)
        assert len(set(rids)) == len(rids), f"load batch {batch} lists a rid twice: {rids}"
        if batch in self.started:
            oldest = next(iter(self.started))
            assert batch == oldest, (
                f"load batch {batch} completed before batch {oldest}, which started first; "
                "load results are FIFO"
            )
            loads = self.started.pop(batch)
            expected = tuple(load.rid for load in loads)
            assert sorted(rids) == sorted(expected), (
                f"load batch {batch} reports rids {rids}, but the batch holds {expected}"
            )
            started = True
        else:
            stray = [rid for rid in rids if rid not in self.orphans]
            assert rids and not stray, (
                f"pop_completed_load() returned batch {batch} with rids {rids}: no such "
                f"batch is awaiting its result, and {stray or 'no rid'} was queued at a reset"
            )
            assert not success, (
                f"load batch {batch} (loads {rids}, queued when reset() came) reported "
                "success; reset() must fail every queued load"
            )
            loads = [self.orphans.pop(rid) for rid in rids]
            started = False
        if success:
            for load in loads:
                for part in load.parts:
                    wrong = devices.wrong_page(part)
                    assert wrong is None, (
                        f"load batch {batch} reported success, but load {load.rid!r} "
                        f"{part.pool.value} page {wrong}"
                    )
        else:
            assert not (lossless and all(load.clean for load in loads)), (
                f"load batch {batch} ({rids}) failed, but every page of it was stored by a "
                "successful offload and nothing evicted, corrupted or reset it since; the "
                "store is lossless"
            )
        if started:  # (a batch of loads queued at a reset was never started)
            self.check_layers(batch, loads, devices, store, full=success is True)
            self.layers_seen.pop(batch, None)
        for load in loads:
            self.done.add(load.rid)
            devices.free(load.parts, f"load {load.rid!r}'s destination, batch {batch} popped")

    def check_layers(
        self,
        batch: int,
        loads: list[PendingLoad],
        devices: Devices,
        store: ExternalStore,
        *,
        full: bool,
    ) -> None:
        """`loaded_layers(batch)`, checked: its form, monotonic, every layer it reports in
        the slots; with `full` (the batch succeeded), every layer of each of its pools."""
        counts: object = store.loaded_layers(batch)
        layers = devices.num_layers
        assert isinstance(counts, dict) and all(
            isinstance(pool, PoolName)
            and pool in devices.pools
            and isinstance(n, int)
            and not isinstance(n, bool)
            and 0 <= n <= layers
            for pool, n in counts.items()
        ), (
            f"loaded_layers({batch}) returned {counts!r}; expected a dict of attached pools "
            f"to layer counts in 0..{layers}"
        )
        seen = self.layers_seen.setdefault(batch, {})
        for pool, before in seen.items():
            assert counts.get(pool, 0) >= before, (
                f"loaded_layers({batch}) reports {counts.get(pool, 0)} {pool.value} layer(s) "
                f"after reporting {before}: progress never goes back"
            )
        seen.update(counts)
        for load in loads:
            for part in load.parts:
                landed = counts.get(part.pool, 0)
                if full:
                    assert landed == layers, (
                        f"load batch {batch} succeeded, but loaded_layers({batch}) reports "
                        f"{landed} of {layers} {part.pool.value} layer(s)"
                    )
                wrong = devices.wrong_layers(part, landed) if landed else None
                assert wrong is None, (
                    f"loaded_layers({batch}) reports {landed} {part.pool.value} layer(s) "
                    f"landed, but load {load.rid!r} {wrong}"
                )

    def check_offload_count(self, recorded: int) -> None:
        """`num_completed_offloads()` answered `recorded`: at most one a pending offload."""
        assert 0 <= recorded <= len(self.offloads), (
            f"num_completed_offloads() is {recorded}, but only {len(self.offloads)} "
            "accepted offload(s) await a flag: a completion was duplicated (or a refused "
            "offload completed)"
        )

    def check_load_count(self, when: str, recorded: int, *, exact: bool = False) -> None:
        """Recorded batch results vs. what awaits one: each started batch, plus the loads
        queued at a reset (reported in one or more failed batches); with `exact` (after
        `progress()` or `reset()`), none is lost either."""
        most = len(self.started) + len(self.orphans)
        least = len(self.started) + bool(self.orphans) if exact else 0
        assert least <= recorded <= most, (
            f"{when}: {recorded} load batch result(s) are recorded, but {len(self.started)} "
            f"started batch(es) and {len(self.orphans)} load(s) failed by a reset await "
            + (
                "theirs: a result was lost"
                if recorded < least
                else "theirs: a result was duplicated"
            )
        )
