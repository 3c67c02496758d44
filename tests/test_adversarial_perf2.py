"""Adversarial checks of the performance fast paths (second round): each test here
failed before the fix committed with it."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from unicache_fsm.store.checksum import page_checksum
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
