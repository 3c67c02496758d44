"""One offload of a chain of tree nodes: the record that the `offload` machine drives.

- ``submit`` — `store_accepted` (guard) says whether the store queued the transfers;
  if not, the offload fails at once and `release_nodes` rolls the nodes back.
- ``complete`` — `succeeded` (guard) is the verdict agreed across ranks (MIN):
  published (nodes stored) or failed (nodes unstored, eligible again); either way
  `release_nodes` finishes the tree's ticket, which releases its lock exactly once.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs

from unicache_fsm.pools.transfer import PoolTransfer
from unicache_fsm.tree.offload import OffloadTicket

if TYPE_CHECKING:
    from unicache_fsm.linker.linker import ExternalLinker

__all__ = ["OffloadTrigger", "PendingOffload"]


class OffloadTrigger(str, enum.Enum):
    SUBMIT = "submit"
    COMPLETE = "complete"


@attrs.define(slots=True, eq=False, repr=False)
class PendingOffload:
    id: int
    linker: ExternalLinker
    ticket: OffloadTicket
    transfers: list[PoolTransfer]
    state: str = ""
    accepted: bool = False
    success: bool = False

    @property
    def fsm_id(self) -> str:
        return f"offload-{self.id}"

    def __repr__(self) -> str:
        nodes = [n.id for n in self.ticket.publish]
        return f"PendingOffload(id={self.id}, state={self.state!r}, nodes={nodes})"

    def store_accepted(self) -> bool:
        return self.accepted

    def succeeded(self) -> bool:
        return self.success

    def release_nodes(self) -> None:
        self.linker._finish_offload(self)
