"""The quarantine: what a misbehaving store may still touch, held until its job has ended.

The rule (``docs/contract.md``, "Stores can lie"): slots a store may still write (a load)
or read (an offload) are never freed or reused until that store's own job for them has
ended, whatever the store says about counts. The trusted end signals are the store's own
completion for that batch or offload, popped and well-formed, and a `reset` / `close` of
the store that returned. When the store breaks the protocol instead (a completion count
it cannot back, a malformed completion, a completion naming a batch that is not the
oldest in flight, a lost reply), the linker ends the request's part at once — the load
aborts and the request recomputes, the offload publishes nothing — and hands what the
store may still touch to the quarantine:

- a load's reserved slots (FULL and SWA, still mapped) with the batch id whose own
  well-formed completion releases them, or None when only a reset or close can (the
  store never acknowledged a batch holding them, or its completion for that batch did
  not name them);
- offloads whose completion can no longer be told apart from the next one's (an offload
  completion carries no id): their nodes stay locked and offloading. Each later
  well-formed offload completion releases the oldest of them, failed (completions are
  in order: whatever completed, this one is done); while any is held, new offloads join
  them, so that no verdict is ever taken for the wrong offload.

Slot conservation has a fourth term: free ⊎ tree-owned ⊎ load-reserved ⊎ quarantined =
capacity (`serving.invariants.slot_conservation`). The linker owns this record; it is
plain data (the linker frees and unlocks on release). Read it through
`ExternalLinker.quarantined_slots()` and the counts here.
"""

from __future__ import annotations

from collections import deque

import attrs
import torch

from unicache_fsm.linker.load import ExternalLoad
from unicache_fsm.linker.offload import PendingOffload
from unicache_fsm.pools.transfer import PoolName

__all__ = ["Quarantine"]


@attrs.define(slots=True, eq=False)
class Quarantine:
    """Held loads (by the batch id that releases them) and held offloads (oldest first).

    `loads` and `offloads` are the linker's to change; readers use the methods.
    """

    loads: list[tuple[int | None, ExternalLoad]] = attrs.field(factory=list)
    # None: a placeholder for this rank's own offload the group refused (its completion
    # is consumed like the others', and releases nothing)
    offloads: deque[PendingOffload | None] = attrs.field(factory=deque)

    def hold_load(self, load: ExternalLoad, batch: int | None) -> None:
        """Hold `load`'s reserved slots until `batch`'s own completion (None: a reset)."""
        self.loads.append((batch, load))

    def take_batch(self, batch: int) -> list[ExternalLoad]:
        """Remove and return the loads held for `batch` (its own completion came)."""
        taken = [ld for b, ld in self.loads if b == batch]
        if taken:
            self.loads = [(b, ld) for b, ld in self.loads if b != batch]
        return taken

    def slots(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(FULL, SWA) slots held: neither free, nor the tree's, nor any live load's."""
        full: list[torch.Tensor] = []
        swa: list[torch.Tensor] = []
        for _, load in self.loads:
            for t in load.transfers:
                assert t.device_indices is not None
                (swa if t.name is PoolName.SWA else full).append(t.device_indices)
        return full, swa

    def num_slots(self) -> int:
        """How many FULL (KV) slots are held."""
        return sum(int(t.numel()) for t in self.slots()[0])

    def __len__(self) -> int:
        """Loads and offloads held."""
        return len(self.loads) + sum(r is not None for r in self.offloads)
