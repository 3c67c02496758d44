"""Issue 11's behaviours 1-9 of SGLang 0.5.23, each as a short program on which the
project's tree (before those behaviours were adopted) and 0.5.23 disagree.

`test_behaviours.py` runs each through the harness and expects agreement; a program
that diverges names its behaviour and prints the first differing observable. They
double as the mutation check's fixed catch list: reverting a behaviour makes its
program diverge again (the random suite is the broader net).
"""

from __future__ import annotations

import attrs

from conformance.model import Complete, Evict, Insert, Lock, Match, Program, SetAccept

__all__ = ["BEHAVIOURS", "Behaviour"]


@attrs.frozen
class Behaviour:
    number: int
    title: str
    config: str
    program: Program
    why: str  # what 0.5.23 does on this program


_A = (0, 1, 0, 2, 1, 1)
_B = (1, 0, 2, 2, 0, 1)

BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour(
        1,
        "a split gives the unmatched suffix a fresh access time",
        "full-p1",
        (Insert((0, 1)), Insert((2,)), Match((0,)), Evict(full=1)),
        "the match splits (0,1) at 1; the suffix (1) is stamped newer than (2), so the LRU "
        "leaf evicted is (2), not the suffix",
    ),
    Behaviour(
        2,
        "a fresh in-window SWA leaf longer than one window is split into an older part "
        "and the last window",
        "swa8-p4",
        (Insert((0, 1, 2, 0)), Insert((0, 1, 2, 0, 1)), Evict(swa=1)),
        "the 16-token leaf is two nodes of 8; once internal, SWA eviction tombstones the "
        "older 8 only",
    ),
    Behaviour(
        3,
        "SWA-pressure eviction deletes an evictable leaf outright (Full freed too)",
        "swa8-p4",
        (Insert((0,)), Evict(swa=1)),
        "the leaf is deleted: 4 Full and 4 SWA tokens freed",
    ),
    Behaviour(
        4,
        "the SWA lock covers only the trailing window of the locked path",
        "swa8-p4",
        (Insert((0, 1, 2, 0)), Lock((0, 1, 2, 0)), Evict(swa=1)),
        "with the whole path locked, the older half (8 tokens) is still SWA-evictable",
    ),
    Behaviour(
        5,
        "SWA eviction order comes from its own LRU list, refreshed only within the last "
        "window (+ one page) at the end of a match or insert",
        "swa8-p4",
        (
            Insert(_A),
            Insert((*_A, 0), match_first=True, prev_pages=6),
            Insert(_B),
            Insert((*_B, 1), match_first=True, prev_pages=6),
            Match((*_A, 0)),
            Evict(swa=1),
        ),
        "the match refreshes only the last window of path A in the SWA list, so SWA "
        "eviction tombstones A's older 16 tokens, not path B (also needs behaviour 2)",
    ),
    Behaviour(
        6,
        "a match refreshes access times only up to where the SWA window cuts it",
        "swa8-p4",
        (
            Insert((0, 1)),
            Insert((0, 1, 2, 0), match_first=True, prev_pages=2, swa_evicted_pages=4),
            Insert((1,)),
            Match((0, 1, 2, 0)),
            Evict(full=1),
        ),
        "the match is cut at 8 (tokens 8..16 are an SWA tombstone) and does not refresh "
        "them, so they are the LRU leaf (8 Full tokens evicted), not (1)",
    ),
    Behaviour(
        7,
        "SWA freed by a Full-leaf eviction in the same call counts toward swa_num_tokens",
        "swa8-p4",
        (Insert((0,)), Evict(full=1, swa=1)),
        "evicting the leaf for Full frees its SWA too and reports it: (4, 4)",
    ),
    Behaviour(
        8,
        "offloads: one store call, one lock and one pending record per chain node, each "
        "settled by its own verdict",
        "full-p4-offload",
        (SetAccept(False), Insert((0,)), SetAccept(True), Insert((0, 1)), Complete((False, True))),
        "the second insert offloads the refused parent and the new leaf as two records; "
        "the verdicts settle them one by one (parent failed, leaf stored)",
    ),
    Behaviour(
        9,
        "prev_prefix_len strictly inside an SWA tombstone: the caller-owned part at or "
        "above prev_prefix_len is adopted (the tree-owned part below it is not: deviation "
        "SWA_TOMBSTONE_READOPT)",
        "swa8-p4",
        (
            Insert((0, 1, 2, 0), swa_evicted_pages=2),
            Insert((0, 1, 2, 0, 1), match_first=True, prev_pages=1),
        ),
        "tokens 0..8 are a tombstone; the second request matched 16, reuses the tree's "
        "slots for 0..4 and brings its own for 4..20: 0.5.23 adopts FULL and SWA for 4..8",
    ),
)
