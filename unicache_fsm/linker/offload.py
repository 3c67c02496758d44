"""One offload of a chain of tree nodes: the record that the `offload` machine drives.

A `PendingOffload` is plain data; the linker is the handler its executor calls
(``linker.name(record, *args)``), see ``specs/offload.toml``:

- ``submit(accepted)`` — `store_accepted` passes a real ``True`` (the store's answer,
  agreed across ranks): pending. Otherwise the offload fails at once and
  `roll_back_nodes` finishes the tree's ticket as failed (nodes unstored, lock released).
- ``complete(success)`` — the verdict agreed across ranks (MIN): `publish_nodes`
  (nodes stored) or `roll_back_nodes` (nodes unstored, eligible again); either way the
  tree's ticket releases its lock exactly once.
"""

from __future__ import annotations

import attrs

from unicache_fsm.pools.transfer import PoolTransfer
from unicache_fsm.spec_enums import OffloadState, OffloadTrigger
from unicache_fsm.tree.offload import OffloadTicket

__all__ = ["OffloadState", "OffloadTrigger", "PendingOffload"]


@attrs.define(slots=True, eq=False, repr=False)
class PendingOffload:
    """A chain's offload: its tree ticket and the transfers handed to the store.

    `chain_pages` counts the KV pages of the chain itself (the KV transfer may start
    with the stored parent's last page, which links the chain in the store).
    """

    id: int
    ticket: OffloadTicket
    transfers: list[PoolTransfer]
    chain_pages: int = 0
    state: str = ""

    @property
    def fsm_id(self) -> str:
        return f"offload-{self.id}"

    def __repr__(self) -> str:
        nodes = [n.id for n in self.ticket.publish]
        return f"PendingOffload(id={self.id}, state={self.state!r}, nodes={nodes})"
