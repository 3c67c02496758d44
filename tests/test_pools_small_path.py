"""The Python path for small slot tensors (`SMALL_SLOTS`) and the tensor path agree:
same page ids for good input, same typed error and culprits for bad input, and the
allocator unchanged after a rejected call."""

from __future__ import annotations

import random

import pytest
import torch

from unicache_fsm.pools import paged, slots
from unicache_fsm.pools.errors import PoolError
from unicache_fsm.pools.paged import PagedAllocator


def _outcome(call: object) -> tuple[str, object]:
    assert callable(call)
    try:
        got = call()
    except PoolError as exc:
        return type(exc).__name__, str(exc)
    return "ok", None if got is None else got.tolist()


SMALL = slots.SMALL_SLOTS  # the default, before any test patches it
KINDS = (
    "good",
    "free",
    "twice",
    "page0",
    "beyond",
    "broken",
    "shifted",
    "partial",
    "negative",
    "swapped",
    "mixed",
    "many",
    "huge",
)


def _case(alloc: PagedAllocator, rng: random.Random, kind: str) -> torch.Tensor:
    """Slots of a few live pages, spoilt the way `kind` says."""
    p = alloc.page_size
    live = alloc.allocated_page_ids().tolist()
    count = rng.randint(12, 30) if kind in ("many", "mixed") else rng.randint(1, 6)
    pages = rng.sample(live, count)
    if kind == "free":
        pages.insert(rng.randrange(len(pages)), rng.choice(alloc.free_page_ids().tolist()))
    elif kind == "twice":
        pages.append(rng.choice(pages))
    elif kind == "page0":
        pages.append(0)
    elif kind == "beyond":
        pages.append(alloc.num_pages + 1)
    values = [k * p + o for k in pages for o in range(p)]
    if kind == "broken":
        values[rng.randrange(len(values))] += 1
    elif kind == "shifted":  # consecutive, but not starting on a page boundary
        values = [v + 1 for v in values] if p > 1 else [-1]
    elif kind == "partial":
        values = values[:-1] if p > 1 else [*values, 10**6]
    elif kind == "negative":
        values.append(-3)
    elif kind == "swapped":  # two slots of one page in the wrong order
        i = rng.randrange(len(pages)) * p
        j = i + rng.randrange(1, p) if p > 1 else (i + 1) % len(values)
        values[i], values[j] = values[j], values[i]
    elif kind == "mixed":  # one slot moved to another page, at the same offset
        i = rng.randrange(len(values))
        values[i] += p * rng.choice([-1, 1]) * rng.randint(1, 3)
    elif kind == "huge":  # a slot far past any pool (its page id would not fit int64)
        values[rng.randrange(len(values))] = 2**63 - 1
    return torch.tensor(values, dtype=torch.int64)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_small_and_tensor_paths_agree(page_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(page_size)
    alloc = PagedAllocator(64 * page_size, page_size)
    taken = alloc.alloc(40 * page_size)
    assert taken is not None
    alloc.free(taken[: 10 * page_size])
    errors = set()
    for kind in KINDS * 6:
        t = _case(alloc, rng, kind)
        results = []
        for small, numpy_pages in ((SMALL, 10**9), (SMALL, 1), (0, 10**9)):
            monkeypatch.setattr(slots, "SMALL_SLOTS", small)
            monkeypatch.setattr(paged, "SMALL_SLOTS", small)
            monkeypatch.setattr(slots, "NUMPY_PAGES", numpy_pages)
            before = alloc.allocated_page_ids().tolist()
            results.append(
                (
                    _outcome(lambda t=t: alloc.check_live(t, "slots")),
                    _outcome(lambda t=t: torch.tensor(alloc.live_page_ids(t, "slots"))),
                    _outcome(lambda t=t: alloc.live_pages(t, what="slots", freeing=False)),
                    _outcome(lambda t=t: alloc.live_pages(t, what="slots", freeing=True)),
                    _outcome(lambda t=t: alloc.codec.to_pages(t, "slots")),
                    _outcome(lambda t=t: alloc.codec.page_ids_and_list(t, "slots")[0]),
                    _outcome(
                        lambda t=t: torch.tensor(alloc.codec.page_ids_and_list(t, "slots")[1])
                    ),
                    slots.SlotCodec.has_duplicates(t),
                    alloc.allocated_page_ids().tolist(),
                )
            )
            assert alloc.allocated_page_ids().tolist() == before
        assert results[0] == results[1] == results[2], t.tolist()  # list, NumPy, tensor
        assert results[0][1] == results[0][2]  # live_page_ids: live_pages' ids, as a list
        assert results[0][4] == results[0][5] == results[0][6]  # to_pages, both halves
        errors.add(results[0][0][0])
    expected = {"ok", "SlotsNotAllocatedError", "DuplicatePagesError", "ForeignSlotsError"}
    expected |= {"UnalignedSlotsError"} if page_size > 1 else set()
    assert expected <= errors, errors
