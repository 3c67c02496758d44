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

XXH3 is not a cryptographic hash: it detects torn, partial, damaged and misplaced pages,
not a party that forges pages on purpose (whoever can write the store can write a page
with a matching checksum anyway). The persistent stores write the value into each page's
header (`unicache_fsm.store.pageformat`); the memory store keeps it beside the page.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import xxhash

__all__ = ["PIECE_BYTES", "copy_checksum", "page_checksum", "page_checksums"]

_XXH3 = xxhash.xxh3_64_intdigest

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
    n = src.shape[0]
    if dst.shape != src.shape:
        msg = f"copy_checksum: destination of {dst.shape} bytes for a source of {src.shape}"
        raise ValueError(msg)
    if n <= PIECE_BYTES:
        dst[...] = src
        return _XXH3(_landed(dst))
    state = xxhash.xxh3_64()
    for at in range(0, n, PIECE_BYTES):
        piece = dst[at : at + PIECE_BYTES]
        piece[...] = src[at : at + PIECE_BYTES]
        state.update(_landed(piece))
    return state.intdigest()


def _landed(a: Any) -> Any:
    """The bytes of the 1-D uint8 array `a` as a buffer XXH3 reads: `a`'s own memory, or
    a contiguous copy when `a` is strided (XXH3 cannot read a strided buffer)."""
    return a.data if a.flags.c_contiguous else np.ascontiguousarray(a).data
