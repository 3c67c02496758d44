"""Observers that record what the machines did: counters and JSONL traces.

- `TransitionCounter` — counts each ``(machine, source, trigger, dest)`` taken; cheap
  enough to leave on for fuzzing and simulation; `per_machine()` sums per machine.
- `TraceRecorder` — one JSON object per transition (``seq``, ``machine``, ``model``,
  ``source``, ``trigger``, ``dest``, ``t``: seconds since the recorder opened, and
  ``step``: the caller's step counter, e.g. the scheduler step, when the caller sets
  `TraceRecorder.step`), written to a JSONL file as it happens, or kept in a ring
  buffer of the last `capacity` records. Initializations are recorded too (trigger
  ``"<init>"``, empty source), so a trace can be replayed from the start. ``t`` and
  ``step`` are additions: `check-trace` needs neither, so traces written before them
  still check.
- `GuardedTrace(recorder, label)` — a `TraceRecorder` as an observer whose failures
  never reach the machine: a write or close that fails (a full disk, a closed pipe)
  stops the trace, is logged once and kept in `error`.
- `attach(observer, *executors)` — register one observer on several executors.

Both are plain `Executor` observers (see `fsm.executor`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from unicache_fsm.fsm.executor import INIT_TRIGGER, ExecutorBase, Observer
from unicache_fsm.fsm.identity import model_id

__all__ = ["GuardedTrace", "TraceRecorder", "TransitionCounter", "attach"]

logger = logging.getLogger(__name__)


def attach(observer: Observer, *executors: ExecutorBase) -> None:
    """Register `observer` on every executor given (each only once)."""
    for ex in dict.fromkeys(executors):
        ex.add_observer(observer)


class TransitionCounter:
    """Counts transitions by ``(machine, source, trigger, dest)``."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str, str, str]] = collections.Counter()

    def __call__(self, ex: ExecutorBase, model: Any, source: str, trigger: str, dest: str) -> None:
        if trigger != INIT_TRIGGER:
            self.counts[(ex.name, source, trigger, dest)] += 1

    def per_machine(self) -> dict[str, int]:
        out: dict[str, int] = collections.defaultdict(int)
        for (machine, _s, _t, _d), n in self.counts.items():
            out[machine] += n
        return dict(sorted(out.items()))

    def total(self) -> int:
        return sum(self.counts.values())


class TraceRecorder:
    """Records every transition as a JSON object (a JSONL file, or a ring buffer)."""

    def __init__(self, path: str | Path | None = None, *, capacity: int = 10_000) -> None:
        self.seq = 0
        self.path = Path(path) if path is not None else None
        self._file: IO[str] | None = (
            self.path.open("w", encoding="utf-8") if self.path is not None else None
        )
        self.ring: collections.deque[dict[str, Any]] = collections.deque(maxlen=capacity)
        #: the caller's step (e.g. the scheduler step) stamped on each record; None: none
        self.step: int | None = None
        self._t0 = time.perf_counter()

    def __call__(self, ex: ExecutorBase, model: Any, source: str, trigger: str, dest: str) -> None:
        self.seq += 1
        record = {
            "seq": self.seq,
            "machine": ex.name,
            "model": model_id(model),
            "source": source,
            "trigger": trigger,
            "dest": dest,
            "t": round(time.perf_counter() - self._t0, 6),
        }
        if self.step is not None:
            record["step"] = self.step
        if self._file is not None:
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        else:
            self.ring.append(record)

    def records(self) -> Iterable[dict[str, Any]]:
        """The records kept in memory (ring-buffer mode)."""
        return list(self.ring)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GuardedTrace:
    """`recorder` as an observer that never fails the run it records.

    A trace is a record of the run, not part of it: a write that fails (a full disk, a
    closed pipe) stops the trace (the recorder is closed, its failed buffer dropped),
    is logged once under `label` and kept in `error`, and never reaches the caller nor
    leaves a transition half done. `close()` flushes and closes, a failing flush
    handled alike. Later transitions are not recorded once the trace stopped.
    """

    __slots__ = ("error", "label", "recorder")

    def __init__(self, recorder: TraceRecorder, label: str) -> None:
        self.recorder = recorder
        self.label = label
        #: why the trace stopped (a write or flush that failed), if it did
        self.error: OSError | None = None

    def __call__(self, ex: ExecutorBase, model: Any, source: str, trigger: str, dest: str) -> None:
        if self.error is not None:
            return
        try:
            self.recorder(ex, model, source, trigger, dest)
        except OSError as exc:
            self._failed(exc)

    def close(self) -> None:
        try:
            self.recorder.close()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if self.error is None:
            self.error = exc
            logger.error("%s trace stopped: %s", self.label, exc)
        with contextlib.suppress(OSError):  # the buffer that failed is dropped
            self.recorder.close()
