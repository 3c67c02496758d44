"""The public fuzzing kit: fuzz your store backend and your hooks against the contract.

- `profiles` — Hypothesis profiles ``dev`` / ``ci`` / ``fuzz`` (``UNICACHE_FSM_PROFILE``).
- `strategies` — keys with shared prefixes, page and pool sizes, fault policies.
- `invariants` — the contract's invariants as functions raising `InvariantViolation`
  (`unicache_fsm.serving.invariants`, re-exported).
- `system` — `System`: tree + pools + store + linker (+ host tier) driven like a
  scheduler, with `audit()` running every invariant; the very `serving.System` that
  ``unicache-fsm simulate`` runs, re-exported with `kv_bytes` and `Request`.
- `machines` — `SystemMachine`: the whole system under random operation; subclass it
  with `make_store()` to put your backend in the loop (its `TestCase` then also runs
  the store contract, `StoreMachine`, on the same store).
- `walk` — a seeded random-walk driver for those machines (what ``unicache-fsm fuzz``
  runs): the same rules without Hypothesis's cost per step, a shrunk program printed
  as a replaying Python script on a failure (`walk.fuzz`, `walk.WalkFailure`).
- `store_check` — `check_store(make_store, examples=N)`: both machines above on your
  store from a script, the first failure as one line (None when it passes).
- `store_machine` — `StoreMachine`: a store backend alone against a truth model;
  subclass it with `make_store()`.
- `ranks` — the rank-agreement property (sparse restorable sets, MIN verdicts).
- `linker` — the SGLang linker kit (`unicache_fsm.integrations.linker_kit`):
  `LinkerMachine`, `check_linker`, `CheckedLinker`, `KvModel`, `Obligation`,
  `LinkerViolation`, the fault interface `BackendFaults` and its ready `DirectoryFaults`
  / `RedisFaults`. Needs SGLang 0.5.23 for the machine and the check.
- `redis_server` — `RedisServer`: a real ``redis-server`` on a free loopback port, to
  fuzz and test the Redis store (or yours) against the real thing.

Every name in `__all__` is importable from here; each is loaded from its submodule
on first use, so importing the kit's profiles stays cheap. `dir()` lists `__all__`.
"""

from __future__ import annotations

import importlib as _importlib
from typing import Any as _Any

__all__ = [
    "POISON",
    "BackendFaults",
    "Chain",
    "CheckedLinker",
    "DirectoryFaults",
    "InvariantViolation",
    "KvModel",
    "LinkerMachine",
    "LinkerViolation",
    "LoadTicket",
    "MemoryStoreMachine",
    "Obligation",
    "RedisFaults",
    "RedisServer",
    "StoreMachine",
    "System",
    "SystemMachine",
    "check_linker",
    "check_rank_agreement",
    "check_store",
    "fault_policies",
    "keys_with_shared_prefixes",
    "load_profile",
    "page_key_chains",
    "page_sizes",
    "pool_sizes",
    "token_keys",
]

_HOME = {
    "POISON": "store_machine",
    "Chain": "store_machine",
    "LoadTicket": "store_machine",
    "MemoryStoreMachine": "store_machine",
    "StoreMachine": "store_machine",
    "InvariantViolation": "invariants",
    "System": "system",
    "SystemMachine": "machines",
    "check_rank_agreement": "ranks",
    "check_store": "store_check",
    "fault_policies": "strategies",
    "keys_with_shared_prefixes": "strategies",
    "page_key_chains": "strategies",
    "page_sizes": "strategies",
    "pool_sizes": "strategies",
    "token_keys": "strategies",
    "load_profile": "profiles",
    "RedisServer": "redis_server",
    "BackendFaults": "linker",
    "CheckedLinker": "linker",
    "DirectoryFaults": "linker",
    "KvModel": "linker",
    "LinkerMachine": "linker",
    "LinkerViolation": "linker",
    "Obligation": "linker",
    "RedisFaults": "linker",
    "check_linker": "linker",
}


def __getattr__(name: str) -> _Any:
    """Names are imported from their submodule on first use (torch stays unloaded
    until a machine or the system is needed)."""
    home = _HOME.get(name)
    if home is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(_importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
