"""Run one program on both caches and compare every observable after every operation.

Slots: each side allocates from its own pools, whose free orders differ (0.5.23's
token allocator appends freed slots, its paged allocator prepends freed pages, the
project's reuses the most recently freed page first). The harness therefore allocates
the same number of slots on both sides for every request and records, position by
position, which 0.5.23 slot stands for which project slot (`full_map`, `swa_map`). Every
slot a tree holds came from such an allocation, so comparing "0.5.23's slot, mapped" with
"the project's slot" checks slot *ownership*: which caller slots each tree adopted,
kept or freed. Slots 0.5.23 holds that never went through the map show up as
``'sglang#<slot>'`` and mismatch.

Compared after every operation (the first difference raises `Divergence`):

- the operation's own result: insert ``prefix_len`` and adopted ranges per component,
  match length and slots, lock length, eviction amounts (Full and SWA);
- free tokens per pool (FULL, and SWA with SWA on);
- the number of offload records awaiting a verdict (offload configurations);
- the whole tree, token by token in a canonical order that ignores node boundaries:
  each token's FULL slot, SWA slot (or tombstone), FULL lock count, stored and
  pending flags (`sides.TokenRow`);
- the project's own audit (`RadixTree.check`).

Named deviations (`deviations.py`) are applied here and nowhere else.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.model import (
    Complete,
    Config,
    Evict,
    Insert,
    Lock,
    Match,
    Op,
    Pool,
    Program,
    SetAccept,
    Unlock,
    describe_tokens,
    key_tokens,
    program_source,
)
from conformance.sides import InsertOut, Side, TokenRow

__all__ = ["Divergence", "Harness", "OracleError", "normalise_ranges", "run_program"]


class Divergence(AssertionError):
    """The two caches disagree on an observable. Subclassed per observable (see
    `divergence_type`) so that Hypothesis keeps distinct observables as distinct bugs
    and shrinks each on its own."""

    observable = "?"


class OracleError(AssertionError):
    """0.5.23 raised or broke its own invariants on a program the generator made: the
    program is outside what the suite may ask, or the oracle is set up wrongly."""


_DIVERGENCE_TYPES: dict[str, type[Divergence]] = {}


def divergence_type(observable: str) -> type[Divergence]:
    cls = _DIVERGENCE_TYPES.get(observable)
    if cls is None:
        name = "Divergence_" + "".join(ch if ch.isalnum() else "_" for ch in observable)
        cls = type(name, (Divergence,), {"observable": observable})
        _DIVERGENCE_TYPES[observable] = cls
    return cls


def normalise_ranges(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged (overlapping or touching) ``[start, end)`` ranges."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[0] < r[1]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return tuple(out)


def _adopted(out: InsertOut) -> dict[str, tuple[tuple[int, int], ...]]:
    # ADOPTED_RANGES_ORDER: both sides' ranges normalised (the project's already are).
    return {
        pool.value: normalise_ranges(ranges)
        for pool, ranges in sorted(out.adopted.items(), key=lambda kv: kv[0].value)
        if normalise_ranges(ranges)
    }


class Harness:
    """One program on one pair of caches; see the module docstring."""

    def __init__(self, config: Config, sglang: Side, project: Side) -> None:
        self.config = config
        self.s = sglang
        self.p = project
        self.P = config.page_size
        self.swa = config.swa_window is not None
        self.full_map: dict[int, int] = {}
        self.swa_map: dict[int, int] = {}
        self.locks: list[tuple[Any, Any]] = []
        self.program: Program = ()
        self.index = 0
        self.stopped_by: str | None = None
        self.trace: list[str] = []

    # -- reporting ---------------------------------------------------------------------
    def _fail(self, observable: str, sglang_value: object, project_value: object) -> None:
        op = self.program[self.index]
        msg = (
            f"conformance mismatch [{observable}] in config {self.config.name} at op "
            f"#{self.index} {op!r}\n"
            f"  sglang 0.5.23: {sglang_value!r}\n"
            f"  project:       {project_value!r}\n"
            f"trace (0.5.23 results):\n" + "\n".join(f"  {t}" for t in self.trace) + "\n"
            "program:\n" + program_source(self.config, self.program)
        )
        raise divergence_type(observable)(msg)

    def _oracle(self, what: str) -> None:
        op = self.program[self.index]
        msg = (
            f"the oracle failed in config {self.config.name} at op #{self.index} {op!r}: "
            f"{what}\nprogram:\n" + program_source(self.config, self.program)
        )
        raise OracleError(msg)

    def _expect(self, observable: str, sglang_value: object, project_value: object) -> None:
        if sglang_value != project_value:
            self._fail(observable, sglang_value, project_value)

    # -- slot maps ---------------------------------------------------------------------
    def _map_full(self, slot: int | None) -> int | str | None:
        if slot is None:
            return None
        return self.full_map.get(slot, f"sglang#{slot}")

    def _map_swa(self, slot: int | None) -> int | str | None:
        if slot is None:
            return None
        return self.swa_map.get(slot, f"sglang#{slot}")

    def _record(self, mapping: dict[int, int], s: torch.Tensor, p: torch.Tensor) -> None:
        mapping.update(zip(s.tolist(), p.tolist(), strict=True))

    # -- the run -----------------------------------------------------------------------
    def run(self, program: Program) -> None:
        """Run `program`; raises `Divergence` / `OracleError` at the first problem."""
        self.program = program
        self.s.start()
        self.p.start()
        for self.index, op in enumerate(program):
            self._apply(op)
            if self.stopped_by is not None:
                return
            self._compare_state()

    def _apply(self, op: Op) -> None:
        if isinstance(op, Insert):
            self._insert(op)
        elif isinstance(op, Match):
            self._match(op)
        elif isinstance(op, Lock):
            self._lock(op)
        elif isinstance(op, Unlock):
            if self.locks:
                rs, rp = self.locks.pop(op.which % len(self.locks))
                self.s.unlock(rs)
                self._project(self.p.unlock, rp)
            self.trace.append(f"#{self.index} {op!r}")
        elif isinstance(op, Evict):
            got_s = self.s.evict(op.full, op.swa if self.swa else 0)
            got_p = self._project(self.p.evict, op.full, op.swa if self.swa else 0)
            self.trace.append(f"#{self.index} {op!r} -> freed {got_s}")
            self._expect("evict.freed", got_s, got_p)
        elif isinstance(op, SetAccept):
            self.s.set_accept(op.accept)
            self.p.set_accept(op.accept)
            self.trace.append(f"#{self.index} {op!r}")
        elif isinstance(op, Complete):
            self.s.complete(op.verdicts)
            self._project(self.p.complete, op.verdicts)
            self.trace.append(f"#{self.index} {op!r}")
        else:  # pragma: no cover - the generator makes only the kinds above
            raise TypeError(op)

    def _project(self, fn: Any, *args: Any) -> Any:
        """Call the project; an exception where 0.5.23 returned is a divergence."""
        try:
            return fn(*args)
        except Exception as exc:
            self._fail("project.raised", "returned", f"{type(exc).__name__}: {exc}")

    def _matched(self, tokens: list[int], what: str) -> tuple[Any, Any]:
        ms = self.s.match(tokens)
        mp = self._project(self.p.match, tokens)
        self._expect(f"{what}.prefix_len", ms.prefix_len, mp.prefix_len)
        self._expect(f"{what}.slots", tuple(self._map_full(s) for s in ms.indices), mp.indices)
        return ms, mp

    def _match(self, op: Match) -> None:
        ms, _ = self._matched(key_tokens(op.pages, self.P, op.extra), "match")
        self.trace.append(f"#{self.index} {op!r} -> {ms.prefix_len}")

    def _lock(self, op: Lock) -> None:
        ms, mp = self._matched(key_tokens(op.pages, self.P), "lock.match")
        self.trace.append(f"#{self.index} {op!r} -> locks {ms.prefix_len}")
        if ms.prefix_len == 0:
            return
        rs = self.s.lock(ms.handle)
        rp = self._project(self.p.lock, mp.handle)
        self.locks.append((rs, rp))

    def _insert(self, op: Insert) -> None:
        P = self.P
        tokens = key_tokens(op.pages, P)
        tree_s: tuple[int, ...] = ()
        tree_p: tuple[int, ...] = ()
        prev = 0
        pinned = None
        if op.match_first:
            ms, mp = self._matched(tokens, "insert.match")
            prev = min(op.prev_pages * P, ms.prefix_len)
            tree_s, tree_p = ms.indices[:prev], mp.indices[:prev]
            if prev:  # a scheduler pins the prefix it reuses while it allocates and inserts
                pinned = (self.s.lock(ms.handle), self._project(self.p.lock, mp.handle))
        try:
            self._insert_after_match(op, tokens, prev, tree_s, tree_p)
        finally:
            if pinned is not None:
                self.s.unlock(pinned[0])
                self._project(self.p.unlock, pinned[1])

    def _insert_after_match(
        self,
        op: Insert,
        tokens: list[int],
        prev: int,
        tree_s: tuple[int, ...],
        tree_p: tuple[int, ...],
    ) -> None:
        P, swa = self.P, self.swa
        n = len(tokens)
        swa_evicted = min(op.swa_evicted_pages * P, n) if swa else 0
        need = n - prev
        short_full = need - self.s.available(Pool.FULL)  # equal on both sides here
        short_swa = need - self.s.available(Pool.SWA) if swa else 0
        if short_full > 0 or short_swa > 0:  # make room first, as a scheduler does
            amounts = (max(short_full, 0), max(short_swa, 0))
            got_s = self.s.evict(*amounts)
            got_p = self._project(self.p.evict, *amounts)
            self.trace.append(f"#{self.index} (making room) Evict{amounts} -> freed {got_s}")
            self._expect("insert.make_room.freed", got_s, got_p)
            self._expect(
                "insert.make_room.pool.full.free",
                self.s.available(Pool.FULL),
                self.p.available(Pool.FULL),
            )
            if swa:
                self._expect(
                    "insert.make_room.pool.swa.free",
                    self.s.available(Pool.SWA),
                    self.p.available(Pool.SWA),
                )
            if self.s.available(Pool.FULL) < need or (swa and self.s.available(Pool.SWA) < need):
                self.trace.append(f"#{self.index} {op!r} -> skipped: pools short")
                return
        got_s, got_p = self.s.alloc(need), self.p.alloc(need)
        if got_s is None or got_p is None:
            self._oracle(f"allocating {need} slots failed with the pools not short")
        assert got_s is not None and got_p is not None
        (fs, ss), (fp, sp) = got_s, got_p
        self._record(self.full_map, fs, fp)
        if swa:
            assert ss is not None and sp is not None
            self._record(self.swa_map, ss, sp)
            released = max(0, swa_evicted - prev)  # the request's own SWA below its bound
            self.s.release_swa(fs[:released])
            self.p.release_swa(fp[:released])
        value_s = torch.cat([torch.tensor(tree_s, dtype=torch.int64), fs])
        value_p = torch.cat([torch.tensor(tree_p, dtype=torch.int64), fp])
        try:
            out_s = self.s.insert(tokens, value_s, prev, swa_evicted)
        except Exception as exc:
            self._oracle(f"0.5.23's insert raised {type(exc).__name__}: {exc}")
        out_p = self._project(self.p.insert, tokens, value_p, prev, swa_evicted)
        adopted_s = _adopted(out_s)
        double = self._double_owned()
        if double:
            if not (prev > 0 and double <= set(tree_s)):
                self._oracle(f"0.5.23's tree holds slots on its free list: {sorted(double)}")
            # SWA_TOMBSTONE_READOPT: compare the caller-owned part only, then stop.
            adopted_s = {
                pool: clipped
                for pool, ranges in adopted_s.items()
                if (clipped := normalise_ranges(tuple((max(s, prev), e) for s, e in ranges)))
            }
            self.stopped_by = "SWA_TOMBSTONE_READOPT"
        self.trace.append(
            f"#{self.index} {op!r} -> prev {prev}, prefix_len {out_s.prefix_len}, "
            f"adopted {adopted_s}" + (f" [{self.stopped_by}]" if self.stopped_by else "")
        )
        self._expect("insert.prefix_len", out_s.prefix_len, out_p.prefix_len)
        self._expect("insert.adopted_ranges", adopted_s, _adopted(out_p))

    def _double_owned(self) -> set[int]:
        free_slots = getattr(self.s, "free_full_slots", None)
        if free_slots is None:
            return set()
        held = {row.full for row in self.s.rows() if row.full is not None}
        return held & free_slots()

    # -- state comparison --------------------------------------------------------------
    def _compare_state(self) -> None:
        self._expect("pool.full.free", self.s.available(Pool.FULL), self.p.available(Pool.FULL))
        if self.swa:
            self._expect("pool.swa.free", self.s.available(Pool.SWA), self.p.available(Pool.SWA))
        if self.config.offload:
            self._expect(
                "offload.pending_records", self.s.pending_records(), self.p.pending_records()
            )
        self._compare_rows(self.s.rows(), self.p.rows())
        finding = self.p.audit()
        if finding is not None:
            self._fail("project.audit", None, finding)

    def _compare_rows(self, rows_s: list[TokenRow], rows_p: list[TokenRow]) -> None:
        mapped = [
            (
                r.depth,
                r.token,
                self._map_full(r.full),
                self._map_swa(r.swa),
                r.lock,
                r.stored,
                r.pending,
            )
            for r in rows_s
        ]
        mine = [(r.depth, r.token, r.full, r.swa, r.lock, r.stored, r.pending) for r in rows_p]
        if mapped == mine:
            return
        path: list[int] = []
        P = self.P
        for k in range(max(len(mapped), len(mine))):
            a = mapped[k] if k < len(mapped) else None
            b = mine[k] if k < len(mine) else None
            if a is not None:
                path = [*path[: a[0]], a[1]]
            elif b is not None:
                path = [*path[: b[0]], b[1]]
            if a == b:
                continue
            where = f"token {len(path) - 1} of {describe_tokens(path, P)}"
            if a is None or b is None or a[:2] != b[:2]:
                self._fail("tree.keys", _leaf_keys(rows_s, P), _leaf_keys(rows_p, P))
            assert a is not None and b is not None
            for i, field in enumerate(("full_slot", "swa_slot", "lock", "stored", "pending"), 2):
                if a[i] != b[i]:
                    self._fail(f"tree.{field}", (where, a[i]), b[i])


def _leaf_keys(rows: list[TokenRow], page_size: int) -> list[str]:
    """The tree's root-to-leaf keys (what a structure mismatch prints)."""
    keys: list[str] = []
    path: list[int] = []
    for k, row in enumerate(rows):
        path = [*path[: row.depth], row.token]
        if k + 1 == len(rows) or rows[k + 1].depth <= row.depth:
            keys.append(describe_tokens(path, page_size))
    return keys


def run_program(config: Config, program: Program, sglang: Side, project: Side) -> Harness:
    """Run `program` on both sides; returns the harness (its `stopped_by`, `trace`)."""
    harness = Harness(config, sglang, project)
    harness.run(program)
    return harness


def minimise(
    config: Config, program: Program, sglang: Side, project: Side, observable: str
) -> Program:
    """Delete operations one at a time while the program still diverges on
    `observable` (Hypothesis's shrinker sometimes leaves redundant operations behind)."""
    current = program
    changed = True
    while changed:
        changed = False
        for i in range(len(current)):
            candidate = current[:i] + current[i + 1 :]
            if not candidate:
                continue
            try:
                run_program(config, candidate, sglang, project)
            except Divergence as exc:
                if exc.observable == observable:
                    current, changed = candidate, True
                    break
            except OracleError:
                continue
    return current


def with_minimised(
    exc: Divergence, config: Config, program: Program, sglang: Side, project: Side
) -> Divergence:
    """`exc` with the program further minimised by `minimise` appended (same type)."""
    smaller = minimise(config, program, sglang, project, exc.observable)
    if len(smaller) == len(program):
        return exc
    try:
        run_program(config, smaller, sglang, project)
    except Divergence as again:
        note = "\n\nfurther minimised by deleting operations:\n" + str(again)
        return type(exc)(str(exc) + note)
    return exc
