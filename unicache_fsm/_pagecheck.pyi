# The native live-page check (unicache_fsm/_pagecheck.c); optional: see unicache_fsm.pools.paged.
from typing import Any

def live_page_ids(
    slots: Any, page_size: int, num_pages: int, free_flags: bytearray
) -> list[int] | None: ...
