"""Helpers and strategies shared by the pool tests (tests/test_pools_*.py)."""

from __future__ import annotations

import attrs
import torch
from hypothesis import strategies as st

from unicache_fsm.pools import PagedAllocator, SWAAllocator

PAGE_SIZES = (1, 4, 16)
page_sizes = st.sampled_from(PAGE_SIZES)


def slots_of(pages: list[int], page_size: int) -> torch.Tensor:
    """The int64 slots of `pages`, page after page (what an allocator hands out)."""
    return torch.tensor(
        [p * page_size + i for p in pages for i in range(page_size)], dtype=torch.int64
    )


def pages_in(slots: torch.Tensor, page_size: int) -> list[int]:
    """Page ids of whole-page `slots`, in order; asserts they are whole pages."""
    values = slots.tolist()
    assert len(values) % page_size == 0
    pages = [values[i] // page_size for i in range(0, len(values), page_size)]
    assert values == [p * page_size + i for p in pages for i in range(page_size)]
    return pages


@attrs.frozen
class PagedSnapshot:
    """Everything observable about a paged allocator's free/allocated state."""

    available: int
    free: tuple[int, ...]
    allocated: tuple[int, ...]


def snapshot(a: PagedAllocator) -> PagedSnapshot:
    return PagedSnapshot(
        a.available_size(),
        tuple(a.free_page_ids().tolist()),
        tuple(a.allocated_page_ids().tolist()),
    )


@attrs.frozen
class SWASnapshot:
    full: PagedSnapshot
    swa: PagedSnapshot
    mapping: tuple[int, ...]


def swa_snapshot(a: SWAAllocator) -> SWASnapshot:
    return SWASnapshot(
        PagedSnapshot(
            a.available_size(),
            tuple(a.free_page_ids().tolist()),
            tuple(a.allocated_page_ids().tolist()),
        ),
        PagedSnapshot(
            a.available_swa_size(),
            tuple(a.swa_free_page_ids().tolist()),
            tuple(a.swa_allocated_page_ids().tolist()),
        ),
        tuple(a.full_to_swa_mapping.tolist()),
    )
