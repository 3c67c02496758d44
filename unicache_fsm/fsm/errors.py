"""The error hierarchy of unicache_fsm.

Every error the library raises on purpose derives from `UnicacheFsmError`. Each class is
small, carries the data that explains it as attributes, and refines the builtin whose
meaning it shares (a malformed spec is a `ValueError`, an illegal trigger a
`RuntimeError`), so callers can catch either. Messages name the culprit and say what
to do; they are built as ``msg = f"..."; raise X(msg)`` by the code that detects them.

Other subpackages add their own classes under `UnicacheFsmError`; this module imports
nothing of ours. Catch `UnicacheFsmError` for anything the library raises, a subpackage's
root (`TreeError`, `PoolError`, `StoreError`, `HashError`) for one part. The whole
hierarchy (checked against the code by `tests/test_public_api.py`; the classes of
``unicache_fsm.integrations.sglang`` exist where SGLang 0.5.23 is installed):

```text
UnicacheFsmError (unicache_fsm.fsm.errors)
  AwaitableGuardError (unicache_fsm.fsm.errors)
  BadLinkerError (unicache_fsm.integrations.linker_kit.obligations)
  BaselineError (unicache_fsm.scheduler.compare)
  ChartInputError (unicache_fsm.scheduler.svg_chart)
  CliError (unicache_fsm.cli)
  DeviceFault (unicache_fsm.testing.store_machine)
  GraphvizFailedError (unicache_fsm.fsm.diagram)
  GraphvizNotFoundError (unicache_fsm.fsm.diagram)
  GuardRejectedError (unicache_fsm.fsm.errors)
  HashError (unicache_fsm.hashing)
    InvalidPriorHashError (unicache_fsm.hashing)
    InvalidTokenError (unicache_fsm.hashing)
    NamespaceFieldError (unicache_fsm.hashing)
    PageSizeError (unicache_fsm.hashing)
  IllegalTransitionError (unicache_fsm.fsm.errors)
    ProtocolViolation (unicache_fsm.integrations.protocol)
    UnknownTriggerError (unicache_fsm.fsm.errors)
  InvalidSpecError (unicache_fsm.fsm.errors)
  InvariantViolation (unicache_fsm.serving.invariants)
  LinkerConfigError (unicache_fsm.integrations.errors)
  LinkerViolation (unicache_fsm.integrations.linker_kit.obligations)
  MonitorConfigError (unicache_fsm.integrations.protocol)
  PoolError (unicache_fsm.pools.errors)
    DeviceMismatchError (unicache_fsm.pools.errors)
    DeviceUnavailableError (unicache_fsm.pools.errors)
    DuplicatePagesError (unicache_fsm.pools.errors)
    ForeignSlotsError (unicache_fsm.pools.errors)
    InvalidPageKeyError (unicache_fsm.pools.transfer)
    LengthMismatchError (unicache_fsm.pools.errors)
    NotPageMultipleError (unicache_fsm.pools.errors)
    PoolConfigError (unicache_fsm.pools.errors)
      PageDeviceError (unicache_fsm.pools.device)
    SlotsNotAllocatedError (unicache_fsm.pools.errors)
      DoubleFreeError (unicache_fsm.pools.errors)
    TensorShapeError (unicache_fsm.pools.errors)
    TensorTypeError (unicache_fsm.pools.errors)
    UnalignedSlotsError (unicache_fsm.pools.errors)
  RankGroupError (unicache_fsm.linker.ranks)
  RedisServerError (unicache_fsm.testing.redis_server)
  Refused (unicache_fsm.testing.explore)
  SearchExpandError (unicache_fsm.testing.search)
  SglangUnavailableError (unicache_fsm.integrations.errors)
  SimConfigError (unicache_fsm.scheduler.simulation)
  SimulationStalledError (unicache_fsm.scheduler.simulation)
  SlotsRevokedError (unicache_fsm.integrations.sglang.buffers)
  StoreError (unicache_fsm.store.errors)
    FaultPolicyError (unicache_fsm.store.errors)
    NoCompletionError (unicache_fsm.store.errors)
    StoreBatchUnknownError (unicache_fsm.store.errors)
    StoreClosedError (unicache_fsm.store.errors)
    StoreConfigError (unicache_fsm.store.errors)
      StoreUnavailableError (unicache_fsm.store.errors)
    StoreFaultError (unicache_fsm.store.errors)
    StoreProtocolError (unicache_fsm.store.errors)
    StoreStateError (unicache_fsm.store.errors)
    StoreTransferError (unicache_fsm.store.errors)
    TornPage (unicache_fsm.store.shared)
    UnknownPoolError (unicache_fsm.store.errors)
  TraceInputError (unicache_fsm.fsm.errors)
  TreeError (unicache_fsm.tree.errors)
    InsertParamsError (unicache_fsm.tree.errors)
    LockUnderflowError (unicache_fsm.tree.errors)
    NodeStateError (unicache_fsm.tree.errors)
    OwnedSlotsError (unicache_fsm.tree.errors)
    SlotTensorError (unicache_fsm.tree.errors)
    TreeConfigError (unicache_fsm.tree.errors)
    TreeConsistencyError (unicache_fsm.tree.errors)
    UnalignedKeyError (unicache_fsm.tree.errors)
    UnsupportedComponentError (unicache_fsm.tree.errors)
    ValueLengthError (unicache_fsm.tree.errors)
  UnknownBatchError (unicache_fsm.integrations.errors)
  UnknownStateError (unicache_fsm.fsm.errors)
  UnknownWorkloadError (unicache_fsm.scheduler.workloads)
  VllmUnavailableError (unicache_fsm.integrations.errors)
  WalkFailure (unicache_fsm.testing.walk)
```
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AwaitableGuardError",
    "GuardRejectedError",
    "IllegalTransitionError",
    "InvalidSpecError",
    "SpecProblem",
    "TraceInputError",
    "UnicacheFsmError",
    "UnknownStateError",
    "UnknownTriggerError",
]


class UnicacheFsmError(Exception):
    """Root of every error unicache_fsm raises on purpose."""

    def __deepcopy__(self, memo: dict[int, object]) -> UnicacheFsmError:
        """An error is a record of what happened: a deep copy of whatever keeps one (a
        store's `last_error`, say) shares it (many errors take keyword-only fields that
        the default copy protocol cannot pass back)."""
        return self


class SpecProblem:
    """One finding of spec validation: a kind of problem and the names it concerns."""

    __slots__ = ("kind", "names")

    def __init__(self, kind: str, names: Sequence[str]) -> None:
        self.kind = kind
        self.names = tuple(names)

    def __repr__(self) -> str:
        return f"SpecProblem({self.kind!r}, {list(self.names)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SpecProblem):
            return NotImplemented
        return (self.kind, self.names) == (other.kind, other.names)

    def __hash__(self) -> int:
        return hash((self.kind, self.names))

    def __str__(self) -> str:
        return f"{self.kind}: {', '.join(self.names)}"


class InvalidSpecError(UnicacheFsmError, ValueError):
    """A machine spec (or its binding to a model class) is malformed.

    `problems` lists every finding at once, each naming all offending states,
    transitions or callbacks, so one run of the validator is enough to fix a spec.
    """

    def __init__(self, machine: str, source: str, problems: Sequence[SpecProblem]) -> None:
        self.machine = machine
        self.source = source
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        where = f" ({source})" if source else ""
        super().__init__(f"invalid machine spec {machine!r}{where}:\n{lines}")

    def kinds(self) -> set[str]:
        """The kinds of problem found (e.g. ``{"unreachable state"}``)."""
        return {p.kind for p in self.problems}

    def names(self, kind: str) -> tuple[str, ...]:
        """All names reported under one kind of problem."""
        return tuple(n for p in self.problems if p.kind == kind for n in p.names)


class IllegalTransitionError(UnicacheFsmError, RuntimeError):
    """A trigger was fired at a model whose current state has no transition for it.

    The model's state is unchanged and no callback ran.
    """

    def __init__(
        self,
        machine: str,
        model: str,
        state: str,
        trigger: str,
        allowed: Sequence[str],
        *,
        noun: str = "",
    ) -> None:
        self.machine = machine
        self.model = model
        self.state = state
        self.trigger = trigger
        self.allowed = tuple(allowed)
        what = noun or machine
        allowed_txt = ", ".join(self.allowed) if self.allowed else "none (the state is final)"
        super().__init__(
            f"cannot {trigger} {what} {model!r} in state {state!r}; allowed: {allowed_txt}"
        )


class UnknownTriggerError(IllegalTransitionError):
    """The trigger is not declared anywhere in the machine's spec (likely a typo)."""

    def __init__(
        self,
        machine: str,
        model: str,
        state: str,
        trigger: str,
        allowed: Sequence[str],
        *,
        noun: str = "",
    ) -> None:
        super().__init__(machine, model, state, trigger, allowed, noun=noun)
        self.args = (
            f"machine {machine!r} has no trigger {trigger!r} (fired at {model!r} in state "
            f"{state!r}); triggers allowed there: {', '.join(self.allowed) or 'none'}",
        )


class GuardRejectedError(UnicacheFsmError, RuntimeError):
    """Every transition for the trigger was vetoed by a guard.

    `guard` names the guard that vetoed the last candidate transition (``"not name"``
    for an ``unless`` guard that held). The model's state is unchanged; `prepare`
    callbacks and the guards themselves did run.
    """

    def __init__(
        self, machine: str, model: str, state: str, trigger: str, guard: str, *, noun: str = ""
    ) -> None:
        self.machine = machine
        self.model = model
        self.state = state
        self.trigger = trigger
        self.guard = guard
        what = noun or machine
        super().__init__(
            f"cannot {trigger} {what} {model!r} in state {state!r}: guard {guard!r} rejected it"
        )


class AwaitableGuardError(UnicacheFsmError, TypeError):
    """A sync executor's guard returned an awaitable (an ``async def`` behind a plain
    wrapper, say): its answer is unknowable without awaiting it, which only an async
    executor does. The awaitable is closed unawaited; the model's state is unchanged.
    """

    def __init__(self, machine: str, guard: str, value: object) -> None:
        self.machine = machine
        self.guard = guard
        super().__init__(
            f"machine {machine!r}: guard {guard!r} returned an awaitable "
            f"({type(value).__name__}); a sync executor cannot await it: use an async "
            "executor, or make the guard a plain function"
        )


class UnknownStateError(UnicacheFsmError, ValueError):
    """A model holds (or a caller named) a state the machine does not declare."""

    def __init__(self, machine: str, state: object, known: Sequence[str]) -> None:
        self.machine = machine
        self.state = state
        self.known = tuple(known)
        shown = ", ".join(self.known[:12]) + (" ..." if len(self.known) > 12 else "")
        super().__init__(f"machine {machine!r} has no state {state!r}; known: {shown}")


class TraceInputError(UnicacheFsmError, ValueError):
    """A trace the checker cannot read: a line that is not JSON, a record that is not an
    object, lacks a field or has one of the wrong type, or a machine with no spec.

    `where` locates the culprit (``"line 3"`` of a file, ``"record 3"`` of the records
    given); `machine` is set when the culprit is a machine with no spec. Unlike a trace
    violation (a readable trace with an illegal step), this is bad input.
    """

    def __init__(self, where: str, reason: str, *, machine: str | None = None) -> None:
        self.where = where
        self.reason = reason
        self.machine = machine
        super().__init__(f"trace {where}: {reason}")
