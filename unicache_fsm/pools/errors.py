"""Errors of the torch pools: caller mistakes, each typed, each carrying its culprit.

Every class derives from `PoolError` (itself a `UnicacheFsmError`) and from the builtin
it refines, so ``except ValueError`` keeps working for callers that do not know us.
Code that detects a mistake builds the message (``msg = f"..."; raise X(msg, ...)``),
naming the offending value and the fix; the values themselves are attributes.

A pool that raises one of these has changed nothing: every operation validates its
whole input before it touches a free list, a mapping or a KV byte.

Running out of free pages is not an error: `alloc` returns None.

- `PoolConfigError`: a constructor argument is unusable (page size < 1, layers < 1, ...).
- `NotPageMultipleError`: a token count (pool size, `alloc` request) is not a multiple of P.
- `DeviceUnavailableError`: a device was asked for that this process cannot use.
- `TensorTypeError`: not a tensor, or the wrong dtype (slots are int64; KV data the pool's);
  also a token count that is not an int.
- `DeviceMismatchError`: a tensor lives on another device than the pool.
- `TensorShapeError`: slots not 1-D, or KV data not ``[n, layers, width]``.
- `LengthMismatchError`: two tensors that pair up element-wise differ in length.
- `ForeignSlotsError`: slots outside the pool (negative, past the end, or in page 0).
- `UnalignedSlotsError`: slots that are not whole pages (a partial page, or a group of
  P entries that is not ``[k*P, ..., k*P + P - 1]``).
- `SlotsNotAllocatedError`: an operation on live pages got pages that are free.
- `DoubleFreeError`: a free of a page that is already free, or of one page twice in a call.
- `DuplicatePagesError`: one page named twice where each page must appear once.
"""

from __future__ import annotations

from collections.abc import Sequence

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = [
    "DeviceMismatchError",
    "DeviceUnavailableError",
    "DoubleFreeError",
    "DuplicatePagesError",
    "ForeignSlotsError",
    "LengthMismatchError",
    "NotPageMultipleError",
    "PoolConfigError",
    "PoolError",
    "SlotsNotAllocatedError",
    "TensorShapeError",
    "TensorTypeError",
    "UnalignedSlotsError",
]


class PoolError(UnicacheFsmError):
    """Root of the errors raised by `unicache_fsm.pools`."""


class PoolConfigError(PoolError, ValueError):
    """A constructor argument is unusable. `argument` names it, `value` holds it."""

    def __init__(self, message: str, *, argument: str, value: object) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value


class NotPageMultipleError(PoolError, ValueError):
    """A token count is not a whole number of pages.

    `what` names the count ("size", "num_tokens"), `value` holds it, `page_size` is P.
    """

    def __init__(self, message: str, *, what: str, value: int, page_size: int) -> None:
        super().__init__(message)
        self.what = what
        self.value = value
        self.page_size = page_size


class DeviceUnavailableError(PoolError, RuntimeError):
    """The device asked for cannot be used here (e.g. CUDA without a GPU). `device` holds it."""

    def __init__(self, message: str, *, device: str) -> None:
        super().__init__(message)
        self.device = device


class TensorTypeError(PoolError, TypeError):
    """An argument has the wrong type: not a tensor, the wrong dtype, or a non-int count.

    `what` names the argument, `got` is its dtype (or Python type), `expected` what is needed.
    """

    def __init__(self, message: str, *, what: str, got: object, expected: object) -> None:
        super().__init__(message)
        self.what = what
        self.got = got
        self.expected = expected


class DeviceMismatchError(PoolError, ValueError):
    """A tensor lives on another device than the pool. `got` and `expected` are devices."""

    def __init__(self, message: str, *, what: str, got: object, expected: object) -> None:
        super().__init__(message)
        self.what = what
        self.got = got
        self.expected = expected


class TensorShapeError(PoolError, ValueError):
    """A tensor has the wrong shape. `got` and `expected` are shape tuples (-1: any)."""

    def __init__(
        self, message: str, *, what: str, got: tuple[int, ...], expected: tuple[int, ...]
    ) -> None:
        super().__init__(message)
        self.what = what
        self.got = got
        self.expected = expected


class LengthMismatchError(PoolError, ValueError):
    """Two tensors paired element-wise differ in length: `left_len` vs `right_len`."""

    def __init__(
        self, message: str, *, left: str, right: str, left_len: int, right_len: int
    ) -> None:
        super().__init__(message)
        self.left = left
        self.right = right
        self.left_len = left_len
        self.right_len = right_len


class ForeignSlotsError(PoolError, ValueError):
    """Slots that this pool never hands out.

    `slots` holds the offending slot ids; the pool's own slots are ``low <= s < high``
    (page 0, slots ``0 .. P-1``, is the padding sink and is never handed out).
    """

    def __init__(
        self, message: str, *, pool: str, slots: Sequence[int], low: int, high: int
    ) -> None:
        super().__init__(message)
        self.pool = pool
        self.slots = tuple(slots)
        self.low = low
        self.high = high


class UnalignedSlotsError(PoolError, ValueError):
    """Slots that are not whole pages.

    `slots` holds the first slot of each broken group of P entries (or, when the length
    is not a multiple of P, is empty and `length` says why); `page_size` is P.
    """

    def __init__(
        self, message: str, *, pool: str, slots: Sequence[int], length: int, page_size: int
    ) -> None:
        super().__init__(message)
        self.pool = pool
        self.slots = tuple(slots)
        self.length = length
        self.page_size = page_size


class SlotsNotAllocatedError(PoolError, ValueError):
    """Pages that had to be allocated are free. `pages` holds their page ids."""

    def __init__(self, message: str, *, pool: str, pages: Sequence[int]) -> None:
        super().__init__(message)
        self.pool = pool
        self.pages = tuple(pages)


class DoubleFreeError(SlotsNotAllocatedError):
    """A free named pages that are already free, or the same page twice in one call.

    `pages` holds the offending page ids (page id = slot // P).
    """


class DuplicatePagesError(PoolError, ValueError):
    """The same page appears twice where each must appear once. `pages` holds them."""

    def __init__(self, message: str, *, pool: str, pages: Sequence[int]) -> None:
        super().__init__(message)
        self.pool = pool
        self.pages = tuple(pages)
