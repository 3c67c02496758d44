"""The on-disk / on-the-wire page format of the persistent stores (file, Redis).

A stored page is one value: a fixed 128-byte header, then the page's bytes. Every field
the reader needs to refuse a wrong value is in the header, so a value is checked on its
own, whoever wrote it (another process, an older run):

- `MAGIC` (8 bytes), `VERSION` (u16), flags (u16: bit 0 = has a parent), the header's
  own CRC-32 (u32, computed with this field zeroed), the payload length (u64), the
  payload checksum (u64), the page key (32 raw bytes), the parent key (32 bytes, zero
  without a parent), the pool name (16 bytes, ASCII, zero-padded), 16 reserved zero
  bytes. Little-endian throughout.
- The payload checksum is `unicache_fsm.store.checksum.page_checksum` of the page's
  bytes (XXH3-64). `VERSION` 2 introduced it (version 1 held a torch dot product); a
  value of any other version is refused like any other invalid header, never served.
- `encode_header(key, parent, pool, nbytes, checksum) -> bytes`,
  `decode_header(raw) -> PageRecord | None` (None for anything that is not a valid
  header of this version: wrong magic or version, bad header CRC, non-zero reserved
  bytes, a pool name that is not a `PoolName`).
- `PageRecord(key, parent, pool, nbytes, checksum)` — a decoded header.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from unicache_fsm.pools.transfer import PoolName

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "VERSION",
    "PageRecord",
    "decode_header",
    "encode_header",
]

MAGIC = b"UCFSPAGE"
VERSION = 2
_HEADER = struct.Struct("<8sHHIQQ32s32s16s16x")
HEADER_SIZE = _HEADER.size
assert HEADER_SIZE == 128
_HAS_PARENT = 1
_CRC_AT = 12  # byte offset of the header CRC field
_U64 = 1 << 64


class PageRecord(NamedTuple):
    """A decoded page header (an immutable named tuple: readers decode one per page read,
    so it is built as cheaply as Python allows)."""

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


_POOLS = {pool.value.encode("ascii").ljust(16, b"\0"): pool for pool in PoolName}
_NO_PARENT = bytes(32)
# A valid header's first 12 bytes are MAGIC, VERSION and flags 0 or 1: the CRC state
# after them and the zeroed CRC field, per flags value (so decoding runs one crc32 pass).
_CRC_PREFIX = {
    flags: zlib.crc32(bytes(4), zlib.crc32(struct.pack("<8sHH", MAGIC, VERSION, flags)))
    for flags in (0, _HAS_PARENT)
}


def decode_header(raw: bytes | bytearray | memoryview) -> PageRecord | None:
    """The header in `raw` (its first `HEADER_SIZE` bytes), or None if it is not one."""
    if len(raw) < HEADER_SIZE:
        return None
    head = memoryview(raw)[:HEADER_SIZE]
    magic, version, flags, crc, nbytes, checksum, key, parent, pool = _HEADER.unpack(head)
    if magic != MAGIC or version != VERSION or flags & ~_HAS_PARENT:
        return None
    # the CRC of the header with its own field zeroed, without copying the header: the
    # bytes before the field are the checked constants above
    if zlib.crc32(head[_CRC_AT + 4 :], _CRC_PREFIX[flags]) != crc:
        return None
    pool_name = _POOLS.get(pool)
    if pool_name is None:
        return None
    has_parent = bool(flags & _HAS_PARENT)
    if not has_parent and parent != _NO_PARENT:
        return None
    return PageRecord(key.hex(), parent.hex() if has_parent else None, pool_name, nbytes, checksum)
