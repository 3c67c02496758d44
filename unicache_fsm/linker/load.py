"""One external load: the record that the `load_transaction` machine drives.

An `ExternalLoad` is created by LOOKUP (idle) and lives until it is committed or
aborted. Its spec callbacks are thin methods that hand over to the linker, so the
machine decides *when* work happens and the linker *how*:

- `reserve_slots` (before ``prepare``) — lock the anchor, LOAD every component
  (allocating, evicting the shortfall), run PREPARE; transactional: on failure it
  undoes its own work and raises, leaving the load idle.
- `queue_store_load` (after ``prepare``) — hand the transfers to the store.
- `landed_everywhere` (guard of ``land``) — the batch verdict agreed across ranks.
- `publish` (before ``commit``) — insert the tail, keep the adopted pages, free the
  duplicates, mark the path stored, and move the anchor lock to the loaded path's end:
  the caller owns that lock on `endpoint` and releases it when the request is done.
- `release_reservation` (before ``abort``) — free exactly what was reserved, cancel a
  queued store load, release the anchor lock, publish nothing.

Who may touch what: the linker owns every field; `state` is written only by the
executor.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs
import torch

from unicache_fsm.pools.transfer import PoolTransfer
from unicache_fsm.tree.components import LoadContext
from unicache_fsm.tree.node import TreeNode

if TYPE_CHECKING:
    from unicache_fsm.linker.linker import ExternalLinker

__all__ = ["AbortReason", "ExternalLoad", "LoadState", "LoadTrigger"]


class LoadTrigger(str, enum.Enum):
    PREPARE = "prepare"
    START = "start"
    LAND = "land"
    COMMIT = "commit"
    ABORT = "abort"


class LoadState(str, enum.Enum):
    """The configurations of the `load_transaction` machine (what `ExternalLoad.state` holds)."""

    IDLE = "idle"
    QUEUED = "prepared.queued"
    LOADING = "prepared.loading"
    LANDED = "prepared.landed"
    COMMITTED = "committed"
    ABORTED = "aborted"


class AbortReason(str, enum.Enum):
    """Why a load ended aborted (the request then recomputes the tail)."""

    NO_SLOTS = "no_slots"  # LOAD could not reserve device slots
    STORE_REFUSED = "store_refused"  # the store did not queue the load
    LOAD_FAILED = "load_failed"  # the batch verdict (MIN across ranks) was failure
    RELEASED = "released"  # the request went away before the load finished
    RESET = "reset"  # the linker was reset or closed
    PEER_ABORTED = "peer_aborted"  # this rank could prepare, another rank could not


@attrs.define(slots=True, eq=False, repr=False)
class ExternalLoad:
    """A request's restorable tail and everything its load reserved."""

    rid: str
    linker: ExternalLinker
    key: tuple[int, ...]  # device prefix + restorable tail, in tokens
    namespace: str | None
    anchor: TreeNode  # the last device node of the match
    device_prefix: torch.Tensor  # the FULL slots of the matched device prefix
    tail_hashes: tuple[str, ...]
    state: str = ""
    transfers: list[PoolTransfer] = attrs.field(factory=list)
    ctx: LoadContext | None = None
    batch: int = -1
    verdict: bool = False
    abort_reason: AbortReason | None = None
    abort_pending: bool = False
    endpoint: TreeNode | None = None
    committed: list[PoolTransfer] = attrs.field(factory=list)
    slots: torch.Tensor | None = None  # after commit: FULL slots of the whole key

    @property
    def fsm_id(self) -> str:
        return self.rid

    @property
    def in_flight(self) -> bool:
        """Reserved slots the store may still write into (prepared, not yet ended)."""
        return self.state in (LoadState.QUEUED, LoadState.LOADING, LoadState.LANDED)

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

    # -- spec callbacks (see the module docstring) -----------------------------------
    def reserve_slots(self) -> None:
        self.linker._reserve(self)

    def queue_store_load(self) -> None:
        self.linker._queue(self)

    def landed_everywhere(self) -> bool:
        return self.verdict

    def publish(self) -> None:
        self.linker._publish(self)

    def release_reservation(self) -> None:
        self.linker._release(self)
