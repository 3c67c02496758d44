"""Machine specs as data, their validation, the two executors, and diagrams.

Primitives, lowest first:

- `parse_spec` / `load_spec` / `bundled_spec` — TOML to a validated `MachineSpec`;
  `MachineBuilder` — the same from Python; `dump_spec` — a spec back to TOML.
- `flatten` — a spec's meaning: configurations and flat transitions.
- `CompiledExecutor` (hot paths) and `ReferenceExecutor` (`transitions`-backed) —
  the same `Executor` API: `initialize`, `fire`, `may_fire`, `allowed_triggers`,
  `state_of`, `is_active`, `is_final`; `AsyncCompiledExecutor` and
  `AsyncReferenceExecutor` (`AsyncExecutor`) await async guards and callbacks.
- Executor options (all off by default): ``ignore_invalid`` (a declared trigger with
  no transition does nothing), ``model_methods`` (trigger, ``may_`` and ``is_<state>``
  methods on the model class), ``event_data`` (``event=TransitionEvent(...)`` to every
  guard and callback), ``lock`` (a per-model lock, sync executors); executors pickle.
- Errors rooted in `UnicacheFsmError`.
"""

from __future__ import annotations

from unicache_fsm.fsm.builder import MachineBuilder
from unicache_fsm.fsm.compiled import AsyncCompiledExecutor, CompiledExecutor
from unicache_fsm.fsm.errors import (
    AwaitableGuardError,
    GuardRejectedError,
    IllegalTransitionError,
    InvalidSpecError,
    SpecProblem,
    UnicacheFsmError,
    UnknownStateError,
    UnknownTriggerError,
)
from unicache_fsm.fsm.executor import AsyncExecutor, Executor, TransitionEvent
from unicache_fsm.fsm.flat import FlatMachine, FlatTransition, flatten
from unicache_fsm.fsm.identity import model_id
from unicache_fsm.fsm.loader import bundled_machines, bundled_spec, load_spec, parse_spec
from unicache_fsm.fsm.reference import AsyncReferenceExecutor, ReferenceExecutor
from unicache_fsm.fsm.spec import ANY_STATE, MachineSpec, StateKind, StateSpec, TransitionSpec
from unicache_fsm.fsm.writer import dump_spec

__all__ = [
    "ANY_STATE",
    "AsyncCompiledExecutor",
    "AsyncExecutor",
    "AsyncReferenceExecutor",
    "AwaitableGuardError",
    "CompiledExecutor",
    "Executor",
    "FlatMachine",
    "FlatTransition",
    "GuardRejectedError",
    "IllegalTransitionError",
    "InvalidSpecError",
    "MachineBuilder",
    "MachineSpec",
    "ReferenceExecutor",
    "SpecProblem",
    "StateKind",
    "StateSpec",
    "TransitionEvent",
    "TransitionSpec",
    "UnicacheFsmError",
    "UnknownStateError",
    "UnknownTriggerError",
    "bundled_machines",
    "bundled_spec",
    "dump_spec",
    "flatten",
    "load_spec",
    "model_id",
    "parse_spec",
]
