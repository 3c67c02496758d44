"""One serving system, under both the reference scheduler and the fuzzing kit.

`scheduler.Simulation` (what ``unicache-fsm simulate`` runs) and `testing.SystemMachine`
/ `testing.explore` drive the same `System`, so a fix in how a request is served, how
slots are allocated or how the system is audited reaches both.

One concept per module:

- `kv` — `kv_bytes`: the one KV synthesis (what a stand-in model computes).
- `request` — `Request` (one request from lookup to release) and `Outcome`.
- `ledger` — `StoreLedger`: what the store acknowledged, recorded between linker and
  store.
- `invariants` — the contract's invariants as functions raising `InvariantViolation`.
- `system` — `System`: pools, tree, host tier, store (behind the ledger, optionally a
  fault injector) and linker; allocation that evicts the shortfall
  (`pools.room.alloc_making_room`); `audit()` running every invariant.

Imports of ours: `pools`, `tree`, `store`, `linker`.
"""

from __future__ import annotations

from unicache_fsm.serving.invariants import InvariantViolation
from unicache_fsm.serving.kv import kv_bytes
from unicache_fsm.serving.ledger import StoreLedger
from unicache_fsm.serving.request import Outcome, Request
from unicache_fsm.serving.system import System

__all__ = ["InvariantViolation", "Outcome", "Request", "StoreLedger", "System", "kv_bytes"]
