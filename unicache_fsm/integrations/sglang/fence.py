"""Slots of SGLang's pools that a misbehaving store may still touch: never handed to it
again until its own job for them ended.

The gate of `buffers.LayerBuffers` keeps a store's late move out of slots SGLang took
back. The fence keeps the store's *old* job out of slots a *new* job of the same store
holds: a later load or offload whose slots meet a fenced slot is refused (SGLang
recomputes), since a page opened for the new job would be open for the old one too.

- `hold(key, rows)` — a load batch's rows, released by `release(key)` when the store's
  own completion of batch `key` is popped (``key`` None: only a reset or close of the
  store that returned releases them, `clear`).
- `owed` — offloads whose completion can no longer be told from the next one's (offload
  completions carry no id), oldest first: each later well-formed offload completion
  releases the oldest.
- `touches(transfers)` — whether any transfer's slots meet a held row of its pool.

Rows are ``(PoolName, slots)`` pairs: SGLang's slot ids, per pool.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from unicache_fsm.pools.transfer import PoolName, PoolTransfer

__all__ = ["Fence", "Release", "Rows", "rows_of"]

#: one job's slots, per pool
Rows = list[tuple[PoolName, torch.Tensor]]

#: a load batch's key: the store batch id whose own completion releases it (None: only
#: a reset or close of the store that returned)
Release = int | None


def rows_of(transfers: Sequence[PoolTransfer]) -> Rows:
    """The slots of `transfers`, per pool (LOOKUP transfers have none)."""
    return [(t.name, t.device_indices) for t in transfers if t.device_indices is not None]


class Fence:
    """Rows a misbehaving store may still touch (module docstring)."""

    def __init__(self) -> None:
        self.loads: list[tuple[Release, Rows]] = []
        self.owed: deque[Rows] = deque()

    def hold(self, key: Release, rows: Rows) -> None:
        if rows:
            self.loads.append((key, rows))

    def release(self, key: int) -> bool:
        """Release the rows batch `key` held; whether it held any."""
        kept = [(k, rows) for k, rows in self.loads if k != key]
        released = len(kept) != len(self.loads)
        self.loads = kept
        return released

    def clear(self) -> None:
        self.loads.clear()
        self.owed.clear()

    def touches(self, transfers: Sequence[PoolTransfer]) -> bool:
        held: dict[PoolName, list[torch.Tensor]] = {}
        for rows in [*(r for _, r in self.loads), *self.owed]:
            for name, slots in rows:
                held.setdefault(name, []).append(slots)
        for t in transfers:
            fenced = held.get(t.name)
            idx = t.device_indices
            if fenced and idx is not None and bool(torch.isin(idx, torch.cat(fenced)).any()):
                return True
        return False

    def __len__(self) -> int:
        return len(self.loads) + len(self.owed)
