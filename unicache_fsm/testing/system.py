"""The kit's system under test: `serving.System`, the same system the reference
scheduler runs (re-exported here with its `Request`, `Outcome` and KV synthesis), and
`run_ranks` for driving several thread ranks at once.

- `System`, `Request`, `Outcome` — see `unicache_fsm.serving.system` and
  `unicache_fsm.serving.request`.
- `kv_bytes`, `NUM_LAYERS`, `WIDTH`, `POISON` — see `unicache_fsm.serving.kv`.
- `run_ranks(n, fn)` runs ``fn(rank, group)`` for n thread ranks (`ThreadRankGroup`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from unicache_fsm.linker.ranks import ThreadRankGroup
from unicache_fsm.serving.kv import NUM_LAYERS, POISON, WIDTH, kv_bytes
from unicache_fsm.serving.request import Outcome, Request
from unicache_fsm.serving.system import System

__all__ = [
    "NUM_LAYERS",
    "POISON",
    "WIDTH",
    "Outcome",
    "Request",
    "System",
    "kv_bytes",
    "run_ranks",
]


def run_ranks(
    n: int, fn: Callable[[int, ThreadRankGroup], Any], timeout: float = 30.0
) -> list[Any]:
    """Run ``fn(rank, group)`` in one thread per rank; return the results, rank order.

    An exception on any rank is re-raised (the first by rank) after every thread ended.
    """
    groups = ThreadRankGroup.create(n, timeout=timeout)
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def target(rank: int) -> None:
        try:
            results[rank] = fn(rank, groups[rank])
        except BaseException as exc:  # reported to the caller below
            errors[rank] = exc

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
        assert not t.is_alive(), "a rank thread hung"
    for exc in errors:
        if exc is not None:
            raise exc
    return results
