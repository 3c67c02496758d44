"""vLLM 0.33.0's offloading contract as four machines, driven from a record of the calls.

- `specs/vllm_manager.toml` — the manager's lock: every method but `shutdown` runs with
  `manager.lock` held, the lock is never re-entered, `shutdown` runs without it.
- `specs/vllm_block.toml` — one residency of one `OffloadKey`: absent, storing (store in
  flight: HIT_PENDING, neither loadable nor evictable), stored (HIT), loading (held by
  counted loads: not evictable), then evicted, failed or cleared.
- `specs/vllm_request.toml` — one request: unseen, active (after `on_new_request`),
  finished (after `on_request_finished`: no more submit-side calls).
- `specs/vllm_transfer.toml` — one worker job: submitted, running, then done, failed or
  refused; `get_finished` reports a running job exactly once.

`OffloadingProtocol(mode="raise" | "record", trace=None)` owns one executor per machine
and is told each call as plain facts (keys are ``bytes``, answers are `LookupResult`
names): ``before_*`` checks that a call is legal now and changes no machine when it is
not; ``after_*`` checks and records the answer. A call the contract forbids is an
`OffloadingViolation` (a `ProtocolViolation`: machine, model, state, trigger, the call
and the model's history); an answer of the wrong kind is a `WrongAnswerError`. Both are
raised in ``raise`` mode, or logged and kept in `violations` in ``record`` mode, where a
violation changes no machine so the rest of the run is still checked.

With ``shared=False`` (the default: a manager whose blocks live only in this process)
the books are the truth: a HIT for a key they never saw stored, or a MISS for a stored
block, is a violation (a failed store that became loadable, a block lost without an
eviction report). With ``shared=True`` (a store shared with other processes, or filled
before the monitor was attached) such a HIT makes the key stored (`found`) and such a
MISS ends its residency (`lose`), unless a load holds it. Always violations: a HIT for
a block whose store is in flight, a load of a key not stored, an eviction of a block a
load or a store holds.

`counter` counts every transition (`coverage()`), and with `trace` every transition is
written to that JSONL file, which ``unicache-fsm check-trace`` replays against the specs.
This module imports nothing of vLLM.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.errors import GuardRejectedError, IllegalTransitionError, UnicacheFsmError
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.trace import TraceRecorder, TransitionCounter, attach
from unicache_fsm.integrations.protocol import MONITOR_MODES, MonitorConfigError, ProtocolViolation
from unicache_fsm.spec_enums import (
    BlockState,
    BlockTrigger,
    ManagerState,
    ManagerTrigger,
    RequestState,
    RequestTrigger,
    TransferState,
    TransferTrigger,
)

__all__ = [
    "REMEMBERED",
    "BlockRecord",
    "BlockState",
    "BlockTrigger",
    "ManagerState",
    "ManagerTrigger",
    "OffloadingProtocol",
    "OffloadingViolation",
    "RequestState",
    "RequestTrigger",
    "TransferState",
    "TransferTrigger",
    "WrongAnswerError",
]

logger = logging.getLogger(__name__)


class OffloadingViolation(ProtocolViolation):
    """A manager or worker call vLLM 0.33.0's offloading contract does not allow now."""


class WrongAnswerError(UnicacheFsmError, TypeError):
    """A manager or worker answered something the contract does not allow.

    `call` is the call as text, `answer` what came back, `expected` what may come back.
    """

    def __init__(self, call: str, answer: object, expected: str) -> None:
        self.call = call
        self.answer = answer
        self.expected = expected
        super().__init__(f"{call} answered {answer!r}; the contract allows {expected}")


class _Record:
    __slots__ = ("__weakref__", "fsm_id", "history", "state")

    def __init__(self, fsm_id: str) -> None:
        self.fsm_id = fsm_id
        self.state = ""
        self.history: deque[str] = deque(maxlen=32)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fsm_id!r}, state={self.state!r})"

    def accepted(self, ok: bool = False) -> bool:
        """Guard: the answer (or success) passed with the trigger."""
        return ok


class ManagerRecord(_Record):
    """The manager object (its lock)."""

    __slots__ = ()


class RequestRecord(_Record):
    """One request, by `req_id`."""

    __slots__ = ()


class TransferRecord(_Record):
    """One worker job, by job id."""

    __slots__ = ()


class BlockRecord(_Record):
    """One residency of one key; `loads` counts the loads holding it."""

    __slots__ = ("key", "loads")

    def __init__(self, fsm_id: str, key: bytes) -> None:
        super().__init__(fsm_id)
        self.key = key
        self.loads = 0

    def succeeded(self, success: bool = False) -> bool:
        return success

    def shared(self, shared: bool = False) -> bool:
        """Guard: the store may hold (or drop) blocks the books did not see stored."""
        return shared

    def still_held(self) -> bool:
        return self.loads > 1


#: how many finished requests and reported jobs the books remember
REMEMBERED = 4096


def _remember(books: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    books[key] = value
    if len(books) > REMEMBERED:
        books.popitem(last=False)


_GONE = frozenset({BlockState.EVICTED, BlockState.FAILED, BlockState.LOST, BlockState.CLEARED})


def _short(key: bytes) -> str:
    return key.hex()[:16]


class OffloadingProtocol:
    """Drives the four machines from the calls one manager (and its workers) receive."""

    _serial = 0

    def __init__(
        self, *, mode: str = "raise", trace: str | Path | None = None, shared: bool = False
    ) -> None:
        if mode not in MONITOR_MODES:
            msg = f"mode must be one of {', '.join(MONITOR_MODES)}, got {mode!r}"
            raise MonitorConfigError(msg, argument="mode", value=mode)
        self.mode = mode
        self.shared = shared
        self.manager_machine = CompiledExecutor(
            "vllm_manager", ManagerRecord, triggers=ManagerTrigger, states=ManagerState
        )
        self.block_machine = CompiledExecutor(
            "vllm_block", BlockRecord, triggers=BlockTrigger, states=BlockState
        )
        self.request_machine = CompiledExecutor(
            "vllm_request", RequestRecord, triggers=RequestTrigger, states=RequestState
        )
        self.transfer_machine = CompiledExecutor(
            "vllm_transfer", TransferRecord, triggers=TransferTrigger, states=TransferState
        )
        self.counter = TransitionCounter()
        attach(self.counter, *self.executors)
        self.trace = TraceRecorder(trace) if trace is not None else None
        if self.trace is not None:
            attach(self.trace, *self.executors)
        type(self)._serial += 1
        self.name = f"vllm manager #{type(self)._serial}"
        self.manager = ManagerRecord(self.name)
        self.manager_machine.initialize(self.manager)
        #: live residencies by key (absent and ended ones are dropped)
        self.blocks: dict[bytes, BlockRecord] = {}
        #: requests not finished; finished ones are remembered in `finished` (the newest
        #: `REMEMBERED`, so a long-running monitor stays bounded)
        self.requests: dict[str, RequestRecord] = {}
        self.finished: OrderedDict[str, RequestRecord] = OrderedDict()
        #: worker jobs in flight, by job id, and the newest `REMEMBERED` reported ones
        self.jobs: dict[int, TransferRecord] = {}
        self.reported: OrderedDict[int, None] = OrderedDict()
        self.violations: list[OffloadingViolation | WrongAnswerError] = []
        self._residencies = 0

    @property
    def executors(self) -> tuple[Executor, ...]:
        return (
            self.manager_machine,
            self.block_machine,
            self.request_machine,
            self.transfer_machine,
        )

    def coverage(self) -> Coverage:
        """The transitions taken so far, for ``diagram --coverage``."""
        return Coverage.from_counter(self.counter)

    def close_trace(self) -> None:
        """Flush and close the JSONL trace (the protocol keeps counting)."""
        if self.trace is not None:
            self.trace.close()

    def block_state(self, key: bytes) -> BlockState:
        """Where the books have `key` (absent when they hold no residency of it)."""
        rec = self.blocks.get(key)
        return BlockState(rec.state) if rec is not None else BlockState.ABSENT

    # -- the lock and the manager's calls -----------------------------------------------

    def acquire(self) -> bool:
        return self._step(self.manager_machine, self.manager, ManagerTrigger.ACQUIRE, "lock")

    def release(self) -> bool:
        return self._step(self.manager_machine, self.manager, ManagerTrigger.RELEASE, "unlock")

    def call(self, call: str) -> bool:
        """Any manager call but `shutdown` (checks the lock)."""
        return self._step(self.manager_machine, self.manager, ManagerTrigger.CALL, call)

    def shutdown(self) -> bool:
        return self._step(self.manager_machine, self.manager, ManagerTrigger.SHUTDOWN, "shutdown()")

    def begin_request(self, req_id: str) -> bool:
        call = f"on_new_request({req_id!r})"
        rec = self._request(req_id)
        return self._step(self.request_machine, rec, RequestTrigger.BEGIN, call)

    def submit(self, req_id: str, call: str) -> bool:
        """A submit-side call (lookup, prepare_load, prepare_store, touch) for `req_id`."""
        return self._step(self.request_machine, self._request(req_id), RequestTrigger.SUBMIT, call)

    def finish_request(self, req_id: str) -> bool:
        call = f"on_request_finished({req_id!r})"
        rec = self._request(req_id)
        ok = self._step(self.request_machine, rec, RequestTrigger.FINISH, call)
        if ok:
            del self.requests[req_id]
            _remember(self.finished, req_id, rec)
        return ok

    # -- blocks -------------------------------------------------------------------------

    def after_lookup(self, key: bytes, answer: str) -> None:
        """`lookup(key)` answered `answer` (a `LookupResult` name)."""
        call = f"lookup({_short(key)}) -> {answer}"
        state = self.block_state(key)
        if answer == "HIT":
            if state in (BlockState.STORED, BlockState.LOADING):
                return
            self._fire_block(key, BlockTrigger.FOUND, call, self.shared)
        elif answer == "MISS" and state is not BlockState.ABSENT:
            self._fire_block(key, BlockTrigger.LOSE, call, self.shared)

    def before_load(self, keys: Sequence[bytes], call: str) -> bool:
        """`prepare_load(keys)`: each must be loadable; no machine changes unless all are."""
        return self._check_blocks(keys, BlockTrigger.LOAD, call)

    def after_load(self, keys: Sequence[bytes], call: str) -> None:
        for key in keys:
            rec = self._block(key)
            if self.block_machine.may_fire(rec, BlockTrigger.LOAD):
                rec.loads += 1
                self._fire_block(key, BlockTrigger.LOAD, call)

    def before_unload(self, keys: Sequence[bytes], call: str) -> bool:
        """`complete_load(keys)`: each must be held by a load."""
        return self._check_blocks(keys, BlockTrigger.UNLOAD, call)

    def after_unload(self, keys: Sequence[bytes], call: str) -> None:
        for key in keys:
            rec = self._block(key)
            if self.block_machine.may_fire(rec, BlockTrigger.UNLOAD):
                self._fire_block(key, BlockTrigger.UNLOAD, call)
                rec.loads -= 1

    def after_store(
        self, offered: Sequence[bytes], to_store: Sequence[bytes], evicted: Sequence[bytes]
    ) -> None:
        """`prepare_store(offered)` listed `to_store` and evicted `evicted`."""
        call = (
            f"prepare_store({len(offered)} key(s)) -> store {len(to_store)}, evict {len(evicted)}"
        )
        offered_set = set(offered)
        strays = [k for k in to_store if k not in offered_set]
        if strays or len(set(to_store)) != len(to_store):
            what = "keys it was not offered" if strays else "a key twice"
            self._wrong(call, list(to_store), f"keys_to_store without {what}")
            to_store = [k for k in dict.fromkeys(to_store) if k in offered_set]
        for key in evicted:
            self._fire_block(key, BlockTrigger.EVICT, call)
        for key in to_store:
            self._fire_block(key, BlockTrigger.STORE, call)

    def after_complete_store(self, keys: Iterable[bytes], success: bool) -> None:
        """`complete_store(keys, success)`: blocks still storing complete or fail."""
        call = f"complete_store(success={success})"
        for key in keys:
            if self.block_state(key) is BlockState.STORING:
                self._fire_block(key, BlockTrigger.COMPLETE, call, success)

    def after_reset(self) -> None:
        for key in list(self.blocks):
            self._fire_block(key, BlockTrigger.CLEAR, "reset_cache()")
        self.blocks.clear()

    # -- worker jobs ----------------------------------------------------------------------

    def before_submit(self, job_id: int, call: str) -> bool:
        if job_id in self.jobs:
            return self._step(
                self.transfer_machine, self.jobs[job_id], TransferTrigger.ANSWER, call
            )
        return True

    def after_submit(self, job_id: int, call: str, accepted: bool) -> None:
        if job_id in self.jobs:
            return  # reported before the call
        rec = TransferRecord(f"job {job_id}")
        self.transfer_machine.initialize(rec)
        legal = self._step(self.transfer_machine, rec, TransferTrigger.ANSWER, call, accepted)
        if legal and rec.state == TransferState.RUNNING:
            self.jobs[job_id] = rec

    def after_finished(self, job_id: int, success: bool) -> None:
        call = f"get_finished() -> job {job_id} success={success}"
        rec = self.jobs.pop(job_id, None)
        if rec is not None:
            _remember(self.reported, job_id, None)
        if rec is None:
            rec = TransferRecord(f"job {job_id} (not in flight)")
            self.transfer_machine.initialize(rec)
            self._step(self.transfer_machine, rec, TransferTrigger.FINISH, call, success)
            return
        self._step(self.transfer_machine, rec, TransferTrigger.FINISH, call, success)

    def check_wait(self, job_ids: Iterable[int]) -> None:
        unknown = sorted(j for j in job_ids if j not in self.jobs and j not in self.reported)
        if unknown:
            self._wrong(f"wait({unknown})", unknown, "ids of jobs the worker accepted")

    # -- answers ---------------------------------------------------------------------------

    def check_answer(self, call: str, answer: object, ok: bool, expected: str) -> bool:
        """Report a `WrongAnswerError` unless `ok`; True when `ok`."""
        if not ok:
            self._wrong(call, answer, expected)
        return ok

    # -- internals -------------------------------------------------------------------------

    def _wrong(self, call: str, answer: object, expected: str) -> None:
        error = WrongAnswerError(call, answer, expected)
        if self.mode == "raise":
            raise error
        logger.error("vLLM offloading contract violation: %s", error)
        self.violations.append(error)

    def _request(self, req_id: str) -> RequestRecord:
        rec = self.requests.get(req_id) or self.finished.get(req_id)
        if rec is None:
            rec = self.requests[req_id] = RequestRecord(f"request {req_id!r}")
            self.request_machine.initialize(rec)
        return rec

    def _block(self, key: bytes) -> BlockRecord:
        rec = self.blocks.get(key)
        if rec is None:
            self._residencies += 1
            rec = BlockRecord(f"block {_short(key)} #{self._residencies}", key)
            self.block_machine.initialize(rec)
            self.blocks[key] = rec
        return rec

    def _check_blocks(self, keys: Sequence[bytes], trigger: BlockTrigger, call: str) -> bool:
        for key in keys:
            rec = self._block(key)
            if not self.block_machine.may_fire(rec, trigger):
                ok = self._step(self.block_machine, rec, trigger, call)
                self._forget(rec)
                return ok
        return True

    def _fire_block(self, key: bytes, trigger: BlockTrigger, call: str, *args: Any) -> bool:
        rec = self._block(key)
        ok = self._step(self.block_machine, rec, trigger, call, *args)
        self._forget(rec)
        return ok

    def _forget(self, rec: BlockRecord) -> None:
        ended = rec.state in _GONE or rec.state == BlockState.ABSENT
        if ended and self.blocks.get(rec.key) is rec:
            del self.blocks[rec.key]

    def _step(self, machine: Executor, rec: _Record, trigger: str, call: str, *args: Any) -> bool:
        """Fire `trigger` at `rec`; True when legal, else report the violation."""
        try:
            machine.fire(rec, trigger, *args)
        except (IllegalTransitionError, GuardRejectedError) as exc:
            violation = OffloadingViolation(exc, call, rec.history)
            if self.mode == "raise":
                raise violation from None
            logger.error("vLLM offloading contract violation: %s", violation)
            self.violations.append(violation)
            return False
        rec.history.append(f"{call}: {getattr(trigger, 'value', trigger)!s} -> {rec.state}")
        return True
