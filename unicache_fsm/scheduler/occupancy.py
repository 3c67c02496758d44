"""Who holds each pool's slots: free, the tree, loads, requests — and what leaked.

`pool_occupancy(tree, reserved, held)` counts, for every pool the tree uses (``FULL``,
``SWA`` when the tree has that component, ``host`` when it has a host tier), the
tokens that are free, owned by tree nodes, reserved by prepared loads (`reserved`,
per component) and held by live requests outside the tree (`held`, per component).
Whatever the pool's capacity leaves over is ``other`` (zero in a sound system).

`leaked_slots(tree, outside)` is exact rather than arithmetic: per pool, the tokens
of the pages the allocator has handed out that neither a tree node nor anything in
`outside` owns. A run that leaks nothing reports 0 for every pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import torch

from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.tree.audit import page_ids
from unicache_fsm.tree.tree import RadixTree

__all__ = ["Occupancy", "leaked_slots", "pool_occupancy"]

Slots = Mapping[ComponentType, Sequence[torch.Tensor]]


@attrs.frozen
class Occupancy:
    """One pool at one moment, in tokens (`other` is capacity minus the rest)."""

    capacity: int
    free: int
    tree: int
    loads: int
    requests: int

    @property
    def other(self) -> int:
        return self.capacity - self.free - self.tree - self.loads - self.requests


def _tokens(slots: Sequence[torch.Tensor]) -> int:
    return sum(int(s.numel()) for s in slots)


def _device_pools(tree: RadixTree) -> list[tuple[str, ComponentType, int, int]]:
    """(name, component, capacity, free) of every device pool the tree allocates from."""
    alloc = tree.allocator
    kinds = {c.component_type for c in tree.components}
    if isinstance(alloc, SWAAllocator):
        pools = [("FULL", ComponentType.FULL, alloc.full_size, alloc.available_size())]
        if ComponentType.SWA in kinds:
            pools.append(("SWA", ComponentType.SWA, alloc.swa_size, alloc.available_swa_size()))
        return pools
    return [("FULL", ComponentType.FULL, alloc.size, alloc.available_size())]


def pool_occupancy(tree: RadixTree, reserved: Slots, held: Slots) -> dict[str, Occupancy]:
    """Per pool name, who holds its tokens now (see the module docstring)."""
    nodes = list(tree.nodes())
    out: dict[str, Occupancy] = {}
    for name, kind, capacity, free in _device_pools(tree):
        owned = sum(int(s.numel()) for n in nodes if (s := n.data.get(kind)) is not None)
        out[name] = Occupancy(
            capacity=capacity,
            free=free,
            tree=owned,
            loads=_tokens(reserved.get(kind, ())),
            requests=_tokens(held.get(kind, ())),
        )
    host = tree.host_allocator
    if host is not None:
        backed = sum(int(n.host.numel()) for n in nodes if n.host is not None)
        out["host"] = Occupancy(
            capacity=host.size, free=host.available_size(), tree=backed, loads=0, requests=0
        )
    return out


def _leaked(owned: Sequence[torch.Tensor], allocated: torch.Tensor, page_size: int) -> int:
    mine = set(page_ids(owned, page_size))
    return sum(1 for p in allocated.tolist() if p not in mine) * page_size


def leaked_slots(tree: RadixTree, outside: Slots) -> dict[str, int]:
    """Per pool name, tokens allocated that nobody owns (0 everywhere when sound)."""
    nodes = list(tree.nodes())
    p = tree.page_size
    alloc = tree.allocator
    out: dict[str, int] = {}
    for name, kind, _, _ in _device_pools(tree):
        owned = [s for n in nodes if (s := n.data.get(kind)) is not None]
        owned += list(outside.get(kind, ()))
        if kind is ComponentType.SWA:
            assert isinstance(alloc, SWAAllocator)
            allocated = alloc.swa_allocated_page_ids()
        else:
            allocated = alloc.allocated_page_ids()
        out[name] = _leaked(owned, allocated, p)
    if tree.host_allocator is not None:
        backed = [n.host for n in nodes if n.host is not None]
        out["host"] = _leaked(backed, tree.host_allocator.allocated_page_ids(), p)
    return out
