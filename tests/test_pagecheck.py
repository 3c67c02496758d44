"""The native live-page check (`unicache_fsm._pagecheck`) against its definition and
against the allocator's Python paths.

`PagedAllocator.live_page_ids` / `live_pages` run the native check first where it was
built (`paged.NATIVE_CHECK`) and fall back to the Python paths for anything it refuses.
Here the native function is held to a plain definition (whole pages, inside the pool,
allocated, named once) on drawn slot lists, with the flag bytes it marks while it runs
left as they were; and the allocator answers, or raises, the same with the native check
on and off.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.pools import PagedAllocator, paged
from unicache_fsm.pools import slots as slots_module
from unicache_fsm.pools.errors import (
    DuplicatePagesError,
    ForeignSlotsError,
    PoolError,
    SlotsNotAllocatedError,
    TensorShapeError,
    TensorTypeError,
    UnalignedSlotsError,
)

try:
    from unicache_fsm import _pagecheck
except ImportError:  # pragma: no cover - built without a C compiler
    _pagecheck = None  # type: ignore[assignment]

needs_native = pytest.mark.skipif(_pagecheck is None, reason="the native check was not built")


def definition(slots: list[int], p: int, num_pages: int, free: set[int]) -> list[int] | None:
    if len(slots) % p:
        return None
    ids = []
    for i in range(0, len(slots), p):
        page = slots[i : i + p]
        k, r = divmod(page[0], p)
        if r or page != list(range(page[0], page[0] + p)) or not 1 <= k <= num_pages:
            return None
        ids.append(k)
    if free.intersection(ids) or len(set(ids)) != len(ids):
        return None
    return ids


@st.composite
def cases(draw: st.DrawFn) -> tuple[PagedAllocator, list[int]]:
    p = draw(st.sampled_from([1, 2, 4, 16]), label="page size")
    num_pages = draw(st.integers(1, 24), label="pages")
    alloc = PagedAllocator(num_pages * p, p)
    taken = alloc.alloc(draw(st.integers(0, num_pages), label="allocated pages") * p)
    assert taken is not None
    if taken.numel():
        ids = [s // p for s in taken[::p].tolist()]
        back = draw(st.lists(st.sampled_from(ids), unique=True), label="freed")
        if back:
            alloc.free(torch.tensor([k * p + o for k in back for o in range(p)]))
    pages = draw(st.lists(st.integers(-2, num_pages + 2), max_size=8), label="pages named")
    slots = [k * p + o for k in pages for o in range(p)]
    if slots and draw(st.booleans(), label="break one slot"):
        at = draw(st.integers(0, len(slots) - 1))
        slots[at] += draw(st.sampled_from([-1, 1, p, -(2**40), 2**40]))
    if slots and draw(st.booleans(), label="drop the last slot"):
        slots.pop()
    return alloc, slots


def free_set(alloc: PagedAllocator) -> set[int]:
    return set(alloc.free_page_ids().tolist())


@needs_native
@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_native_check_is_the_definition_and_leaves_the_flags(
    case: tuple[PagedAllocator, list[int]],
) -> None:
    assert _pagecheck is not None
    alloc, slots = case
    flags = alloc._free_flags  # the allocator's own flag bytes (what the native call marks)
    assert flags is not None
    before = bytes(flags)
    t = torch.tensor(slots, dtype=torch.int64)
    got = _pagecheck.live_page_ids(t.numpy(), alloc.page_size, alloc.size // alloc.page_size, flags)
    assert got == definition(slots, alloc.page_size, alloc.size // alloc.page_size, free_set(alloc))
    assert bytes(flags) == before


@needs_native
@settings(max_examples=300, deadline=None)
@given(case=cases(), pad=st.integers(0, 3), packed=st.booleans())
def test_native_check_by_address_answers_as_by_buffer(
    case: tuple[PagedAllocator, list[int]], pad: int, packed: bool
) -> None:
    """`live_page_ids_at` over a tensor's memory (a view with a storage offset too)
    answers what `live_page_ids` answers over its NumPy view, and leaves the flags."""
    assert _pagecheck is not None
    alloc, slots = case
    flags = alloc._free_flags
    assert flags is not None
    before = bytes(flags)
    t = torch.tensor([7] * pad + slots, dtype=torch.int64)[pad:]  # storage offset `pad`
    p, num_pages = alloc.page_size, alloc.size // alloc.page_size
    want = _pagecheck.live_page_ids(t.numpy(), p, num_pages, flags, packed)
    got = _pagecheck.live_page_ids_at(t.data_ptr(), t.numel(), p, num_pages, flags, packed)
    assert got == want
    assert bytes(flags) == before


@needs_native
@pytest.mark.parametrize(
    ("address", "count"),
    [(0, 4), (8, -1), (12, 4), (2**64 - 4, 4)],
)
def test_native_check_by_address_refuses_a_null_misaligned_or_negative_span(
    address: int, count: int
) -> None:
    assert _pagecheck is not None
    flags = bytearray(9)
    with pytest.raises(ValueError, match="address"):
        _pagecheck.live_page_ids_at(address, count, 1, 8, flags)
    assert flags == bytearray(9)


@needs_native
@pytest.mark.parametrize(
    ("address", "error"), [(-8, OverflowError), (2**64, OverflowError), (8.0, TypeError)]
)
def test_native_check_by_address_refuses_what_is_no_address(
    address: object, error: type[Exception]
) -> None:
    """A negative or too large int is never wrapped into an address; a float is none."""
    assert _pagecheck is not None
    with pytest.raises(error):
        _pagecheck.live_page_ids_at(address, 4, 1, 8, bytearray(9))  # type: ignore[arg-type]


@needs_native
def test_native_check_by_address_reads_nothing_for_no_slots_or_a_partial_page() -> None:
    """An empty span is no pages (its address is never read, even null); a span that
    is not a whole number of pages is refused (None) before any slot is read."""
    assert _pagecheck is not None
    flags = bytearray(9)
    assert _pagecheck.live_page_ids_at(0, 0, 4, 8, flags) == []
    assert _pagecheck.live_page_ids_at(0, 0, 4, 8, flags, True) == b""
    t = torch.arange(4, 7, dtype=torch.int64)
    assert _pagecheck.live_page_ids_at(t.data_ptr(), 3, 4, 8, flags) is None
    with pytest.raises(ValueError, match="page_size"):
        _pagecheck.live_page_ids_at(t.data_ptr(), 3, 0, 8, flags)


def outcome(alloc: PagedAllocator, t: torch.Tensor) -> Any:
    try:
        return alloc.live_page_ids(t, "slots")
    except PoolError as exc:
        return type(exc), str(exc)


@settings(max_examples=200, deadline=None)
@given(case=cases())
def test_the_allocator_answers_alike_with_the_native_check_on_and_off(
    case: tuple[PagedAllocator, list[int]],
) -> None:
    alloc, slots = case
    t = torch.tensor(slots, dtype=torch.int64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paged, "NATIVE_CHECK", False)
        python = outcome(alloc, t)
    assert outcome(alloc, t) == python
    if not isinstance(python, list):
        assert python[0] in {  # the Python paths name the culprit
            SlotsNotAllocatedError,
            DuplicatePagesError,
            UnalignedSlotsError,
            ForeignSlotsError,
        }


@settings(max_examples=150, deadline=None)
@given(case=cases(), data=st.data())
def test_a_start_offset_checks_the_slots_past_it_as_a_slice_would(
    case: tuple[PagedAllocator, list[int]], data: st.DataObject
) -> None:
    """``live_page_ids(t, what, start)`` and ``live_page_array`` answer (ids or the same
    typed error) as ``live_page_ids(t[start:], what)``, with the native check on and
    off: the tree checks an insert's value past its prefix without slicing it, and
    keeps the ids as one array."""
    alloc, slots = case
    t = torch.tensor([*range(10**6, 10**6 + 8), *slots], dtype=torch.int64)  # a head
    start = data.draw(st.sampled_from([0, 8, len(t)]), label="start")

    def with_start(alloc: PagedAllocator) -> Any:
        try:
            return alloc.live_page_ids(t, "slots", start)
        except PoolError as exc:
            return type(exc), str(exc)

    def as_array(alloc: PagedAllocator) -> Any:
        try:
            return alloc.live_page_array(t, "slots", start).tolist()
        except PoolError as exc:
            return type(exc), str(exc)

    for native in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(paged, "NATIVE_CHECK", native)
            want = outcome(alloc, t[start:])
            assert with_start(alloc) == want, (native, start)
            assert as_array(alloc) == want, (native, start)  # the ids as array('q')


@pytest.mark.parametrize("start", [-1, 9, 2.5, "1", None, False, 0.0, ""])
def test_a_start_outside_the_slots_is_a_typed_error(start: Any) -> None:
    alloc = PagedAllocator(64, 1)
    t = alloc.alloc(8)
    assert t is not None
    with pytest.raises(TensorShapeError, match="start"):
        alloc.live_page_ids(t, "slots", start)
    with pytest.raises(TensorShapeError, match="start"):
        alloc.live_page_array(t, "slots", start)
    assert alloc.live_page_ids(t, "slots", 8) == []


@pytest.mark.parametrize("p", [1, 4])
def test_strided_negative_bit_and_empty_slot_tensors(p: int) -> None:
    """A strided view (NumPy hands the native call no contiguous buffer), a tensor with
    a negative bit (read through a resolved copy) and an empty tensor answer as the
    Python paths do."""
    alloc = PagedAllocator(64 * p, p)
    slots = alloc.alloc(8 * p)
    assert slots is not None
    spread = torch.stack([slots, torch.zeros_like(slots)], dim=1).reshape(-1)[::2]
    negated = torch._neg_view(-slots)
    for t in (spread, negated, slots[:0]):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(paged, "NATIVE_CHECK", False)
            python = outcome(alloc, t)
        assert outcome(alloc, t) == python
    assert outcome(alloc, spread) == list(range(1, 9))
    assert outcome(alloc, negated) == list(range(1, 9))


@needs_native
@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((torch.zeros(4, dtype=torch.int64).numpy(), 0, 4, bytearray(5)), ValueError),
        ((torch.zeros(4, dtype=torch.int64).numpy(), 1, 8, bytearray(5)), ValueError),
        ((torch.zeros(4, dtype=torch.int64).numpy(), 1, 4, b"\x00" * 5), BufferError),
        (("1234", 1, 4, bytearray(5)), TypeError),
    ],
)
def test_native_refuses_bad_arguments(args: tuple[Any, ...], error: type[Exception]) -> None:
    assert _pagecheck is not None
    with pytest.raises(error):
        _pagecheck.live_page_ids(*args)


@needs_native
def test_native_answers_none_for_slots_that_are_not_int64() -> None:
    assert _pagecheck is not None
    for t in (torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1.0, 2.0])):
        assert _pagecheck.live_page_ids(t.numpy(), 1, 4, bytearray(5)) is None


@pytest.mark.parametrize("native", [True, False])
def test_a_sparse_slot_tensor_is_a_typed_error(native: bool) -> None:
    """A sparse int64 slot tensor raised a bare RuntimeError on the Python paths (no
    storage) and a TypeError on the native one (NumPy cannot view it); now
    TensorTypeError naming the layout on both, nothing changed."""
    alloc = PagedAllocator(64 * 2, 2)
    slots = alloc.alloc(8)
    assert slots is not None
    before = alloc.free_page_ids().tolist()
    sparse = slots.to_sparse()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paged, "NATIVE_CHECK", native)
        for call in (alloc.live_page_ids, alloc.check_live, alloc.free):
            with pytest.raises(TensorTypeError, match="layout") as info:
                call(sparse)
            assert info.value.got == torch.sparse_coo
    assert alloc.free_page_ids().tolist() == before


@needs_native
def test_a_page_count_at_the_top_of_the_range_is_refused_not_read_past_the_flags() -> None:
    """``num_pages + 1`` overflowed at num_pages = 2**63 - 1, so two flag bytes passed the
    length check and page ids far past them were read and marked (a crash). Run in a
    child process, so that a regression fails this test instead of killing the run."""
    probe = textwrap.dedent(
        """
        import numpy as np
        from unicache_fsm import _pagecheck
        for slots in ([2, 3], [10**12]):
            flags = bytearray(2)
            try:
                _pagecheck.live_page_ids(np.array(slots, dtype=np.int64), 1, 2**63 - 1, flags)
            except ValueError as exc:
                assert "fewer than num_pages + 1" in str(exc), exc
            else:
                raise SystemExit("accepted")
            assert flags == bytearray(2)
        print("refused")
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "refused"), done.stderr[-2000:]


@pytest.mark.parametrize("start", [0, 4, 8])
def test_a_start_of_another_integer_type_is_its_value(start: int) -> None:
    """A NumPy integer start (an insert's ``prev_prefix_len`` may be one) checks the
    slots past it as the same int does, on both ids forms."""
    alloc = PagedAllocator(64, 4)
    t = alloc.alloc(8)
    assert t is not None
    want = alloc.live_page_ids(t, "slots", start)
    assert want == [s // 4 for s in t[start::4].tolist()]
    assert alloc.live_page_ids(t, "slots", np.int64(start)) == want
    assert alloc.live_page_array(t, "slots", np.int64(start)).tolist() == want


@pytest.mark.parametrize("native", [True, False])
def test_a_misaligned_slot_tensor_is_answered_as_an_aligned_one(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A contiguous int64 tensor whose memory is not 8-byte aligned (``torch.frombuffer``
    at a byte offset) is answered by every path as its aligned copy is: the native check
    by address does not apply to it, and it must not turn it into a ValueError."""
    monkeypatch.setattr(slots_module, "NATIVE_DECODE", native)
    monkeypatch.setattr(paged, "NATIVE_CHECK", native)
    alloc = PagedAllocator(64, 4)
    slots = alloc.alloc(8)
    t = torch.frombuffer(bytearray(8 * 8 + 1), dtype=torch.int64, offset=1, count=8)
    t.copy_(slots)
    assert t.data_ptr() % 8 and t.is_contiguous()
    assert alloc.live_page_ids(t) == alloc.live_page_ids(slots.clone())
    assert list(alloc.live_page_array(t)) == alloc.live_page_ids(slots.clone())
    codec = alloc.codec
    assert codec.to_pages(t, "x").tolist() == codec.to_pages(slots.clone(), "x").tolist()
    assert codec.page_list(t, "x") == codec.page_list(slots.clone(), "x")
    assert alloc.live_pages(t, what="x", freeing=False).tolist() == alloc.live_page_ids(slots)


@pytest.mark.parametrize(
    "make",
    [
        lambda s: s.to(torch.int32),  # half the bytes: read as int64, past its end
        lambda s: s.view(torch.float64),  # the same bytes, not int64 values
        lambda s: s.to("meta"),  # no memory at all
    ],
)
def test_the_native_decode_never_reads_a_tensor_that_is_not_cpu_int64(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`native_live_page_ids` (public) and the codec's public calls, handed a tensor of
    another dtype or device by mistake, answer as with the native decode off: no read
    of its memory as int64 slots (past its end, or at no address)."""
    alloc = PagedAllocator(64, 4)
    t = make(alloc.alloc(8))
    flags = bytearray(17)
    assert slots_module.native_live_page_ids(t, 0, 4, 16, flags, False) is None
    assert flags == bytearray(17)
    codec = alloc.codec

    def answers() -> list[Any]:
        out = []
        for call in (codec.to_pages, codec.page_list, codec.to_pages_once):
            try:
                got = call(t, "x")
                out.append(("ok", repr(got)))
            except Exception as exc:
                out.append((type(exc).__name__, str(exc)))
        return out

    native = answers()
    monkeypatch.setattr(slots_module, "NATIVE_DECODE", False)
    assert native == answers()
