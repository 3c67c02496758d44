"""Value types of the tree's operations (names as in SGLang's unified cache).

- `ComponentType` — FULL (the backbone; every node has FULL data), SWA, MAMBA (the
  one enum of components and their pools, `unicache_fsm.pools.transfer`).
- `InsertParams` — what `RadixTree.insert` takes: the key, the caller's FULL slots
  aligned with it, how much of them the caller got from the tree (`prev_prefix_len`),
  the request's SWA boundary (`swa_evicted_seqlen`) and the SWA it keeps below it
  (`swa_kept_ranges`: checkpoint windows), `chunked`, adopted-range tracking.
- `InsertResult` — where the insert ended and which caller slots the tree adopted
  (`adopted_ranges`, kept sorted and disjoint by `record_adopted_range`), plus the
  write-through chain the insert triggered (root first).
- `MatchResult` — the device prefix (length, last device node: a handle on the
  matched path, whose slots `device_indices` reads off the tree on demand) and the
  host hit beyond it.
- `EvictParams` / `EvictResult` — tokens to free in FULL and in SWA, and what was freed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import torch

from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.tree.errors import InsertParamsError, TreeError

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode

__all__ = [
    "ComponentType",
    "EvictParams",
    "EvictResult",
    "InsertParams",
    "InsertResult",
    "MatchResult",
    "as_key",
]


def as_key(value: Sequence[int] | torch.Tensor) -> tuple[int, ...]:
    """A key as the tree holds it: a tuple of token ids."""
    if isinstance(value, tuple):
        return value
    if isinstance(value, torch.Tensor):
        return tuple(value.tolist())
    return tuple(value)


def _as_ranges(value: object) -> tuple[tuple[int, int], ...]:
    """`swa_kept_ranges` as a tuple of ``(start, end)`` int pairs; `InsertParamsError`
    naming the field for anything else (bounds and alignment are the insert's check)."""
    try:
        out = tuple((a, b) for a, b in value)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        out = None
    if out is None or not all(type(a) is int and type(b) is int for a, b in out):
        msg = f"swa_kept_ranges must be (start, end) pairs of ints, got {value!r}"
        raise InsertParamsError(msg, what="swa_kept_ranges", value=-1)
    return out


_as_key = as_key  # the linker's import (kept for it; new code uses `as_key`)


@attrs.frozen
class InsertParams:
    """One insert. `value[i]` is the caller's FULL slot for `key[i]`.

    `prev_prefix_len` leading tokens of `value` came from the tree (the caller's match):
    the insert neither frees nor adopts them. Below `swa_evicted_seqlen` the caller's
    SWA slots are already freed: those tokens go in as SWA tombstones, except inside
    `swa_kept_ranges` — absolute token ranges ``(start, end)`` below the boundary,
    sorted and disjoint, whose SWA slots the caller still holds, mapped from its FULL
    slots (the windows of `tree.swa_checkpoints`; empty, 0.5.23's behaviour, by
    default): a node the insert creates or unevicts there is split at their edges and
    keeps them live. `chunked`
    inserts (chunked prefill, loads) neither count hits nor trigger write-through.
    `namespace` is the request's namespace seed (`hashing.namespace_seed`), which
    separates tenants in the tree and seeds its page hashes.
    """

    key: tuple[int, ...] = attrs.field(converter=as_key)
    value: torch.Tensor = attrs.field(eq=False)
    prev_prefix_len: int = 0
    swa_evicted_seqlen: int = 0
    chunked: bool = False
    track_adopted_ranges: bool = False
    namespace: str | None = None
    swa_kept_ranges: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_as_ranges)

    def positions(self) -> tuple[tuple[str, int], ...]:
        """The token positions inside the key this insert names, by field name (each
        must be a whole-page position within the key)."""
        return (
            ("prev_prefix_len", self.prev_prefix_len),
            ("swa_evicted_seqlen", self.swa_evicted_seqlen),
        )


@attrs.define(slots=True, eq=False)
class InsertResult:
    """What an insert did; see the module docstring."""

    prefix_len: int = 0
    last_device_node: TreeNode | None = None
    adopted_ranges: dict[ComponentType, list[tuple[int, int]]] | None = None
    write_through: list[TreeNode] = attrs.field(factory=list)

    def record_adopted_range(self, component: ComponentType, start: int, end: int) -> None:
        """Record that the tree took the caller's slots for tokens ``[start, end)``.

        No-op when tracking is off or the range is empty. Ranges stay sorted and
        disjoint whatever the call order; overlapping or touching ranges merge.
        """
        if self.adopted_ranges is None or start >= end:
            return
        ranges = self.adopted_ranges.setdefault(component, [])
        merged_start, merged_end = start, end
        kept: list[tuple[int, int]] = []
        insert_at = 0
        for s, e in ranges:
            if e < merged_start:
                kept.append((s, e))
                insert_at = len(kept)
            elif s > merged_end:
                kept.append((s, e))
            else:  # overlapping or touching: absorb
                merged_start, merged_end = min(s, merged_start), max(e, merged_end)
        kept.insert(insert_at, (merged_start, merged_end))
        ranges[:] = kept


@attrs.frozen
class MatchResult:
    """The device prefix of a key, and what more a host backup holds.

    A handle, not a copy: `prefix_len` and `last_device_node` say where the prefix
    ends, and `device_indices` reads its backbone slots off the path from the root to
    `last_device_node` when asked (a fresh tensor each time, never the tree's). Read
    them before the tree evicts that path, or lock it first (`inc_lock_ref`); splits
    in between do not matter.
    """

    prefix_len: int
    last_device_node: TreeNode = attrs.field(eq=False)
    backbone: ComponentType = attrs.field(eq=False)  # the tree's backbone component
    device: torch.device = attrs.field(eq=False)  # the tree's device
    host_hit_length: int = 0
    last_host_node: TreeNode | None = attrs.field(default=None, eq=False)

    @property
    def device_indices(self) -> torch.Tensor:
        """The prefix's backbone slots, root first (int64, `prefix_len` of them)."""
        kind = self.backbone
        node = self.last_device_node
        parts: list[torch.Tensor] = []
        while node.parent is not None:
            slots = node.data.get(kind)
            if slots is None:
                msg = (
                    f"node {node.id} of a matched path lost its device slots since the "
                    "match: read device_indices before the tree evicts, or lock the path"
                )
                raise TreeError(msg)
            parts.append(slots)
            node = node.parent
        if not parts:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        parts.reverse()
        out = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        assert out.numel() == self.prefix_len, (out.numel(), self.prefix_len)
        return out


@attrs.frozen
class EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0


@attrs.frozen
class EvictResult:
    num_tokens: int = 0
    swa_num_tokens: int = 0
