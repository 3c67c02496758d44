"""Trace conformance: replay a recorded trace against the specs.

`check_trace(records)` walks a trace (the JSON objects `fsm.trace.TraceRecorder`
writes) model by model and checks every step against the machine's flat table:

- a model's first record is its initialization (trigger ``"<init>"``) into a known
  configuration — the spec's initial one, or any one when copied from another model
  (a node born by splitting carries its sibling's residency);
- every later record leaves the configuration the model is in, with a trigger that
  configuration allows, into a configuration one of its candidate transitions reaches;
- machines must be known specs; records must carry every field.

The result is a `TraceCheck`: records checked, models seen, and the first illegal step
(`TraceViolation`, with the model's previous records as context), or None.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.fsm.executor import INIT_TRIGGER
from unicache_fsm.fsm.flat import FlatMachine, flatten
from unicache_fsm.fsm.loader import bundled_spec
from unicache_fsm.fsm.spec import MachineSpec

__all__ = ["TraceCheck", "TraceViolation", "check_trace", "read_trace"]

_FIELDS = ("seq", "machine", "model", "source", "trigger", "dest")


@attrs.frozen
class TraceViolation:
    """The first step the specs do not allow, with what led to it."""

    record: dict[str, Any]
    reason: str
    context: tuple[dict[str, Any], ...] = ()

    def describe(self) -> str:
        lines = [f"illegal step at seq {self.record.get('seq')}: {self.reason}"]
        lines.append(f"  record: {json.dumps(self.record, sort_keys=True)}")
        if self.context:
            lines.append(f"  previous records of model {self.record.get('model')!r}:")
            lines += [f"    {json.dumps(r, sort_keys=True)}" for r in self.context]
        return "\n".join(lines)


@attrs.frozen
class TraceCheck:
    records: int
    models: int
    violation: TraceViolation | None

    @property
    def ok(self) -> bool:
        return self.violation is None


def read_trace(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a JSONL trace file, in order."""
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def check_trace(
    records: Iterable[dict[str, Any]],
    specs: Callable[[str], MachineSpec] = bundled_spec,
    *,
    context: int = 5,
) -> TraceCheck:
    """Replay `records` against the specs (`specs(name)` gives a machine's spec)."""
    flats: dict[str, FlatMachine] = {}
    state: dict[tuple[str, str], str] = {}
    history: dict[tuple[str, str], deque[dict[str, Any]]] = defaultdict(
        lambda: deque(maxlen=context)
    )
    count = 0

    def fail(record: dict[str, Any], reason: str, key: tuple[str, str] | None) -> TraceCheck:
        ctx = tuple(history[key]) if key is not None else ()
        return TraceCheck(count, len(state), TraceViolation(record, reason, ctx))

    for record in records:
        count += 1
        missing = [f for f in _FIELDS if f not in record]
        if missing:
            return fail(record, f"record lacks {', '.join(missing)}", None)
        machine = str(record["machine"])
        if machine not in flats:
            try:
                flats[machine] = flatten(specs(machine))
            except UnicacheFsmError as exc:
                return fail(record, f"unknown machine {machine!r} ({exc})", None)
        flat = flats[machine]
        key = (machine, str(record["model"]))
        source, trigger, dest = record["source"], record["trigger"], record["dest"]
        if trigger == INIT_TRIGGER:
            if dest not in flat.active:
                return fail(record, f"{machine}: initialized into unknown state {dest!r}", key)
        elif key not in state:
            return fail(record, f"{machine}: model {key[1]!r} moves before being initialized", key)
        elif state[key] != source:
            reason = f"{machine}: source {source!r} but the model is in {state[key]!r}"
            return fail(record, reason, key)
        else:
            candidates = flat.table.get((source, trigger))
            if not candidates:
                allowed = ", ".join(flat.triggers_from(source)) or "none"
                reason = f"{machine}: no {trigger!r} from {source!r} (allowed: {allowed})"
                return fail(record, reason, key)
            if dest not in {ft.dest for ft in candidates}:
                reason = f"{machine}: {trigger!r} from {source!r} cannot reach {dest!r}"
                return fail(record, reason, key)
        state[key] = dest
        history[key].append(record)
    return TraceCheck(count, len(state), None)
