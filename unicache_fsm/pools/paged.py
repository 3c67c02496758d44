"""The paged token-slot allocator: whole pages of P slots out of a fixed pool.

Lifecycle primitives, in the order a caller uses them:

- `PagedAllocator(size, page_size, device=..., name=...)`: `size` tokens (a multiple of
  P) in pages 1 .. size/P, all free. Page 0 (slots 0 .. P-1) is never handed out.
- `alloc(num_tokens)` -> int64 slot tensor of ``num_tokens / P`` whole pages, or None
  when fewer pages are free (the allocator is then unchanged). `num_tokens` must be a
  multiple of P; 0 gives an empty tensor.
- `free(slots)`: return whole pages (length a multiple of P; each group of P entries is
  one page ``[k*P, ..., k*P + P - 1]``). A page that is already free, or named twice in
  the call, raises `DoubleFreeError`; freeing is never idempotent.
- `available_size()` -> free tokens (free pages x P).
- `free_page_ids()` / `allocated_page_ids()` -> sorted snapshots, for checks and tests
  (`allocated_page_list()`: the same ids as Python ints, for audits).

Every call does O(pages in the call) tensor work and no Python loop per page or token:
the free pages sit in a stack tensor (`_free_stack[:_num_free]`, allocation pops from the
top so recently freed pages are reused first), and `_is_free[page]` answers double frees
in one gather. Every bad input raises a typed error from `pools.errors` before anything
changes. On CPU `_is_free` is a view of a bytearray (`_free_flags`), so a call with at most
`SMALL_SLOTS` slots (at P > 1, `SMALL_SLOTS` pages: `SlotCodec.checks_in_python`) checks
ownership in Python over that same memory instead of paying a few tensor ops' fixed
cost: same checks, same errors; at P = 1 past that, up to `NUMPY_SLOTS` slots,
`live_page_ids` checks a sorted NumPy copy and leaves any refusal to the tensor path,
which names the culprits. On CPU, pops and pushes also go through NumPy views of
the stack and of that bytearray (made once, and again for a deep copy over the copy's
own memory), not torch ops.

Where the optional C extension ``unicache_fsm._pagecheck`` was built (`NATIVE_CHECK`),
a CPU slot tensor's live-page check (`live_page_ids`, and `live_pages` on the list path)
runs first in one native call over the same flag bytes; it answers the page ids when
every check holds, and anything it refuses goes to the paths above, which name the
culprits. The same answers either way (tests/test_pagecheck.py).
"""

from __future__ import annotations

import operator
from array import array
from typing import Any, Literal, overload

import numpy as np
import torch

from unicache_fsm.copying import deep
from unicache_fsm.pools.errors import (
    DoubleFreeError,
    DuplicatePagesError,
    ForeignSlotsError,
    NotPageMultipleError,
    SlotsNotAllocatedError,
    TensorShapeError,
    TensorTypeError,
)
from unicache_fsm.pools.layout import PageLayout, resolve_device
from unicache_fsm.pools.pageflags import any_set
from unicache_fsm.pools.slots import (
    HAVE_NATIVE_CHECK,
    SMALL_SLOTS,
    SlotCodec,
    int64_tensor,
    live_page_slots_np,
    native_live_page_ids,
    numpy_view,
    preview,
)

__all__ = ["NATIVE_CHECK", "NUMPY_SLOTS", "PagedAllocator"]

NATIVE_CHECK: bool = HAVE_NATIVE_CHECK
"""Whether CPU live-page checks run first in native code (``unicache_fsm._pagecheck``);
read at each call, so a test may turn it off to run the Python paths alone."""

#: At P = 1 on CPU, `live_page_ids` checks up to this many slots (past `SMALL_SLOTS`)
#: over a sorted NumPy copy, a few fixed-cost calls, instead of the torch reductions
#: and `unique` of the tensor path.
NUMPY_SLOTS = 1 << 16

#: the types of a list of page ids that are all plain ints (bools and NumPy ints are not)
_INT_ONLY = {int}


class PagedAllocator:
    """Hands out and takes back whole pages of token slots (see the module docstring)."""

    __slots__ = (
        "_codec",
        "_device",
        "_flags_np",
        "_free_flags",
        "_free_stack",
        "_is_free",
        "_layout",
        "_num_free",
        "_stack_np",
    )

    def __init__(
        self,
        size: int,
        page_size: int,
        *,
        device: str | torch.device = "cpu",
        name: str = "kv",
    ) -> None:
        self._layout = PageLayout(size, page_size, name)
        self._device = resolve_device(device)
        self._codec = SlotCodec(self._layout, self._device)
        n = self._layout.num_pages
        # The stack holds free page ids in [0, _num_free); its top is popped first.
        # Built descending so a fresh allocator hands out pages 1, 2, 3, ... in order.
        self._free_stack = torch.arange(n, 0, -1, dtype=torch.int64, device=self._device)
        self._num_free = n
        # _is_free[k] for page ids 0 .. n; page 0 stays False (it is never free: never ours).
        # On CPU the flags live in a bytearray the tensor views (one memory, two readers).
        self._free_flags: bytearray | None = None
        if self._device.type == "cpu":
            self._free_flags = bytearray(n + 1)
            self._is_free = torch.frombuffer(self._free_flags, dtype=torch.bool)
            self._is_free.fill_(True)
        else:
            self._is_free = torch.ones(n + 1, dtype=torch.bool, device=self._device)
        self._is_free[0] = False
        self._bind_views()

    def _bind_views(self) -> None:
        """On CPU, NumPy views of the free stack and of the flags' bytearray (the same
        memory as the tensors): pops and pushes move page ids through them, with no
        torch call. Made again for a copy, over the copy's own memory."""
        self._stack_np: Any = None
        self._flags_np: Any = None
        if self._free_flags is not None:
            self._stack_np = self._free_stack.numpy()
            self._flags_np = np.frombuffer(self._free_flags, dtype=np.bool_)

    def __deepcopy__(self, memo: dict[int, Any]) -> PagedAllocator:
        """An independent allocator in the same state (a search's snapshot): the copy's
        flag tensor views the copy's own bytearray, as the original's does."""
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        slots = {n for k in cls.__mro__ for n in getattr(k, "__slots__", ())} - {"__dict__"}
        views = {"_stack_np", "_flags_np"}
        if self._free_flags is not None:
            views.add("_is_free")
        for name in slots - views:
            if hasattr(self, name):
                setattr(new, name, deep(getattr(self, name), memo))
        if hasattr(self, "__dict__"):  # a subclass without __slots__
            new.__dict__.update(deep(self.__dict__, memo))
        if new._free_flags is not None:
            new._is_free = torch.frombuffer(new._free_flags, dtype=torch.bool)
        new._bind_views()
        return new

    # -- read-only facts ---------------------------------------------------------------

    @property
    def layout(self) -> PageLayout:
        return self._layout

    @property
    def name(self) -> str:
        return self._layout.name

    @property
    def page_size(self) -> int:
        return self._layout.page_size

    @property
    def size(self) -> int:
        """Capacity in tokens (page 0 excluded)."""
        return self._layout.size

    @property
    def num_pages(self) -> int:
        return self._layout.num_pages

    @property
    def num_slots(self) -> int:
        """Rows of a slot-indexed tensor for this pool (capacity plus page 0)."""
        return self._layout.num_slots

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def codec(self) -> SlotCodec:
        """The validator/converter for this pool's slot tensors."""
        return self._codec

    def available_size(self) -> int:
        """Free capacity in tokens."""
        return self._num_free * self._layout.page_size

    def free_page_ids(self) -> torch.Tensor:
        """Sorted ids of the free pages (a copy)."""
        return torch.sort(self._free_stack[: self._num_free]).values

    def allocated_page_ids(self) -> torch.Tensor:
        """Sorted ids of the pages currently handed out (a copy)."""
        flags = self._free_flags
        if flags is not None and len(flags) <= SMALL_SLOTS:
            return int64_tensor(self.allocated_page_list(), self._device)
        return torch.nonzero(~self._is_free[1:]).view(-1) + 1

    def allocated_page_list(self) -> list[int]:
        """`allocated_page_ids` as a list of Python ints (for an audit that compares
        them as a set: on CPU read from the flags directly, no tensor in between)."""
        flags = self._free_flags
        if flags is None:
            return self.allocated_page_ids().tolist()
        if len(flags) <= SMALL_SLOTS:
            return [k for k in range(1, len(flags)) if not flags[k]]
        return (np.flatnonzero(~self._flags_np[1:]) + 1).tolist()

    def __repr__(self) -> str:
        return (
            f"PagedAllocator(size={self.size}, page_size={self.page_size}, "
            f"device={str(self._device)!r}, name={self.name!r})"
        )

    # -- primitives --------------------------------------------------------------------

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """``num_tokens / P`` whole pages as int64 slots, or None (unchanged) when short."""
        p = self._layout.page_size
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
            msg = f"pool {self.name!r}: num_tokens must be an int, got {num_tokens!r}"
            raise TensorTypeError(msg, what="num_tokens", got=type(num_tokens), expected=int)
        if num_tokens < 0 or num_tokens % p:
            msg = (
                f"pool {self.name!r}: cannot alloc {num_tokens} tokens: ask for a non-negative "
                f"multiple of the page size {p} (round up to whole pages)"
            )
            raise NotPageMultipleError(msg, what="num_tokens", value=num_tokens, page_size=p)
        n = num_tokens // p
        stack = self._stack_np
        if stack is not None:
            # on CPU: pop the ids off the NumPy stack and build their slots in NumPy (a
            # fresh array), one tensor at the end (not a page tensor, then its slots)
            top = self._num_free
            if n > top:
                return None
            ids = stack[top - n : top][::-1]
            self._num_free = top - n
            self._flags_np[ids] = False
            return torch.from_numpy(live_page_slots_np(ids, p, self._layout.num_pages))
        pages = self._take_pages(n)
        return None if pages is None else self._codec.to_slots(pages)

    def free(self, slots: torch.Tensor) -> None:
        """Return whole pages; a free page (or one named twice) raises `DoubleFreeError`."""
        pages = self.live_pages(slots, what="slots to free", freeing=True)
        self.release_pages(pages)

    # -- package-internal (used by the SWA allocator, which validates first) ------------

    def _take_pages(self, n: int) -> torch.Tensor | None:
        """Pop `n` free page ids (a fresh tensor), or None when fewer are free."""
        if n > self._num_free:
            return None
        top = self._num_free
        stack = self._stack_np
        if stack is not None:
            ids = stack[top - n : top][::-1].copy()  # a copy: later pushes cannot alias it
            self._num_free = top - n
            self._flags_np[ids] = False
            return torch.from_numpy(ids)
        # flip() copies, so later pushes onto the stack cannot alias the caller's pages.
        pages = self._free_stack[top - n : top].flip(0)
        self._num_free = top - n
        self._is_free.index_fill_(0, pages, False)
        return pages

    def release_pages(self, pages: torch.Tensor) -> None:
        """Push page ids back on the free stack. They must be validated, allocated and
        distinct (`live_pages(..., freeing=True)` checks that): a composing allocator
        (`SWAAllocator`) validates both of its pools before it releases either."""
        n = pages.numel()
        if n == 0:
            return
        top = self._num_free
        if self._stack_np is not None and pages.device.type == "cpu":
            self._release_page_list(numpy_view(pages))
            return
        self._free_stack[top : top + n].copy_(pages)
        self._num_free = top + n
        self._is_free.index_fill_(0, pages, True)

    def release_page_ids(self, page_ids: list[int]) -> None:
        """`release_pages` of ids in a list (validated, allocated, distinct: the same
        contract), without a tensor on CPU."""
        if self._stack_np is None:
            self.release_pages(int64_tensor(page_ids, self._device))
        elif page_ids:  # one conversion of the list, for both NumPy writes
            self._release_page_list(np.array(page_ids, dtype=np.int64))

    def _release_page_list(self, page_ids: Any) -> None:
        """`release_pages` of ids in an int64 NumPy array, on CPU: through the NumPy
        views of the stack and of the flags (validated, allocated, distinct ids: see
        `release_pages`)."""
        top, n = self._num_free, len(page_ids)
        self._stack_np[top : top + n] = page_ids
        self._num_free = top + n
        self._flags_np[page_ids] = True

    def free_page_list(self, page_ids: list[int], what: str = "pages to free") -> None:
        """`free` by page id, for an owner that keeps its pages' ids (the tree): each id
        must be an int page of this pool (1 .. num_pages), allocated and named once, else
        `ForeignSlotsError` / `DoubleFreeError` and nothing changes. On CPU the checks run
        in Python over the ids and the free flags (no slot tensor to decode); elsewhere
        they are `free`'s own, over the pages' slots."""
        if not page_ids:
            return
        if {*map(type, page_ids)} != _INT_ONLY:  # (in C: no Python step per id)
            bad = next(k for k in page_ids if type(k) is not int)
            msg = f"pool {self.name!r}: {what} must be int page ids, got {bad!r}"
            raise TensorTypeError(msg, what=what, got=type(bad), expected=int)
        num_pages = self._layout.num_pages
        if min(page_ids) < 1 or max(page_ids) > num_pages:
            # refused here, in Python ints: as int64 slots (page * P) an id far outside
            # the pool could wrap around onto a live page, or not fit at all
            self._raise_foreign_page_ids(page_ids, what)
        flags = self._free_flags
        if flags is None or len(page_ids) > SMALL_SLOTS:
            # the general path names every culprit (and handles any device)
            pages = torch.tensor(page_ids, dtype=torch.int64, device=self._device)
            self.free(self._codec.to_slots(pages))
            return
        if any_set(flags, page_ids) or len(set(page_ids)) != len(page_ids):
            pages = torch.tensor(page_ids, dtype=torch.int64)
            self._raise_not_live(pages, what=what, freeing=True)
        self.release_page_ids(page_ids)

    def _raise_foreign_page_ids(self, page_ids: list[int], what: str) -> None:
        p, num_pages = self.page_size, self._layout.num_pages
        bad = [k for k in page_ids if not 1 <= k <= num_pages]
        msg = (
            f"pool {self.name!r}: {what} names {len(bad)} page id(s) outside this pool: "
            f"{preview(bad)}; its pages are 1 .. {num_pages} (page 0 is the padding sink)"
        )
        slots = [k * p + o for k in bad for o in range(p)]
        raise ForeignSlotsError(
            msg, pool=self.name, slots=slots, low=p, high=self._layout.num_slots
        )

    def check_live(self, slots: object, what: str = "slots") -> None:
        """Raise a typed error unless `slots` are whole, distinct, allocated pages.

        For callers about to take ownership of slots (the tree adopting an insert's
        value): one gather, nothing changed.
        """
        self.live_page_ids(slots, what)

    def live_page_ids(self, slots: object, what: str = "slots", start: int = 0) -> list[int]:
        """`check_live` of ``slots[start:]``, returning the page id of each of its pages
        (in order), for a caller that keeps books by page id (the tree's owned pages).
        `start` (an integer, of any integer type but bool, in 0 .. ``len(slots)``, else
        `TensorShapeError`) spares a caller holding a whole tensor a slice of it: the
        tree checks an insert's value past its prefix."""
        t, start = self._checked_from(slots, what, start)
        if self._free_flags is not None:
            ids = self._native_page_ids(t, start)
            if ids is not None:
                return ids
        return self._live_id_list(t[start:] if start else t, what)

    def live_page_array(self, slots: object, what: str = "slots", start: int = 0) -> array[int]:
        """`live_page_ids` as an ``array('q')``: one object, no int object per page (the
        native check writes the ids straight into it), for a caller that keeps the ids
        a while (the tree, an insert's tail); the same checks and errors."""
        t = self._codec.check_index_tensor(slots, what)
        if type(start) is not int or (start and not 0 < start <= t.numel()):
            # (else `_checked_from`'s checks held: a plain int start inside the slots)
            t, start = self._checked_from(slots, what, start)
        ids = array("q")
        flags = self._free_flags
        if flags is not None and NATIVE_CHECK:  # (`_native_page_ids`, inline)
            layout = self._layout
            packed = native_live_page_ids(
                t, start, layout.page_size, layout.num_pages, flags, packed=True
            )
            if packed is not None:
                ids.frombytes(packed)
                return ids
        ids.fromlist(self._live_id_list(t[start:] if start else t, what))
        return ids

    def _checked_from(self, slots: object, what: str, start: object) -> tuple[torch.Tensor, int]:
        """`slots` checked as a slot tensor of this pool's, and `start` as an index inside
        it: an int, or an integer of another type (a NumPy integer: an insert's
        ``prev_prefix_len`` may be one), not a bool; else `TensorShapeError`."""
        t = self._codec.check_index_tensor(slots, what)
        if type(start) is not int:  # (None, False, 0.0 are not a start of 0)
            at = None if isinstance(start, bool) else _as_index(start)
            if at is None:
                n = t.numel()
                msg = f"pool {self.name!r}: {what}: start {start!r} is not an integer index"
                raise TensorShapeError(msg, what=what, got=(n,), expected=(-1,))
            start = at
        if start:
            n = t.numel()
            if not 0 <= start <= n:
                msg = f"pool {self.name!r}: {what}: start {start!r} outside 0 .. {n}"
                raise TensorShapeError(msg, what=what, got=(n,), expected=(-1,))
        return t, start

    def _live_id_list(self, t: torch.Tensor, what: str) -> list[int]:
        """`live_page_ids` of a checked slot tensor by the Python paths (which name the
        culprits of anything the native check refused)."""
        codec, flags = self._codec, self._free_flags
        if flags is not None:
            n = t.numel()
            if codec.checks_in_python(n):
                return self._live_page_list(t, what=what, freeing=False)
            if self._layout.page_size == 1 and n <= NUMPY_SLOTS:
                ids = self._sorted_live_ids(t)
                if ids is not None:
                    return ids
        # (the tensor path also names the culprits of what the NumPy check refused)
        pages: list[int] = self.live_pages(t, what=what, freeing=False).tolist()
        return pages

    def _sorted_live_ids(self, t: torch.Tensor) -> list[int] | None:
        """`live_page_ids` of a CPU slot tensor at P = 1 past `SMALL_SLOTS`, checked over
        its sorted NumPy copy (range at both ends, free flags, neighbours for
        duplicates: no torch reduction, no `unique`); None when some check fails."""
        a = numpy_view(t)
        s = a.copy()  # (NumPy methods and bytes searches: no Python-level NumPy wrapper,
        s.sort()  # as np.sort and ndarray.any go through)
        if (
            s[0] < 1
            or s[-1] > self._layout.num_pages
            or b"\x01" in self._flags_np[s].tobytes()  # a free page
            or b"\x01" in (s[1:] == s[:-1]).tobytes()  # a page named twice
        ):
            return None
        ids: list[int] = a.tolist()
        return ids

    def live_pages(self, slots: object, *, what: str, freeing: bool) -> torch.Tensor:
        """Page ids of `slots`, which must be whole, distinct, currently allocated pages.

        Raises (nothing changed) `DoubleFreeError` when `freeing`, else
        `SlotsNotAllocatedError` / `DuplicatePagesError`.
        """
        codec = self._codec
        t = codec.check_index_tensor(slots, what)
        if self._free_flags is not None and codec.checks_in_python(t.numel()):
            native = self._native_page_ids(t)
            page_ids = (
                native
                if native is not None
                else self._live_page_list(t, what=what, freeing=freeing)
            )
            if self._layout.page_size == 1:
                return t
            return int64_tensor(page_ids, self._device)
        pages = codec.to_pages(t, what)
        if pages.numel() == 0:
            return pages
        if self._is_free.index_select(0, pages).any().item() or codec.has_duplicates(pages):
            self._raise_not_live(pages, what=what, freeing=freeing)
        return pages

    @overload
    def _native_page_ids(
        self, t: torch.Tensor, start: int = 0, *, packed: Literal[False] = False
    ) -> list[int] | None: ...
    @overload
    def _native_page_ids(
        self, t: torch.Tensor, start: int = 0, *, packed: Literal[True]
    ) -> bytes | None: ...
    def _native_page_ids(
        self, t: torch.Tensor, start: int = 0, *, packed: bool = False
    ) -> list[int] | bytes | None:
        """The native check's page ids of a CPU slot tensor from `start` on (`packed`: as
        native int64 bytes); None where it is not built or turned off (`NATIVE_CHECK`),
        or refuses (the Python paths name why)."""
        flags = self._free_flags
        if not NATIVE_CHECK or flags is None:
            return None
        layout = self._layout
        ids: list[int] | bytes | None = native_live_page_ids(
            t, start, layout.page_size, layout.num_pages, flags, packed
        )
        return ids

    def _live_page_list(self, t: torch.Tensor, *, what: str, freeing: bool) -> list[int]:
        """`live_pages` for a small slot tensor on CPU, checked in Python over `tolist()`
        and the bytearray `_is_free` views (same checks, same errors)."""
        flags = self._free_flags
        assert flags is not None, "the Python path needs the CPU bytearray flags"
        page_ids = self._codec.page_list(t, what)
        if any_set(flags, page_ids) or len(set(page_ids)) != len(page_ids):
            pages = torch.tensor(page_ids, dtype=torch.int64)
            self._raise_not_live(pages, what=what, freeing=freeing)
        return page_ids

    def _raise_not_live(self, pages: torch.Tensor, *, what: str, freeing: bool) -> None:
        name = self.name
        free = torch.unique(pages[self._is_free.index_select(0, pages)]).tolist()
        if free:
            if freeing:
                msg = (
                    f"pool {name!r}: double free of {len(free)} page(s) {preview(free)} "
                    f"(page id = slot // {self.page_size}): they are already free; free each "
                    "page exactly once, by its owner"
                )
                raise DoubleFreeError(msg, pool=name, pages=free)
            msg = (
                f"pool {name!r}: {what} names {len(free)} free page(s) {preview(free)}; "
                "only pages handed out by alloc (and not freed since) may be used here"
            )
            raise SlotsNotAllocatedError(msg, pool=name, pages=free)
        dup = SlotCodec.duplicate_pages(pages)
        assert dup, "_raise_not_live called on distinct allocated pages"
        if freeing:
            msg = (
                f"pool {name!r}: double free: {what} names page(s) {preview(dup)} more than "
                "once in one call; pass each page once"
            )
            raise DoubleFreeError(msg, pool=name, pages=dup)
        msg = f"pool {name!r}: {what} names page(s) {preview(dup)} more than once; pass each once"
        raise DuplicatePagesError(msg, pool=name, pages=dup)


def _as_index(value: object) -> int | None:
    """`value` as an int by its ``__index__`` (an integer of any type), else None."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
