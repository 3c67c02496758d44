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

XXH3 is not a cryptographic hash: it detects torn, partial, damaged and misplaced pages,
not a party that forges pages on purpose (whoever can write the store can write a page
with a matching checksum anyway). The persistent stores write the value into each page's
header (`unicache_fsm.store.pageformat`); the memory store keeps it beside the page.
"""

from __future__ import annotations

import torch
import xxhash

__all__ = ["page_checksum", "page_checksums"]

_XXH3 = xxhash.xxh3_64_intdigest


def page_checksum(page: torch.Tensor | memoryview | bytes) -> int:
    """XXH3-64 of the bytes of `page` (a 1-D uint8 CPU tensor or a byte buffer), read in
    place."""
    if isinstance(page, torch.Tensor):
        return _XXH3(page.contiguous().numpy().data)
    return _XXH3(page)


def page_checksums(pages: torch.Tensor) -> list[int]:
    """`page_checksum` of each row of `pages` (``[n, nbytes]`` uint8, CPU), in order."""
    return [_XXH3(row.data) for row in pages.contiguous().numpy()]
