"""Machine specs as data, their validation, the two executors, and diagrams.

Primitives, lowest first:

- `parse_spec` / `load_spec` / `bundled_spec` — TOML to a validated `MachineSpec`.
- `flatten` — a spec's meaning: configurations and flat transitions.
- `CompiledExecutor` (hot paths) and `ReferenceExecutor` (`transitions`-backed) —
  the same `Executor` API: `initialize`, `fire`, `may_fire`, `allowed_triggers`,
  `state_of`, `is_active`, `is_final`; `AsyncCompiledExecutor` and
  `AsyncReferenceExecutor` (`AsyncExecutor`) await async guards and callbacks.
- Errors rooted in `UnicacheFsmError`.
"""

from __future__ import annotations

from unicache_fsm.fsm.compiled import AsyncCompiledExecutor, CompiledExecutor
from unicache_fsm.fsm.errors import (
    GuardRejectedError,
    IllegalTransitionError,
    InvalidSpecError,
    SpecProblem,
    UnicacheFsmError,
    UnknownStateError,
    UnknownTriggerError,
)
from unicache_fsm.fsm.executor import AsyncExecutor, Executor
from unicache_fsm.fsm.flat import FlatMachine, FlatTransition, flatten
from unicache_fsm.fsm.identity import model_id
from unicache_fsm.fsm.loader import bundled_machines, bundled_spec, load_spec, parse_spec
from unicache_fsm.fsm.reference import AsyncReferenceExecutor, ReferenceExecutor
from unicache_fsm.fsm.spec import ANY_STATE, MachineSpec, StateKind, StateSpec, TransitionSpec

__all__ = [
    "ANY_STATE",
    "AsyncCompiledExecutor",
    "AsyncExecutor",
    "AsyncReferenceExecutor",
    "CompiledExecutor",
    "Executor",
    "FlatMachine",
    "FlatTransition",
    "GuardRejectedError",
    "IllegalTransitionError",
    "InvalidSpecError",
    "MachineSpec",
    "ReferenceExecutor",
    "SpecProblem",
    "StateKind",
    "StateSpec",
    "TransitionSpec",
    "UnicacheFsmError",
    "UnknownStateError",
    "UnknownTriggerError",
    "bundled_machines",
    "bundled_spec",
    "flatten",
    "load_spec",
    "model_id",
    "parse_spec",
]
