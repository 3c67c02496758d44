"""`SlotCodec.to_slots`: its NumPy path on CPU answers what its definition (the
broadcast torch add) answers, for any page ids, and hands back a fresh tensor."""

from __future__ import annotations

import random

import pytest
import torch

from unicache_fsm.pools.layout import PageLayout
from unicache_fsm.pools.slots import SlotCodec


def _definition(pages: torch.Tensor, p: int) -> torch.Tensor:
    return torch.add(torch.arange(p, dtype=torch.int64), pages.unsqueeze(1), alpha=p).view(-1)


@pytest.mark.parametrize("page_size", [2, 4, 16, 64])
def test_to_slots_matches_its_definition(page_size: int) -> None:
    rng = random.Random(page_size)
    codec = SlotCodec(PageLayout(256 * page_size, page_size), torch.device("cpu"))
    for _ in range(200):
        ids = [rng.randint(-5, 300) for _ in range(rng.randint(0, 40))]
        base = torch.tensor(ids, dtype=torch.int64)
        for pages in (base, torch.tensor(ids * 2, dtype=torch.int64)[::2], base.neg().neg()):
            got = codec.to_slots(pages)
            want = _definition(pages, page_size)
            assert got.dtype == torch.int64 and got.dim() == 1 and got.is_contiguous()
            assert torch.equal(got, want), ids


def test_to_slots_of_a_negated_view_and_a_fresh_result() -> None:
    codec = SlotCodec(PageLayout(64, 16), torch.device("cpu"))
    ids = torch.tensor([-1, -3], dtype=torch.int64)
    neg = torch.neg(ids.clone())._neg_view()  # a lazily negated view: NumPy cannot view it
    assert torch.equal(codec.to_slots(neg), _definition(torch.tensor([-1, -3]), 16))
    pages = torch.tensor([1, 2], dtype=torch.int64)
    out = codec.to_slots(pages)
    out.zero_()  # the result is the caller's: writing it leaves the ids alone
    assert pages.tolist() == [1, 2]
    assert codec.to_slots(pages).tolist() == list(range(16, 48))
