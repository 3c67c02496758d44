"""What the harness needs from each cache: the `Side` protocol and its value types.

Both adapters (`sglang_side.SglangSide`, `project_side.ProjectSide`) report raw slot
numbers of their own pools; the harness maps 0.5.23's slots onto the project's.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import torch

from conformance.model import Pool

__all__ = ["InsertOut", "MatchOut", "Side", "TokenRow"]


@attrs.frozen
class MatchOut:
    prefix_len: int
    indices: tuple[int, ...]
    handle: Any = attrs.field(eq=False, repr=False)  # the node to lock


@attrs.frozen
class InsertOut:
    prefix_len: int
    adopted: dict[Pool, tuple[tuple[int, int], ...]]


@attrs.frozen
class TokenRow:
    """One token of the tree, in a canonical order that ignores node boundaries.

    Rows come from a depth-first walk, children ordered by their first page, each node
    expanded into one row per token. `depth` is the token's position in its key;
    `full` / `swa` its FULL / SWA slot (None: no device FULL / an SWA tombstone);
    `lock` the FULL lock count on its node; `stored` / `pending` its external-store
    flags.
    """

    depth: int
    token: int
    full: int | None
    swa: int | None
    lock: int
    stored: bool
    pending: bool


class Side(Protocol):
    """One cache under test, driven through the same operations as the other."""

    name: str

    def start(self) -> None:
        """Begin a program from an empty cache and fresh pools."""

    def available(self, pool: Pool) -> int: ...

    def alloc(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """`n` fresh FULL slots (whole pages) and, with SWA, mapped SWA peers."""

    def release_swa(self, full_slots: torch.Tensor) -> None:
        """The request frees the SWA peers of these (caller-owned) FULL slots."""

    def match(self, tokens: list[int]) -> MatchOut: ...

    def insert(
        self, tokens: list[int], value: torch.Tensor, prev: int, swa_evicted: int
    ) -> InsertOut: ...

    def lock(self, handle: Any) -> Any: ...

    def unlock(self, receipt: Any) -> None: ...

    def evict(self, full: int, swa: int) -> tuple[int, int]: ...

    def set_accept(self, accept: bool) -> None: ...

    def complete(self, verdicts: tuple[bool, ...]) -> None: ...

    def pending_records(self) -> int:
        """Offloads accepted by the store and not yet settled by the cache."""

    def rows(self) -> list[TokenRow]: ...

    def audit(self) -> str | None:
        """The cache's own consistency check: None when it passes, else the finding."""
