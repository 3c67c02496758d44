"""Slot tensors <-> page ids, validated with vectorised torch ops only.

Every pool operation that takes slots goes through one `SlotCodec`, so a caller's
mistake is reported the same way everywhere and before anything is mutated:

- `check_index_tensor(t, what)` -> t: a 1-D int64 tensor on the pool's device, else
  `TensorTypeError` / `DeviceMismatchError` / `TensorShapeError`.
- `to_pages(slots, what)` -> page ids (int64, one per page, caller's order): `slots`
  must be whole pages ``[k*P, ..., k*P + P - 1]`` of usable pages 1 .. num_pages, else
  `ForeignSlotsError` (outside the pool, page 0 included) or `UnalignedSlotsError`.
- `to_pages_once(slots, what)` -> `to_pages`, and whether the ids are known to be
  distinct (the native decode proved it), so a caller that refuses repeats skips
  `has_duplicates`.
- `to_slots(pages)` -> the slots of those pages, page after page.
- `duplicate_pages(pages)` -> the page ids that occur more than once (sorted, unique).

The happy path costs a handful of tensor ops and one host sync per call, whatever the
number of pages; the diagnosis that names culprits runs only once a check failed. Up to
`SMALL_SLOTS` slots the same checks run in Python over one `tolist()` copy instead
(`page_list`; `to_pages` does so at P > 1): at that size a tensor op's fixed cost
dominates, and a few small tensor ops cost more than a Python pass over the values.
From `NUMPY_PAGES` pages on, a CPU tensor at P > 1 is checked by a few NumPy operations
over its memory instead of a Python pass per slot, and the list path then serves up to
`SMALL_SLOTS` pages (`checks_in_python`). Where the optional C extension
``unicache_fsm._pagecheck`` was built (`NATIVE_DECODE`), a C-contiguous CPU slot
tensor is decoded first by one native call (`live_page_ids` over flag bytes that mark
no page free), which answers the page ids when the slots are whole pages inside the
pool and name no page twice; anything it refuses (a repeated page included, which
`to_pages` accepts) goes to the paths above, which answer or name the culprits. Every
path accepts and rejects exactly the same inputs and raises the same errors.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np
import torch

from unicache_fsm.pools.errors import (
    DeviceMismatchError,
    ForeignSlotsError,
    TensorShapeError,
    TensorTypeError,
    UnalignedSlotsError,
)
from unicache_fsm.pools.layout import PageLayout

__all__ = [
    "HAVE_NATIVE_CHECK",
    "NATIVE_DECODE",
    "NUMPY_PAGES",
    "SLOT_TABLE_SLOTS",
    "SMALL_SLOTS",
    "SlotCodec",
    "int64_tensor",
    "live_page_slots_np",
    "native_live_page_ids",
    "numpy_view",
    "page_slots_np",
    "preview",
    "whole_page_ids",
]

_PREVIEW = 8

#: Up to this many slots (or page ids) the checks run in Python over `tolist()`
#: (measured on 2 shared cores: the Python ownership check costs less than the tensor
#: one up to about 200 pages at P = 1 and 500 slots at P = 16).
SMALL_SLOTS = 256

#: From this many pages on, `page_list` checks a CPU slot tensor at P > 1 with a few
#: NumPy operations over its memory (a fixed cost) instead of a Python pass per slot.
NUMPY_PAGES = 8


# `_pagecheck.live_page_ids` (see there): the page ids of whole, live, distinct pages;
# `live_page_ids_at` the same over a contiguous tensor's memory by its address
_native_live_page_ids: Callable[..., Any] | None
_native_live_page_ids_at: Callable[..., Any] | None
try:
    from unicache_fsm._pagecheck import live_page_ids as _native_live_page_ids
    from unicache_fsm._pagecheck import live_page_ids_at as _native_live_page_ids_at
except ImportError:  # pragma: no cover - built without a C compiler
    _native_live_page_ids = _native_live_page_ids_at = None

HAVE_NATIVE_CHECK: bool = _native_live_page_ids is not None
"""Whether ``unicache_fsm._pagecheck`` was built (`native_live_page_ids` answers)."""

NATIVE_DECODE: bool = HAVE_NATIVE_CHECK
"""Whether CPU slot tensors are decoded first in native code (``unicache_fsm._pagecheck``);
read at each call, so a test may turn it off to run the NumPy and Python paths alone."""


def native_live_page_ids(
    t: torch.Tensor, start: int, page_size: int, num_pages: int, flags: bytearray, packed: bool
) -> Any:
    """`_pagecheck.live_page_ids` over ``t[start:]`` (a checked CPU int64 slot tensor,
    `flags` one byte per page, 1 = free): the page ids (a list, or with `packed` their
    int64 bytes) when the slots are whole, distinct pages of 1 .. `num_pages` none of
    which is flagged; else None, as where the extension was not built. A contiguous
    tensor is read by its memory's address, held here through the call (`Tensor.numpy`
    costs more than the check of a few pages) when that is 8-byte aligned; any other
    (``torch.frombuffer`` at an odd byte offset, say) through its NumPy view. A tensor
    of another dtype or device (a caller's mistake) is None, its memory never read."""
    if _native_live_page_ids is None or _native_live_page_ids_at is None:
        return None
    if t.dtype != torch.int64 or not t.is_cpu:  # (not slots to read: the caller decides)
        return None
    address = t.data_ptr() + 8 * start
    if t.is_contiguous() and not t.is_neg() and not address % 8:  # (else: by its view)
        count = t.numel() - start
        return _native_live_page_ids_at(address, count, page_size, num_pages, flags, packed)
    view = numpy_view(t)
    if start:
        view = view[start:]
    return _native_live_page_ids(view, page_size, num_pages, flags, packed)


def preview(values: list[int]) -> str:
    """At most eight values for a message, with a count of the rest."""
    head = ", ".join(str(v) for v in values[:_PREVIEW])
    more = len(values) - _PREVIEW
    return f"[{head}, ... {more} more]" if more > 0 else f"[{head}]"


def int64_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """`values` as a 1-D int64 tensor on `device`; on CPU it views an `array("q")` (a third
    of `torch.tensor`'s cost for a short list)."""
    if device.type == "cpu" and values:
        return torch.frombuffer(array("q", values), dtype=torch.int64)
    return torch.tensor(values, dtype=torch.int64, device=device)


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """The values of a CPU tensor as a NumPy array: a view of its memory, or a copy
    when the tensor carries a negative or conjugate bit (which NumPy cannot view)."""
    try:
        return t.numpy()
    except RuntimeError:
        return t.resolve_neg().resolve_conj().numpy()


_OFFSETS: dict[int, np.ndarray] = {}


def _offsets_np(p: int, n: int) -> np.ndarray:
    """The slot offsets within a page (0 .. p-1) repeated over `n` slots (a multiple of
    `p`), as a read-only int64 array; one per page size, grown on demand."""
    row = _OFFSETS.get(p)
    if row is None or len(row) < n:
        pages = max(-(-n // p), SMALL_SLOTS)
        row = np.tile(np.arange(p, dtype=np.int64), pages)
        row.flags.writeable = False
        _OFFSETS[p] = row
    return row[:n]


def page_slots_np(ids: np.ndarray, p: int) -> np.ndarray:
    """The slots of the page ids `ids` (1-D int64, any strides), page after page, each
    page's slots ascending, as a fresh C-contiguous array (never a view of `ids`)."""
    if p == 1:
        return ids.copy()
    slots: np.ndarray = (ids[:, None] * p + _offsets_np(p, p)).ravel()
    return slots


#: `live_page_slots_np` reads pools of up to this many slots (page 0 included) from one
#: shared read-only table of slots per page size (8 bytes a slot: 16 MiB at most)
SLOT_TABLE_SLOTS = 1 << 21

_SLOT_ROWS: dict[int, np.ndarray] = {}


def live_page_slots_np(ids: np.ndarray, p: int, num_pages: int) -> np.ndarray:
    """`page_slots_np` of page ids `ids` that the caller holds to lie in 0 .. `num_pages`
    (an allocator's own free stack: an id outside would be read as another row, or
    wrap around). Up to `SLOT_TABLE_SLOTS` slots, the rows of one shared table of
    ``[k*p, ..., k*p + p - 1]`` per page id (grown on demand, per page size) are
    gathered by one NumPy call, a third of the broadcast's cost."""
    if p == 1:
        return ids.copy()
    rows = _SLOT_ROWS.get(p)
    if rows is None or len(rows) <= num_pages:
        if (num_pages + 1) * p > SLOT_TABLE_SLOTS:
            return page_slots_np(ids, p)
        rows = np.arange((num_pages + 1) * p, dtype=np.int64).reshape(-1, p)
        rows.flags.writeable = False
        _SLOT_ROWS[p] = rows
    return rows.take(ids, axis=0).ravel()


def whole_page_ids(flat: np.ndarray, p: int) -> np.ndarray | None:
    """The page id of each page of `flat` (1-D int64 slots, a multiple of `p` long) when
    every group of `p` is ``k*P, k*P+1, ..., k*P+P-1`` for ``k`` = its first slot // P,
    else None (an unaligned first slot differs from k*P). The ids are not range-checked.
    One compare of the bytes against the slots rebuilt from the page ids: fewer NumPy
    calls than a 2-D compare and reductions."""
    pages = flat[::p] // p
    if p > 1:
        whole = (pages * p).repeat(p) + _offsets_np(p, flat.size)
        if whole.tobytes() != flat.tobytes():
            return None
    return pages


class SlotCodec:
    """Validates and converts the slot tensors of one pool (one layout, one device)."""

    __slots__ = ("_device", "_layout", "_none_free", "_offsets")

    def __init__(self, layout: PageLayout, device: torch.device) -> None:
        self._layout = layout
        self._device = device
        # flag bytes for the native decode: no page is free, so it checks whole pages in
        # range, named once (it marks and clears them within the call, the GIL held)
        self._none_free = bytearray(layout.num_pages + 1) if device.type == "cpu" else None
        # Slot offsets within a page, built once: slots of page k = k*P + _offsets.
        self._offsets = torch.arange(layout.page_size, dtype=torch.int64, device=device)

    @property
    def layout(self) -> PageLayout:
        return self._layout

    @property
    def device(self) -> torch.device:
        return self._device

    def check_index_tensor(self, t: object, what: str) -> torch.Tensor:
        """`t` itself if it is a dense 1-D int64 tensor on this pool's device; else a typed
        error."""
        name = self._layout.name
        if not isinstance(t, torch.Tensor):
            msg = (
                f"pool {name!r}: {what} must be a 1-D torch.int64 tensor of slot ids, "
                f"got {type(t).__name__}; wrap it with torch.tensor(..., dtype=torch.int64)"
            )
            raise TensorTypeError(msg, what=what, got=type(t), expected=torch.int64)
        if t.dtype != torch.int64:
            msg = (
                f"pool {name!r}: {what} must have dtype torch.int64, got {t.dtype}; "
                f"convert with .to(torch.int64)"
            )
            raise TensorTypeError(msg, what=what, got=t.dtype, expected=torch.int64)
        if t.layout != torch.strided:  # a sparse tensor has no memory to view or index
            msg = (
                f"pool {name!r}: {what} must be a dense (strided) tensor, got layout "
                f"{t.layout}; convert it with .to_dense()"
            )
            raise TensorTypeError(msg, what=what, got=t.layout, expected=torch.strided)
        if t.device != self._device:
            msg = (
                f"pool {name!r}: {what} is on {t.device} but the pool lives on "
                f"{self._device}; move it with .to({str(self._device)!r})"
            )
            raise DeviceMismatchError(msg, what=what, got=t.device, expected=self._device)
        if t.dim() != 1:
            msg = (
                f"pool {name!r}: {what} must be 1-D, got shape {tuple(t.shape)}; "
                "flatten it with .reshape(-1) page by page"
            )
            raise TensorShapeError(msg, what=what, got=tuple(t.shape), expected=(-1,))
        return t

    def checks_in_python(self, n: int) -> bool:
        """Whether a call over `n` slots takes the list path (`page_list`): up to
        `SMALL_SLOTS` slots, or at P > 1 on CPU up to `SMALL_SLOTS` pages (those are
        decoded by NumPy at a fixed cost, and the checks then run per page)."""
        if n <= SMALL_SLOTS:
            return True
        p = self._layout.page_size
        return p > 1 and self._device.type == "cpu" and n <= SMALL_SLOTS * p

    def _check_length(self, n: int, what: str) -> None:
        p = self._layout.page_size
        if n % p:
            name = self._layout.name
            msg = (
                f"pool {name!r}: {what} has {n} slots, not a whole number of pages of "
                f"{p}; pass every slot of each page ([k*{p}, ..., k*{p}+{p - 1}])"
            )
            raise UnalignedSlotsError(msg, pool=name, slots=(), length=n, page_size=p)

    def _native(self, slots: torch.Tensor, packed: bool) -> Any:
        """The page ids of a CPU slot tensor by one native call (a list, or with `packed`
        their int64 bytes) when they are whole pages inside the pool, each named once;
        None when the native decode is off or refuses them (the other paths decide)."""
        flags = self._none_free
        if flags is None or not NATIVE_DECODE:
            return None
        layout = self._layout
        return native_live_page_ids(slots, 0, layout.page_size, layout.num_pages, flags, packed)

    def page_list(self, slots: torch.Tensor, what: str) -> list[int]:
        """`to_pages` as a Python list, checked in Python (meant for <= `SMALL_SLOTS`)."""
        layout = self._layout
        p = layout.page_size
        n = slots.numel()
        if n:
            ids: list[int] | None = self._native(slots, False)
            if ids is not None:
                return ids
        self._check_length(n, what)
        if p > 1 and n >= NUMPY_PAGES * p and slots.device.type == "cpu":
            return self._numpy_page_list(slots, what)
        values: list[int] = slots.tolist()
        if not values:
            return values
        if p == 1:
            pages = values
        else:
            pages = [s // p for s in values[::p]]
            # whole pages <=> each group of P is k*P, k*P+1, ..., k*P+P-1 for k = its
            # first slot // P (an unaligned first slot differs from k*P): compared
            # with the slots rebuilt from the page ids, a range per page (no Python
            # step per slot)
            whole: list[int] = []
            for k in pages:
                whole += range(k * p, k * p + p)
            if values != whole:
                self._raise_bad_slots(slots, what)
        if min(pages) < 1 or max(pages) > layout.num_pages:
            self._raise_bad_slots(slots, what)
        return pages

    def page_ids_and_list(self, slots: torch.Tensor, what: str) -> tuple[torch.Tensor, list[int]]:
        """`to_pages(slots)` and the same ids as `page_list` gives them, from one decode
        on `page_list`'s paths (meant for <= `SMALL_SLOTS`; the same checks, the same
        errors): a caller that needs both builds neither from the other."""
        p = self._layout.page_size
        n = slots.numel()
        if n:
            native: list[int] | None = self._native(slots, False)
            if native is not None:
                return int64_tensor(native, self._device), native
        self._check_length(n, what)
        if p > 1 and n >= NUMPY_PAGES * p and slots.device.type == "cpu":
            pages, ids = self._numpy_pages(slots, what)
            return torch.from_numpy(pages), ids
        ids = self.page_list(slots, what)
        return int64_tensor(ids, self._device), ids

    def _numpy_page_list(self, slots: torch.Tensor, what: str) -> list[int]:
        """`page_list` of a CPU slot tensor at P > 1, checked with NumPy over its memory:
        the same checks (whole pages, inside 1 .. num_pages), the same errors."""
        return self._numpy_pages(slots, what)[1]

    def _numpy_pages(self, slots: torch.Tensor, what: str) -> tuple[np.ndarray, list[int]]:
        """The page ids of a non-empty CPU slot tensor at P > 1 as a fresh NumPy array
        and as a list, checked as `page_list` checks them (whole pages, inside
        1 .. num_pages; else its errors)."""
        layout = self._layout
        p = layout.page_size
        pages = whole_page_ids(numpy_view(slots), p)
        if pages is None:
            self._raise_bad_slots(slots, what)
        page_ids: list[int] = pages.tolist()  # (the range check runs over the short list)
        if min(page_ids) < 1 or max(page_ids) > layout.num_pages:
            self._raise_bad_slots(slots, what)
        return pages, page_ids

    def to_pages_once(self, slots: torch.Tensor, what: str) -> tuple[torch.Tensor, bool]:
        """`to_pages(slots, what)` and whether the ids are known to name each page once
        (True when the native decode answered, which refuses a repeated page; False
        means not known: the caller checks with `has_duplicates` if it must)."""
        if slots.numel():
            packed: bytes | None = self._native(slots, True)
            if packed is not None:
                return torch.frombuffer(bytearray(packed), dtype=torch.int64), True
        return self.to_pages(slots, what), False

    def to_pages(self, slots: torch.Tensor, what: str) -> torch.Tensor:
        """The page id of each whole page in `slots` (validated 1-D int64 on our device)."""
        layout = self._layout
        p = layout.page_size
        n = slots.numel()
        if n:
            packed: bytes | None = self._native(slots, True)
            if packed is not None:  # (a bytearray: torch views only writable memory)
                return torch.frombuffer(bytearray(packed), dtype=torch.int64)
        self._check_length(n, what)
        if n == 0:
            return slots
        if p > 1 and self.checks_in_python(n):  # at P = 1 the tensor path is two reductions
            if n >= NUMPY_PAGES * p and slots.device.type == "cpu":
                # `page_list`'s NumPy path, its array handed over as the tensor (a fresh
                # array: `whole_page_ids` divides into a new one), not rebuilt from the list
                return torch.from_numpy(self._numpy_pages(slots, what)[0])
            return int64_tensor(self.page_list(slots, what), self._device)
        if p == 1:
            pages = slots
            whole = True
        else:
            pages = slots[::p].div(p, rounding_mode="floor")
            # Whole pages <=> the slots are exactly the slots of their first slots' pages.
            whole = torch.equal(self.to_slots(pages), slots)
        lo, hi = torch.aminmax(pages)
        if whole and lo.item() >= 1 and hi.item() <= layout.num_pages:
            return pages
        self._raise_bad_slots(slots, what)
        raise AssertionError("unreachable: _raise_bad_slots always raises")

    def raise_out_of_pool(self, slots: torch.Tensor, what: str, *, allow_page0: bool) -> None:
        """Raise `ForeignSlotsError` naming the slots of `slots` outside the pool, if any.

        The pool's slots are P .. num_slots-1, or 0 .. num_slots-1 with `allow_page0`.
        """
        layout = self._layout
        p = layout.page_size
        low = 0 if allow_page0 else p
        foreign = (slots < low) | (slots >= layout.num_slots)
        if not foreign.any().item():
            return
        bad = slots[foreign].tolist()
        sink = "" if allow_page0 else f" (page 0, slots 0 .. {p - 1}, is the padding sink)"
        msg = (
            f"pool {layout.name!r}: {what} holds {len(bad)} slot(s) outside this pool: "
            f"{preview(bad)}; its slots are {low} .. {layout.num_slots - 1}{sink}. "
            "Pass slots from this pool's alloc"
        )
        raise ForeignSlotsError(msg, pool=layout.name, slots=bad, low=low, high=layout.num_slots)

    def _raise_bad_slots(self, slots: torch.Tensor, what: str) -> NoReturn:
        layout = self._layout
        p = layout.page_size
        self.raise_out_of_pool(slots, what, allow_page0=False)
        assert p > 1, "P == 1 slots in range are always whole pages"
        grid = slots.view(-1, p)
        starts = grid[:, :1]
        broken = (starts % p != 0) | torch.ne(grid, starts + self._offsets).any(dim=1, keepdim=True)
        firsts = starts[broken].tolist()
        msg = (
            f"pool {layout.name!r}: {what} is not whole pages of {p}: {len(firsts)} group(s) of "
            f"{p} consecutive entries, starting at slots {preview(firsts)}, are not "
            f"[k*{p}, k*{p}+1, ..., k*{p}+{p - 1}]; pass each page's slots in order"
        )
        raise UnalignedSlotsError(
            msg, pool=layout.name, slots=firsts, length=slots.numel(), page_size=p
        )

    def to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        """The slots of `pages`, page after page, each page's slots ascending."""
        p = self._layout.page_size
        if p == 1:
            return pages.clone()
        if pages.device.type == "cpu" and pages.dtype == torch.int64 and pages.dim() == 1:
            # the same values by NumPy over the ids' memory: a fresh array, half the
            # cost of the broadcast torch.add at the sizes an allocation asks for
            return torch.from_numpy(page_slots_np(numpy_view(pages), p))
        return torch.add(self._offsets, pages.unsqueeze(1), alpha=p).view(-1)

    @staticmethod
    def has_duplicates(pages: torch.Tensor) -> bool:
        """Does some page id occur twice in `pages`?"""
        n = pages.numel()
        if n <= 1:
            return False
        if n <= SMALL_SLOTS:
            return len(set(pages.tolist())) != n
        return int(torch.unique(pages).numel()) != n

    @staticmethod
    def duplicate_pages(pages: torch.Tensor) -> list[int]:
        """The page ids that occur more than once, ascending (diagnosis only)."""
        values, counts = torch.unique(pages, return_counts=True)
        dup: list[int] = values[counts > 1].tolist()
        return dup
