"""Adversarial checks of issue 16's fast paths: inputs a fast path might take for good
ones (ids that wrap around int64, tensors with lazy conjugate or negative bits, slices
that start off an 8-byte boundary, a bytearray digest), each against the contract the
simple path kept: the right answer, or a typed error naming the culprit with nothing
changed."""

from __future__ import annotations

import hashlib
import random
import tracemalloc

import attrs
import pytest
import torch

from unicache_fsm import hashing
from unicache_fsm.pools import KVPool, PagedAllocator, slots
from unicache_fsm.pools.errors import ForeignSlotsError, PoolError
from unicache_fsm.serving.invariants import InvariantViolation, committed_load_sound
from unicache_fsm.serving.kv import same_kv
from unicache_fsm.serving.system import System


# -- PagedAllocator.free_page_list: page ids far outside the pool ---------------------------
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("offset", [2**62, 2**63, 2**64, 2**70, -(2**62)])
def test_free_page_list_refuses_an_id_that_wraps_onto_a_live_page(
    page_size: int, offset: int
) -> None:
    """Page 1 plus a multiple of 2**64 / P is page 1 again once multiplied by P in int64
    (or does not fit int64 at all): the id must be refused as foreign, not free page 1."""
    p = page_size
    alloc = PagedAllocator(16 * p, p)
    assert alloc.alloc(8 * p) is not None
    live = alloc.allocated_page_ids().tolist()
    assert 1 in live
    bad = 1 + offset // p  # p * bad == p + offset: page 1's slots modulo 2**64 when it wraps
    with pytest.raises(ForeignSlotsError) as info:
        alloc.free_page_list([live[-1], bad], "a node's FULL pages")
    assert str(bad) in str(info.value)  # the culprit, by its page id
    assert "a node's FULL pages" in str(info.value)
    assert info.value.slots == tuple(bad * p + o for o in range(p))
    assert alloc.allocated_page_ids().tolist() == live  # nothing freed


# -- KVPool writes into a CPU pool: lazily conjugated / negated data -------------------------
@pytest.mark.parametrize(
    ("page_size", "width"),
    [(1, 4), (4, 4), (16, 64)],  # NumPy row assignment (< 16 KiB) and page by page (16 KiB)
)
def test_kv_write_pages_lands_the_values_of_conjugate_and_negative_views(
    page_size: int, width: int
) -> None:
    """`x.conj()` and `x.conj().imag` are tensors whose values are resolved lazily (a
    conjugate or negative bit over the same memory): the pool must hold their values."""
    p, rng = page_size, torch.Generator().manual_seed(page_size)
    for dtype in (torch.complex64, torch.float32):
        pool = KVPool(8 * p, p, 2, width, dtype=dtype)
        base = torch.complex(
            torch.randn(2 * p, 2, width, generator=rng), torch.randn(2 * p, 2, width, generator=rng)
        )
        data = base.conj() if dtype.is_complex else base.conj().imag
        assert data.is_conj() or data.is_neg()
        want = data.clone().resolve_conj().resolve_neg()
        slots_ = torch.arange(2 * p, 4 * p, dtype=torch.int64)
        pool.write_pages(slots_, data)
        assert torch.equal(pool.read_pages(slots_), want)
        pages = torch.tensor([5, 4], dtype=torch.int64)  # write_page_ids: already validated
        pool.write_page_ids(pages, data)
        assert torch.equal(pool.read_page_ids(pages), want)


# -- slot checks: the NumPy path at the edges of int64, over strided tensors ----------------
def _wrap(v: int) -> int:
    """`v` as int64 arithmetic leaves it (modulo 2**64, signed)."""
    return (v + 2**63) % 2**64 - 2**63


@pytest.mark.parametrize("page_size", [2, 3, 4])
def test_numpy_slot_checks_agree_with_the_other_paths_at_int64_edges(
    page_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Near 2**63 a page's last slot wraps in NumPy's int64 arithmetic; the NumPy path
    must still refuse such pages (as the list and tensor paths do), also when the slot
    tensor is a strided view."""
    p, top = page_size, 2**63 - 1
    rng = random.Random(p)
    alloc = PagedAllocator(400 * p, p)
    codec = alloc.codec
    spoilt = {
        "top": [_wrap(top // p * p + o) for o in range(p)],  # the last slot wraps at P = 3
        "below_top": [(top // p - 1) * p + o for o in range(p)],
        "bottom": [-(2**63) + o for o in range(p)],
        "negative": [-p + o for o in range(p)],
    }
    for npages in (slots.NUMPY_PAGES - 1, slots.NUMPY_PAGES, 300, 400):
        for name, page in spoilt.items():
            pages = rng.sample(range(1, 401), npages)
            values = [k * p + o for k in pages for o in range(p)]
            at = rng.randrange(npages) * p
            values[at : at + p] = page
            dense = torch.tensor(values, dtype=torch.int64)
            strided = torch.stack([dense, -dense]).t().reshape(-1)[::2]
            assert not strided.is_contiguous()
            for t in (dense, strided):
                outcomes = []
                for small, numpy_pages in ((slots.SMALL_SLOTS, slots.NUMPY_PAGES), (0, 10**9)):
                    monkeypatch.setattr(slots, "SMALL_SLOTS", small)
                    monkeypatch.setattr(slots, "NUMPY_PAGES", numpy_pages)
                    try:
                        codec.to_pages(t, "slots")
                        outcomes.append(("ok", ""))
                    except PoolError as exc:
                        outcomes.append((type(exc).__name__, str(exc)))
                monkeypatch.undo()
                assert outcomes[0] == outcomes[1], (name, npages)
                assert outcomes[0][0] == "ForeignSlotsError", (name, npages)


# -- same_kv: tensors that start off an 8-byte boundary of their storage --------------------
def test_same_kv_compares_slices_that_start_off_an_eight_byte_boundary() -> None:
    rows = torch.arange(40 * 4, dtype=torch.float16).view(40, 2, 2)
    for start in (1, 2, 3):
        a = rows[start : start + 4]  # 32 bytes from byte 8*start: offsets 8, 16, 24
        flat = rows.view(-1)[1 : 1 + a.numel()].view(a.shape)  # 2 bytes into its storage
        assert flat.storage_offset() * flat.element_size() % 8 == 2
        b = a.clone()
        assert same_kv(flat, flat.clone())
        assert same_kv(a, b) and same_kv(b, a)
        shifted = torch.cat([rows.view(-1)[:1], b.reshape(-1)])[1:].view(a.shape)
        assert same_kv(a, shifted) and same_kv(shifted, a)  # same bytes, odd offset
        shifted[-1, -1, -1] += 1
        assert not same_kv(a, shifted)


# -- page_digests: a prior digest held in a bytearray ---------------------------------------
def test_page_digests_takes_a_bytearray_or_memoryview_prior() -> None:
    """`prior + page` is the SHA-256 input, for any bytes-like prior (mypy lets a
    bytearray pass as bytes); the memo must not make it unhashable."""
    packed = hashing.pack_tokens(list(range(12)))
    prior = hashlib.sha256(b"seed").digest()
    want = hashing.page_digests(packed, 4, prior)
    assert want[0] == hashlib.sha256(prior + packed[:16]).digest()
    for native in (True, False):
        assert hashing.page_digests(packed, 4, bytearray(prior), native=native) == want
        view = memoryview(prior)
        assert hashing.page_digests(packed, 4, view, native=native) == want  # type: ignore[arg-type]


# -- page_digests' memo: bounded in bytes, whatever the page size ---------------------------
def test_page_digests_memo_stays_a_few_mib_at_large_page_sizes() -> None:
    """16,384 remembered pages of 4 KiB (P = 1024) are 64 MiB of keys: the memo must
    stay within its stated few MiB however large the pages are."""
    p = 1024
    packed = bytes(range(256)) * 64  # four pages of 4 KiB
    tracemalloc.start()
    try:
        for i in range(hashing.DIGEST_MEMO_SIZE // 4):
            prior = hashlib.sha256(i.to_bytes(4, "little")).digest()  # a chain per call
            assert len(hashing.page_digests(packed, p, prior, native=False)) == 4
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 20 * 2**20, f"{held / 2**20:.1f} MiB held after hashing 64 MiB of pages"


# -- COMMIT soundness: one torch.isin over the kept slots -----------------------------------
def test_commit_soundness_rejects_kept_slots_off_the_loaded_path() -> None:
    """A committed load may keep only slots of its own loaded path: a page the tree owns
    on another branch, or one it does not own at all, in place of one kept page (the
    rest sound) is named as a stray."""
    s = System.build(4, full_pages=64)
    key = tuple(range(1, 17))
    other = key[:8] + tuple(range(100, 108))
    s.compute("a", key)
    s.drive()
    s.evict_all()
    s.compute("prefix", key[:4])  # a one-page device hit; the rest comes from the store
    s.begin("r", key)
    (load,) = s.drive(audit=False)
    assert load.committed_ok and load.device_hit_len == 4
    committed_load_sound(s.tree, load)  # sound as committed
    (kept,) = load.committed
    assert kept.device_indices is not None and kept.num_pages >= 2
    s.compute("b", other)  # another branch, its pages the tree's too
    elsewhere = s.tree.match_prefix(other).device_indices[-4:]
    fresh = s.alloc(4)  # a page nobody owns
    for stray in (elsewhere, fresh):
        assert not set(stray.tolist()) & set(s.tree.path_slots(load.endpoint).tolist())
        for at in (0, kept.num_pages - 1):  # first or last kept page
            slots_ = kept.device_indices.clone()
            slots_[at * 4 : at * 4 + 4] = stray
            load.committed = [attrs.evolve(kept, device_indices=slots_)]
            with pytest.raises(
                InvariantViolation, match="kept 4 loaded slots the tree does not own"
            ):
                committed_load_sound(s.tree, load)
    load.committed = [kept]
    committed_load_sound(s.tree, load)


# -- KV writes whose data is the pool's own memory under another storage --------------------
@pytest.mark.parametrize("width", [4, 256])  # 256 B pages (NumPy rows), 16 KiB (page by page)
def test_kv_write_page_ids_from_the_pools_own_bytes_writes_what_they_held(width: int) -> None:
    """Data over the pool's memory that is not a torch view of it (a tensor made from
    `page_bytes()`): pages 1 and 2 swapped must land as they were before the call."""
    p = 16
    pool = KVPool(8 * p, p, 2, width)
    n = 4 * p * 2 * width
    values = (torch.arange(n, dtype=torch.float32) % 2000).to(pool.dtype).view(4 * p, 2, width)
    pool.write_pages(torch.arange(p, 5 * p), values)
    before = pool.data.clone()
    alias = torch.from_numpy(pool.page_bytes()[1:3]).view(pool.dtype).view(2 * p, 2, width)
    pool.write_page_ids(torch.tensor([2, 1]), alias)
    assert torch.equal(pool.data[2 * p : 3 * p], before[p : 2 * p])
    assert torch.equal(pool.data[p : 2 * p], before[2 * p : 3 * p])
    assert torch.equal(pool.data[3 * p :], before[3 * p :])
