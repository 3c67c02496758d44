"""One external load: the record that the `load_transaction` machine drives.

An `ExternalLoad` is plain data: created by LOOKUP (idle), it lives until it is
committed or aborted. It holds no reference to the linker; the linker is the handler
its executor calls (``linker.name(load, *args)``), so the machine decides *when* work
happens and the linker *how* (see ``specs/load_transaction.toml``):

- ``prepare`` — `reserve_slots` (before) re-checks the matched prefix against the
  tree, locks the anchor, LOADs every component and runs PREPARE (transactional: on
  failure it undoes its own work and raises, leaving the load idle);
  `queue_store_load` (after) hands the transfers to the store.
- ``start`` — the store acknowledged a started batch holding the load.
- ``land(verdict)`` — `landed_everywhere` passes only a real ``True`` verdict.
- ``commit`` — `publish` inserts the tail, keeps the adopted pages, frees the
  duplicates, marks the path stored and moves the anchor lock to the loaded path's
  end: the caller owns that lock on `endpoint` and releases it when the request is done.
- ``abort(reason)`` — per source: nothing to undo (idle); `withdraw_store_load` then
  `free_reservation` (queued; the withdrawal raises, and nothing changes, when the
  store does not confirm it gave the load back); `free_reservation` (after the batch
  ended). A `suspect` load's slots are quarantined instead of freed (the store broke
  the protocol about it and may still write them; `linker.quarantine`). Entering
  ``aborted`` runs `record_abort`, which keeps the reason.

Who may touch what: the linker owns every field; `state` is written only by the
executor.
"""

from __future__ import annotations

import enum

import attrs
import torch

from unicache_fsm.pools.transfer import PoolTransfer
from unicache_fsm.spec_enums import LoadState, LoadTrigger
from unicache_fsm.tree.components import LoadContext
from unicache_fsm.tree.node import TreeNode

__all__ = ["AbortReason", "ExternalLoad", "LoadState", "LoadTrigger"]


class AbortReason(str, enum.Enum):
    """Why a load ended aborted (the request then recomputes the tail)."""

    NO_SLOTS = "no_slots"  # LOAD could not reserve device slots
    STALE_PREFIX = "stale_prefix"  # the matched device prefix changed before LOAD
    STORE_REFUSED = "store_refused"  # the store did not queue the load (or the call failed)
    LOAD_FAILED = "load_failed"  # the batch verdict (MIN across ranks) was failure
    RELEASED = "released"  # the request went away before the load finished
    RESET = "reset"  # the linker was reset or closed
    PEER_ABORTED = "peer_aborted"  # this rank could prepare, another rank could not


#: The states in which the load holds reserved slots the store may write into.
IN_FLIGHT = frozenset({LoadState.QUEUED, LoadState.LOADING, LoadState.LANDED})


@attrs.define(slots=True, eq=False, repr=False)
class ExternalLoad:
    """A request's restorable tail and everything its load reserved."""

    rid: str
    key: tuple[int, ...]  # device prefix + restorable tail, in tokens
    namespace: str | None
    anchor: TreeNode  # the last device node of the match
    device_prefix: torch.Tensor  # the FULL slots of the matched device prefix
    tail_hashes: tuple[str, ...]
    state: str = ""
    transfers: list[PoolTransfer] = attrs.field(factory=list)
    ctx: LoadContext | None = None
    batch: int = -1
    seq: int = -1  # order of load_back (the same on every rank)
    awaited: bool = False  # load_back answered True: the caller waits for its end
    # None while this rank's store may still write into the slots; then True (every
    # page landed) or False (the store is done with it without landing it all)
    settled: bool | None = None
    abort_reason: AbortReason | None = None
    # why it aborts once every rank's store is done with it (released, refused while
    # the store may still hold it)
    abort_pending: AbortReason | None = None
    # the store broke the protocol about this load: its slots go to the linker's
    # quarantine when it ends (not freed), released by `held_for`'s own completion
    # (None: only by a reset or close of the store that returned)
    suspect: bool = False
    held_for: int | None = None
    # a `start_loading` whose answer was lost may have started it: a store that then
    # says nothing is queued is no proof that it writes nothing into its slots
    maybe_started: bool = False
    # a cancel whose answer was lost may have withdrawn it: a batch the store answers
    # later may hold nothing of it (nor ever complete, if its id was never started)
    maybe_withdrawn: bool = False
    endpoint: TreeNode | None = None
    committed: list[PoolTransfer] = attrs.field(factory=list)
    slots: torch.Tensor | None = None  # after commit: FULL slots of the whole key

    @property
    def fsm_id(self) -> str:
        return self.rid

    @property
    def in_flight(self) -> bool:
        """Reserved slots the store may still write into (prepared, not yet ended)."""
        return self.state in IN_FLIGHT

    @property
    def committed_ok(self) -> bool:
        return self.state == LoadState.COMMITTED

    @property
    def device_hit_len(self) -> int:
        return int(self.device_prefix.numel())

    @property
    def prefix_len(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return (
            f"ExternalLoad(rid={self.rid!r}, state={self.state!r}, "
            f"device_hit_len={self.device_hit_len}, prefix_len={self.prefix_len})"
        )
