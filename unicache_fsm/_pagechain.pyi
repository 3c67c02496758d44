# The native page-hash chain (unicache_fsm/_pagechain.c); optional: see unicache_fsm.hashing.

from typing import Any, Literal, overload

HARDWARE_SHA: bool

@overload
def chain_digests(
    data: bytes | bytearray | memoryview,
    stride: int,
    prior: bytes,
    start: int,
    end: int,
    hardware: bool = True,
    joined: Literal[False] = False,
) -> list[bytes]: ...
@overload
def chain_digests(
    data: bytes | bytearray | memoryview,
    stride: int,
    prior: bytes,
    start: int,
    end: int,
    hardware: bool = True,
    *,
    joined: Literal[True],
) -> bytes: ...
def pack_u32(tokens: Any) -> bytes | None: ...
