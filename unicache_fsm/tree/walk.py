"""Walking a radix tree of whole pages: how children are filed and how keys compare.

- `child_key(parent, packed, at, namespace, stride)` — the dict key under which the
  child whose packed key (`pack_key`) starts at byte `at` of `packed` is filed in
  `parent.children`: its first page's packed bytes (`stride` = page size x token
  width), and at the root also the namespace (tenants never share a subtree). Bytes,
  not a tuple of tokens: no object the garbage collector tracks per node, and a page
  compare is a memcmp.
- `pack_key(key, fmt)` — the key's tokens as fixed-width bytes (`fmt`: ``"I"``,
  u32 little-endian as page hashes cover them, or ``"q"``, int64 native), or
  `InvalidTokenError` naming the first token that does not fit. The tree packs a key
  once and compares packed bytes: a page compare is a memcmp, no per-token Python work.
- `TokenKey(tokens)` — a key (a tuple of its tokens) that keeps its packings: build
  it once per request and pass it to every match and insert of that request, and the
  tree packs it no more (`packed(fmt)`). It is only a cache: a token that does not
  pack raises where a plain tuple's would, when the tree packs it.
- `packed_common_len(node, packed, pos, end, page_size, width)` — the length of the
  page-aligned common prefix of `node.packed` and the packed key's tokens
  ``[pos:end]`` (`width` bytes per token), given that the first page matches (it
  selected the child).
- `check_aligned(what, value, page_size)` — `UnalignedKeyError` unless `value` is a
  page multiple.

Pure functions over nodes and tuples: no tree state, no residency.
"""

from __future__ import annotations

import contextlib
import functools
import struct
from collections.abc import Callable, Iterable
from typing import Any

import torch

from unicache_fsm import hashing
from unicache_fsm.tree.errors import UnalignedKeyError
from unicache_fsm.tree.node import TreeNode

__all__ = ["TokenKey", "check_aligned", "child_key", "pack_key", "packed_common_len"]

_I64 = (-(1 << 63), 1 << 63)


def child_key(parent: TreeNode, packed: bytes, at: int, namespace: str | None, stride: int) -> Any:
    page = packed[at : at + stride]
    return (namespace, page) if parent.parent is None else page


@functools.lru_cache(maxsize=512)
def _i64_packer(n: int) -> Callable[..., bytes]:
    """`struct` packer of `n` native int64s (one C loop over a tuple; array('q') walks a
    tuple subclass such as `TokenKey` item by item, several times slower)."""
    return struct.Struct(f"={n}q").pack


def pack_key(key: tuple[int, ...], fmt: str) -> bytes:
    if fmt == "I":
        return hashing.pack_tokens(key)  # u32 little-endian, typed error on a bad token
    try:
        return _i64_packer(len(key))(*key)
    except (OverflowError, TypeError, struct.error) as exc:
        for index, token in enumerate(key):
            if not hasattr(token, "__index__") or not _I64[0] <= token.__index__() < _I64[1]:
                msg = f"token {token!r} at index {index} is not a 64-bit integer"
                raise hashing.InvalidTokenError(msg, index=index, token=token) from exc
        raise


class TokenKey(tuple[int, ...]):
    """A key that keeps its packings (see the module docstring); equal to, and hashed
    like, the tuple of its tokens. Slices are plain tuples.

    Built from any int sequence (a tensor through ``tolist``); it packs its tokens as
    u32 (the format of a hashing tree) at once when they fit, otherwise on first use.
    """

    _packings: dict[str, bytes]

    def __new__(cls, tokens: Iterable[int] | torch.Tensor = ()) -> TokenKey:
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.tolist()
        self = super().__new__(cls, tokens)
        self._packings = {}
        # a token that does not fit is refused again, where a tuple's would be, by
        # the tree that packs it
        with contextlib.suppress(hashing.InvalidTokenError):
            self._packings["I"] = hashing.pack_tokens(self)
        return self

    def packed(self, fmt: str) -> bytes:
        """The tokens packed by `pack_key` in `fmt` (computed once per format)."""
        got = self._packings.get(fmt)
        if got is None:
            got = self._packings[fmt] = pack_key(self, fmt)
        return got


def packed_common_len(
    node: TreeNode, packed: bytes, pos: int, end: int, page_size: int, width: int
) -> int:
    mine = node.packed
    n = len(mine) // width
    at = pos * width
    # bytes.startswith at an offset is a memcmp in place: no copy of the key's bytes
    # (and a memoryview's == compares byte by byte, far slower)
    if end - pos >= n and packed.startswith(mine, at):
        return n
    stride = page_size * width
    lo, hi = 1, min(n, end - pos) // page_size  # pages; lo pages are known to match
    own = memoryview(mine)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if packed.startswith(own[: mid * stride], at):
            lo = mid
        else:
            hi = mid - 1
    return lo * page_size


def check_aligned(what: str, value: int, page_size: int) -> None:
    if value % page_size:
        msg = (
            f"{what} = {value} is not a multiple of the page size {page_size}; "
            "the tree holds whole pages only"
        )
        raise UnalignedKeyError(msg, what=what, value=value, page_size=page_size)
