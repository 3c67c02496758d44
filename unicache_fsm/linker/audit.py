"""What the linker holds, for audits and reports: reserved and quarantined slots, the
locks it owns, whether anything is in flight, and its counters.

`serving.invariants` reads these to check slot conservation (free ⊎ tree-owned ⊎
load-reserved ⊎ quarantined = capacity) and lock accounting; none of them changes state.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from unicache_fsm.linker.state import LinkerState
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.tree.node import TreeNode

__all__ = ["Audit"]


class Audit(LinkerState):
    """Read-only views of the linker's state (slots held outside the tree, locks, work
    in flight, counters).

    Contract: nothing here changes state; `reserved_slots` and `quarantined_slots` are
    the load-reserved and quarantined terms of slot conservation, `locks_held` anchors
    every lock the linker owns.
    """

    def reserved_slots(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(FULL, SWA) slots reserved by prepared loads: held outside the tree."""
        full: list[torch.Tensor] = []
        swa: list[torch.Tensor] = []
        for load in [*self.loads.values(), *self.draining]:
            for t in load.transfers:
                assert t.device_indices is not None
                (swa if t.name is PoolName.SWA else full).append(t.device_indices)
        return full, swa

    def quarantined_slots(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(FULL, SWA) slots in the quarantine: held outside the tree, neither free nor
        any live load's (the fourth term of slot conservation)."""
        return self.quarantine.slots()

    def locks_held(self) -> list[TreeNode]:
        """The node each of the linker's outstanding locks is anchored on (the
        quarantined offloads' included)."""
        held = [ld.anchor for ld in [*self.loads.values(), *self.draining] if ld.transfers]
        held += [
            rec.ticket.anchor
            for rec in [*self.offloads, *self.quarantine.offloads]
            if rec is not None
        ]
        return held

    def busy(self) -> bool:
        """Whether any load or offload is still in flight (prepared, or pending); what
        the quarantine holds is not: only the store's own signal releases it."""
        return bool(self.held or any(b.loads for b in self.batches) or self.offloads)

    def describe(self) -> dict[str, Any]:
        """The counters (`LinkerStats`) as a plain dict."""
        return attrs.asdict(self.stats)
