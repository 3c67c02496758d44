"""The public fuzzing kit: fuzz your store backend and your hooks against the contract.

- `profiles` — Hypothesis profiles ``dev`` / ``ci`` / ``fuzz`` (``UNICACHE_FSM_PROFILE``).
- `strategies` — keys with shared prefixes, page and pool sizes, fault policies.
- `invariants` — the contract's invariants as functions raising `InvariantViolation`.
- `system` — `System`: tree + pools + store + linker (+ host tier) driven like a
  scheduler, with `audit()` running every invariant.
- `machines` — `SystemMachine`: the whole system under random operation; subclass it
  with `make_store()` to put your backend in the loop.
- `store_machine` — `StoreMachine`: a store backend alone against a truth model;
  subclass it with `make_store()`.
- `ranks` — the rank-agreement property (sparse restorable sets, MIN verdicts).

Submodules are imported on use (``from unicache_fsm.testing.machines import
SystemMachine``) so that importing the kit's profiles stays cheap.
"""
