# The native page-hash chain (unicache_fsm/_pagechain.c); optional: see unicache_fsm.hashing.

HARDWARE_SHA: bool

def chain_digests(
    data: bytes | bytearray | memoryview,
    stride: int,
    prior: bytes,
    start: int,
    end: int,
    hardware: bool = True,
) -> list[bytes]: ...
