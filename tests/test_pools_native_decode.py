"""The native slot decode (`slots.NATIVE_DECODE`) answers exactly what the NumPy and
Python paths answer: the same page ids for slots they accept (repeated pages
included), the same typed error and message for slots they refuse."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.pools import slots
from unicache_fsm.pools.errors import PoolError
from unicache_fsm.pools.layout import PageLayout
from unicache_fsm.pools.slots import SlotCodec

NUM_PAGES = 40

needs_native = pytest.mark.skipif(not slots.NATIVE_DECODE, reason="built without _pagecheck")


def _outcome(call: object) -> tuple[str, object]:
    assert callable(call)
    try:
        got = call()
    except PoolError as exc:
        return type(exc).__name__, str(exc)
    if isinstance(got, tuple):  # page_ids_and_list: both forms must agree
        pages, ids = got
        assert pages.dtype == torch.int64 and pages.tolist() == ids
        return "ok", ids
    return "ok", got if isinstance(got, list) else got.tolist()


@st.composite
def slot_tensors(draw: st.DrawFn, page_size: int) -> torch.Tensor:
    """Slots of a few pages, maybe spoilt: pages out of range (0 included), repeated,
    a slot changed, cut short, shifted; maybe a strided (not C-contiguous) view."""
    pages = draw(st.lists(st.integers(0, NUM_PAGES + 2), min_size=1, max_size=40))
    values = [k * page_size + o for k in pages for o in range(page_size)]
    spoil = draw(st.sampled_from(["none", "none", "slot", "cut", "shift", "huge"]))
    if spoil == "slot":
        i = draw(st.integers(0, len(values) - 1))
        values[i] += draw(st.sampled_from([-page_size, -1, 1, page_size]))
    elif spoil == "cut" and len(values) > 1:
        values = values[:-1]
    elif spoil == "shift":
        values = [v + 1 for v in values]
    elif spoil == "huge":
        values[draw(st.integers(0, len(values) - 1))] = 2**63 - 1
    if draw(st.booleans()):  # every other element of a doubled tensor: not C-contiguous
        doubled = torch.tensor([v for v in values for _ in (0, 1)], dtype=torch.int64)
        return doubled[::2]
    return torch.tensor(values, dtype=torch.int64)


@needs_native
@pytest.mark.parametrize("page_size", [1, 4, 16])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_native_decode_answers_what_the_other_paths_answer(
    page_size: int, data: st.DataObject
) -> None:
    codec = SlotCodec(PageLayout(NUM_PAGES * page_size, page_size), torch.device("cpu"))
    t = data.draw(slot_tensors(page_size))
    for call in ("to_pages", "page_list", "page_ids_and_list"):
        method = getattr(codec, call)
        slots.NATIVE_DECODE = True
        try:
            fast = _outcome(lambda: method(t, "slots"))  # noqa: B023
            slots.NATIVE_DECODE = False
            slow = _outcome(lambda: method(t, "slots"))  # noqa: B023
        finally:
            slots.NATIVE_DECODE = True
        assert fast == slow, call
    slots.NATIVE_DECODE = True
    once = _outcome(lambda: codec.to_pages_once(t, "slots")[0])
    assert once == _outcome(lambda: codec.to_pages(t, "slots"))
    if once[0] == "ok" and codec.to_pages_once(t, "slots")[1]:  # known distinct: it is
        assert isinstance(once[1], list) and len(set(once[1])) == len(once[1])


@needs_native
def test_native_decode_leaves_no_mark_behind() -> None:
    """A refused decode (a repeated page) and an accepted one leave the flag bytes clear,
    so the next call is judged on its own slots."""
    codec = SlotCodec(PageLayout(8 * 4, 4), torch.device("cpu"))
    twice = torch.tensor([4, 5, 6, 7, 4, 5, 6, 7], dtype=torch.int64)
    assert codec.to_pages(twice, "slots").tolist() == [1, 1]  # accepted by the slow path
    once = torch.tensor([4, 5, 6, 7], dtype=torch.int64)
    assert codec.page_list(once, "slots") == [1]
    assert codec.to_pages(once, "slots").tolist() == [1]


@needs_native
def test_whole_pages_in_range_are_decoded_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    """A contiguous tensor by its memory's address; a strided one is offered through
    its view, which the native call refuses (no contiguous buffer): the other paths
    decode it, alike."""
    calls: list[tuple[str, bool]] = []
    for name in ("_native_live_page_ids", "_native_live_page_ids_at"):
        native = getattr(slots, name)
        assert native is not None

        def counted(*args: object, native: Any = native, name: str = name) -> object:
            result = native(*args)
            calls.append((name, result is not None))
            return result

        monkeypatch.setattr(slots, name, counted)
    codec = SlotCodec(PageLayout(8 * 4, 4), torch.device("cpu"))
    good = torch.arange(8, 16, dtype=torch.int64)
    assert codec.to_pages(good, "slots").tolist() == [2, 3]
    assert codec.page_ids_and_list(good, "slots")[1] == [2, 3]
    spread = torch.stack([good, torch.zeros_like(good)], dim=1).reshape(-1)[::2]
    assert codec.to_pages(spread, "slots").tolist() == [2, 3]
    assert calls[:2] == [("_native_live_page_ids_at", True)] * 2
    assert calls[2:] and set(calls[2:]) == {("_native_live_page_ids", False)}
