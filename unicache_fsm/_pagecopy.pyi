# The native fused page copy and XXH3-64 (unicache_fsm/_pagecopy.c); optional: see
# unicache_fsm.store.checksum.

from typing import Any

HARDWARE_AVX2: bool
SHORT_MAX: int

def xxh3_64(data: Any, hardware: bool = True) -> int: ...
def copy_rows(
    dst: Any,
    dst_rows: Any,
    src: Any,
    src_rows: Any,
    row_bytes: int,
    hardware: bool = True,
) -> list[int]: ...
def gather_pages(
    dst: Any,
    sources: Any,
    row_bytes: Any,
    pages: Any,
    page_size: int,
    checksum: bool = True,
    hardware: bool = True,
    threads: int = 1,
) -> list[int] | None: ...
def scatter_pages(
    src: Any,
    dests: Any,
    row_bytes: Any,
    pages: Any,
    page_size: int,
    checksum: bool = True,
    hardware: bool = True,
    threads: int = 1,
) -> list[int] | None: ...
def set_team(address: int) -> None: ...
