"""Trace conformance: replay a recorded trace against the specs.

`check_trace(records, specs)` walks a trace (the JSON objects `fsm.trace.TraceRecorder`
writes) model by model and checks every step against the machine's meaning
(`fsm.flat`). A record is an object with ``seq`` (an integer) and ``machine``,
``model``, ``source``, ``trigger``, ``dest`` (strings). The rules:

- ``seq`` goes up by exactly one from one record to the next (a gap means records
  were lost or deleted; the first record may have any ``seq``, as a ring buffer's
  trace starts mid-run);
- a model (a ``(machine, model)`` pair) starts with an initialization: trigger
  ``"<init>"``, an empty source, and as dest the spec's initial configuration — or,
  for a machine whose models may be born as copies (the *copy rule*, `copies`: by
  default the bundled cache machines, where a node born by splitting another carries
  its sibling's residency), the configuration a live model of the same machine is in
  right now;
- a model is initialized again only once it has reached a final configuration (its
  id was recycled); a second ``<init>`` of a live model would let a trace teleport it;
- every other record leaves the configuration the model is in, with a trigger that
  configuration allows, into a configuration one of its candidate transitions reaches.

The result is a `TraceCheck`: records checked, models seen, and the first illegal step
(`TraceViolation`, with the model's previous records as context), or None. A trace that
cannot be checked at all — a line that is not JSON, a record that is not an object,
lacks a field or holds a value of the wrong type (a number where a model id string
belongs: ``1`` and ``"1"`` are never merged), a machine `specs` does not know — raises
`TraceInputError` naming the record instead.

- `read_trace(path)` — the records of a JSONL file (`TraceInputError` naming the line
  that is not UTF-8, not JSON, or nested or numbered beyond what can be read).
- `spec_lookup(specs, fallback)` — a `specs` callable over given specs, then `fallback`.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from unicache_fsm.fsm.errors import (
    InvalidSpecError,
    SpecProblem,
    TraceInputError,
    UnicacheFsmError,
)
from unicache_fsm.fsm.executor import INIT_TRIGGER
from unicache_fsm.fsm.flat import FlatMachine, flatten
from unicache_fsm.fsm.loader import bundled_machines, bundled_spec
from unicache_fsm.fsm.spec import MachineSpec
from unicache_fsm.fsm.validate import check_spec

__all__ = ["TraceCheck", "TraceViolation", "check_trace", "read_trace", "spec_lookup"]

_TEXT_FIELDS = ("machine", "model", "source", "trigger", "dest")


@attrs.frozen
class TraceViolation:
    """The first step the specs do not allow, with what led to it.

    `index` is the 1-based position of the record in the trace.
    """

    record: dict[str, Any]
    reason: str
    context: tuple[dict[str, Any], ...] = ()
    index: int = 0

    def describe(self) -> str:
        where = f"record {self.index}, " if self.index else ""
        lines = [f"illegal step at {where}seq {self.record.get('seq')}: {self.reason}"]
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


def read_trace(path: str | Path) -> Iterator[Any]:
    """The records of a JSONL trace file, in order (blank lines skipped).

    Raises `TraceInputError` naming the line when a line is not UTF-8, not JSON, nested
    too deep to parse or holds an integer too long to read; what the records hold is
    `check_trace`'s business. Lines are decoded one at a time, so the culprit is the
    line that holds the bad byte.
    """
    with Path(path).open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a BOM is tolerated
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceInputError(f"line {n}", f"not UTF-8 ({exc.reason})") from None
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceInputError(f"line {n}", f"not JSON ({exc.msg})") from None
            except RecursionError:
                raise TraceInputError(f"line {n}", "not readable (nested too deep)") from None
            except ValueError as exc:  # an integer beyond the digit limit, say
                raise TraceInputError(f"line {n}", f"not readable ({exc})") from None


def spec_lookup(
    specs: Iterable[MachineSpec], fallback: Callable[[str], MachineSpec] | None = bundled_spec
) -> Callable[[str], MachineSpec]:
    """A machine-name -> spec function for `check_trace`: the given specs first, then
    `fallback` (the bundled machines by default; None: no others).

    Raises `InvalidSpecError` when a given spec is invalid (`check_spec`) or two of
    them have the same machine name; the
    function it returns raises `InvalidSpecError` for a name it does not know.
    """
    by_name: dict[str, MachineSpec] = {}
    for spec in specs:
        check_spec(spec)
        if spec.name in by_name:
            both = [by_name[spec.name].source, spec.source]
            raise InvalidSpecError(spec.name, spec.source, [SpecProblem("defined twice", both)])
        by_name[spec.name] = spec

    def lookup(name: str) -> MachineSpec:
        if name in by_name:
            return by_name[name]
        if fallback is None:
            known = ", ".join(sorted(by_name)) or "none"
            msg = f"no spec for machine {name!r}; given: {known}"
            raise InvalidSpecError(name, "", [SpecProblem("unknown machine", [msg])])
        return fallback(name)

    return lookup


def _validated(index: int, record: object) -> Mapping[str, Any]:
    """The record if it has every field with the right type, else `TraceInputError`."""
    where = f"record {index}"
    if not isinstance(record, dict):
        shown = json.dumps(record)[:80] if _jsonable(record) else repr(record)[:80]
        raise TraceInputError(where, f"expected a JSON object, got {shown}")
    missing = [f for f in ("seq", *_TEXT_FIELDS) if f not in record]
    if missing:
        raise TraceInputError(where, f"lacks {', '.join(missing)}")
    seq = record["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TraceInputError(where, f"seq must be an integer, got {seq!r}")
    for field in _TEXT_FIELDS:
        value = record[field]
        if not isinstance(value, str):
            raise TraceInputError(where, f"{field} must be a string, got {value!r}")
    return record


def _jsonable(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def check_trace(
    records: Iterable[object],
    specs: Callable[[str], MachineSpec] = bundled_spec,
    *,
    context: int = 5,
    copies: Collection[str] | None = None,
) -> TraceCheck:
    """Replay `records` against the specs (`specs(name)` gives a machine's spec).

    `copies` names the machines under the copy rule (an ``<init>`` may put a model in
    the configuration of a live one); None: the bundled machines (`bundled_machines`).
    Returns the first illegal step, if any; raises `TraceInputError` on a record that
    cannot be checked (see the module docstring).
    """
    copying = frozenset(bundled_machines() if copies is None else copies)
    flats: dict[str, FlatMachine] = {}
    state: dict[tuple[str, str], str] = {}
    # per machine: how many live (non-final) models are in each configuration
    occupied: dict[str, Counter[str]] = defaultdict(Counter)
    history: dict[tuple[str, str], deque[dict[str, Any]]] = defaultdict(
        lambda: deque(maxlen=context)
    )
    count = 0
    last_seq: int | None = None

    def fail(record: Mapping[str, Any], reason: str, key: tuple[str, str] | None) -> TraceCheck:
        ctx = tuple(history[key]) if key is not None else ()
        return TraceCheck(count, len(state), TraceViolation(dict(record), reason, ctx, count))

    def move(key: tuple[str, str], flat: FlatMachine, dest: str) -> None:
        old = state.get(key)
        if old is not None and not flat.is_final(old):
            occupied[key[0]][old] -= 1
        state[key] = dest
        if not flat.is_final(dest):
            occupied[key[0]][dest] += 1

    for raw in records:
        count += 1
        record = _validated(count, raw)
        machine: str = record["machine"]
        if machine not in flats:
            try:
                flats[machine] = flatten(specs(machine))
            except (UnicacheFsmError, LookupError) as exc:
                detail = (
                    "; ".join(n for p in exc.problems for n in p.names)
                    if isinstance(exc, InvalidSpecError)
                    else str(exc)
                )
                reason = f"unknown machine {machine!r} ({detail})"
                raise TraceInputError(f"record {count}", reason, machine=machine) from None
        flat = flats[machine]
        key = (machine, record["model"])
        seq: int = record["seq"]
        source, trigger, dest = record["source"], record["trigger"], record["dest"]
        if last_seq is not None and seq != last_seq + 1:
            lost = " (records missing between them)" if seq > last_seq else ""
            return fail(record, f"seq {seq} does not follow seq {last_seq}{lost}", key)
        last_seq = seq
        current = state.get(key)
        if trigger == INIT_TRIGGER:
            if source:
                reason = f"{machine}: an <init> record has source {source!r} (it must be empty)"
                return fail(record, reason, key)
            if current is not None and not flat.is_final(current):
                reason = f"{machine}: model {key[1]!r} initialized again while live in {current!r}"
                return fail(record, reason, key)
            if dest != flat.initial and (machine not in copying or occupied[machine][dest] <= 0):
                what = (
                    f"neither the initial configuration {flat.initial!r} nor that of a live "
                    f"{machine} model"
                    if machine in copying
                    else f"not the initial configuration {flat.initial!r}"
                )
                reason = f"{machine}: initialized into {dest!r}, which is {what}"
                return fail(record, reason, key)
        elif current is None:
            return fail(record, f"{machine}: model {key[1]!r} moves before being initialized", key)
        elif current != source:
            reason = f"{machine}: source {source!r} but the model is in {current!r}"
            return fail(record, reason, key)
        else:
            candidates = flat.group(source, trigger)
            if not candidates:
                allowed = ", ".join(flat.triggers_from(source)) or "none"
                reason = f"{machine}: no {trigger!r} from {source!r} (allowed: {allowed})"
                return fail(record, reason, key)
            if dest not in {ft.dest for ft in candidates}:
                reason = f"{machine}: {trigger!r} from {source!r} cannot reach {dest!r}"
                return fail(record, reason, key)
        move(key, flat, dest)
        history[key].append(dict(record))
    return TraceCheck(count, len(state), None)
