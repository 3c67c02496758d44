"""The KV synthesis (`serving.kv`): the fast table path against the definition, and the
byte comparison against `torch.equal`."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.pools.errors import PoolError
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.serving.kv import POISON, kv_bytes, pool_holds, reference_kv_bytes, same_kv

tokens_st = st.lists(st.integers(-(2**40), 2**40), min_size=0, max_size=300)


@settings(max_examples=200, deadline=None)
@given(
    tokens=tokens_st,
    start=st.integers(0, 10**6),
    swa=st.booleans(),
    num_layers=st.integers(1, 3),
    width=st.sampled_from([1, 4, 7, 64, 600]),
)
def test_kv_bytes_equals_the_definition(
    tokens: list[int], start: int, swa: bool, num_layers: int, width: int
) -> None:
    fast = kv_bytes(tokens, start, swa=swa, num_layers=num_layers, width=width)
    slow = reference_kv_bytes(tokens, start, swa=swa, num_layers=num_layers, width=width)
    assert fast.dtype == slow.dtype == torch.float16
    assert fast.shape == slow.shape == (len(tokens), num_layers, width)
    assert torch.equal(fast, slow)


def test_kv_bytes_values_and_swa_negation() -> None:
    toks = list(range(500, 900))
    full = kv_bytes(toks, 3, num_layers=2, width=64)
    swa = kv_bytes(toks, 3, swa=True, num_layers=2, width=64)
    assert torch.equal(swa, -(full + 1))
    assert float(full.min()) >= 0 and float(full.max()) <= 1998
    assert not bool((full == POISON).any()) and not bool((swa == POISON).any())
    # a row depends on its token and position only
    assert torch.equal(kv_bytes(toks[10:], 13, num_layers=2, width=64), full[10:])
    assert not torch.equal(kv_bytes(toks, 4, num_layers=2, width=64), full)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 40),
    width=st.sampled_from([1, 3, 4, 8]),
    flip=st.one_of(st.none(), st.integers(0, 10**6)),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.int64, torch.uint8]),
)
def test_same_kv_agrees_with_torch_equal(
    n: int, width: int, flip: int | None, dtype: torch.dtype
) -> None:
    a = (torch.arange(n * 2 * width) % 251).to(dtype).view(n, 2, width)
    b = a.clone()
    if flip is not None and b.numel():
        b.view(-1)[flip % b.numel()] += 1
    assert same_kv(a, b) == torch.equal(a, b)


def test_same_kv_is_byte_for_byte() -> None:
    a = torch.zeros(4, 2, 4, dtype=torch.float16)
    assert same_kv(a, a.clone())
    assert not same_kv(a, -a)  # -0.0 == 0.0 as numbers, not as bytes
    assert not same_kv(a, a.view(2, 4, 4))  # another shape
    assert not same_kv(a, a.to(torch.float32))  # another dtype
    assert same_kv(a.transpose(0, 1), a.transpose(0, 1).contiguous())  # layout aside


# -- pool_holds: the NumPy path against read_pages + same_kv ---------------------------


def _pool(p: int, dtype: torch.dtype = torch.float16) -> KVPool:
    pool = KVPool(8 * p, p, 2, 4, dtype=dtype)
    pool.data.copy_((torch.arange(pool.data.numel()) % 1000).to(dtype).view(pool.data.shape))
    return pool


def _slots(pages: list[int], p: int) -> torch.Tensor:
    return torch.tensor([k * p + o for k in pages for o in range(p)], dtype=torch.int64)


@settings(max_examples=200, deadline=None)
@given(
    p=st.sampled_from([1, 4]),
    parts=st.lists(st.lists(st.integers(1, 8), min_size=0, max_size=4), min_size=1, max_size=4),
    flip=st.one_of(st.none(), st.integers(0, 10**6)),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.bfloat16]),
    same_parts=st.booleans(),
)
def test_pool_holds_agrees_with_read_pages(
    p: int,
    parts: list[list[int]],
    flip: int | None,
    dtype: torch.dtype,
    same_parts: bool,
) -> None:
    pool = _pool(p, dtype)
    slots = [_slots(pages, p) for pages in parts]
    whole = torch.cat(slots)
    want = pool.read_pages(whole).clone()
    if flip is not None and want.numel():
        raw = want.view(-1).view(torch.uint8)
        raw[flip % raw.numel()] ^= 1  # one bit of one byte
    # the rows cut where the slots are, or in other places (only the concatenation counts)
    cuts = [s.numel() for s in slots] if same_parts else [want.shape[0]]
    rows = list(torch.split(want, cuts))
    expected = same_kv(pool.read_pages(whole), want)
    assert pool_holds(pool, slots, rows) == expected
    assert expected == (flip is None or not want.numel())


@pytest.mark.parametrize(
    "slots",
    [
        torch.arange(1, 5),  # unaligned
        torch.arange(0, 4),  # page 0
        torch.arange(36, 40),  # past the end
        torch.arange(4, 7),  # not whole pages
        torch.tensor([5, 4, 6, 7]),  # a page's slots out of order
        torch.arange(4, 8, dtype=torch.int32),  # not int64
        torch.arange(4, 8).view(2, 2),  # not 1-D
    ],
)
def test_pool_holds_refuses_what_read_pages_refuses(slots: torch.Tensor) -> None:
    pool = _pool(4)
    rows = [torch.zeros(4, 2, 4, dtype=torch.float16)]
    with pytest.raises(PoolError) as read_error:
        pool.read_pages(slots)
    with pytest.raises(type(read_error.value)):
        pool_holds(pool, [slots], rows)
    parts = [torch.arange(8, 12), slots]  # a bad part among good ones: as concatenated
    try:
        pool.read_pages(torch.cat(parts))
    except Exception as exc:  # a pool error, or cat's own (a 2-D part)
        with pytest.raises(type(exc)):
            pool_holds(pool, parts, rows * 2)
    else:
        assert not pool_holds(pool, parts, rows * 2)  # the zeros are not the pool's bytes


def test_pool_holds_compares_shape_and_dtype() -> None:
    pool = _pool(1)
    slots = [torch.tensor([1, 2], dtype=torch.int64)]
    rows = pool.read_pages(slots[0]).clone()
    assert pool_holds(pool, slots, [rows])
    assert not pool_holds(pool, slots, [rows[:1]])  # fewer rows than slots
    assert not pool_holds(pool, slots, [rows.to(torch.float32)])  # another dtype
    assert not pool_holds(pool, slots, [rows.view(2, 4, 2)])  # another row shape
    assert not pool_holds(pool, slots, [-rows])  # -0.0 is not 0.0 byte for byte
    with pytest.raises(ValueError, match="at least one"):
        pool_holds(pool, [], [rows])
