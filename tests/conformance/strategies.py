"""Hypothesis strategies for programs (`model.Program`) of one configuration.

A key is a prefix of one of three fixed page sequences (`BASES`) followed by up to two
pages of the 4-page alphabet (page 3 diverges inside a page), at most
`Config.max_key_pages` pages: programs keep hitting shared prefixes of every length,
splits, duplicates and divergence inside a page. Operation
mix per draw: insert 4, match 2, evict 2, lock 1, unlock 1, and with offload cycles
complete 2 and set-accept 1. Programs hold 1..40 operations (about 16 on average); Hypothesis shrinks
failing ones to the shortest it can find.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.model import (
    Complete,
    Config,
    Evict,
    Insert,
    Lock,
    Match,
    Op,
    Program,
    SetAccept,
    Unlock,
)

__all__ = ["ops", "programs"]

MAX_OPS = 40
# Three long page sequences over pages 0..2 that share their first pages pairwise.
BASES: tuple[tuple[int, ...], ...] = (
    (0, 1, 0, 2, 1, 1, 0, 0, 2, 0, 1, 2, 2, 0, 1, 0, 0, 1, 2, 1, 0, 2, 0, 1),
    (0, 1, 0, 1, 2, 0, 2, 1, 0, 0, 1, 1, 0, 2, 2, 1, 0, 1, 0, 0, 2, 1, 1, 0),
    (1, 0, 2, 2, 0, 1, 1, 0, 1, 2, 0, 0, 1, 0, 2, 1, 2, 0, 1, 1, 0, 0, 2, 2),
)


def _pages(max_pages: int) -> st.SearchStrategy[tuple[int, ...]]:
    def build(base: int, length: int, tail: list[int]) -> tuple[int, ...]:
        return (BASES[base][:length] + tuple(tail))[:max_pages] or (0,)

    return st.builds(
        build,
        st.integers(0, len(BASES) - 1),
        st.integers(0, max_pages),
        st.lists(st.sampled_from([0, 1, 2, 3]), max_size=2),
    )


def ops(config: Config) -> st.SearchStrategy[Op]:
    P = config.page_size
    swa = config.swa_window is not None
    max_pages = config.max_key_pages
    pages_idx = st.integers(0, max_pages)
    insert = st.builds(
        Insert,
        pages=_pages(max_pages),
        match_first=st.booleans(),
        prev_pages=pages_idx,
        swa_evicted_pages=pages_idx if swa else st.just(0),
    )
    match = st.builds(Match, pages=_pages(max_pages), extra=st.integers(0, P - 1))
    amount = st.one_of(st.just(0), st.integers(1, 3 * P), st.integers(1, config.full_tokens))
    evict = st.builds(
        Evict,
        full=amount,
        swa=st.one_of(st.just(0), st.integers(1, 3 * P), st.integers(1, config.swa_tokens))
        if swa
        else st.just(0),
    )
    lock = st.builds(Lock, pages=_pages(max_pages))
    unlock = st.builds(Unlock, which=st.integers(0, 3))
    kinds: list[st.SearchStrategy[Op]] = [insert] * 4 + [match] * 2 + [evict] * 2 + [lock, unlock]
    if config.offload:
        complete = st.builds(
            Complete, verdicts=st.lists(st.booleans(), min_size=1, max_size=4).map(tuple)
        )
        set_accept = st.builds(SetAccept, accept=st.booleans())
        kinds += [complete, complete, set_accept]
    return st.sampled_from(kinds).flatmap(lambda s: s)


def programs(config: Config) -> st.SearchStrategy[Program]:
    """Up to MAX_OPS operations, drawn as a list of short runs: a plain `st.lists` mostly
    draws a handful of elements, and long programs reach the states that matter, while
    nested lists still shrink by deleting runs and operations."""
    runs = st.lists(st.lists(ops(config), min_size=1, max_size=6), min_size=1, max_size=8)
    return runs.map(lambda rs: tuple(op for r in rs for op in r)[:MAX_OPS])
