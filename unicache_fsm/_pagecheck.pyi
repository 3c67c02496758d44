# The native live-page check (unicache_fsm/_pagecheck.c); optional: see unicache_fsm.pools.paged.
from array import array
from typing import Any, Literal, overload

@overload
def live_page_ids(
    slots: Any,
    page_size: int,
    num_pages: int,
    free_flags: bytearray,
    packed: Literal[False] = False,
) -> list[int] | None: ...
@overload
def live_page_ids(
    slots: Any, page_size: int, num_pages: int, free_flags: bytearray, packed: Literal[True]
) -> bytes | None: ...
@overload
def live_page_ids_at(
    address: int,
    count: int,
    page_size: int,
    num_pages: int,
    free_flags: bytearray,
    packed: Literal[False] = False,
) -> list[int] | None: ...
@overload
def live_page_ids_at(
    address: int,
    count: int,
    page_size: int,
    num_pages: int,
    free_flags: bytearray,
    packed: Literal[True],
) -> bytes | None: ...
def any_flagged(flags: bytearray, ids: list[int] | array[int]) -> bool: ...
def set_flags(flags: bytearray, ids: list[int] | array[int], value: bool) -> None: ...
