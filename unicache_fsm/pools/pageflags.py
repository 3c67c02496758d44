"""Per-page flag bytes: one byte per page id, read and written by lists of ids.

- `PageFlags(num_pages)` — flags for page ids 0 .. num_pages, all clear. Fixed size:
  marking never reallocates (a set of page ids rehashes as it grows, every element at
  once, which a tree that keeps growing pays again and again).
- `any_of(ids)` -> whether some id of the list is marked; `marked_of(ids)` -> the
  marked ones (sorted, once each).
- `mark(ids)` / `clear(ids)` — set / clear the flag of every id in the list.
- `marked()` -> every marked id, ascending; `marks_exactly(ids)` -> whether the
  marked ids are exactly the set `ids` (``set(marked()) == ids``, without listing them).
- `any_set(flags, ids)` — the Python read over any flag bytearray, for ids already
  checked (the allocator's free flags use it too).

Ids come as a list or an ``array('q')`` (any other iterable is copied into a list first;
an array is read in place, no int object per id) and must be integers
(`TypeError` otherwise) in 0 .. num_pages (`IndexError` otherwise); every id is checked
before any flag is read or written, so a refused call changes nothing and `any_of`
refuses a bad id even after a marked one.
Where the optional C extension ``unicache_fsm._pagecheck`` was built, each call over a
list or an array is one native call; otherwise the same in Python (`operator.itemgetter` to read,
a loop to write). `tests/test_pageflags.py` holds both to a set of ids.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from operator import index, itemgetter

import numpy as np

__all__ = ["PageFlags", "any_set"]

_native_any: Callable[[bytearray, list[int] | array[int]], bool] | None
_native_set: Callable[[bytearray, list[int] | array[int], bool], None] | None
try:
    from unicache_fsm._pagecheck import any_flagged as _native_any
    from unicache_fsm._pagecheck import set_flags as _native_set
except ImportError:  # pragma: no cover - built without a C compiler
    _native_any = _native_set = None


def any_set(flags: bytearray, ids: list[int]) -> bool:
    """Is ``flags[k]`` set for some `k` of `ids` (ids already checked to lie inside)?

    One `itemgetter` call gathers every flag in C (a third of the time of a Python call
    per id, which `map(flags.__getitem__, ...)` makes)."""
    if len(ids) > 1:
        return any(itemgetter(*ids)(flags))
    return bool(ids) and bool(flags[ids[0]])


class PageFlags:
    """One flag byte per page id in 0 .. `num_pages`, read and written by lists (or
    ``array('q')``) of ids. Every id is checked before any flag is touched: a refused
    call (`TypeError`, `IndexError`) changes nothing. Fixed size, never reallocated.
    `native` False runs the Python forms even where the C extension was built (tests
    hold both to the same answers)."""

    __slots__ = ("_any", "_flags", "_set")

    def __init__(self, num_pages: int, *, native: bool = True) -> None:
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 0:
            msg = f"num_pages must be an int >= 0, got {num_pages!r}"
            raise ValueError(msg)
        self._flags = bytearray(num_pages + 1)
        use = native and _native_any is not None and _native_set is not None
        self._any = _native_any if use else None
        self._set = _native_set if use else None

    @property
    def num_pages(self) -> int:
        return len(self._flags) - 1

    def _check(self, ids: Iterable[int]) -> list[int]:
        """`ids` as a list of ints, each inside the flags; else TypeError / IndexError."""
        keys = list(map(index, ids))
        top = len(self._flags)
        if keys and (min(keys) < 0 or max(keys) >= top):
            bad = next(k for k in keys if not 0 <= k < top)
            msg = f"page id {bad} outside the {top} flag bytes"
            raise IndexError(msg)
        return keys

    def any_of(self, ids: Iterable[int]) -> bool:
        native = self._any
        if native is not None:
            if type(ids) is array and ids.typecode == "q":  # (`_as_native_ids`, inline)
                return native(self._flags, ids)
            return native(self._flags, _as_native_ids(ids))
        return any_set(self._flags, self._check(ids))

    def marked_of(self, ids: Iterable[int]) -> list[int]:
        flags = self._flags
        return sorted({k for k in self._check(ids) if flags[k]})

    def mark(self, ids: Iterable[int]) -> None:
        native = self._set
        if native is not None:  # (`_write`, inline: the tree marks on every adoption)
            if type(ids) is not list and not (type(ids) is array and ids.typecode == "q"):
                ids = list(ids)  # (`_as_native_ids`, inline)
            native(self._flags, ids, True)
            return
        self._write(ids, True)

    def clear(self, ids: Iterable[int]) -> None:
        native = self._set
        if native is not None:
            if type(ids) is not list and not (type(ids) is array and ids.typecode == "q"):
                ids = list(ids)  # (`_as_native_ids`, inline)
            native(self._flags, ids, False)
            return
        self._write(ids, False)

    def _write(self, ids: Iterable[int], value: bool) -> None:
        if self._set is not None:
            self._set(self._flags, _as_native_ids(ids), value)
            return
        flags, byte = self._flags, int(value)
        for k in self._check(ids):
            flags[k] = byte

    def marked(self) -> list[int]:
        ids: list[int] = np.flatnonzero(np.frombuffer(self._flags, dtype=np.uint8)).tolist()
        return ids

    def marks_exactly(self, ids: set[int] | frozenset[int]) -> bool:
        """Whether the marked ids are exactly `ids` (a set of ints; any id outside the
        flags, or not an int, makes it False): ``set(self.marked()) == ids``, answered
        by one count of the clear bytes and one gather of the flags of `ids`."""
        flags = self._flags
        if len(flags) - flags.count(0) != len(ids):
            return False
        if not ids:
            return True
        if not all(type(k) is int for k in ids) or min(ids) < 0 or max(ids) >= len(flags):
            return False
        return any_set(flags, list(ids)) if len(ids) == 1 else all(itemgetter(*ids)(flags))


def _as_native_ids(ids: Iterable[int]) -> list[int] | array[int]:
    """`ids` as the native calls take them: a list or an ``array('q')`` as it is, any
    other iterable copied into a list."""
    if type(ids) is list or (type(ids) is array and ids.typecode == "q"):
        return ids
    return list(ids)
