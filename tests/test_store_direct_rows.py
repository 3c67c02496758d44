"""`MemoryStore` reads the pages of a CPU device with no page as one run of bytes (the
per-layer K/V device of `test_store_page_device`, as SGLang's buffers) straight into its
new pages' rows when those rows are one run; rows scattered by evictions go through
staging. Either way every page loads back byte for byte and no other page's row is
touched."""

from __future__ import annotations

from test_store_page_device import KV, SplitKV, keys, run_load, settle, transfer
from unicache_fsm.store.memory import MemoryStore


def test_an_offload_into_scattered_rows_overwrites_no_other_page() -> None:
    store, device = MemoryStore(), SplitKV()
    store.attach({KV: device})
    device.fill(list(range(1, 21)), seed=11)
    # 16 rows filled (the slab's first size): A rows 0-1, B rows 2-13, C rows 14-15
    a, b, c, d = keys(2, 0), keys(12, 100), keys(2, 200), keys(4, 300)
    for pages, names in ((range(1, 3), a), (range(3, 15), b), (range(15, 17), c)):
        assert store.offload(transfer(list(pages), names))
        settle(store)
    assert store.evict([*a, *c], KV) == 4  # free rows 0, 1, 14, 15: no run of 4
    assert store.offload(transfer(list(range(17, 21)), d))  # into rows 0, 1, 14, 15
    settle(store)
    assert run_load(store, "b", list(range(21, 33)), b)
    assert run_load(store, "d", list(range(33, 37)), d)
    assert device.pages(list(range(21, 33))).equal(device.pages(list(range(3, 15))))
    assert device.pages(list(range(33, 37))).equal(device.pages(list(range(17, 21))))
    store.close()


def test_an_offload_into_one_run_of_rows_loads_back_exactly() -> None:
    store, device = MemoryStore(staging_bytes=1), SplitKV()  # one page per read
    store.attach({KV: device})
    device.fill(list(range(1, 6)), seed=12)
    names = keys(5, 0)
    assert store.offload(transfer(list(range(1, 6)), names))
    settle(store)
    assert run_load(store, "r", list(range(6, 11)), names)
    assert device.pages(list(range(6, 11))).equal(device.pages(list(range(1, 6))))
    store.close()
