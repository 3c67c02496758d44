"""Breadth-first search over fingerprinted states, shortest violation first.

The driver both exhaustive searches share (`testing.explore` on one rank,
`testing.rank_explore` on a world of ranks). A frontier entry is the operation path
that reached a state plus whatever the caller keeps to expand it from (`explore` keeps
nothing and replays or copies; `rank_explore` keeps the world itself). The caller's
`expand` makes every successor of a batch of entries (in worker processes or in this
one) and says, per successor, its fingerprint or the invariant it broke; the driver
deduplicates fingerprints, builds the next level, and stops:

- at the end of the first level holding a violation (the first one found at that depth,
  so no shorter path to any violation exists);
- when a level brings no new state (the space is exhausted);
- with `SearchExpandError` when `expand` yields more or fewer groups than entries;
- past `max_depth` operations, or at `deadline` (checked between entries, so a level
  cut short is not counted and the space is not called exhausted).

Memory is the `visited` fingerprints plus two frontiers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Generic, TypeVar

import attrs

from unicache_fsm.fsm.errors import UnicacheFsmError

S = TypeVar("S")

Path = tuple[Any, ...]


class SearchExpandError(UnicacheFsmError, ValueError):
    """The caller's `expand` yielded fewer or more successor groups than the entries it
    was given: a level would be miscounted (a missing group looks like a leaf, so a space
    could be called exhausted that was not)."""


@attrs.frozen
class Successor(Generic[S]):
    """One operation run on a frontier entry's state: its fingerprint (None when it broke
    an invariant: `error` says which) and what the next level expands it from."""

    op: Any
    digest: Hashable | None
    error: str | None = None
    state: S | None = None


@attrs.define
class Outcome:
    """Where a search stopped: levels completed, states seen (the root included),
    successors made, whether the space was exhausted, and the shortest violation as
    (path, error) when one was found."""

    depth: int = 0
    states: int = 0
    transitions: int = 0
    exhausted: bool = False
    violation: tuple[Path, str] | None = None


Expand = Callable[[Sequence[tuple[Path, S | None]]], Iterable[Iterable[Successor[S]]]]


def breadth_first(
    root: S | None,
    visited: set[Any],
    expand: Expand[S],
    *,
    max_depth: int | None = None,
    deadline: float | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> Outcome:
    """Search from `root`, whose fingerprint `visited` already holds (`visited` grows in
    place, so `expand` may consult it). `expand(entries)` yields, in order, each entry's
    successors (an iterable each: a lazy one sees `visited` grow between them).
    `deadline` is a `time.perf_counter()` value; `progress` is called after each level
    with (depth, states, frontier size)."""
    out = Outcome()
    frontier: list[tuple[Path, S | None]] = [((), root)]

    def expired() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    while frontier:
        if (max_depth is not None and out.depth >= max_depth) or expired():
            break
        nxt: list[tuple[Path, S | None]] = []
        found: tuple[Path, str] | None = None
        cut = False
        groups = iter(expand(frontier))
        for i, (path, _) in enumerate(frontier):
            successors = next(groups, None)
            if successors is None:
                msg = f"expand yielded {i} successor groups for {len(frontier)} entries"
                raise SearchExpandError(msg)
            for child in successors:
                out.transitions += 1
                if child.digest is None:
                    if found is None:
                        found = ((*path, child.op), child.error or "")
                    continue
                if child.digest not in visited:
                    visited.add(child.digest)
                    nxt.append(((*path, child.op), child.state))
            if found is None and expired():
                cut = True
                break
        if cut:
            break
        if next(groups, None) is not None:
            msg = f"expand yielded more successor groups than the {len(frontier)} entries"
            raise SearchExpandError(msg)
        out.depth += 1
        frontier = nxt
        if progress is not None:
            progress(out.depth, len(visited), len(frontier))
        if found is not None:
            out.violation = found
            break
    out.exhausted = not frontier and out.violation is None
    out.states = len(visited)
    return out


def summary(
    *,
    scope: str,
    states: int,
    transitions: int,
    refused: int,
    depth: int,
    timing: str,
    violation: tuple[int, str] | None,
    exhausted: bool,
    extra: Sequence[str] = (),
) -> str:
    """The report both explorers print: the scope, states, transitions (and how many
    the tiny pools refused), depth, `timing` as worded by the caller, `extra` lines, and
    the result (a violation as its length and error, exhausted, or stopped)."""
    if violation is not None:
        result = f"VIOLATION after {violation[0]} operations: {violation[1]}"
    elif exhausted:
        result = "exhausted: every reachable state checked, no invariant broken"
    else:
        result = "stopped (depth or time limit): no invariant broken so far"
    return "\n".join(
        [
            f"scope          {scope}",
            f"states         {states} distinct",
            f"transitions    {transitions} ({refused} refused by the tiny pools)",
            f"depth          {depth}",
            f"time           {timing}",
            *extra,
            f"result         {result}",
        ]
    )
