"""`alloc_making_room`: evict the shortfall (only when short, only the shortfall), then
allocate; None, with nothing allocated, when the pool stays short."""

from __future__ import annotations

import torch

from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.room import alloc_making_room

P = 4


def _full_pool() -> tuple[PagedAllocator, torch.Tensor]:
    alloc = PagedAllocator(8 * P, P)
    held = alloc.alloc(alloc.available_size())
    assert held is not None and alloc.available_size() == 0
    return alloc, held


def test_no_room_is_made_when_the_pool_has_enough() -> None:
    alloc = PagedAllocator(8 * P, P)
    asked: list[int] = []
    slots = alloc_making_room(2 * P, alloc.available_size, alloc.alloc, asked.append)
    assert asked == [] and slots is not None and slots.numel() == 2 * P


def test_exactly_the_shortfall_is_asked_for_then_allocated() -> None:
    alloc, held = _full_pool()
    alloc.free(held[:P])  # one page free, three wanted
    asked: list[int] = []

    def make_room(short: int) -> None:
        asked.append(short)
        alloc.free(held[P : P + short])

    slots = alloc_making_room(3 * P, alloc.available_size, alloc.alloc, make_room)
    assert asked == [2 * P]
    assert slots is not None and slots.numel() == 3 * P and alloc.available_size() == 0


def test_still_short_gives_none_and_allocates_nothing() -> None:
    alloc, held = _full_pool()
    alloc.free(held[:P])
    asked: list[int] = []
    slots = alloc_making_room(2 * P, alloc.available_size, alloc.alloc, asked.append)
    assert slots is None and asked == [P]
    assert alloc.available_size() == P  # the free page is still free
