"""The store-side machines: one small record per load and per offload, and the shared
executors that move them (`specs/store_load.toml`, `specs/store_offload.toml`).

A store never sets a record's state by hand; it fires triggers through the compiled
executors below, so every store speaks the same lifecycle and an illegal step raises.

- `StoreLoad(rid, transfers)` — one queued load (validated `CheckedTransfer`s).
  Lifecycle, fired by the store: `START` (into a batch), `FINISH(ok)` (landed when ok,
  else failed), `CANCEL` (queued only), `ABANDON` (reset/close: queued or started ->
  failed).
- `StoreOffload(seq, transfers)` — one queued offload: `START`, `FINISH(ok)`, `ABANDON`.
- `LOAD_MACHINE`, `OFFLOAD_MACHINE` — the executors (`initialize`, `fire`, `state_of`,
  `is_final`); records keep only their state slot, the machines are shared.
- `StoreLoadState`, `StoreOffloadState`, `StoreLoadTrigger`, `StoreOffloadTrigger` —
  the states and triggers as enums (``str`` enums: they compare equal to the names the
  executors report), generated from the specs (`unicache_fsm.spec_enums`, re-exported
  here) and checked against them again when the executors are bound.
"""

from __future__ import annotations

import attrs

from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.spec_enums import (
    StoreLoadState,
    StoreLoadTrigger,
    StoreOffloadState,
    StoreOffloadTrigger,
)
from unicache_fsm.store.requests import CheckedTransfer

__all__ = [
    "LOAD_MACHINE",
    "OFFLOAD_MACHINE",
    "StoreLoad",
    "StoreLoadState",
    "StoreLoadTrigger",
    "StoreOffload",
    "StoreOffloadState",
    "StoreOffloadTrigger",
]


def _verified(self: object, ok: bool = False) -> bool:
    """Guard of FINISH: the verdict passed with the trigger."""
    return ok


@attrs.define(slots=True, eq=False, repr=False)
class StoreLoad:
    """One load inside a store. `batch` is -1 until `start_loading` takes it."""

    rid: str
    transfers: tuple[CheckedTransfer, ...]
    batch: int = -1
    state: str = attrs.field(init=False, default="")

    verified = _verified

    @property
    def fsm_id(self) -> str:
        return f"load {self.rid!r}"

    def __repr__(self) -> str:
        return f"StoreLoad(rid={self.rid!r}, batch={self.batch}, state={self.state!r})"


@attrs.define(slots=True, eq=False, repr=False)
class StoreOffload:
    """One offload inside a store; `seq` is its submission number (0, 1, ...)."""

    seq: int
    transfers: tuple[CheckedTransfer, ...]
    state: str = attrs.field(init=False, default="")

    verified = _verified

    @property
    def fsm_id(self) -> str:
        return f"offload #{self.seq}"

    def __repr__(self) -> str:
        return f"StoreOffload(seq={self.seq}, state={self.state!r})"


LOAD_MACHINE = CompiledExecutor(
    "store_load", StoreLoad, triggers=StoreLoadTrigger, states=StoreLoadState
)
OFFLOAD_MACHINE = CompiledExecutor(
    "store_offload", StoreOffload, triggers=StoreOffloadTrigger, states=StoreOffloadState
)
