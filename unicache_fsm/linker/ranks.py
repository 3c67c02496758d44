"""Rank agreement: every tensor-parallel rank must act on the same LOOKUP length and the
same load/offload verdicts, so they agree through a MIN all-reduce.

- `RankGroup` — the interface: `rank`, `world_size`, `all_reduce_min(values)` (element-
  wise MIN of an int vector across ranks; every rank passes the same length and gets
  the same result). Collective: every rank of the group must make the same calls in
  the same order.
- `intersect_restorable(group, restorable, num_pages)` -> the largest boundary in
  ``1..num_pages`` that every rank can restore, 0 if none: each rank sends a 0/1 mask
  over the boundaries and takes the largest that survives the MIN. The ranks' sets may
  be sparse, so the MIN of their maxima would be wrong ({2, 4} and {2, 3} give 2, not 3).
- `agree(group, flag)` -> True iff every rank passed True (MIN of 0/1).
- `SingleRank()` — a world of one: the reductions return their input.
- `ThreadRankGroup.create(n)` -> n groups, one per rank, for ranks simulated by threads
  of one process (tests, simulation); they meet at a `threading.Barrier`.
- `TorchDistRankGroup(group=None, device="cpu")` — a `torch.distributed` process group
  (gloo on CPU, nccl with a CUDA device); the reduction is ``all_reduce(MIN)`` on an
  int64 tensor. The default process group must be initialised first.
- `RankGroupError` — a reduction that cannot be done (lengths differ across threads,
  a rank gave up, bad input such as a boundary outside ``1..num_pages``: raised after
  the reduction, so the other ranks are not left waiting).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = [
    "RankGroup",
    "RankGroupError",
    "SingleRank",
    "ThreadRankGroup",
    "TorchDistRankGroup",
    "agree",
    "intersect_restorable",
]


class RankGroupError(UnicacheFsmError, RuntimeError):
    """A rank reduction failed or got unusable input. `rank` is the reporting rank."""

    def __init__(self, message: str, *, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


@runtime_checkable
class RankGroup(Protocol):
    """A group of ranks that can agree on int vectors by element-wise MIN."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def all_reduce_min(self, values: Sequence[int]) -> list[int]: ...


def _ints(values: Sequence[int], rank: int) -> list[int]:
    if set(map(type, values)) <= _INT:  # the usual case, checked in one C-level pass
        return list(values)
    out: list[int] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            msg = f"rank {rank}: all_reduce_min takes ints, got {v!r}"
            raise RankGroupError(msg, rank=rank)
        out.append(v)
    return out


#: the one value type a reduction takes (`bool` is an int subclass, and refused)
_INT = frozenset({int})


def intersect_restorable(group: RankGroup, restorable: Sequence[int], num_pages: int) -> int:
    """The largest boundary every rank of `group` can restore (0 if none); collective."""
    rank = group.rank
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 0:
        msg = f"rank {rank}: num_pages must be an int >= 0, got {num_pages!r}"
        raise RankGroupError(msg, rank=rank)
    bad: list[object] = []
    if set(map(type, restorable)) <= _INT and (
        not restorable or (min(restorable) >= 1 and max(restorable) <= num_pages)
    ):  # every boundary an int inside 1..num_pages, checked in C-level passes
        if type(group) is SingleRank:  # a world of one: the MIN is this rank's mask
            return max(restorable, default=0)
        mask = [0] * num_pages
        for b in restorable:
            mask[b - 1] = 1
        restorable = ()
    else:
        mask = [0] * num_pages
    for b in restorable:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= num_pages:
            bad.append(b)  # not restorable here, hence nowhere
            continue
        mask[b - 1] = 1
    common = group.all_reduce_min(mask)  # joined even with bad input: no peer waits alone
    if bad:
        msg = (
            f"rank {rank}: restorable boundary {bad[0]!r} is outside 1..{num_pages}; "
            "pass the store's lookup answer for this tail (checked: `CheckedStore.lookup`)"
        )
        raise RankGroupError(msg, rank=rank)
    for boundary in range(num_pages, 0, -1):
        if common[boundary - 1]:
            return boundary
    return 0


def agree(group: RankGroup, flag: bool) -> bool:
    """True iff every rank of `group` passed True; collective. (A `SingleRank` is
    answered without building the one-value vector: its MIN is the flag itself.)"""
    if type(group) is SingleRank:
        return bool(flag)
    return group.all_reduce_min([1 if flag else 0])[0] == 1


class SingleRank:
    """A world of one rank: every reduction returns its input."""

    __slots__ = ()

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        return _ints(values, 0)

    def __repr__(self) -> str:
        return "SingleRank()"


class _Rendezvous:
    """What the thread ranks of one world share: a barrier and one slot per rank."""

    __slots__ = ("barrier", "slots")

    def __init__(self, world_size: int, timeout: float) -> None:
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        self.slots: list[list[int] | None] = [None] * world_size


class ThreadRankGroup:
    """One rank of a world simulated by threads; build a world with `create`."""

    __slots__ = ("_rank", "_shared")

    def __init__(self, rank: int, shared: _Rendezvous) -> None:
        self._rank = rank
        self._shared = shared

    @classmethod
    def create(cls, world_size: int, *, timeout: float = 30.0) -> list[ThreadRankGroup]:
        """`world_size` groups, rank 0 first; give each to its own thread."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            msg = f"world_size must be an int >= 1, got {world_size!r}"
            raise RankGroupError(msg, rank=-1)
        shared = _Rendezvous(world_size, timeout)
        return [cls(r, shared) for r in range(world_size)]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return len(self._shared.slots)

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        shared = self._shared
        try:
            mine = _ints(values, self._rank)
        except RankGroupError:
            shared.barrier.abort()  # release the other ranks at once instead of a timeout
            raise
        shared.slots[self._rank] = mine
        self._wait("publish its values")
        every = [s for s in shared.slots if s is not None]
        lengths = {len(s) for s in every}
        result = [min(col) for col in zip(*every, strict=False)] if len(lengths) == 1 else None
        self._wait("read the others' values")  # nobody overwrites a slot before all read
        if result is None:
            msg = (
                f"rank {self._rank}: ranks passed vectors of different lengths "
                f"({sorted(lengths)}); every rank must reduce the same number of values"
            )
            raise RankGroupError(msg, rank=self._rank)
        return result

    def _wait(self, step: str) -> None:
        try:
            self._shared.barrier.wait()
        except threading.BrokenBarrierError as exc:
            msg = (
                f"rank {self._rank}: the other ranks did not arrive to {step} (a rank "
                "failed, skipped the collective, or timed out); every rank must make the "
                "same collective calls"
            )
            raise RankGroupError(msg, rank=self._rank) from exc

    def __repr__(self) -> str:
        return f"ThreadRankGroup(rank={self._rank}, world_size={self.world_size})"


class TorchDistRankGroup:
    """A `torch.distributed` process group (None: the default group)."""

    __slots__ = ("_device", "_group", "_rank", "_world_size")

    def __init__(self, group: Any = None, *, device: str | torch.device = "cpu") -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            msg = (
                "torch.distributed is not initialised in this process; call "
                "torch.distributed.init_process_group('gloo', ...) first"
            )
            raise RankGroupError(msg, rank=-1)
        self._group = group
        self._device = torch.device(device)
        self._rank = dist.get_rank(group)
        self._world_size = dist.get_world_size(group)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def all_reduce_min(self, values: Sequence[int]) -> list[int]:
        import torch.distributed as dist

        t = torch.tensor(_ints(values, self._rank), dtype=torch.int64, device=self._device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._group)
        result: list[int] = t.tolist()
        return result

    def __repr__(self) -> str:
        return f"TorchDistRankGroup(rank={self._rank}, world_size={self._world_size})"
