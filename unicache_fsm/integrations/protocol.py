"""SGLang 0.5.23's linker protocol as machines, driven from a record of the calls.

SGLang 0.5.23's `UnifiedRadixCache` drives its external linker through ten methods
(lookup, load, start/finish of a layer-wise loading batch, cancel, offload, the two
completion calls, reset, close). 0.5.23 has no COMMIT phase (docs/deviations.md, D1):
a loaded tail is private to its request until the request inserts it like computed KV.
That protocol is three machines of its own, separate from the project's load
transaction:

- `specs/sglang_linker.toml` — the linker object: open until `close`; every call is a
  transition, `finish` needs a started, unfinished batch index and `pop` a reported,
  unpopped completion.
- `specs/sglang_load.toml` — one `load` call: requested, queued, started, then landed,
  failed, refused, cancelled or dropped.
- `specs/sglang_offload.toml` — one `offload` call: requested, pending, completed
  (counted by `num_completed_offloads`), then stored, failed, refused or dropped.

`ProtocolMonitor(mode="raise" | "record", trace=None)` owns one executor per machine
(so two monitors never see each other's transitions) and is told about each call in two
halves: ``before_<call>(...)`` checks that the call is legal now and changes nothing
when it is not; ``after_<call>(..., answer)`` records what the linker answered, exactly
as it answered (the caller must not coerce it). An answer is checked too, since the
cache acts on it: every verdict is a `bool` (``"False"``, ``None`` or ``1`` is a
violation, not a truthy verdict), a cancel answered True needs a queued load of that
rid, ``start_layer_wise_loading`` answers an `int` that is not the index of a batch still
in flight, and ``num_completed_offloads`` an `int` from 0 to the accepted offloads not
popped yet. A call or an answer the protocol does not allow is a `ProtocolViolation`,
an `IllegalTransitionError` that carries the history of the load, offload or linker
concerned: raised in ``raise`` mode, logged in ``record`` mode and counted in
`violation_count`, the newest `KEPT_VIOLATIONS` kept in `violations` (a deployment's
monitor runs for weeks: its memory stays bounded). A recorded violation changes no
machine, so the rest of the run is still checked.

`counter` counts every transition (`coverage()` gives the `Coverage` that
``unicache-fsm diagram --coverage`` draws); with `trace` every transition is written to
that JSONL file, which ``unicache-fsm check-trace`` replays against the specs. A trace
path that is a directory, FIFO or socket is refused (`MonitorConfigError`); a write that
fails later (a full disk) stops the trace, is logged and kept in `trace_error`, and is
never raised into the caller.

The enums are generated from the specs (`unicache_fsm.spec_enums`, re-exported here;
checked again when the executors are bound). This module imports nothing of SGLang.
"""

from __future__ import annotations

import logging
import numbers
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.errors import (
    GuardRejectedError,
    IllegalTransitionError,
    UnicacheFsmError,
)
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.trace import GuardedTrace, TraceRecorder, TransitionCounter, attach
from unicache_fsm.spec_enums import (
    SglangLinkerState,
    SglangLinkerTrigger,
    SglangLoadState,
    SglangLoadTrigger,
    SglangOffloadState,
    SglangOffloadTrigger,
)

__all__ = [
    "KEPT_VIOLATIONS",
    "MONITOR_MODES",
    "LinkerRecord",
    "LoadRecord",
    "MonitorConfigError",
    "OffloadRecord",
    "ProtocolMonitor",
    "ProtocolViolation",
    "SglangLinkerState",
    "SglangLinkerTrigger",
    "SglangLoadState",
    "SglangLoadTrigger",
    "SglangOffloadState",
    "SglangOffloadTrigger",
]

logger = logging.getLogger(__name__)

MONITOR_MODES = ("raise", "record")

#: recorded violations a `ProtocolMonitor` keeps (the newest; every one is counted)
KEPT_VIOLATIONS = 256


class MonitorConfigError(UnicacheFsmError, ValueError):
    """A `ProtocolMonitor` was built with a bad argument (named in `argument`)."""

    def __init__(self, msg: str, *, argument: str, value: object) -> None:
        self.argument = argument
        self.value = value
        super().__init__(msg)


class ProtocolViolation(IllegalTransitionError):
    """A linker call SGLang 0.5.23's protocol does not allow at this point.

    The fields of `IllegalTransitionError` name the machine, the model (a load, an
    offload or the linker), its state and the trigger; `call` is the offending call as
    text, `history` the calls that brought that model where it is (oldest first), and
    `guard` the guard that vetoed it ("" when the state has no such transition at all).
    """

    def __init__(
        self, cause: IllegalTransitionError | GuardRejectedError, call: str, history: Sequence[str]
    ) -> None:
        allowed = cause.allowed if isinstance(cause, IllegalTransitionError) else (cause.trigger,)
        super().__init__(cause.machine, cause.model, cause.state, cause.trigger, allowed)
        self.call = call
        self.history = tuple(history)
        self.guard = cause.guard if isinstance(cause, GuardRejectedError) else ""
        lines = "\n".join(f"  {h}" for h in self.history) or "  (none)"
        self.args = (f"{call}: {cause}\nhistory of {cause.model}:\n{lines}",)


def _accepted(self: object, ok: object = None) -> bool:
    """Guard: the answer passed with the trigger is True (the bool, nothing truthy)."""
    return ok is True


def _declined(self: object, ok: object = None) -> bool:
    """Guard: the answer passed with the trigger is False (the bool, nothing falsy)."""
    return ok is False


def _is_int(value: object) -> TypeGuard[int]:
    """An integer answer (NumPy's too); a `bool` is an int to Python, not to the protocol."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _blocks_or_fails(path: Path) -> bool:
    """Whether opening `path` to write would wait forever (a FIFO with no reader) or
    fail (a directory, a socket); a device such as /dev/null is a file to write."""
    return path.is_dir() or path.is_fifo() or path.is_socket()


class _Record:
    __slots__ = ("__weakref__", "fsm_id", "history", "state")

    def __init__(self, fsm_id: str) -> None:
        self.fsm_id = fsm_id
        self.state = ""
        self.history: deque[str] = deque(maxlen=64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fsm_id!r}, state={self.state!r})"


class LoadRecord(_Record):
    """One `load` call: its request id and, once started, its batch index."""

    __slots__ = ("batch", "rid")

    accepted = _accepted
    declined = _declined

    def __init__(self, fsm_id: str, rid: str) -> None:
        super().__init__(fsm_id)
        self.rid = rid
        self.batch: int | None = None


class OffloadRecord(_Record):
    """One `offload` call, numbered in submission order."""

    __slots__ = ("seq",)

    accepted = _accepted
    declined = _declined

    def __init__(self, fsm_id: str, seq: int) -> None:
        super().__init__(fsm_id)
        self.seq = seq


class LinkerRecord(_Record):
    """The linker object; its guards read the monitor's books."""

    __slots__ = ("monitor",)

    def __init__(self, fsm_id: str, monitor: ProtocolMonitor) -> None:
        super().__init__(fsm_id)
        self.monitor = monitor

    def batch_started(self, index: object = None) -> bool:
        return self.monitor.in_flight_batch(index)

    def completion_reported(self) -> bool:
        oldest = self.monitor.oldest_offload()
        return oldest is not None and oldest.state == SglangOffloadState.COMPLETED

    def index_free(self, index: object = None) -> bool:
        """Guard of `start_answer`: an int that names no batch still in flight."""
        return _is_int(index) and not self.monitor.in_flight_batch(index)

    def count_backed(self, count: object = None) -> bool:
        """Guard of `count_answer`: an int from 0 to the accepted offloads not popped."""
        return _is_int(count) and 0 <= count <= len(self.monitor.offloads)


_LIVE_LOAD = (SglangLoadState.QUEUED, SglangLoadState.STARTED)
_LIVE_OFFLOAD = (SglangOffloadState.PENDING, SglangOffloadState.COMPLETED)


class ProtocolMonitor:
    """Drives the three protocol machines from the calls one linker receives."""

    _serial = 0

    def __init__(self, *, mode: str = "raise", trace: str | Path | None = None) -> None:
        if mode not in MONITOR_MODES:
            msg = f"mode must be one of {', '.join(MONITOR_MODES)}, got {mode!r}"
            raise MonitorConfigError(msg, argument="mode", value=mode)
        self.mode = mode
        self.linker_machine = CompiledExecutor(
            "sglang_linker", LinkerRecord, triggers=SglangLinkerTrigger, states=SglangLinkerState
        )
        self.load_machine = CompiledExecutor(
            "sglang_load", LoadRecord, triggers=SglangLoadTrigger, states=SglangLoadState
        )
        self.offload_machine = CompiledExecutor(
            "sglang_offload",
            OffloadRecord,
            triggers=SglangOffloadTrigger,
            states=SglangOffloadState,
        )
        self.counter = TransitionCounter()
        attach(self.counter, *self.executors)
        if trace is not None and _blocks_or_fails(Path(trace)):
            msg = f"trace {str(trace)!r} is a directory, FIFO or socket, not a file to write"
            raise MonitorConfigError(msg, argument="trace", value=trace)
        self.trace = TraceRecorder(trace) if trace is not None else None
        self._guard = (
            GuardedTrace(self.trace, "SGLang linker protocol") if self.trace is not None else None
        )
        if self._guard is not None:
            attach(self._guard, *self.executors)
        type(self)._serial += 1
        self.name = f"sglang linker #{type(self)._serial}"
        self.linker = LinkerRecord(self.name, self)
        self.linker_machine.initialize(self.linker)
        #: loads not yet ended, oldest first; started batches by index
        self.loads: list[LoadRecord] = []
        self.batches: dict[int, list[LoadRecord]] = {}
        #: accepted offloads not yet popped or dropped, in submission order
        self.offloads: deque[OffloadRecord] = deque()
        #: the newest `KEPT_VIOLATIONS` recorded violations; all of them are counted
        self.violations: list[ProtocolViolation] = []
        self.violation_count = 0
        self._loads_made = 0
        self._offloads_made = 0

    @property
    def executors(self) -> tuple[Executor, ...]:
        return (self.linker_machine, self.load_machine, self.offload_machine)

    def coverage(self) -> Coverage:
        """The transitions taken so far, for ``diagram --coverage``."""
        return Coverage.from_counter(self.counter)

    @property
    def trace_error(self) -> OSError | None:
        """Why the trace stopped (a write that failed: a full disk, a pipe closed), if it did."""
        return None if self._guard is None else self._guard.error

    def close_trace(self) -> None:
        """Flush and close the JSONL trace (the monitor keeps counting); a flush that
        fails stops the trace as a failed write does (`fsm.trace.GuardedTrace`)."""
        if self._guard is not None:
            self._guard.close()

    @property
    def closed(self) -> bool:
        """Whether the linker saw its `close`."""
        return self.linker.state == SglangLinkerState.CLOSED

    def in_flight_batch(self, index: object) -> bool:
        """Whether `index` names a batch started and not finished; False for anything
        that is no integer (a list, an array: what a linker answered is never trusted
        to be hashable)."""
        return _is_int(index) and index in self.batches

    def oldest_offload(self) -> OffloadRecord | None:
        return self.offloads[0] if self.offloads else None

    # -- the calls, in two halves ------------------------------------------------------

    def before_lookup(self, rid: str) -> bool:
        return self._linker_call(SglangLinkerTrigger.LOOKUP, f"lookup({rid!r})")

    def before_load(self, rid: str) -> bool:
        return self._linker_call(SglangLinkerTrigger.LOAD, f"load({rid!r})")

    def after_load(self, rid: str, answer: object) -> None:
        self._loads_made += 1
        rec = LoadRecord(f"load {rid!r} #{self._loads_made}", rid)
        self.load_machine.initialize(rec)
        self._step(
            self.load_machine, rec, SglangLoadTrigger.ANSWER, f"load({rid!r}) -> {answer}", answer
        )
        if rec.state == SglangLoadState.QUEUED:
            self.loads.append(rec)

    def before_start(self) -> bool:
        return self._linker_call(SglangLinkerTrigger.START, "start_layer_wise_loading()")

    def after_start(self, index: object) -> None:
        call = f"start_layer_wise_loading() -> {index!r}"
        if not self._answer(SglangLinkerTrigger.START_ANSWER, call, index):
            return  # a recorded violation changes nothing: the loads stay queued
        queued = [r for r in self.loads if r.state == SglangLoadState.QUEUED]
        if not queued:
            return
        assert _is_int(index)  # index_free held
        index = int(index)
        batch = self.batches.setdefault(index, [])
        for rec in queued:
            rec.batch = index
            self._step(self.load_machine, rec, SglangLoadTrigger.START, call)
            batch.append(rec)

    def before_finish(self, index: int) -> bool:
        call = f"finish_layer_wise_loading({index})"
        if not self.in_flight_batch(index):
            # finish before start: the oldest queued load shows it best
            queued = [r for r in self.loads if r.state == SglangLoadState.QUEUED]
            if queued:
                return self._step(self.load_machine, queued[0], SglangLoadTrigger.FINISH, call)
        return self._linker_call(SglangLinkerTrigger.FINISH, call, index)

    def after_finish(self, index: int, answer: object) -> None:
        call = f"finish_layer_wise_loading({index}) -> {answer!r}"
        batch = self.batches.pop(index, []) if self.in_flight_batch(index) else []
        for rec in batch:  # the batch ended whatever it answered
            self._forget_load(rec)
        for rec in batch:
            self._step(self.load_machine, rec, SglangLoadTrigger.FINISH, call, answer)

    def before_cancel(self, rid: str) -> bool:
        return self._linker_call(SglangLinkerTrigger.CANCEL, f"cancel_queued_load({rid!r})")

    def after_cancel(self, rid: str, answer: object) -> None:
        if answer is False:
            return
        call = f"cancel_queued_load({rid!r}) -> {answer!r}"
        live = [r for r in self.loads if r.rid == rid]
        if live:  # only a queued load can be cancelled, and only by the answer True
            rec = live[0]
            if self._step(self.load_machine, rec, SglangLoadTrigger.CANCEL, call, answer):
                self._forget_load(rec)
            return
        # no load of `rid` is queued: a cancel that claims one was withdrawn is a lie;
        # the load machine shows it as a load that no `load` call ever answered
        phantom = LoadRecord(f"load {rid!r} (never queued)", rid)
        self.load_machine.initialize(phantom)
        self._step(self.load_machine, phantom, SglangLoadTrigger.CANCEL, call, answer)

    def before_offload(self) -> bool:
        return self._linker_call(SglangLinkerTrigger.OFFLOAD, "offload(...)")

    def after_offload(self, answer: object, pages: int) -> None:
        self._offloads_made += 1
        rec = OffloadRecord(f"offload #{self._offloads_made}", self._offloads_made)
        self.offload_machine.initialize(rec)
        call = f"offload({pages} page(s)) -> {answer!r}"
        self._step(self.offload_machine, rec, SglangOffloadTrigger.ANSWER, call, answer)
        if rec.state == SglangOffloadState.PENDING:
            self.offloads.append(rec)

    def before_count(self) -> bool:
        return self._linker_call(SglangLinkerTrigger.COUNT, "num_completed_offloads()")

    def after_count(self, answer: object) -> None:
        call = f"num_completed_offloads() -> {answer!r}"
        if not self._answer(SglangLinkerTrigger.COUNT_ANSWER, call, answer):
            return
        assert _is_int(answer)  # count_backed held
        # the oldest `answer` offloads completed
        for rec in list(self.offloads)[: int(answer)]:
            if rec.state == SglangOffloadState.PENDING:
                self._step(self.offload_machine, rec, SglangOffloadTrigger.REPORT, call)

    def before_pop(self) -> bool:
        call = "pop_completed_offload()"
        oldest = self.oldest_offload()
        if oldest is not None and oldest.state != SglangOffloadState.COMPLETED:
            return self._step(self.offload_machine, oldest, SglangOffloadTrigger.POP, call)
        return self._linker_call(SglangLinkerTrigger.POP, call)

    def after_pop(self, answer: object) -> None:
        oldest = self.oldest_offload()
        if oldest is None or oldest.state != SglangOffloadState.COMPLETED:
            return  # the violation was reported before the call
        call = f"pop_completed_offload() -> {answer!r}"
        self._step(self.offload_machine, oldest, SglangOffloadTrigger.POP, call, answer)
        self.offloads.popleft()

    def before_reset(self) -> bool:
        return self._linker_call(SglangLinkerTrigger.RESET, "reset()")

    def after_reset(self) -> None:
        self._drop_all("reset()")

    def before_close(self) -> bool:
        return self._linker_call(SglangLinkerTrigger.CLOSE, "close()")

    def after_close(self) -> None:
        self._drop_all("close()")

    # -- internals ---------------------------------------------------------------------

    def _drop_all(self, call: str) -> None:
        for rec in self.loads:
            if rec.state in _LIVE_LOAD:
                self._step(self.load_machine, rec, SglangLoadTrigger.DROP, call)
        self.loads.clear()
        self.batches.clear()
        for off in self.offloads:
            self._step(self.offload_machine, off, SglangOffloadTrigger.DROP, call)
        self.offloads.clear()

    def _forget_load(self, rec: LoadRecord) -> None:
        if rec in self.loads:
            self.loads.remove(rec)

    def _linker_call(self, trigger: SglangLinkerTrigger, call: str, *args: Any) -> bool:
        return self._step(self.linker_machine, self.linker, trigger, call, *args)

    def _answer(self, trigger: SglangLinkerTrigger, call: str, answer: object) -> bool:
        """Check an answer the cache acts on; after `close` the call itself was the
        violation (reported before it), so its answer is not checked again."""
        if self.closed:
            return False
        return self._linker_call(trigger, call, answer)

    def _step(self, machine: Executor, rec: _Record, trigger: str, call: str, *args: Any) -> bool:
        """Fire `trigger` at `rec`; True when legal, else report the violation."""
        try:
            machine.fire(rec, trigger, *args)
        except (IllegalTransitionError, GuardRejectedError) as exc:
            violation = ProtocolViolation(exc, call, rec.history)
            if self.mode == "raise":
                raise violation from None
            logger.error("SGLang linker protocol violation: %s", violation)
            self.violation_count += 1
            self.violations.append(violation)
            if len(self.violations) > KEPT_VIOLATIONS:
                del self.violations[0]
            return False
        rec.history.append(f"{call}: {getattr(trigger, 'value', trigger)!s} -> {rec.state}")
        return True
