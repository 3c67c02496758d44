"""The external linker: the contract between a radix tree and an external KV store.

A serving engine calls plain methods; each load and each offload is a machine
(`load_transaction`, `offload`). The records (`ExternalLoad`, `PendingOffload`) are plain
data; the linker is the handler their executors are bound to, so the spec callbacks are
the linker's methods (listed under "Spec callbacks" below; called by the executors only).

Primitives, in the order a scheduler step uses them:

- `match(rid, key, namespace)` — the tree's device prefix, then LOOKUP of the whole
  pages past it: tail hashes chained from the last device page, one LOOKUP transfer
  per component, the store's restorable boundaries intersected across ranks (0/1
  mask, MIN). A hit creates an idle `ExternalLoad` held for the request.
- `load_back(load)` — LOAD + PREPARE (``idle → prepared``): first re-check that the
  matched device prefix is still the tree's (same slots, a live SWA window: the
  scheduler need not pin it between `match` and `load_back`; if another request
  evicted, reloaded or replaced it, the load aborts with ``stale_prefix`` and the
  request recomputes), then reserve slots, map SWA, queue the store load; the outcome
  is agreed across ranks (MIN), so a load runs everywhere or nowhere. False when it
  aborted instead (the request recomputes).
- `start_loading()` — start every queued store load as one batch.
- `finish_loads()` — take this rank's completed batches (at most those in flight; each
  completion ends the batch it names; a batch left without one for a few calls asks
  the store to start loads again, in case it answered an id it never started), then
  agree per prepared load (one MIN all-reduce) on whether every rank's store is done
  with it and every page landed; LAND and COMMIT
  those (LAND then ABORT where the request gave the load up meanwhile), ABORT the ones
  done but failed, keep waiting for the rest. Returns the loads that
  ended (not those whose `load_back` answered False: the request already recomputes).
  A committed load hands the caller one lock on `load.endpoint` (the end of the loaded
  path), which the caller releases with ``tree.dec_lock_ref``.
- `offload_nodes(chain)` — hand a root-first chain of nodes (a write-through result)
  to the store, one offload per node, acceptance agreed across ranks;
  `poll_offloads()` completes them FIFO with verdicts agreed across ranks. Each KV
  transfer starts with the last page of the node's parent when that parent is on the
  device (stored, offloading or backed up): the store usually holds that page already
  and links the node to it (else it stores it too), so its capacity eviction shrinks
  the whole path from its end.
- `verify_stored(node)` — LOOKUP a stored path and demote the nodes whose pages the
  store lost.
- `release_request(rid)` — abort a request's load now if every rank's store gave it
  back, else when its store is done with it (a running batch ends, or a lost
  `cancel_queued_load` answer is settled).
- `reset()` / `close()` — quiesce the store first, then abort every load and fail
  every offload, releasing their locks; a store reset that returned also releases the
  quarantine (below).

Store faults: the linker talks to its store through a `CheckedStore`. Any exception or
malformed answer from any store call is a fault of that call (counted in
`stats.store_faults`, the last one kept in `last_store_fault`, a `StoreProtocolError`
for an ill-typed answer), never an error for the caller: a failed LOOKUP is a miss, a
failed `load` a refusal (the load aborts, the request recomputes), a refused `offload` a
refusal (its nodes return to unstored, unlocked) — but a lost `offload` answer (it
raised or was no bool; the store may have queued it) holds it in the quarantine, nodes
locked — and a verdict that is not a real ``True`` a failure. Slots are freed only when
the store acknowledged it will write no more into them (a confirmed cancel, the batch's
own well-formed completion, a reset that returned). When the store breaks the protocol
instead — a completion count it cannot back, a faulty pop, a completion naming an
unknown batch, skipping an older one or naming other loads, a lost `start_loading`
answer — the loads involved abort (their requests recompute) and their slots go to the
quarantine (`linker.quarantine`, the fourth term of slot conservation), released only by
that batch's own completion or a reset; after a faulty offload pop, every offload in
flight is held (nodes locked), published never, released one per later completion (see
`poll_offloads`). A faulty load completion ends the oldest batch holding loads, never an
empty one (which may never complete), so no load waits forever. After a reset the
completions its drain did not find are owed and dropped when they come (see `reset`).
Completion loops pop at most what can be in flight, so every call returns in bounded
time. With `LinkerConfig.reset_when_idle` a linker holding a quarantine and nothing in
flight resets its store to release it.

Every reserved slot ends exactly one way: adopted by the tree at COMMIT, freed as a
duplicate at COMMIT, or freed by ABORT. Nothing is published before the verdict, so no
node claims KV that never landed.

Where each part lives: `ExternalLinker` is composed of one mixin per concept, all over
one state (`linker.state.LinkerState`: every field made in one ``__init__``), so a call
costs what a method of one class costs. `linker.matching` (LOOKUP: `match`,
`verify_stored`), `linker.loading` (LOAD + PREPARE: `load_back`), `linker.landing`
(batches and completions, LAND and COMMIT: `start_loading`, `finish_loads`),
`linker.aborting` (ABORT: `release_request`, cancels, suspicion, freeing or
quarantining slots), `linker.offloading` (`offload_nodes`, `poll_offloads`),
`linker.lifecycle` (`reset`, `close`, the drain and `reset_when_idle`), `linker.audit`
(`reserved_slots`, `quarantined_slots`, `locks_held`, `busy`, `describe`).

Spec callbacks (``callback(record, *trigger_args)``; never call them directly):
`reserve_slots`, `queue_store_load`, `landed_everywhere`, `publish`,
`withdraw_store_load`, `free_reservation`, `record_abort` (load_transaction);
`store_accepted`, `succeeded`, `publish_nodes`, `roll_back_nodes` (offload).

Collective calls: with several ranks, every rank calls `match`, `load_back`,
`finish_loads`, `release_request`, `offload_nodes`, `poll_offloads`, `verify_stored`
and `reset` in the same order with the same arguments (their trees stay identical
because every decision that could differ — restorable prefixes, PREPARE, store
acceptance, whether a store gave a load back, verdicts, completion counts, faults
included — is agreed by a MIN all-reduce before the tree changes). `start_loading`
is per rank: a rank whose store failed to start a batch keeps its loads queued and
starts them later; agreement per load makes the ranks end them together.
"""

from __future__ import annotations

from unicache_fsm.linker.audit import Audit
from unicache_fsm.linker.landing import Landing
from unicache_fsm.linker.lifecycle import Lifecycle
from unicache_fsm.linker.loading import Loading
from unicache_fsm.linker.matching import LinkerMatch, Matching
from unicache_fsm.linker.offloading import Offloading
from unicache_fsm.linker.state import LinkerConfig, LinkerStats

__all__ = ["ExternalLinker", "LinkerConfig", "LinkerMatch", "LinkerStats"]


class ExternalLinker(Matching, Loading, Landing, Offloading, Lifecycle, Audit):
    """One rank's linker between a `RadixTree` and an `ExternalStore`: LOOKUP at
    `match`, LOAD + PREPARE at `load_back`, LAND and COMMIT or ABORT at `finish_loads`,
    OFFLOAD at `offload_nodes` / `poll_offloads` (the primitives, in the order a
    scheduler step calls them, are in the module docstring).

    Contract: no request reads KV that is not its prefix's; every store fault is
    contained (the request recomputes, the slots the store may still write are
    quarantined until the store proves it done); every slot it reserves is freed or
    handed to the tree exactly once. The caller attaches the store to the KV pools
    before building the linker; with several ranks, `group` agrees every verdict.
    """
