"""The kit's invariants: `unicache_fsm.serving.invariants`, re-exported.

They live below both the reference scheduler and the kit, so `simulate`'s audits and
the kit's `System.audit` run the same functions; see that module for each one. Slot
conservation has four terms: free ⊎ tree-owned ⊎ held outside ⊎ quarantined (what a
misbehaving store may still touch: `ExternalLinker.quarantined_slots()`, passed as
``quarantined_full`` / ``quarantined_swa``; `System.audit` does).
"""

from __future__ import annotations

from unicache_fsm.serving.invariants import (
    InvariantViolation,
    adopted_ranges_shape,
    committed_load_sound,
    hash_chain,
    loads_landed,
    lock_balance,
    mapping_consistency,
    no_concurrent_offloads,
    nothing_in_flight_evicted,
    resident_kv_matches,
    restorable_intersection,
    slot_conservation,
    store_chains_whole,
    stored_pages_landed,
    stored_pages_present,
)

kv_bytes_match = resident_kv_matches  # its earlier name

__all__ = [
    "InvariantViolation",
    "adopted_ranges_shape",
    "committed_load_sound",
    "hash_chain",
    "kv_bytes_match",
    "loads_landed",
    "lock_balance",
    "mapping_consistency",
    "no_concurrent_offloads",
    "nothing_in_flight_evicted",
    "resident_kv_matches",
    "restorable_intersection",
    "slot_conservation",
    "store_chains_whole",
    "stored_pages_landed",
    "stored_pages_present",
]
