"""`alloc_making_room`: the one "evict the shortfall, then allocate" primitive.

Every caller that needs slots from a pool the radix tree may be holding on to (the
tree loading a host backup back, a component reserving slots for an external load,
a scheduler computing a request's tail) does the same three things: ask how many slots
are free, have the owner of the cached slots free the shortfall, allocate. This module
is that sequence, written once. It sits below the tree, so the tree passes its own
eviction as `make_room`; it knows no pool by name, so the FULL and SWA pools of an
allocator are both served by passing the matching pair of bound methods.

- ``alloc_making_room(n, available, alloc, make_room)`` — when ``available()`` is
  short of `n`, call ``make_room(shortfall)`` once, then return ``alloc(n)``: the
  slots, or None when the pool is still short (nothing is allocated then). Errors of
  `alloc` (a bad `n`) propagate unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["alloc_making_room"]


def alloc_making_room(
    n: int,
    available: Callable[[], int],
    alloc: Callable[[int], torch.Tensor | None],
    make_room: Callable[[int], object],
) -> torch.Tensor | None:
    """Free the shortfall with `make_room`, then allocate `n` tokens (None if short)."""
    short = n - available()
    if short > 0:
        make_room(short)
    return alloc(n)
