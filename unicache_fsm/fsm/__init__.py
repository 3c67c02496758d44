"""Machine specs as data, their validation, the two executors, and diagrams."""

from __future__ import annotations

from unicache_fsm.fsm.errors import (
    GuardRejectedError,
    IllegalTransitionError,
    InvalidSpecError,
    SpecProblem,
    UnicacheFsmError,
    UnknownStateError,
    UnknownTriggerError,
)

__all__ = [
    "GuardRejectedError",
    "IllegalTransitionError",
    "InvalidSpecError",
    "SpecProblem",
    "UnicacheFsmError",
    "UnknownStateError",
    "UnknownTriggerError",
]
