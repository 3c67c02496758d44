"""Errors of the external stores: caller mistakes and store conditions, each typed.

Every class derives from `StoreError` (itself a `UnicacheFsmError`) and from the builtin
it refines. Code that detects a problem builds the message (``msg = f"..."; raise X(msg,
...)``) naming the culprit and the fix; the culprit is also an attribute.

A store that raises one of these for bad input has queued nothing and changed nothing.
Malformed slot tensors and keys are reported with the pool errors the stores reuse
(`InvalidPageKeyError`, `LengthMismatchError`, `TensorTypeError`, `DeviceMismatchError`,
`TensorShapeError`, `ForeignSlotsError`, `UnalignedSlotsError`, `DuplicatePagesError`).

- `StoreClosedError`: a call on a store after `close()`.
- `StoreFaultError`: an injected fault (or a backend failure) on a call that answers
  synchronously, such as `lookup`.
- `UnknownPoolError`: a transfer names a pool that is not attached.
- `StoreConfigError`: a constructor or `attach` argument is unusable (pools of unequal
  page size, capacity below 1, a pool re-attached with another page layout).
  - `StoreUnavailableError`: the store's medium cannot be reached or used, found when
    the store is opened (a Redis server that does not answer at the URL, a directory
    that cannot be created, read or locked, or that is not a store of this format).
- `StoreStateError`: a call that the store's current state forbids (re-attaching while
  work is queued).
- `StoreTransferError`: transfers that do not form a valid request (no KV transfer, a
  pool named twice, no slots for a load or offload, keys that do not match the KV keys).
- `NoCompletionError`: `pop_completed_load`/`pop_completed_offload` with nothing completed.
- `StoreBatchUnknownError`: `loaded_layers` of a batch the store never started (or forgot).
- `FaultPolicyError`: a fault policy string or argument that cannot be parsed.
- `StoreProtocolError`: a store answered a call with a value the protocol does not
  allow (a verdict that is not a bool, a completion naming a batch not in flight, a
  restorable boundary outside ``1..n``); the caller treats it as a fault of that call.
"""

from __future__ import annotations

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = [
    "FaultPolicyError",
    "NoCompletionError",
    "StoreBatchUnknownError",
    "StoreClosedError",
    "StoreConfigError",
    "StoreError",
    "StoreFaultError",
    "StoreProtocolError",
    "StoreStateError",
    "StoreTransferError",
    "StoreUnavailableError",
    "UnknownPoolError",
]


class StoreError(UnicacheFsmError):
    """Root of the errors raised by `unicache_fsm.store`."""


class StoreClosedError(StoreError, RuntimeError):
    """A call on a closed store. `operation` names the call."""

    def __init__(self, message: str, *, operation: str) -> None:
        super().__init__(message)
        self.operation = operation


class StoreFaultError(StoreError, RuntimeError):
    """A store call failed (an injected fault, or a backend error). `operation` names it."""

    def __init__(self, message: str, *, operation: str) -> None:
        super().__init__(message)
        self.operation = operation


class UnknownPoolError(StoreError, LookupError):
    """A transfer names pool `pool`, which is not among `attached`."""

    def __init__(self, message: str, *, pool: object, attached: tuple[str, ...]) -> None:
        super().__init__(message)
        self.pool = pool
        self.attached = attached


class StoreConfigError(StoreError, ValueError):
    """A constructor or `attach` argument is unusable. `argument` names it, `value` holds it."""

    def __init__(self, message: str, *, argument: str, value: object) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value


class StoreUnavailableError(StoreConfigError):
    """The store named by `argument` (``"url"``, ``"directory"``) at `value` cannot be
    reached or used; raised when the store is opened, never later. The message is one
    line naming the address or path and the cause."""


class StoreStateError(StoreError, RuntimeError):
    """A call that the store's current state forbids. `operation` names the call."""

    def __init__(self, message: str, *, operation: str) -> None:
        super().__init__(message)
        self.operation = operation


class StoreTransferError(StoreError, ValueError):
    """Transfers that do not form a valid request. `pool` names the culprit (None: all)."""

    def __init__(self, message: str, *, pool: object) -> None:
        super().__init__(message)
        self.pool = pool


class NoCompletionError(StoreError, LookupError):
    """A pop with nothing completed. `what` is "load" or "offload"."""

    def __init__(self, message: str, *, what: str) -> None:
        super().__init__(message)
        self.what = what


class StoreBatchUnknownError(StoreError, LookupError):
    """`loaded_layers` asked about a batch the store never started (or forgot)."""

    def __init__(self, message: str, *, batch: object) -> None:
        super().__init__(message)
        self.batch = batch


class FaultPolicyError(StoreError, ValueError):
    """A fault policy that cannot be built. `item` is the offending part of the input."""

    def __init__(self, message: str, *, item: str) -> None:
        super().__init__(message)
        self.item = item


class StoreProtocolError(StoreError, TypeError):
    """A store's answer to `operation` broke the protocol; `value` is the answer."""

    def __init__(self, message: str, *, operation: str, value: object) -> None:
        super().__init__(message)
        self.operation = operation
        self.value = value
