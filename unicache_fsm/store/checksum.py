"""The checksum of a stored page: the one function every store uses to verify page bytes.

- `page_checksum(page) -> int` — XXH3-64 (seed 0) of the bytes of one page, a 1-D uint8
  CPU tensor or a contiguous byte buffer (`memoryview`, `bytes`), as an unsigned 64-bit
  int. The hash reads the memory in place (a non-contiguous tensor is made contiguous
  first), so checking a page costs one pass over its bytes and no copy. XXH3 is a
  fixed, published algorithm (the `xxhash` package binds the reference C
  implementation): the value is the same in every process, on every platform, in every
  version (a golden value in the tests pins it), and any change of one bit changes it.
- `page_checksums(pages) -> list[int]` — `page_checksum` of every row of a ``[n, nbytes]``
  uint8 CPU tensor, in order.
- `copy_checksum(dst, src) -> int` — copy one page's bytes (``dst[...] = src``, two 1-D
  uint8 NumPy arrays of one length, not overlapping; either may be strided) and return
  `page_checksum` of them: the copy goes in pieces of `PIECE_BYTES`, each hashed
  (XXH3's streaming form, the same value) right after it lands, while it is still in
  the core's cache, so a copy and its checksum cost one pass over memory, not two.
  Both the copy and the hash release the GIL while they run.
- `copy_checksums(dst, dst_rows, src, src_rows) -> list[int]` — `copy_checksum` of
  ``dst[dst_rows[i]]`` and ``src[src_rows[i]]`` for each i (2-D uint8 NumPy arrays of
  one row length; rows inside their arrays, no destination row overlapping its source
  row), the checksums in order: the form `unicache_fsm.store.copier` calls, a chunk of
  pages at a time.

- `gather_checksums(dst, sources, row_bytes, pages, page_size) -> list[int]` — pages
  assembled from page-major sources into the store's page format (a KV cache's
  per-layer K and V buffers: source ``s`` holds pages of ``page_size`` rows of
  ``row_bytes[s]`` bytes; page ``i`` of `dst` holds, token by token, that token's row of
  every source in order), with each assembled page's `page_checksum`, taken right
  after the page landed, while it is in the core's cache. `dst` is a C-contiguous,
  writable uint8 array of exactly ``len(pages) * page_size * sum(row_bytes)`` bytes;
  the sources C-contiguous uint8 arrays. `gather_pages` is the same move without the
  checksums. Bad arguments raise `TypeError` (an array of another kind, a read-only
  destination, a page, size or page_size that is not an integer) / `ValueError`
  (sizes that do not add up or exceed memory, a page outside the sources, a source
  overlapping `dst`) before a byte moves, the same on either path.
- `scatter_checksums(src, dests, row_bytes, pages, page_size) -> list[int]` — the
  inverse: each page of `src` (page format) into its rows of the page-major `dests`
  (writable), with its `page_checksum`, taken before its rows are copied (which leaves
  the page in cache for them); `scatter_pages` without the checksums.
- `PageBuffers(buffers, row_bytes, page_size)` — the page-major side of those moves,
  checked once: its `gather(dst, pages, checksum=..., threads=1)` and `scatter(src,
  pages, checksum=..., threads=1)` check only their own arguments (a page device moving
  its buffers on every offload and load skips re-checking them each call). With
  ``threads > 1`` a native move of 1 MiB or more shares its pages among up to that many
  threads, each taking the next page until none is left: torch's OpenMP team where
  `unicache_fsm.store.team` found it, else threads the call starts (the same bytes and
  checksums either way; a thread count that is not an int >= 1 is a `ValueError`).

Rows are ints, NumPy integers or integer arrays (read by value on either path; a bool
or a non-integer row is a `TypeError` naming it).

Errors: `TypeError` naming the side for an array that is not uint8 (the native copy
moves bytes, so another dtype's rows would be cut at the wrong places), `ValueError` for
arrays of unequal page lengths or row counts, both before anything is written. The
native path also refuses, with `ValueError` before writing, a row outside its array or
a destination row overlapping its source row; the Python path takes those as given
(the copier checks its rows first).

Native copies: where the optional extension ``unicache_fsm._pagecopy`` is built (setup.py)
and `NATIVE_COPY` is true, pages of more than 240 bytes whose source and destination
are C-contiguous move in native code, many pages in one call with the GIL released:
each 64-byte stripe is read once, folded into XXH3's state and stored from the same
register (AVX2 where the CPU has it; large aligned pages with streaming stores, which
skip reading the destination first), so the checksum is of the bytes as stored, as in
the piece-by-piece Python path. A gather assembles each page in a scratch that stays in
the core's cache, then stores and hashes it in one pass; a page over 512 KiB whose
token rows are whole 1 KiB blocks of XXH3 goes by runs of tokens, the hash carried from
run to run (a 2 MiB page would not stay in cache). The values are XXH3-64's, the same
as the Python path's (the native XXH3 is checked against the `xxhash` package in the
tests). Other pages
(short, strided), and every page when the extension is absent or `NATIVE_COPY` is set
false, take the Python path above. `COPY_IMPLEMENTATION` says which runs, in words.

XXH3 is not a cryptographic hash: it detects torn, partial, damaged and misplaced pages,
not a party that forges pages on purpose (whoever can write the store can write a page
with a matching checksum anyway). The persistent stores write the value into each page's
header (`unicache_fsm.store.pageformat`); the memory store keeps it beside the page.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np
import torch
import xxhash

from unicache_fsm.store import team  # noqa: F401  (sets the threads of split moves)

__all__ = [
    "COPY_IMPLEMENTATION",
    "NATIVE_COPY",
    "PIECE_BYTES",
    "PageBuffers",
    "copy_checksum",
    "copy_checksums",
    "gather_checksums",
    "gather_pages",
    "page_checksum",
    "page_checksums",
    "scatter_checksums",
    "scatter_pages",
]

_XXH3 = xxhash.xxh3_64_intdigest

_NativeRows = Callable[[Any, list[int], Any, list[int], int], list[int]]
_NativeMove = Callable[..., "list[int] | None"]
_native_rows: _NativeRows | None
_native_gather: _NativeMove | None
_native_scatter: _NativeMove | None
try:
    from unicache_fsm._pagecopy import HARDWARE_AVX2 as _HARDWARE_AVX2
    from unicache_fsm._pagecopy import SHORT_MAX as _SHORT_MAX
    from unicache_fsm._pagecopy import copy_rows as _native_rows
    from unicache_fsm._pagecopy import gather_pages as _native_gather
    from unicache_fsm._pagecopy import scatter_pages as _native_scatter
except ImportError:  # pragma: no cover - built without a C compiler
    _native_rows, _HARDWARE_AVX2, _SHORT_MAX = None, False, 0
    _native_gather = _native_scatter = None

NATIVE_COPY: bool = _native_rows is not None
"""Whether `copy_checksum` and `copy_checksums` move contiguous pages of more than 240
bytes in native code (``unicache_fsm._pagecopy``; optional, see setup.py). Read at each
call: setting it false (the tests do) runs the Python path."""

COPY_IMPLEMENTATION: str = (
    ("native, AVX2" if _HARDWARE_AVX2 else "native, portable C") if _native_rows else "Python"
)
"""What copies and checksums pages here, in words (benchmarks print it)."""

#: bytes `copy_checksum` copies and hashes at a time (source and destination of one
#: piece together fit a core's L2 cache with room to spare)
PIECE_BYTES = 256 << 10


def page_checksum(page: torch.Tensor | memoryview | bytes) -> int:
    """XXH3-64 of the bytes of `page` (a 1-D uint8 CPU tensor or a byte buffer), read in
    place."""
    if isinstance(page, torch.Tensor):
        return _XXH3(page.contiguous().numpy().data)
    return _XXH3(page)


def page_checksums(pages: torch.Tensor) -> list[int]:
    """`page_checksum` of each row of `pages` (``[n, nbytes]`` uint8, CPU), in order."""
    return [_XXH3(row.data) for row in pages.contiguous().numpy()]


def copy_checksum(dst: Any, src: Any) -> int:
    """Copy `src` into `dst` (1-D uint8 NumPy arrays of one length, not overlapping) and
    return `page_checksum` of the bytes, each piece hashed while it is in cache."""
    _check_bytes(dst, src, "copy_checksum")
    n = src.shape[0]
    if dst.shape != src.shape:
        msg = f"copy_checksum: destination of {dst.shape} bytes for a source of {src.shape}"
        raise ValueError(msg)
    if _native(dst, src, n):
        assert _native_rows is not None
        return _native_rows(dst, [0], src, [0], n)[0]
    if n <= PIECE_BYTES:
        dst[...] = src
        return _XXH3(_landed(dst))
    state = xxhash.xxh3_64()
    for at in range(0, n, PIECE_BYTES):
        piece = dst[at : at + PIECE_BYTES]
        piece[...] = src[at : at + PIECE_BYTES]
        state.update(_landed(piece))
    return state.intdigest()


def copy_checksums(
    dst: Any, dst_rows: Sequence[int], src: Any, src_rows: Sequence[int]
) -> list[int]:
    """``copy_checksum(dst[dst_rows[i]], src[src_rows[i]])`` for each i (2-D uint8 NumPy
    arrays, rows inside them, as many of each), in one native call where it can."""
    if dst.dtype is not _UINT8 or src.dtype is not _UINT8:  # (inline: the usual case)
        _check_bytes(dst, src, "copy_checksums")
    n = src.shape[1]
    if dst.shape[1] != n or len(dst_rows) != len(src_rows):
        msg = (
            f"copy_checksums: {len(src_rows)} source row(s) of {n} bytes into "
            f"{len(dst_rows)} destination row(s) of {dst.shape[1]} bytes"
        )
        raise ValueError(msg)
    # (lists of plain ints, the usual case, pass as they are without a call each)
    if type(dst_rows) is not list or not set(map(type, dst_rows)) <= _INT:
        dst_rows = _int_rows(dst_rows, "destination row")
    if type(src_rows) is not list or not set(map(type, src_rows)) <= _INT:
        src_rows = _int_rows(src_rows, "source row")
    if NATIVE_COPY and n > _SHORT_MAX:  # `_native`, inline
        flags = dst.flags
        if flags.c_contiguous and flags.writeable and src.flags.c_contiguous:
            assert _native_rows is not None
            return _native_rows(dst, dst_rows, src, src_rows, n)
    return [copy_checksum(dst[d], src[s]) for d, s in zip(dst_rows, src_rows, strict=True)]


def gather_checksums(
    dst: Any, sources: Sequence[Any], row_bytes: Sequence[int], pages: Sequence[int], page_size: int
) -> list[int]:
    """Assemble `pages` from `sources` into `dst` and return each page's `page_checksum`
    (module docstring); native where built, else NumPy and the `xxhash` package."""
    sums = _move(dst, sources, row_bytes, pages, page_size, checksum=True, scatter=False)
    assert sums is not None
    return sums


def gather_pages(
    dst: Any, sources: Sequence[Any], row_bytes: Sequence[int], pages: Sequence[int], page_size: int
) -> None:
    """`gather_checksums` without the checksums."""
    _move(dst, sources, row_bytes, pages, page_size, checksum=False, scatter=False)


def scatter_checksums(
    src: Any, dests: Sequence[Any], row_bytes: Sequence[int], pages: Sequence[int], page_size: int
) -> list[int]:
    """The inverse of `gather_checksums`: each page of `src` into its rows of `dests`,
    and its `page_checksum` (module docstring)."""
    sums = _move(src, dests, row_bytes, pages, page_size, checksum=True, scatter=True)
    assert sums is not None
    return sums


def scatter_pages(
    src: Any, dests: Sequence[Any], row_bytes: Sequence[int], pages: Sequence[int], page_size: int
) -> None:
    """`scatter_checksums` without the checksums."""
    _move(src, dests, row_bytes, pages, page_size, checksum=False, scatter=True)


def _move(
    side: Any,
    buffers: Sequence[Any],
    row_bytes: Sequence[int],
    pages: Sequence[int],
    page_size: int,
    *,
    checksum: bool,
    scatter: bool,
) -> list[int] | None:
    """A gather (`side` is written) or a scatter (`buffers` are written) of page-format
    bytes `side` and page-major `buffers`, native where built."""
    call = "scatter" if scatter else "gather"
    return PageBuffers(buffers, row_bytes, page_size, call=call).move(
        side, pages, checksum=checksum, scatter=scatter
    )


class PageBuffers:
    """Page-major buffers checked once, for many gathers and scatters (a page device's
    K and V buffers, moved every offload and load): `gather(dst, pages, checksum=...)`
    and `scatter(src, pages, checksum=...)` are `gather_checksums` / `gather_pages` and
    `scatter_checksums` / `scatter_pages` of these buffers, and check only their own
    arguments (the page-format side, the pages) and, for a scatter, that the buffers
    are writable. Built from `buffers` (C-contiguous uint8 arrays), their `row_bytes`
    and `page_size`, checked as those functions check them (`TypeError` /
    `ValueError`); `call` names the move in those messages."""

    __slots__ = ("arrays", "page_size", "row_bytes", "token_bytes")

    def __init__(
        self,
        buffers: Sequence[Any],
        row_bytes: Sequence[int],
        page_size: int,
        *,
        call: str = "page buffers",
    ) -> None:
        rows = _int_rows(row_bytes, "row size", call)
        if isinstance(page_size, (bool, np.bool_)) or not hasattr(type(page_size), "__index__"):
            msg = f"{call}: page_size is a {type(page_size).__name__}, not an integer"
            raise TypeError(msg)
        size = operator.index(page_size)
        arrays = list(buffers)
        for i, a in enumerate(arrays):
            if not _is_bytes(a):
                _not_bytes(call, f"buffer {i}", a)
        token = sum(rows) if rows else 0
        nbytes = size * token
        if size < 1 or nbytes > sys.maxsize:  # (the native code refuses a wrapped size)
            msg = f"{call}: page_size {size} * row sizes {rows}: pages of {nbytes} bytes"
            raise ValueError(msg)
        self.arrays, self.row_bytes, self.page_size, self.token_bytes = arrays, rows, size, token

    def gather(
        self, dst: Any, pages: Sequence[int], *, checksum: bool, threads: int = 1
    ) -> list[int] | None:
        """`pages` of the buffers into `dst`; each page's checksum with `checksum`."""
        return self.move(dst, pages, checksum=checksum, scatter=False, threads=threads)

    def scatter(
        self, src: Any, pages: Sequence[int], *, checksum: bool, threads: int = 1
    ) -> list[int] | None:
        """Each page of `src` into its rows of the buffers; its checksum with `checksum`."""
        return self.move(src, pages, checksum=checksum, scatter=True, threads=threads)

    def move(
        self, side: Any, pages: Sequence[int], *, checksum: bool, scatter: bool, threads: int = 1
    ) -> list[int] | None:
        """`gather` (`side` is written) or `scatter` (the buffers are written). A native
        move splits its pages over up to `threads` threads (each takes the next page not
        yet moved; at most 64, one per 512 KiB of the move and one per page: a thread
        costs tens of microseconds to start), the GIL released; the Python path moves
        them in this thread. Same bytes, same sums."""
        call = "scatter" if scatter else "gather"
        if type(threads) is not int or threads < 1:
            msg = f"{call}: threads must be an int >= 1, got {threads!r}"
            raise ValueError(msg)
        ids = _int_rows(pages, "page", call)
        if not _is_bytes(side):
            _not_bytes(call, "page-format bytes", side)
        # (checked here: no path writes part of a move)
        if not scatter and not side.flags.writeable:
            _read_only(call, "page-format bytes")
        if scatter:
            for i, a in enumerate(self.arrays):
                if not a.flags.writeable:
                    _read_only(call, f"buffer {i}")
        return self._run(side, ids, checksum, scatter, call, threads)

    def _run(
        self, side: Any, ids: list[int], checksum: bool, scatter: bool, call: str, threads: int
    ) -> list[int] | None:
        buffers, rows, page_size = self.arrays, self.row_bytes, self.page_size
        token = self.token_bytes
        nbytes = page_size * token
        if checksum and nbytes <= _SHORT_MAX_PAGE:
            # short pages: XXH3's short paths are not native; the move is, then each hash
            self._run(side, ids, False, scatter, call, threads)
            return [_XXH3(page.data) for page in side.reshape(len(ids), nbytes)]
        native = _native_scatter if scatter else _native_gather
        if NATIVE_COPY and native is not None:
            got: list[int] | None = native(
                side, buffers, rows, ids, page_size, checksum, threads=threads
            )
            return got
        # the same checks as the native path, then the same bytes page by page through NumPy
        if len(buffers) != len(rows) or not buffers or min(rows) < 1:
            msg = f"{call}: {len(buffers)} buffer(s), row sizes {rows}, page_size {page_size}"
            raise ValueError(msg)
        have = min(a.size // (page_size * r) for a, r in zip(buffers, rows, strict=True))
        if side.size != len(ids) * nbytes or any(not 0 <= i < have for i in ids):
            msg = (
                f"{call}: {side.size} page-format bytes for pages {ids} of {nbytes} "
                f"(0 .. {have - 1})"
            )
            raise ValueError(msg)
        for i, a in enumerate(buffers):
            if side.size and np.may_share_memory(side, a):  # (contiguous: bounds are exact)
                msg = f"{call}: buffer {i} overlaps the page-format bytes"
                raise ValueError(msg)
        formatted = side.reshape(len(ids), page_size, token)
        # (C-contiguous: a buffer of any shape is its flat bytes, as the native path reads it)
        flat = [a.reshape(-1) for a in buffers]
        sums = []
        for i, page in enumerate(ids):
            if checksum and scatter:
                sums.append(_XXH3(formatted[i].data))
            at = 0
            for buf, r in zip(flat, rows, strict=True):
                run = buf[page * page_size * r : (page + 1) * page_size * r].reshape(page_size, r)
                if scatter:
                    run[...] = formatted[i, :, at : at + r]
                else:
                    formatted[i, :, at : at + r] = run
                at += r
            if checksum and not scatter:
                sums.append(_XXH3(formatted[i].data))
        return sums if checksum else None


def _is_bytes(a: Any) -> bool:
    """Whether `a` is a C-contiguous uint8 NumPy array (what a native move reads)."""
    return isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.flags.c_contiguous


def _not_bytes(call: str, what: str, a: Any) -> NoReturn:
    kind = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
    msg = f"{call}: the {what} must be a C-contiguous uint8 array, got {kind}"
    raise TypeError(msg)


def _read_only(call: str, what: str) -> NoReturn:
    msg = f"{call}: the {what} must be writable, got a read-only array"
    raise TypeError(msg)


def _int_rows(rows: Any, side: str, call: str = "copy_checksums") -> list[int]:
    """`rows` as a list of ints (NumPy integers and arrays read by value; one path
    takes what the other does), else TypeError naming the row (a bool too: NumPy would
    read it as a mask)."""
    if type(rows) is list and set(map(type, rows)) <= _INT:  # (one C-level pass)
        return rows
    if isinstance(rows, np.ndarray) and rows.dtype.kind in "iu":
        listed: list[int] = rows.tolist()
        return listed
    out = []
    for i, r in enumerate(rows):
        if isinstance(r, (bool, np.bool_)) or not hasattr(type(r), "__index__"):
            msg = f"{call}: {side} {i} is a {type(r).__name__}, not an integer"
            raise TypeError(msg)
        out.append(operator.index(r))
    return out


_INT = frozenset({int})
#: pages of at most this many bytes take XXH3's short paths, which the native code lacks
#: (the gathers and scatters move them natively and hash them with the `xxhash` package)
_SHORT_MAX_PAGE = 240
_UINT8 = np.dtype(np.uint8)


def _check_bytes(dst: Any, src: Any, call: str) -> None:
    """TypeError naming the side unless both arrays hold uint8 (page bytes)."""
    if dst.dtype is _UINT8 and src.dtype is _UINT8:  # (the usual case: the one instance)
        return
    for side, a in (("destination", dst), ("source", src)):
        if a.dtype != np.uint8:
            msg = f"{call}: the {side} holds {a.dtype}, not the uint8 bytes of pages"
            raise TypeError(msg)


def _native(dst: Any, src: Any, n: int) -> bool:
    """Whether pages of `n` bytes of the arrays `dst` and `src` go to the native copy."""
    if not NATIVE_COPY or n <= _SHORT_MAX:
        return False
    flags = dst.flags  # (a new flags object per read: read once)
    return bool(flags.c_contiguous and flags.writeable and src.flags.c_contiguous)


def _landed(a: Any) -> Any:
    """The bytes of the 1-D uint8 array `a` as a buffer XXH3 reads: `a`'s own memory, or
    a contiguous copy when `a` is strided (XXH3 cannot read a strided buffer)."""
    return a.data if a.flags.c_contiguous else np.ascontiguousarray(a).data
