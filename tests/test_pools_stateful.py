"""Hypothesis state machines over PagedAllocator and SWAAllocator, each beside a set model.

Rules are the allocators' operations; preconditions say when an operation is legal
(never `assume`); "bad input" rules feed a mistake and demand the exact error type
and an unchanged allocator. Invariants run after every step:

- free pages ⊎ allocated pages = every page 1 .. N, with no page (so no slot) twice;
- page 0 is never handed out; the allocated set equals the model's;
- (SWA) a free FULL slot maps to 0; every non-zero mapping points at an allocated
  SWA slot, no SWA slot twice; the mapping tensor equals the model slot for slot.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from pool_strategies import (
    PagedSnapshot,
    page_sizes,
    pages_in,
    slots_of,
    snapshot,
    swa_snapshot,
)
from unicache_fsm.pools import (
    DoubleFreeError,
    DuplicatePagesError,
    ForeignSlotsError,
    LengthMismatchError,
    NotPageMultipleError,
    PagedAllocator,
    SlotsNotAllocatedError,
    SWAAllocator,
    TensorShapeError,
    TensorTypeError,
    UnalignedSlotsError,
)

# Scaled from the active profile (tests/conftest.py): ~50 programs of 30 steps on "ci".
STATEFUL = settings(
    max_examples=max(10, settings.default.max_examples // 2),
    stateful_step_count=30,
    deadline=None,
)


def some_of(pages: set[int]) -> st.SearchStrategy[list[int]]:
    """A non-empty list of distinct pages from `pages`, in any order."""
    return st.lists(st.sampled_from(sorted(pages)), min_size=1, max_size=6, unique=True)


def assert_refused(
    take_snapshot: Callable[[], object],
    call: Callable[..., object],
    error: type[Exception],
    *args: object,
) -> None:
    """`call(*args)` must raise exactly `error` and leave the snapshot unchanged."""
    before = take_snapshot()
    try:
        call(*args)
    except error as exc:
        assert type(exc) is error, f"expected {error.__name__}, got {type(exc).__name__}"
    else:
        raise AssertionError(f"expected {error.__name__}, nothing was raised")
    assert take_snapshot() == before, "a refused call changed the allocator"


def check_paged(a: PagedAllocator, model_live: set[int]) -> None:
    snap = snapshot(a)
    free, allocated = set(snap.free), set(snap.allocated)
    assert len(free) == len(snap.free), "a page is free twice"
    assert len(allocated) == len(snap.allocated), "a page is allocated twice"
    assert not free & allocated, "a page is both free and allocated"
    assert free | allocated == set(range(1, a.num_pages + 1)), "pages lost or invented"
    assert 0 not in allocated, "page 0 was handed out"
    assert allocated == model_live, "allocator and model disagree on what is out"
    assert snap.available == len(free) * a.page_size


class PagedAllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.a = PagedAllocator(0, 1)
        self.p = 1
        self.live: set[int] = set()

    @initialize(page_size=page_sizes, num_pages=st.integers(0, 12))
    def build(self, page_size: int, num_pages: int) -> None:
        self.a = PagedAllocator(num_pages * page_size, page_size)
        self.p = page_size
        self.live = set()

    @property
    def free(self) -> set[int]:
        return set(range(1, self.a.num_pages + 1)) - self.live

    def refused(self, call: Callable[..., object], error: type[Exception], *args: object) -> None:
        assert_refused(lambda: snapshot(self.a), call, error, *args)

    # -- legal operations ---------------------------------------------------------------

    @rule(num_pages=st.integers(0, 5))
    def alloc(self, num_pages: int) -> None:
        before = snapshot(self.a)
        got = self.a.alloc(num_pages * self.p)
        if num_pages > len(self.free):
            assert got is None
            assert snapshot(self.a) == before
            return
        assert got is not None
        assert got.dtype == torch.int64
        pages = pages_in(got, self.p)
        assert len(pages) == num_pages
        assert set(pages) <= self.free
        assert len(set(pages)) == len(pages)
        self.live |= set(pages)

    @rule(extra=st.integers(1, 3))
    def alloc_more_than_free_is_none(self, extra: int) -> None:
        before = snapshot(self.a)
        assert self.a.alloc((len(self.free) + extra) * self.p) is None
        assert snapshot(self.a) == before

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free_pages(self, data: st.DataObject) -> None:
        pages = data.draw(some_of(self.live), label="pages to free")
        self.a.free(slots_of(pages, self.p))
        self.live -= set(pages)

    # -- bad input --------------------------------------------------------------------

    @rule(data=st.data())
    def bad_free_is_refused(self, data: st.DataObject) -> None:
        """A mistaken free (the kinds that apply now) raises its type and changes nothing."""
        kinds = ["foreign"]
        if self.free:
            kinds.append("already free")
        if self.live:
            kinds += ["twice in one call", "int32", "float64", "2-D"]
            if self.p > 1:
                kinds += ["partial page", "rotated page", "shifted page"]
        kind = data.draw(st.sampled_from(kinds), label="mistake")
        live = sorted(self.live)
        good = data.draw(st.lists(st.sampled_from(live), max_size=2, unique=True)) if live else []
        if kind == "foreign":
            n = self.a.num_pages
            bad = data.draw(st.sampled_from([0, -1, n + 1, n + 7]), label="page")
            self.refused(self.a.free, ForeignSlotsError, slots_of([*good, bad], self.p))
        elif kind == "already free":
            bad = data.draw(st.sampled_from(sorted(self.free)), label="free page")
            self.refused(self.a.free, DoubleFreeError, slots_of([*good, bad], self.p))
        elif kind == "twice in one call":
            pages = data.draw(some_of(self.live), label="pages")
            self.refused(self.a.free, DoubleFreeError, slots_of([*pages, pages[0]], self.p))
        elif kind in ("int32", "float64"):
            dtype = torch.int32 if kind == "int32" else torch.float64
            self.refused(self.a.free, TensorTypeError, slots_of(live[:1], self.p).to(dtype))
        elif kind == "2-D":
            self.refused(self.a.free, TensorShapeError, slots_of(live[:1], self.p).view(1, -1))
        else:
            page = data.draw(st.sampled_from(live), label="page")
            slots = self.unaligned(page, kind, data)
            # Shifting the last page up leaves the pool: foreign is reported before unaligned.
            outside = int(slots.max()) >= self.a.num_slots
            self.refused(self.a.free, ForeignSlotsError if outside else UnalignedSlotsError, slots)

    def unaligned(self, page: int, kind: str, data: st.DataObject) -> torch.Tensor:
        """The slots of `page`, broken the way `kind` says."""
        slots = slots_of([page], self.p)
        k = data.draw(st.integers(1, self.p - 1), label="by")
        if kind == "partial page":
            return slots[:k]
        if kind == "rotated page":
            return torch.roll(slots, k)
        return slots - k if page > 1 else slots + k

    @precondition(lambda self: self.p > 1)
    @rule(num_pages=st.integers(0, 3), data=st.data())
    def alloc_partial_page_is_refused(self, num_pages: int, data: st.DataObject) -> None:
        rest = data.draw(st.integers(1, self.p - 1), label="rest")
        self.refused(self.a.alloc, NotPageMultipleError, num_pages * self.p + rest)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def conservation(self) -> None:
        check_paged(self.a, self.live)


class SWAAllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.a = SWAAllocator(0, 0, 1)
        self.p = 1
        self.full: set[int] = set()
        self.swa: set[int] = set()
        self.mapping: dict[int, int] = {}  # FULL page -> SWA page

    @initialize(page_size=page_sizes, full_pages=st.integers(1, 10), swa_pages=st.integers(1, 6))
    def build(self, page_size: int, full_pages: int, swa_pages: int) -> None:
        self.a = SWAAllocator(full_pages * page_size, swa_pages * page_size, page_size)
        self.p = page_size
        self.full, self.swa, self.mapping = set(), set(), {}

    @property
    def full_free(self) -> set[int]:
        return set(range(1, self.a.full_size // self.p + 1)) - self.full

    @property
    def swa_free(self) -> set[int]:
        return set(range(1, self.a.swa_size // self.p + 1)) - self.swa

    def slots(self, pages: list[int]) -> torch.Tensor:
        return slots_of(pages, self.p)

    def refused(self, call: Callable[..., object], error: type[Exception], *args: object) -> None:
        assert_refused(lambda: swa_snapshot(self.a), call, error, *args)

    def unmap_full(self, pages: list[int]) -> None:
        for f in pages:
            self.mapping.pop(f, None)

    # -- legal operations ---------------------------------------------------------------

    @rule(num_pages=st.integers(0, 4))
    def alloc(self, num_pages: int) -> None:
        got = self.a.alloc(num_pages * self.p)
        if num_pages > len(self.full_free):
            assert got is None
            return
        assert got is not None
        pages = pages_in(got, self.p)
        assert set(pages) <= self.full_free
        self.full |= set(pages)

    @rule(num_pages=st.integers(0, 3))
    def alloc_swa(self, num_pages: int) -> None:
        got = self.a.alloc_swa(num_pages * self.p)
        if num_pages > len(self.swa_free):
            assert got is None
            return
        assert got is not None
        pages = pages_in(got, self.p)
        assert set(pages) <= self.swa_free
        self.swa |= set(pages)

    @precondition(lambda self: self.full and self.swa)
    @rule(data=st.data())
    def set_mapping(self, data: st.DataObject) -> None:
        k = data.draw(st.integers(1, min(len(self.full), len(self.swa))), label="pages")
        fulls = data.draw(st.permutations(sorted(self.full)), label="full order")[:k]
        swas = data.draw(st.permutations(sorted(self.swa)), label="swa order")[:k]
        self.a.set_full_to_swa_mapping(self.slots(fulls), self.slots(swas))
        for f, s in zip(fulls, swas, strict=True):
            self.mapping.pop(f, None)
            for other in [g for g, t in self.mapping.items() if t == s]:
                del self.mapping[other]
            self.mapping[f] = s

    @rule(data=st.data())
    def translate(self, data: st.DataObject) -> None:
        probe = data.draw(
            st.lists(st.integers(0, self.a.full_num_slots - 1), max_size=8), label="slots"
        )
        got = self.a.translate(torch.tensor(probe, dtype=torch.int64)).tolist()
        expected = [
            self.mapping[s // self.p] * self.p + s % self.p if s // self.p in self.mapping else 0
            for s in probe
        ]
        assert got == expected

    @precondition(lambda self: self.full)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        pages = data.draw(some_of(self.full), label="full pages")
        self.a.free(self.slots(pages))
        self.full -= set(pages)
        self.swa -= {self.mapping[f] for f in pages if f in self.mapping}
        self.unmap_full(pages)

    @precondition(lambda self: self.full)
    @rule(data=st.data())
    def free_full_only(self, data: st.DataObject) -> None:
        pages = data.draw(some_of(self.full), label="full pages")
        self.a.free_full_only(self.slots(pages))
        self.full -= set(pages)
        self.unmap_full(pages)

    @precondition(lambda self: self.full)
    @rule(data=st.data())
    def free_mapped_swa(self, data: st.DataObject) -> None:
        pages = data.draw(some_of(self.full), label="full pages")
        self.a.free_mapped_swa(self.slots(pages))
        self.swa -= {self.mapping[f] for f in pages if f in self.mapping}
        self.unmap_full(pages)

    @precondition(lambda self: self.swa)
    @rule(data=st.data())
    def free_swa(self, data: st.DataObject) -> None:
        pages = data.draw(some_of(self.swa), label="swa pages")
        self.a.free_swa(self.slots(pages))
        self.swa -= set(pages)
        for f in [f for f, s in self.mapping.items() if s in pages]:
            del self.mapping[f]

    # -- bad input --------------------------------------------------------------------

    @precondition(lambda self: self.full and self.swa)
    @rule(data=st.data())
    def bad_mapping_is_refused(self, data: st.DataObject) -> None:
        """A mistaken mapping (the kinds that apply now) raises and changes nothing."""
        kinds = ["lengths differ", "SWA page 0"]
        if self.full_free:
            kinds.append("free FULL page")
        if self.swa_free:
            kinds.append("free SWA page")
        if len(self.full) >= 2:
            kinds.append("SWA page twice")
        kind = data.draw(st.sampled_from(kinds), label="mistake")
        fulls = data.draw(some_of(self.full), label="full pages")
        swas = data.draw(some_of(self.swa), label="swa pages")
        k = min(len(fulls), len(swas))
        fulls, swas = fulls[:k], swas[:k]
        error: type[Exception]
        if kind == "lengths differ":
            swas, error = swas[:-1], LengthMismatchError
        elif kind == "SWA page 0":
            swas, error = [*swas[:-1], 0], ForeignSlotsError
        elif kind == "free FULL page":
            bad = data.draw(st.sampled_from(sorted(self.full_free)), label="free full page")
            fulls, error = [*fulls[:-1], bad], SlotsNotAllocatedError
        elif kind == "free SWA page":
            bad = data.draw(st.sampled_from(sorted(self.swa_free)), label="free swa page")
            swas, error = [*swas[:-1], bad], SlotsNotAllocatedError
        else:
            fulls = data.draw(st.permutations(sorted(self.full)), label="full")[:2]
            swas, error = [swas[0], swas[0]], DuplicatePagesError
        self.refused(self.a.set_full_to_swa_mapping, error, self.slots(fulls), self.slots(swas))

    @rule(data=st.data())
    def bad_free_is_refused(self, data: st.DataObject) -> None:
        """A mistaken free or translate raises its type and changes nothing."""
        kinds = ["page 0", "translate past the end"]
        if self.full_free:
            kinds += ["FULL double free", "FULL-only double free", "tombstone of a free page"]
        if self.swa_free:
            kinds.append("SWA double free")
        kind = data.draw(st.sampled_from(kinds), label="mistake")
        full_free, swa_free = sorted(self.full_free), sorted(self.swa_free)
        some_full, some_swa = sorted(self.full)[:2], sorted(self.swa)[:2]
        if kind == "page 0":
            op = data.draw(
                st.sampled_from(["free", "free_full_only", "free_mapped_swa", "free_swa"])
            )
            self.refused(getattr(self.a, op), ForeignSlotsError, self.slots([0]))
        elif kind == "translate past the end":
            bad = torch.tensor([self.a.full_num_slots], dtype=torch.int64)
            self.refused(self.a.translate, ForeignSlotsError, bad)
        elif kind == "SWA double free":
            bad = data.draw(st.sampled_from(swa_free), label="free swa page")
            self.refused(self.a.free_swa, DoubleFreeError, self.slots([*some_swa, bad]))
        else:
            bad = data.draw(st.sampled_from(full_free), label="free full page")
            slots = self.slots([*some_full, bad])
            if kind == "FULL double free":
                self.refused(self.a.free, DoubleFreeError, slots)
            elif kind == "FULL-only double free":
                self.refused(self.a.free_full_only, DoubleFreeError, slots)
            else:
                self.refused(self.a.free_mapped_swa, SlotsNotAllocatedError, slots)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def conservation(self) -> None:
        snap = swa_snapshot(self.a)
        for pool_snap, live, n in (
            (snap.full, self.full, self.a.full_size // self.p),
            (snap.swa, self.swa, self.a.swa_size // self.p),
        ):
            assert isinstance(pool_snap, PagedSnapshot)
            free, allocated = set(pool_snap.free), set(pool_snap.allocated)
            assert len(free) == len(pool_snap.free)
            assert not free & allocated
            assert free | allocated == set(range(1, n + 1))
            assert 0 not in allocated
            assert allocated == live
            assert pool_snap.available == len(free) * self.p

    @invariant()
    def free_full_slots_map_to_zero(self) -> None:
        mapping = self.a.full_to_swa_mapping
        free_full = self.a.free_page_ids()
        if free_full.numel():
            assert int(mapping[slots_of(free_full.tolist(), self.p)].abs().sum()) == 0
        assert int(mapping[: self.p].abs().sum()) == 0, "page 0 must map to 0"

    @invariant()
    def live_mappings_point_at_allocated_swa_slots(self) -> None:
        values = self.a.full_to_swa_mapping
        live = values[values != 0].tolist()
        assert len(set(live)) == len(live), "two FULL slots share an SWA slot"
        allocated = set(self.a.swa_allocated_page_ids().tolist())
        assert {s // self.p for s in live} <= allocated

    @invariant()
    def mapping_equals_the_model(self) -> None:
        expected = torch.zeros(self.a.full_num_slots, dtype=torch.int64)
        if self.mapping:
            fulls = sorted(self.mapping)
            expected[slots_of(fulls, self.p)] = slots_of([self.mapping[f] for f in fulls], self.p)
        assert torch.equal(self.a.full_to_swa_mapping, expected)


PagedAllocatorMachine.TestCase.settings = STATEFUL
SWAAllocatorMachine.TestCase.settings = STATEFUL
TestPagedAllocatorMachine = PagedAllocatorMachine.TestCase
TestSWAAllocatorMachine = SWAAllocatorMachine.TestCase
