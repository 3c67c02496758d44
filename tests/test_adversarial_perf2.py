"""Adversarial checks of the performance fast paths (second round): each test here
failed before the fix committed with it."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from unicache_fsm.pools.kv import KVPool
from unicache_fsm.serving.kv import pool_holds, same_kv
from unicache_fsm.store.checksum import PIECE_BYTES, copy_checksum, page_checksum
from unicache_fsm.store.copier import CHUNK_BYTES, PARALLEL_BYTES, PageCopier


class _CloseAfterPoolChosen(PageCopier):
    """A copier whose `close()` (from another thread) lands right after a call chose its
    pool and before it handed the pool any work: the race `close()` may always win."""

    def _pool_for(self, extra: int) -> Any:
        pool = super()._pool_for(extra)
        closer = threading.Thread(target=self.close)
        closer.start()
        closer.join()
        return pool


def test_close_from_another_thread_mid_call_does_not_fail_the_call() -> None:
    copier = _CloseAfterPoolChosen(threads=4)
    n = 2 * PARALLEL_BYTES // CHUNK_BYTES  # enough chunks for every worker
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, size=(n, CHUNK_BYTES), dtype=np.uint8)
    dst = np.zeros_like(src)
    rows = list(range(n))
    sums = copier.copy_checksummed(dst, rows, src, rows)
    assert np.array_equal(dst, src)
    assert sums == [page_checksum(row.data) for row in src]


def _neg_view(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values behind a negative bit (what `torch._neg_view` makes; NumPy cannot view
    it): ``-view`` is `t`."""
    view = torch._neg_view(-t)
    assert view.is_neg() and torch.equal(view, t)
    return view


def test_pool_holds_answers_slots_with_a_negative_bit_as_read_pages_does() -> None:
    pool = KVPool(16, 1, 2, 4)
    values = torch.arange(pool.data.numel()) % 1000
    pool.data.copy_(values.to(torch.float16).view(pool.data.shape))
    slots = torch.arange(3, 7)
    want = pool.read_pages(slots).clone()
    assert pool_holds(pool, [_neg_view(slots)], [want])
    assert pool_holds(pool, [slots], [_neg_view(want)])


@pytest.mark.parametrize(
    ("dst_rows", "src_rows", "culprit"),
    [
        ([-1], [0], "-1"),  # NumPy would wrap it onto the last row
        ([4], [0], "4"),  # past the end
        ([0], [-4], "-4"),
        ([1, 1], [0, 2], "1"),  # a destination row twice: one page's bytes lost
    ],
)
def test_copier_refuses_rows_outside_or_twice_and_writes_nothing(
    dst_rows: list[int], src_rows: list[int], culprit: str
) -> None:
    copier = PageCopier(1)
    src = np.arange(4 * 64, dtype=np.uint8).reshape(4, 64)
    dst = np.zeros((4, 64), dtype=np.uint8)
    with pytest.raises(ValueError, match=culprit):
        copier.copy_checksummed(dst, dst_rows, src, src_rows)
    assert not dst.any()


def test_copier_refuses_a_destination_row_that_is_a_source_row_of_the_same_array() -> None:
    copier = PageCopier(1)
    pages = np.arange(4 * 64, dtype=np.uint8).reshape(4, 64)
    before = pages.copy()
    with pytest.raises(ValueError, match="2"):
        copier.copy_checksummed(pages, [2, 3], pages, [1, 2])
    assert np.array_equal(pages, before)
    # rows of one array that do not meet are fine
    assert copier.copy_checksummed(pages, [3], pages, [0]) == [page_checksum(before[0].data)]
    assert np.array_equal(pages[3], before[0])


@pytest.mark.parametrize("n", [64, 3 * PIECE_BYTES + 5])  # one piece, several pieces
def test_copy_checksum_into_a_strided_destination_copies_and_checksums(n: int) -> None:
    src = np.random.default_rng(n).integers(0, 256, size=n, dtype=np.uint8)
    dst = np.zeros(2 * n, dtype=np.uint8)[::2]  # every other byte: not contiguous
    assert copy_checksum(dst, src) == page_checksum(src.tobytes())
    assert np.array_equal(dst, src)


def test_copier_rows_of_a_strided_array_copy_and_checksum() -> None:
    src = np.random.default_rng(3).integers(0, 256, size=(3, 128), dtype=np.uint8)
    wide = np.zeros((3, 256), dtype=np.uint8)
    dst = wide[:, ::2]  # rows of a 2-D array, each with a byte stride of 2
    sums = PageCopier(1).copy_checksummed(dst, [2, 0], src, [0, 1])
    assert sums == [page_checksum(src[0].tobytes()), page_checksum(src[1].tobytes())]
    assert np.array_equal(dst[2], src[0]) and np.array_equal(dst[0], src[1])


def test_same_kv_and_pool_holds_compare_bfloat16_rows_with_a_negative_bit() -> None:
    pool = KVPool(16, 1, 2, 4, dtype=torch.bfloat16)
    pool.data.copy_(torch.randn(pool.data.shape, generator=torch.Generator().manual_seed(5)))
    slots = torch.arange(3, 7)
    want = pool.read_pages(slots).clone()
    assert same_kv(want, _neg_view(want)) and same_kv(_neg_view(want), want)
    assert pool_holds(pool, [slots], [_neg_view(want)])
    other = want.clone()
    other[0, 0, 0] += 1
    assert not same_kv(want, _neg_view(other))
