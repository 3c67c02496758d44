"""The scripted external store both caches offload to.

The test decides everything a store could decide: whether an offload call is accepted
(`accept`), when accepted offloads complete and with which verdict (`complete`). Each
side owns one `OffloadScript`; its store / linker adapter forwards `offload()`,
`num_completed_offloads()` and `pop_completed_offload()` to it. Completions are FIFO,
as in both caches.
"""

from __future__ import annotations

from collections import deque

__all__ = ["OffloadScript"]


class OffloadScript:
    """Accepted offloads in submission order, and the verdicts of completed ones."""

    def __init__(self) -> None:
        self.accept = True
        self.submitted = 0  # every offload() call, accepted or not
        self.in_flight = 0  # accepted, not completed
        self.completed: deque[bool] = deque()  # verdicts not yet popped, FIFO

    def submit(self) -> bool:
        self.submitted += 1
        if self.accept:
            self.in_flight += 1
        return self.accept

    def complete(self, verdicts: tuple[bool, ...]) -> int:
        """Complete the oldest in-flight offloads with `verdicts`; returns how many."""
        n = min(len(verdicts), self.in_flight)
        self.completed.extend(verdicts[:n])
        self.in_flight -= n
        return n

    def num_completed(self) -> int:
        return len(self.completed)

    def pop(self) -> bool:
        return self.completed.popleft()

    def reset(self) -> None:
        """Quiesce: in-flight offloads complete as failed (both caches' contract)."""
        self.completed.extend([False] * self.in_flight)
        self.in_flight = 0
