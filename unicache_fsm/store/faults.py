"""Fault injection for any `ExternalStore`: a wrapper that makes the store misbehave on
purpose, reproducibly, in every way the linker must survive.

- `FaultKind` — what can go wrong (the value is the name used in policy strings):
  - FAIL_LOOKUP (``fail_lookup``): `lookup` raises `StoreFaultError`.
  - REFUSE_LOAD (``refuse_load``): `load` returns False; the inner store never sees it.
  - FAIL_BATCH_BEFORE_START (``fail_batch_before_start``): `start_loading` cancels the
    batch's loads in the inner store; the batch completes failed and no byte is written
    (if the inner store cannot cancel, the batch runs and is reported failed).
  - FAIL_BATCH_MIDWAY (``fail_batch_midway``): the batch runs in the inner store (its
    pages land in the reserved slots) and is reported failed, like a short read.
  - REFUSE_OFFLOAD (``refuse_offload``): `offload` returns False; nothing is queued.
  - FAIL_OFFLOAD (``fail_offload``): the offload runs in the inner store but completes
    False (the pages may be stored; the caller is told they are not).
  - EVICT_AFTER_LOOKUP (``evict_after_lookup``): right after a `lookup` that found a
    restorable prefix, the page at its largest boundary is evicted from the inner store
    (every pool), so a `load` of that prefix is refused: the LOOKUP -> LOAD race.
  - DELAY_COMPLETION (``delay_completion``): a completion is held back for
    `FaultPolicy.delay_steps` `progress()` calls (FIFO order is kept: later completions
    wait behind it).
  - RAISE_ERROR (``raise_error``): a call the linker makes (`lookup`, `load`,
    `start_loading`, `num_completed_*`, `pop_completed_*`, `cancel_queued_load`,
    `offload`) raises an exception of an arbitrary type (`ConnectionError`,
    `TimeoutError`, `KeyError`, `ValueError`, `StoreFaultError`, ...). As the protocol
    allows: a call that queues or starts work raises before reaching the inner store
    (nothing changed); a pop raises after taking the completion (it is consumed, the
    answer lost); `lookup` after the inner lookup; `cancel_queued_load` either way.
  - GARBAGE_ANSWER (``garbage_answer``): the same calls answer a value the protocol does
    not allow — None, a string (``"false"`` as a verdict, ``"1"``), a number out of
    range, a boundary outside ``1..n``, a completion naming an unknown batch — with the
    same rules for what reached the inner store.
  The lying store (`LYING`): a store that says one thing and does another. Each lie is
  told about work the inner store really has, so a caller that believes it frees slots
  the store still writes into (a load) or reads from (an offload):
  - OVERCOUNT_COMPLETIONS (``overcount_completions``): `num_completed_loads` /
    `num_completed_offloads` answer one more than the completions ready, while a started
    batch (an accepted offload) of this wrapper is still running; the pop the store
    cannot back raises `NoCompletionError`, and the job runs on.
  - UNDERCOUNT_COMPLETIONS (``undercount_completions``): the same counts answer one
    fewer than ready (at least one ready); the hidden completion stays poppable.
  - MALFORMED_COMPLETION (``malformed_completion``): a pop consumes its completion and
    answers it malformed: a load result whose `rids` is None, a str, or names a rid
    the batch does not hold, whose batch id is a str or a batch never started, or a
    bare tuple; an offload flag that is not a bool (``1``, ``"True"``, ``[True]``).
  - LOST_REPLY (``lost_reply``): `load`, `start_loading` and `offload` do their work
    in the inner store (the load queued, the batch started, the offload queued), then
    the reply is lost: `TimeoutError`. The work completes later, as usual.
  - UNKNOWN_BATCH (``unknown_batch``): `start_loading` answers a fresh batch id it
    never started: the queued loads stay queued (a later call starts them under
    another id), and with nothing queued the id names an empty batch, not -1.
  - OVERREPORT_LAYERS (``overreport_layers``, not in `LYING`: only a layer-wise loader
    asks `loaded_layers`): `loaded_layers` of a batch still running
    in the inner store claims layers that have not landed: every layer of each pool,
    one layer more than the pool has, or a count that is not an int.
- `FaultRule(probability=0.0, every=0)` — when a kind fires: with `probability` per
  eligible call, or deterministically on every `every`-th eligible call.
- `FaultPolicy(rules, *, seed=0, delay_steps=2)` — one rule per kind, a
  `random.Random(seed)` shared by the probabilistic rules, and `injected`, a Counter of
  the faults actually injected per kind. Same rules, same seed, same calls: same faults.
  `FaultPolicy.parse("refuse_load=0.3,fail_batch_midway=every:4,seed=7,delay_steps=3")`
  builds one from a CLI-style string (`FaultPolicyError` naming the bad item);
  ``str(policy)`` gives the canonical string back; `fresh()` a copy with clean counters.
- `FaultyStore(inner, policy)` — an `ExternalStore` that forwards to `inner` and
  injects faults per `policy`. It numbers its own load batches (the inner store's ids
  are translated) and keeps its own completion FIFOs. Drive it from one thread.
  `pending()` describes that in-flight work without its numbering (for state-space
  exploration: two wrappers with equal `pending()` behave alike from here on).
"""

from __future__ import annotations

import collections
import enum
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from unicache_fsm.pools.device import PageDevice
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.errors import (
    FaultPolicyError,
    NoCompletionError,
    StoreBatchUnknownError,
    StoreClosedError,
    StoreFaultError,
)
from unicache_fsm.store.protocol import ExternalStore, LoadBatchResult

__all__ = [
    "ERROR_TYPES",
    "LYING",
    "MISBEHAVIOUR",
    "FaultKind",
    "FaultPolicy",
    "FaultRule",
    "FaultyStore",
]


class FaultKind(str, enum.Enum):
    FAIL_LOOKUP = "fail_lookup"
    REFUSE_LOAD = "refuse_load"
    FAIL_BATCH_BEFORE_START = "fail_batch_before_start"
    FAIL_BATCH_MIDWAY = "fail_batch_midway"
    REFUSE_OFFLOAD = "refuse_offload"
    FAIL_OFFLOAD = "fail_offload"
    EVICT_AFTER_LOOKUP = "evict_after_lookup"
    DELAY_COMPLETION = "delay_completion"
    RAISE_ERROR = "raise_error"
    GARBAGE_ANSWER = "garbage_answer"
    OVERCOUNT_COMPLETIONS = "overcount_completions"
    UNDERCOUNT_COMPLETIONS = "undercount_completions"
    MALFORMED_COMPLETION = "malformed_completion"
    LOST_REPLY = "lost_reply"
    UNKNOWN_BATCH = "unknown_batch"
    OVERREPORT_LAYERS = "overreport_layers"


#: The lying store: answers that misstate the work the store really has in hand.
LYING = frozenset(
    {
        FaultKind.OVERCOUNT_COMPLETIONS,
        FaultKind.UNDERCOUNT_COMPLETIONS,
        FaultKind.MALFORMED_COMPLETION,
        FaultKind.LOST_REPLY,
        FaultKind.UNKNOWN_BATCH,
    }
)

#: The kinds a conforming store never shows (the protocol's checks in `testing`'s
#: `StoreMachine` flag them); a caller must survive them all the same.
MISBEHAVIOUR = frozenset(
    {FaultKind.RAISE_ERROR, FaultKind.GARBAGE_ANSWER, FaultKind.OVERREPORT_LAYERS, *LYING}
)

#: What RAISE_ERROR raises: the failures a real backend's client library throws.
ERROR_TYPES: tuple[type[Exception], ...] = (
    ConnectionError,
    TimeoutError,
    OSError,
    RuntimeError,
    ValueError,
    KeyError,
    TypeError,
    AttributeError,
    StoreFaultError,
)


def _check_rule(rule: FaultRule) -> None:
    p, every = rule.probability, rule.every
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        msg = f"fault probability must be a number in [0, 1], got {p!r}"
        raise FaultPolicyError(msg, item=repr(p))
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        msg = f"fault period `every` must be an int >= 0 (0: not periodic), got {every!r}"
        raise FaultPolicyError(msg, item=repr(every))
    if p and every:
        msg = f"a fault rule is a probability or a period, not both (got {p} and every {every})"
        raise FaultPolicyError(msg, item=f"{p}/every:{every}")


@attrs.frozen(repr=False)
class FaultRule:
    """When one fault kind fires: with `probability`, or on every `every`-th call."""

    probability: float = 0.0
    every: int = 0

    def __attrs_post_init__(self) -> None:
        _check_rule(self)

    @property
    def active(self) -> bool:
        return bool(self.probability or self.every)

    def __str__(self) -> str:
        return f"every:{self.every}" if self.every else repr(float(self.probability))

    def __repr__(self) -> str:
        if self.every:
            return f"FaultRule(every={self.every})"
        return f"FaultRule(probability={float(self.probability)!r})"


def _int_item(item: str, name: str, value: str, low: int) -> int:
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if number < low:
        msg = f"fault policy item {item!r}: {name} must be an int >= {low}"
        raise FaultPolicyError(msg, item=item)
    return number


class FaultPolicy:
    """Which faults to inject and when; see the module docstring."""

    __slots__ = ("_calls", "_rng", "delay_steps", "injected", "rules", "seed")

    def __init__(
        self,
        rules: Mapping[FaultKind, FaultRule] | None = None,
        *,
        seed: int = 0,
        delay_steps: int = 2,
    ) -> None:
        pairs: Iterable[tuple[object, object]] = (rules or {}).items()
        checked: dict[FaultKind, FaultRule] = {}
        for kind, rule in pairs:
            if not isinstance(kind, FaultKind) or not isinstance(rule, FaultRule):
                msg = f"fault rules map FaultKind to FaultRule, got {kind!r}: {rule!r}"
                raise FaultPolicyError(msg, item=repr(kind))
            if rule.active:
                checked[kind] = rule
        if isinstance(seed, bool) or not isinstance(seed, int):
            msg = f"fault policy seed must be an int, got {seed!r}"
            raise FaultPolicyError(msg, item=repr(seed))
        if isinstance(delay_steps, bool) or not isinstance(delay_steps, int) or delay_steps < 1:
            msg = f"delay_steps must be an int >= 1 (progress() calls), got {delay_steps!r}"
            raise FaultPolicyError(msg, item=repr(delay_steps))
        self.rules = checked
        self.seed = seed
        self.delay_steps = delay_steps
        self.injected: collections.Counter[FaultKind] = collections.Counter()
        self._calls: collections.Counter[FaultKind] = collections.Counter()
        self._rng = random.Random(seed)

    def __deepcopy__(self, memo: dict[int, Any]) -> FaultPolicy:
        """An independent copy that draws the same faults from here on (the generator's
        state is copied whole, in one call, instead of its 625 words one by one)."""
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        new.rules = dict(self.rules)  # FaultKind -> FaultRule, both immutable
        new.seed = self.seed
        new.delay_steps = self.delay_steps
        new.injected = collections.Counter(self.injected)
        new._calls = collections.Counter(self._calls)
        new._rng = random.Random()
        new._rng.setstate(self._rng.getstate())
        return new

    @classmethod
    def parse(cls, text: str) -> FaultPolicy:
        """A policy from ``"kind=P|every:K, ..., seed=N, delay_steps=K"`` (or "" / "none")."""
        given: object = text
        if not isinstance(given, str):
            msg = f"a fault policy string is a str, got {type(given).__name__}"
            raise FaultPolicyError(msg, item=repr(given))
        rules: dict[FaultKind, FaultRule] = {}
        seed = 0
        delay_steps = 2
        seen: set[str] = set()
        body = text.strip()
        items = [] if body in ("", "none") else body.split(",")
        kinds = {k.value: k for k in FaultKind}
        for raw in items:
            item = raw.strip()
            name, sep, value = (part.strip() for part in item.partition("="))
            if not sep or not name or not value:
                msg = f"fault policy item {item!r} is not name=value (e.g. refuse_load=0.3)"
                raise FaultPolicyError(msg, item=item)
            if name in seen:
                msg = f"fault policy item {item!r} names {name!r} a second time; give it once"
                raise FaultPolicyError(msg, item=item)
            seen.add(name)
            if name == "seed":
                seed = _int_item(item, "seed", value, -(2**63))
            elif name == "delay_steps":
                delay_steps = _int_item(item, "delay_steps", value, 1)
            elif name in kinds:
                rules[kinds[name]] = cls._parse_rule(item, value)
            else:
                valid = ", ".join([*kinds, "seed", "delay_steps"])
                msg = f"fault policy item {item!r}: unknown name {name!r}; valid names: {valid}"
                raise FaultPolicyError(msg, item=item)
        return cls(rules, seed=seed, delay_steps=delay_steps)

    @staticmethod
    def _parse_rule(item: str, value: str) -> FaultRule:
        if value.startswith("every:"):
            return FaultRule(every=_int_item(item, "every", value[len("every:") :], 1))
        try:
            p = float(value)
        except ValueError:
            p = -1.0
        if not 0.0 <= p <= 1.0:
            msg = (
                f"fault policy item {item!r}: the value must be a probability in [0, 1] "
                "or every:K (K >= 1)"
            )
            raise FaultPolicyError(msg, item=item)
        return FaultRule(probability=p)

    def __str__(self) -> str:
        parts = [f"{k.value}={self.rules[k]}" for k in FaultKind if k in self.rules]
        return ",".join([*parts, f"seed={self.seed}", f"delay_steps={self.delay_steps}"])

    def __repr__(self) -> str:
        return f"FaultPolicy.parse({str(self)!r})"

    def fresh(self) -> FaultPolicy:
        """The same rules and seed with clean counters and a rewound random stream."""
        return FaultPolicy(self.rules, seed=self.seed, delay_steps=self.delay_steps)

    def pick(self, options: Sequence[object]) -> object:
        """One of `options`, drawn from the policy's random stream (reproducible)."""
        return options[self._rng.randrange(len(options))]

    def calls(self, kind: FaultKind) -> int:
        """How many eligible calls `roll` saw for `kind` (counted only while a rule for
        `kind` is present, whether or not it fired)."""
        return self._calls[kind]

    def roll(self, kind: FaultKind) -> bool:
        """Whether to inject `kind` on this eligible call (counted in `injected` if so)."""
        rule = self.rules.get(kind)
        if rule is None:
            return False
        self._calls[kind] += 1
        if rule.every:
            hit = self._calls[kind] % rule.every == 0
        else:
            hit = self._rng.random() < rule.probability
        if hit:
            self.injected[kind] += 1
        return hit


@attrs.define(slots=True)
class _LoadEntry:
    batch: int
    inner_batch: int | None  # None: the batch never reached the inner store
    rids: tuple[str, ...]
    force_fail: bool
    success: bool | None = None
    release_at: int = 0
    cancelled: bool = False  # some of its loads were cancelled in the inner store


@attrs.define(slots=True)
class _OffloadEntry:
    force_fail: bool
    success: bool | None = None
    release_at: int = 0


class FaultyStore:
    """An `ExternalStore` that injects the faults of `policy` into `inner`."""

    def __init__(self, inner: ExternalStore, policy: FaultPolicy) -> None:
        self.inner = inner
        self.policy = policy
        self._queued: list[str] = []
        self._loads: collections.deque[_LoadEntry] = collections.deque()
        self._offloads: collections.deque[_OffloadEntry] = collections.deque()
        self._tick = 0
        self._next_batch = 0
        self._closed = False
        self._num_layers: dict[PoolName, int] = {}  # of the attached pools
        # popped batches, for `loaded_layers` after the pop (the last 256)
        self._popped: collections.OrderedDict[int, _LoadEntry] = collections.OrderedDict()

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r}, {self.policy!r})"

    # -- forwarded with faults -----------------------------------------------------------

    def attach(self, pools: Mapping[PoolName, PageDevice]) -> None:
        self._check_open("attach")
        self.inner.attach(pools)
        self._num_layers = {name: pool.num_layers for name, pool in pools.items()}

    def lookup(self, rid: str, transfers: Sequence[PoolTransfer]) -> list[int]:
        self._check_open("lookup")
        if self.policy.roll(FaultKind.FAIL_LOOKUP):
            msg = f"lookup for {rid!r} failed (injected fault {FaultKind.FAIL_LOOKUP.value})"
            raise StoreFaultError(msg, operation="lookup")
        mischief = self._mischief()
        found = self.inner.lookup(rid, transfers)
        if found and self.policy.roll(FaultKind.EVICT_AFTER_LOOKUP):
            kv = next(t for t in transfers if t.name is PoolName.KV)
            self.inner.evict([kv.keys[found[-1] - 1]])
        if mischief is not None:
            n = len(next((t.keys for t in transfers if t.name is PoolName.KV), ()))
            junk: list[object] = [None, "1", [str(b) for b in found], [0], [*found, n + 1], True]
            return self._misbehave("lookup", mischief, junk)  # type: ignore[no-any-return]
        return found

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        self._check_open("load")
        if self.policy.roll(FaultKind.REFUSE_LOAD):
            return False
        mischief = self._mischief()
        if mischief is not None:  # before the inner store: nothing was queued
            return self._misbehave("load", mischief, [None, "true", 1, "false"])  # type: ignore[no-any-return]
        accepted = self.inner.load(rid, transfers)
        if accepted:
            self._queued.append(rid)
            self._lose_reply("load")
        return accepted

    def start_loading(self) -> int:
        self._check_open("start_loading")
        mischief = self._mischief()
        if mischief is not None:  # before the inner store: nothing started
            return self._misbehave("start_loading", mischief, [None, "0", 0.5, -7])  # type: ignore[no-any-return]
        if self.policy.roll(FaultKind.UNKNOWN_BATCH):  # nothing starts; the loads stay queued
            self._next_batch += 1
            return self._next_batch - 1
        if not self._queued:
            return -1
        rids = tuple(self._queued)
        self._queued.clear()
        batch = self._next_batch
        self._next_batch += 1
        if self.policy.roll(FaultKind.FAIL_BATCH_BEFORE_START):
            left = [rid for rid in rids if not self.inner.cancel_queued_load(rid)]
            inner = self.inner.start_loading() if left else -1
            entry = _LoadEntry(batch, inner if inner >= 0 else None, rids, force_fail=True)
            entry.cancelled = len(left) < len(rids)
        else:
            inner = self.inner.start_loading()
            force = self.policy.roll(FaultKind.FAIL_BATCH_MIDWAY)
            entry = _LoadEntry(batch, inner if inner >= 0 else None, rids, force_fail=force)
        self._loads.append(entry)
        if entry.inner_batch is None:
            self._settle(entry, False)
        self._lose_reply("start_loading")
        return batch

    def num_completed_loads(self) -> int:
        self._check_open("num_completed_loads")
        mischief = self._mischief()
        if mischief is not None:
            return self._misbehave("num_completed_loads", mischief, [None, -1, "1", 1.5])  # type: ignore[no-any-return]
        return self._miscount(self._count_loads(), len(self._loads))

    def pop_completed_load(self) -> LoadBatchResult:
        self._check_open("pop_completed_load")
        if not self._count_loads():
            msg = "pop_completed_load: no load batch has completed; check num_completed_loads()"
            raise NoCompletionError(msg, what="load")
        mischief = self._mischief()
        entry = self._loads.popleft()  # consumed, whatever the answer says
        assert entry.success is not None
        self._popped[entry.batch] = entry
        while len(self._popped) > 256:
            self._popped.popitem(last=False)
        result = LoadBatchResult(entry.batch, entry.rids, entry.success)
        if mischief is not None:
            verdict = "true" if entry.success else "false"
            junk: list[object] = [
                None,
                0,
                LoadBatchResult(entry.batch, entry.rids, verdict),  # type: ignore[arg-type]
                LoadBatchResult(entry.batch + 10_000, entry.rids, entry.success),
            ]
            return self._misbehave("pop_completed_load", mischief, junk)  # type: ignore[no-any-return]
        if self.policy.roll(FaultKind.MALFORMED_COMPLETION):
            self._next_batch += 1  # an id no batch of this store will ever have
            malformed: list[object] = [
                LoadBatchResult(entry.batch, None, entry.success),  # type: ignore[arg-type]
                LoadBatchResult(entry.batch, ",".join(entry.rids), entry.success),  # type: ignore[arg-type]
                LoadBatchResult(entry.batch, (*entry.rids, "unknown-rid"), entry.success),
                LoadBatchResult(str(entry.batch), entry.rids, entry.success),  # type: ignore[arg-type]
                LoadBatchResult(self._next_batch - 1, entry.rids, entry.success),
                (entry.batch, entry.rids, entry.success),
            ]
            return self.policy.pick(malformed)  # type: ignore[return-value]
        return result

    def loaded_layers(self, batch: int) -> dict[PoolName, int]:
        """The inner store's progress of this wrapper's `batch` (a batch that never
        reached the inner store: no pool), or an OVERREPORT_LAYERS lie while it runs."""
        self._check_open("loaded_layers")
        entry = next((e for e in self._loads if e.batch == batch), None) or self._popped.get(batch)
        if entry is None:
            msg = f"loaded_layers: batch {batch!r} was never started by this store"
            raise StoreBatchUnknownError(msg, batch=batch)
        if entry.inner_batch is None or entry.cancelled:
            return {}  # nothing, or not every load of the batch, reached the inner store
        counts = self.inner.loaded_layers(entry.inner_batch)
        full = {pool: self._num_layers.get(pool, n) for pool, n in counts.items()}
        if counts != full and self.policy.roll(FaultKind.OVERREPORT_LAYERS):
            lies: list[object] = [
                full,
                {pool: n + 1 for pool, n in full.items()},
                {pool: str(n) for pool, n in counts.items()},
            ]
            return self.policy.pick(lies)  # type: ignore[return-value]
        return counts

    def cancel_queued_load(self, rid: str) -> bool:
        self._check_open("cancel_queued_load")
        mischief = self._mischief()
        reached = mischief is None or bool(self.policy.pick([True, False]))
        cancelled = self.inner.cancel_queued_load(rid) if reached else False
        if cancelled and rid in self._queued:
            self._queued.remove(rid)
        if mischief is not None:  # the answer is lost (the cancel may have happened)
            return self._misbehave("cancel_queued_load", mischief, [None, "yes", 1])  # type: ignore[no-any-return]
        return cancelled

    def offload(self, transfers: Sequence[PoolTransfer]) -> bool:
        self._check_open("offload")
        if self.policy.roll(FaultKind.REFUSE_OFFLOAD):
            return False
        mischief = self._mischief()
        if mischief is not None:  # before the inner store: nothing was queued
            return self._misbehave("offload", mischief, [None, "ok", 1])  # type: ignore[no-any-return]
        accepted = self.inner.offload(transfers)
        if accepted:
            self._offloads.append(_OffloadEntry(self.policy.roll(FaultKind.FAIL_OFFLOAD)))
            self._lose_reply("offload")
        return accepted

    def num_completed_offloads(self) -> int:
        self._check_open("num_completed_offloads")
        mischief = self._mischief()
        if mischief is not None:
            return self._misbehave("num_completed_offloads", mischief, [None, -1, "2"])  # type: ignore[no-any-return]
        return self._miscount(self._count_offloads(), len(self._offloads))

    def pop_completed_offload(self) -> bool:
        self._check_open("pop_completed_offload")
        if not self._count_offloads():
            msg = "pop_completed_offload: no offload has completed; check num_completed_offloads()"
            raise NoCompletionError(msg, what="offload")
        mischief = self._mischief()
        entry = self._offloads.popleft()  # consumed, whatever the answer says
        assert entry.success is not None
        if mischief is not None:
            junk: list[object] = [None, "false", "true", 1, 0]
            return self._misbehave("pop_completed_offload", mischief, junk)  # type: ignore[no-any-return]
        if self.policy.roll(FaultKind.MALFORMED_COMPLETION):
            flags: list[object] = [int(entry.success), str(entry.success), [entry.success]]
            return self.policy.pick(flags)  # type: ignore[return-value]
        return entry.success

    def progress(self) -> int:
        self._check_open("progress")
        self._tick += 1
        done = self.inner.progress()
        self._pull()
        return done

    def evict(self, keys: Sequence[str], pool: PoolName | None = None) -> int:
        self._check_open("evict")
        return self.inner.evict(keys, pool)

    def contains(self, pool: PoolName, key: str) -> bool:
        self._check_open("contains")
        return self.inner.contains(pool, key)

    def reset(self) -> None:
        self._check_open("reset")
        self.inner.reset()
        self._pull()
        self._queued.clear()
        entries: list[_LoadEntry | _OffloadEntry] = [*self._loads, *self._offloads]
        for entry in entries:
            if entry.success is None:  # the inner store lost it: report it failed
                entry.success = False
            entry.release_at = min(entry.release_at, self._tick)

    def close(self) -> None:
        if self._closed:
            return
        self.reset()
        self.inner.close()
        self._closed = True

    def pending(self) -> tuple[object, ...]:
        """The wrapper's in-flight work, free of batch numbers and the clock: the rids
        queued for the next batch, then per started batch (rids, forced failure, verdict
        or None, progress() calls until it is released), then per offload (forced
        failure, verdict or None, calls until released). Reads only; changes nothing."""
        loads = tuple(
            (e.rids, e.force_fail, e.success, max(0, e.release_at - self._tick))
            for e in self._loads
        )
        offloads = tuple(
            (e.force_fail, e.success, max(0, e.release_at - self._tick)) for e in self._offloads
        )
        return (tuple(self._queued), loads, offloads)

    # -- internals -----------------------------------------------------------------------

    def _count_loads(self) -> int:
        self._pull()
        return self._ready(self._loads)

    def _count_offloads(self) -> int:
        self._pull()
        return self._ready(self._offloads)

    def _miscount(self, ready: int, jobs: int) -> int:
        """The completion count to answer: `ready`, or a lie about it (see LYING): one
        more while a job of the `jobs` in flight is still running, one fewer."""
        if jobs > ready and self.policy.roll(FaultKind.OVERCOUNT_COMPLETIONS):
            return ready + 1
        if ready and self.policy.roll(FaultKind.UNDERCOUNT_COMPLETIONS):
            return ready - 1
        return ready

    def _lose_reply(self, operation: str) -> None:
        """After `operation` did its work in the inner store: lose its reply (LOST_REPLY)."""
        if self.policy.roll(FaultKind.LOST_REPLY):
            msg = f"{operation}: the reply was lost (injected fault {FaultKind.LOST_REPLY.value})"
            raise TimeoutError(msg)

    def _mischief(self) -> FaultKind | None:
        """RAISE_ERROR or GARBAGE_ANSWER when one fires for this call (rolled in order)."""
        if self.policy.roll(FaultKind.RAISE_ERROR):
            return FaultKind.RAISE_ERROR
        if self.policy.roll(FaultKind.GARBAGE_ANSWER):
            return FaultKind.GARBAGE_ANSWER
        return None

    def _misbehave(self, operation: str, mischief: FaultKind, junk: Sequence[object]) -> Any:
        """Raise an arbitrary exception (RAISE_ERROR) or return one of `junk` (an answer
        of the wrong type on purpose, hence `Any`)."""
        if mischief is FaultKind.GARBAGE_ANSWER:
            return self.policy.pick(junk)
        kind = self.policy.pick(ERROR_TYPES)
        msg = f"{operation}: injected fault {FaultKind.RAISE_ERROR.value}"
        if kind is StoreFaultError:
            raise StoreFaultError(msg, operation=operation)
        assert isinstance(kind, type) and issubclass(kind, Exception)
        raise kind(msg)

    def _check_open(self, operation: str) -> None:
        if self._closed:
            msg = f"{operation}: the store is closed; create a new store"
            raise StoreClosedError(msg, operation=operation)

    def _settle(self, entry: _LoadEntry | _OffloadEntry, success: bool) -> None:
        entry.success = success and not entry.force_fail
        delay = self.policy.delay_steps if self.policy.roll(FaultKind.DELAY_COMPLETION) else 0
        entry.release_at = self._tick + delay

    def _ready(self, entries: Iterable[_LoadEntry | _OffloadEntry]) -> int:
        count = 0
        for entry in entries:
            if entry.success is None or entry.release_at > self._tick:
                break
            count += 1
        return count

    def _pull(self) -> None:
        """Take the inner store's completions into this wrapper's FIFOs."""
        inner = self.inner
        while inner.num_completed_loads():
            result = inner.pop_completed_load()
            entry = next(
                (e for e in self._loads if e.success is None and e.inner_batch == result.batch),
                None,
            )
            if entry is None:  # loads the inner store failed on its own (its reset)
                entry = _LoadEntry(self._next_batch, result.batch, result.rids, False)
                self._next_batch += 1
                self._loads.append(entry)
                self._queued = [r for r in self._queued if r not in result.rids]
            self._settle(entry, result.success)
        while inner.num_completed_offloads():
            success = inner.pop_completed_offload()
            pending = next((e for e in self._offloads if e.success is None), None)
            if pending is not None:
                self._settle(pending, success)
