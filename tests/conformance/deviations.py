"""The named deviations: every deliberate difference between the project and SGLang
0.5.23 that the differential suite excludes from its comparison.

Each has a name (used in the harness and in reports), why the project differs, how
the suite excludes it, and the test that pins it (in `test_deviations.py`). They are
written up for users in docs/deviations.md. Nothing else may differ: any other
difference is a mismatch.
"""

from __future__ import annotations

import attrs

__all__ = ["DEVIATIONS", "Deviation", "deviation"]


@attrs.frozen
class Deviation:
    name: str
    doc_id: str  # its section in docs/deviations.md
    summary: str
    reason: str
    exclusion: str
    pinned_by: str


_ALL = (
    Deviation(
        name="COMMIT_PHASE",
        doc_id="D1",
        summary=(
            "The project's linker finishes a load with a COMMIT phase that keeps only the "
            "pages the tree adopted (and an ABORT that frees the reservation); 0.5.23 has "
            "PREPARE and ABORT only and never narrows a landed load."
        ),
        reason=(
            "Without COMMIT, bytes a load wrote into pages the tree did not adopt are "
            "nobody's responsibility; the project's load machine ends every reserved slot "
            "exactly one way."
        ),
        exclusion=(
            "The generated programs drive no loads (no LOOKUP hits, LOAD, PREPARE, COMMIT "
            "or ABORT): the scripted store misses every lookup and refuses every load. "
            "Only insert, match, lock, evict and offload cycles are compared."
        ),
        pinned_by="tests/conformance/test_deviations.py::test_commit_phase_is_the_projects_own",
    ),
    Deviation(
        name="SWA_TOMBSTONE_READOPT",
        doc_id="D5",
        summary=(
            "When prev_prefix_len falls strictly inside an SWA tombstone node, 0.5.23 "
            "re-adopts the tree's own FULL slots below prev_prefix_len and frees them: its "
            "tree then holds slots that are also on its free list. The project never adopts "
            "below prev_prefix_len."
        ),
        reason=(
            "It is a bug in 0.5.23 (a later allocation hands out slots the tree still "
            "maps); positions below prev_prefix_len are the tree's own by definition."
        ),
        exclusion=(
            "After every 0.5.23 insert the harness looks for FULL slots its tree holds "
            "that are also on its free list. When there are some and all lie below the "
            "insert's prev_prefix_len (this bug's signature), that insert's adopted ranges "
            "are compared clipped to >= prev_prefix_len, its pool counts are not compared, "
            "and the program ends there (0.5.23's pools are corrupt from then on). Any "
            "other double ownership is reported as an oracle failure."
        ),
        pinned_by=(
            "tests/conformance/test_deviations.py::"
            "test_swa_tombstone_readopt_is_a_bug_of_0_5_23_only"
        ),
    ),
    Deviation(
        name="ADOPTED_RANGES_ORDER",
        doc_id="D3",
        summary=(
            "The project keeps InsertResult.adopted_ranges sorted and disjoint whatever "
            "order ranges are recorded in; 0.5.23 merges a range only with the last one "
            "recorded."
        ),
        reason=(
            "Readers of adopted ranges (COMMIT) should not depend on the order in which "
            "the insert walk happened to record them."
        ),
        exclusion=(
            "0.5.23's adopted ranges are sorted and merged before the comparison (a no-op "
            "whenever its walk records them in order, which is every case seen so far)."
        ),
        pinned_by=("tests/conformance/test_deviations.py::test_adopted_ranges_order_is_normalised"),
    ),
    Deviation(
        name="UNALIGNED_INSERT",
        doc_id="D6",
        summary=(
            "The project refuses an insert key that is not whole pages "
            "(UnalignedKeyError, nothing changed); 0.5.23 inserts the whole pages and "
            "leaves the partial page with the caller."
        ),
        reason=(
            "Bad input gets a typed error naming the culprit: a caller that passes a "
            "partial page has lost track of which slots it still owns."
        ),
        exclusion=(
            "Programs insert whole pages only (matches may end inside a page; both sides "
            "cut those to whole pages)."
        ),
        pinned_by="tests/conformance/test_deviations.py::test_unaligned_insert_is_refused",
    ),
)

_ALL += (
    Deviation(
        name="LOAD_FAILURE_RECOMPUTES",
        doc_id="D2",
        summary=(
            "A failed load is aborted (its reservation freed) and the request recomputes; "
            "0.5.23 aborts the requests of a batch whose loading failed."
        ),
        reason="A store is a cache: losing it must cost time, not requests.",
        exclusion="No loads are driven (as for COMMIT_PHASE).",
        pinned_by=("tests/test_linker_faults.py::test_load_fault_ends_committed_or_recomputed"),
    ),
    Deviation(
        name="LOOKUP_DEMOTES",
        doc_id="D4",
        summary=(
            "verify_stored demotes a stored node whose FULL pages the store lost; in "
            "0.5.23 external_cache_stored never goes back to false."
        ),
        reason="Stores evict; a flag that cannot go back stops the store from refilling.",
        exclusion=(
            "The scripted store misses every lookup and the programs never call "
            "verify_stored: stored flags only change by offload verdicts."
        ),
        pinned_by="tests/test_linker_offload.py::test_verify_stored_demotes_and_offloads_again",
    ),
)

DEVIATIONS: dict[str, Deviation] = {d.name: d for d in _ALL}


def deviation(name: str) -> Deviation:
    return DEVIATIONS[name]
