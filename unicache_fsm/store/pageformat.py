"""The on-disk / on-the-wire page format of the persistent stores (file, Redis).

A stored page is one value: a fixed 128-byte header, then the page's bytes. Every field
the reader needs to refuse a wrong value is in the header, so a value is checked on its
own, whoever wrote it (another process, an older run):

- `MAGIC` (8 bytes), `VERSION` (u16), flags (u16: bit 0 = has a parent), the header's
  own CRC-32 (u32, computed with this field zeroed), the payload length (u64), the
  payload checksum (u64), the page key (32 raw bytes), the parent key (32 bytes, zero
  without a parent), the pool name (16 bytes, ASCII, zero-padded), 16 reserved zero
  bytes. Little-endian throughout.
- `page_checksums(pages)` — one 64-bit checksum per row of a ``[n, nbytes]`` uint8 CPU
  tensor: the page's little-endian 64-bit words (bytes, when nbytes is not a multiple of
  8) dotted with fixed odd weights, mod 2**64. The weights are the splitmix64 sequence
  from `WEIGHT_SEED`, so the checksum is the same in every process and every version of
  torch (a golden value in the tests pins it). Any change of one word changes it.
- `page_checksum(page)` — the same checksum of one page (a 1-D uint8 CPU tensor).
- `encode_header(key, parent, pool, nbytes, checksum) -> bytes`,
  `decode_header(raw) -> PageRecord | None` (None for anything that is not a valid
  header of this version: wrong magic or version, bad header CRC, non-zero reserved
  bytes, a pool name that is not a `PoolName`).
- `PageRecord(key, parent, pool, nbytes, checksum)` — a decoded header.
"""

from __future__ import annotations

import functools
import struct
import zlib

import attrs
import torch

from unicache_fsm.pools.transfer import PoolName

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "VERSION",
    "WEIGHT_SEED",
    "PageRecord",
    "decode_header",
    "encode_header",
    "page_checksum",
    "page_checksums",
]

MAGIC = b"UCFSPAGE"
VERSION = 1
WEIGHT_SEED = 0x5EED_CAC4E_F11E
_HEADER = struct.Struct("<8sHHIQQ32s32s16s16x")
HEADER_SIZE = _HEADER.size
assert HEADER_SIZE == 128
_HAS_PARENT = 1
_CRC_AT = 12  # byte offset of the header CRC field
_U64 = 1 << 64


@attrs.frozen
class PageRecord:
    """A decoded page header."""

    key: str
    parent: str | None
    pool: PoolName
    nbytes: int
    checksum: int


def encode_header(
    key: str, parent: str | None, pool: PoolName, nbytes: int, checksum: int
) -> bytes:
    """The 128-byte header of a page (keys are 64-hex page hashes, already checked)."""
    flags = _HAS_PARENT if parent is not None else 0
    raw = bytearray(
        _HEADER.pack(
            MAGIC,
            VERSION,
            flags,
            0,
            nbytes,
            checksum % _U64,
            bytes.fromhex(key),
            bytes.fromhex(parent) if parent is not None else bytes(32),
            pool.value.encode("ascii"),
        )
    )
    struct.pack_into("<I", raw, _CRC_AT, zlib.crc32(raw))
    return bytes(raw)


def decode_header(raw: bytes | bytearray | memoryview) -> PageRecord | None:
    """The header in `raw` (its first `HEADER_SIZE` bytes), or None if it is not one."""
    if len(raw) < HEADER_SIZE:
        return None
    head = bytearray(raw[:HEADER_SIZE])
    magic, version, flags, crc, nbytes, checksum, key, parent, pool = _HEADER.unpack(head)
    if magic != MAGIC or version != VERSION or flags & ~_HAS_PARENT:
        return None
    struct.pack_into("<I", head, _CRC_AT, 0)
    if zlib.crc32(head) != crc:
        return None
    try:
        pool_name = PoolName(pool.rstrip(b"\0").decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    has_parent = bool(flags & _HAS_PARENT)
    if not has_parent and any(parent):
        return None
    return PageRecord(key.hex(), parent.hex() if has_parent else None, pool_name, nbytes, checksum)


def _splitmix64(n: int, seed: int) -> torch.Tensor:
    """The first `n` outputs of splitmix64 from `seed`, as int64 (two's complement)."""

    def signed(value: int) -> int:
        value %= _U64
        return value - _U64 if value >= 1 << 63 else value

    def shr(z: torch.Tensor, s: int) -> torch.Tensor:  # logical shift right
        return (z >> s) & ((1 << (64 - s)) - 1)

    i = torch.arange(1, n + 1, dtype=torch.int64)
    z = signed(seed) + i * signed(0x9E3779B97F4A7C15)
    z = (z ^ shr(z, 30)) * signed(0xBF58476D1CE4E5B9)
    z = (z ^ shr(z, 27)) * signed(0x94D049BB133111EB)
    return z ^ shr(z, 31)


@functools.lru_cache(maxsize=16)
def _weights(words: int) -> torch.Tensor:
    return _splitmix64(words, WEIGHT_SEED) | 1


def page_checksums(pages: torch.Tensor) -> list[int]:
    """One unsigned 64-bit checksum per row of `pages` (``[n, nbytes]`` uint8, CPU)."""
    n, nbytes = pages.shape
    if n == 0:
        return []
    words = pages.view(torch.int64) if nbytes % 8 == 0 else pages.to(torch.int64)
    sums = torch.mv(words, _weights(words.shape[1]))
    return [v % _U64 for v in sums.tolist()]


def page_checksum(page: torch.Tensor) -> int:
    """`page_checksums` of one page, a 1-D uint8 CPU tensor (one dot product)."""
    nbytes = page.numel()
    if nbytes % 8 or not page.is_contiguous():
        return page_checksums(page.view(1, -1))[0]
    words = page.view(torch.int64)
    return int(torch.dot(words, _weights(words.numel()))) % _U64
