"""The KV synthesis (`serving.kv`): the fast table path against the definition, and the
byte comparison against `torch.equal`."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.serving.kv import POISON, kv_bytes, reference_kv_bytes, same_kv

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
