"""Observers that record what the machines did: counters and JSONL traces.

- `TransitionCounter` — counts each ``(machine, source, trigger, dest)`` taken; cheap
  enough to leave on for fuzzing and simulation; `per_machine()` sums per machine.
- `TraceRecorder` — one JSON object per transition (``seq``, ``machine``, ``model``,
  ``source``, ``trigger``, ``dest``), written to a JSONL file as it happens, or kept in
  a ring buffer of the last `capacity` records. Initializations are recorded too
  (trigger ``"<init>"``, empty source), so a trace can be replayed from the start.
- `attach(observer, *executors)` — register one observer on several executors.

Both are plain `Executor` observers (see `fsm.executor`).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from unicache_fsm.fsm.executor import INIT_TRIGGER, ExecutorBase, Observer
from unicache_fsm.fsm.identity import model_id

__all__ = ["TraceRecorder", "TransitionCounter", "attach"]


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

    def __call__(self, ex: ExecutorBase, model: Any, source: str, trigger: str, dest: str) -> None:
        self.seq += 1
        record = {
            "seq": self.seq,
            "machine": ex.name,
            "model": model_id(model),
            "source": source,
            "trigger": trigger,
            "dest": dest,
        }
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
