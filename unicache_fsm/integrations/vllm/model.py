"""The project's executable model of vLLM 0.33.0's CPU offloading manager.

`ModelManager(num_chunks, policy="lru" | "arc")` is an `OffloadingManager` written from
what vLLM 0.33.0 documents and does (``vllm/v1/kv_offload/cpu/manager.py`` and
``cpu/policies/{lru,arc}.py``), as plain data: every block is a `Block` (ready or
not, and how many loads hold it), a policy object orders them. The differential suite
(tests/vllm/test_differential.py) runs the same programs against both and compares
every answer. Scope: keys without end-token positions, no store threshold (every
offered key is a store candidate), events off.

The manager's rules, in call order:

- `lookup(key)` — MISS when absent, HIT_PENDING while its store is in flight, else HIT.
- `prepare_load(keys)` — every key must be ready (else `AssertionError`, as vLLM); each
  gains one load hold, which makes it unevictable. The keys count as the request's
  reuse (below).
- `complete_load(keys)` — each loses one hold.
- `touch(keys)` — the policy's recency update (below).
- `prepare_store(keys)` — candidates are the absent keys, in offer order; the request
  notes the absent candidates and the ready present keys as accessed (first time
  only), the ready ones as reused. Then, when candidates exceed the free chunks: None
  when fewer idle blocks (ready, no hold) exist than are missing, else the policy
  evicts that many idle blocks not among the offered keys, or None when it cannot (then
  nothing was evicted). The candidates enter the policy, not ready, unevictable.
- `complete_store(keys, success)` — every named block still storing becomes ready and
  idle; with ``success=False`` it is removed instead (its chunk freed). Others are
  ignored.
- `on_request_finished` — once per request (and cache generation): the policy sees the
  request's accessed keys (each KV-cache group in first-access order, groups by index)
  with which were only inserted by it and which it reused.
- `reset_cache` — drops every block and the policy's state; requests start afresh.

LRU (`_Lru`): every block has a recency number from one counter; a new block gets
the next number at `prepare_store`; `touch(keys)` and a request's finish give every
present key a new number, walking the list from its last key to its first (so the
first key ends most recent). Eviction takes the idle unprotected blocks with the
smallest numbers, oldest first.

ARC (`_Arc`): T1 (seen once) and T2 (reused) in recency order, ghost lists B1 and B2,
a target size for T1 starting at 0. A store candidate found in a ghost list adapts the
target (B1: up by max(1, |B2|/|B1|), capped at the capacity; B2: down by max(1,
|B1|/|B2|), floored at 0) and becomes that ghost list's newest, once per request, at
`prepare_store`, walking candidates last to first. A new block enters T1 newest and
leaves the ghost lists. `touch`, last key first: a ready T1 block moves to T2's newest
end, a storing one to T1's newest end; a T2 block to T2's newest end; a ghost adapts
as above. A request's finish, last key first: a key it only inserted moves to the
newest end of its list; a key it reused moves from T1 to T2, or to T2's newest end.
Eviction, one block at a time: from T1 (oldest idle unprotected first) while the T1
count, less what this eviction already took from T1, is at least the target's integer
part; otherwise, or when T1 has none left, from T2; then from T1 again; each scan goes
on from where the previous one of that list stopped. Evicted blocks become the newest
of B1 (from T1) or B2 (from T2); then each ghost list drops its oldest beyond the
capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Sequence

import attrs
from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)

__all__ = ["POLICIES", "Block", "KeysSpec", "ModelManager"]

POLICIES = ("lru", "arc")


@attrs.define(slots=True)
class Block:
    """One block: `ready` once its store completed; `holds` loads pin it."""

    ready: bool = False
    holds: int = 0

    @property
    def idle(self) -> bool:
        return self.ready and self.holds == 0


class KeysSpec(LoadStoreSpec):  # type: ignore[misc]
    """Where blocks live in the model: their keys, in order."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        self.keys = tuple(keys)

    def __repr__(self) -> str:
        return f"KeysSpec({len(self.keys)} key(s))"


@attrs.define(slots=True)
class _Access:
    """What one request did to the cache since it began (or since the last reset)."""

    owner: object
    generation: int
    groups: dict[int, list[bytes]] = attrs.Factory(dict)
    seen: set[bytes] = attrs.Factory(set)
    inserted: set[bytes] = attrs.Factory(set)
    reused: set[bytes] = attrs.Factory(set)
    ghost_checked: set[bytes] = attrs.Factory(set)
    finished: bool = False

    def note(self, keys: Iterable[bytes], reused: Iterable[bytes] = ()) -> None:
        for key in keys:
            if key not in self.seen:
                self.seen.add(key)
                self.groups.setdefault(int.from_bytes(key[-4:], "big"), []).append(key)
        self.reused.update(k for k in reused if k not in self.inserted)

    def ordered(self) -> list[bytes]:
        return [k for g in sorted(self.groups) for k in self.groups[g]]


class _Lru:
    def __init__(self, capacity: int) -> None:
        self.blocks: dict[bytes, Block] = {}
        self.recency: dict[bytes, int] = {}
        self.clock = 0

    def _stamp(self, key: bytes) -> None:
        self.clock += 1
        self.recency[key] = self.clock

    def insert(self, key: bytes, block: Block) -> None:
        self.blocks[key] = block
        self._stamp(key)

    def remove(self, key: bytes) -> None:
        del self.blocks[key]
        del self.recency[key]

    def touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            if key in self.blocks:
                self._stamp(key)

    def store_miss(self, keys: Sequence[bytes]) -> None:
        self.touch(keys)

    def finished(self, access: _Access) -> None:
        self.touch(access.ordered())

    def evict(self, n: int, protected: set[bytes]) -> list[bytes] | None:
        idle = sorted(
            (self.recency[k], k) for k, b in self.blocks.items() if b.idle and k not in protected
        )
        if len(idle) < n:
            return None
        chosen = [k for _, k in idle[:n]]
        for key in chosen:
            self.remove(key)
        return chosen

    def clear(self) -> None:
        self.blocks.clear()
        self.recency.clear()
        self.clock = 0


class _Arc:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target = 0.0
        self.t1: OrderedDict[bytes, Block] = OrderedDict()
        self.t2: OrderedDict[bytes, Block] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()
        self.blocks = _Both(self)

    def insert(self, key: bytes, block: Block) -> None:
        self.t1[key] = block
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: bytes) -> None:
        if key in self.t1:
            del self.t1[key]
        else:
            del self.t2[key]

    def _ghost(self, key: bytes) -> None:
        if key in self.b1:
            self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
            self.b2.move_to_end(key)

    def store_miss(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            self._ghost(key)

    def touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            if key in self.t1:
                block = self.t1.pop(key)
                (self.t2 if block.ready else self.t1)[key] = block
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._ghost(key)

    def finished(self, access: _Access) -> None:
        only_inserted = access.inserted - access.reused
        for key in reversed(access.ordered()):
            if key in only_inserted:
                for lst in (self.t1, self.t2):
                    if key in lst:
                        lst.move_to_end(key)
                        break
            elif key in access.reused:
                if key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[bytes]) -> list[bytes] | None:
        def scan(lst: OrderedDict[bytes, Block]) -> Iterator[bytes]:
            return (k for k, b in lst.items() if b.holds == 0 and b.ready and k not in protected)

        from_t1, from_t2 = scan(self.t1), scan(self.t2)
        t1_left = len(self.t1)
        picked: list[tuple[bytes, bool]] = []
        for _ in range(n):
            key = next(from_t1, None) if t1_left >= int(self.target) else None
            if key is not None:
                picked.append((key, True))
                t1_left -= 1
                continue
            key = next(from_t2, None)
            if key is not None:
                picked.append((key, False))
                continue
            key = next(from_t1, None)
            if key is None:
                return None
            picked.append((key, True))
            t1_left -= 1
        for key, was_t1 in picked:
            if was_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)
        return [k for k, _ in picked]

    def clear(self) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.clear()
        self.target = 0.0


class _Both:
    """The resident blocks of an ARC policy (T1 and T2) as one read-only mapping."""

    def __init__(self, arc: _Arc) -> None:
        self.arc = arc

    def get(self, key: bytes) -> Block | None:
        return self.arc.t1.get(key) or self.arc.t2.get(key)

    def __contains__(self, key: bytes) -> bool:
        return key in self.arc.t1 or key in self.arc.t2

    def __len__(self) -> int:
        return len(self.arc.t1) + len(self.arc.t2)

    def values(self) -> Iterator[Block]:
        yield from self.arc.t1.values()
        yield from self.arc.t2.values()


class ModelManager(OffloadingManager):  # type: ignore[misc]
    """vLLM 0.33.0's CPU manager as the project reads it (module docstring)."""

    def __init__(self, num_chunks: int, policy: str = "lru") -> None:
        if policy not in POLICIES:
            msg = f"policy must be one of {', '.join(POLICIES)}, got {policy!r}"
            raise ValueError(msg)
        self.num_chunks = num_chunks
        self.policy = _Lru(num_chunks) if policy == "lru" else _Arc(num_chunks)
        self.generation = 0

    def _block(self, key: bytes) -> Block | None:
        return self.policy.blocks.get(key)

    def _access(self, ctx: ReqContext) -> _Access:
        access: _Access | None = ctx.get_state(_Access)
        if access is None or access.owner is not self or access.generation != self.generation:
            access = _Access(self, self.generation)
            ctx.set_state(access)
        return access

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._access(req_context)
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        block = self._block(key)
        if block is None:
            return LookupResult.MISS
        return LookupResult.HIT if block.ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        for key in keys:
            block = self._block(key)
            assert block is not None and block.ready, f"block {key!r} is not loadable"
            block.holds += 1
        self._access(req_context).note(keys, reused=keys)
        return KeysSpec(list(keys))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.policy.touch(list(keys))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            block = self._block(key)
            assert block is not None and block.holds > 0, f"block {key!r} holds no load"
            block.holds -= 1

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = list(keys)
        blocks = [self._block(k) for k in offered]
        candidates = [k for k, b in zip(offered, blocks, strict=True) if b is None]
        ready = [k for k, b in zip(offered, blocks, strict=True) if b is not None and b.ready]
        access = self._access(req_context)
        misses = [k for k in candidates if k not in access.ghost_checked]
        if misses:
            self.policy.store_miss(misses)
            access.ghost_checked.update(misses)
        noted = set(candidates) | set(ready)
        access.note([k for k in offered if k in noted], reused=ready)
        if not candidates:
            return PrepareStoreOutput(keys_to_store=[], store_spec=KeysSpec([]), evicted_keys=[])
        missing = len(candidates) - (self.num_chunks - len(self.policy.blocks))
        evicted: list[bytes] = []
        if missing > 0:
            if missing > sum(b.idle for b in self.policy.blocks.values()):
                return None
            chosen = self.policy.evict(missing, set(offered))
            if chosen is None:
                return None
            evicted = chosen
        for key in candidates:
            self.policy.insert(key, Block())
        access.inserted.update(candidates)
        return PrepareStoreOutput(
            keys_to_store=[OffloadKey(k) for k in candidates],
            store_spec=KeysSpec(candidates),
            evicted_keys=[OffloadKey(k) for k in evicted],
        )

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        for key in keys:
            block = self._block(key)
            if block is None or block.ready:
                continue
            if success:
                block.ready = True
            else:
                self.policy.remove(key)

    def on_request_finished(self, req_context: ReqContext) -> None:
        access = req_context.get_state(_Access)
        if (
            access is None
            or access.owner is not self
            or access.generation != self.generation
            or access.finished
        ):
            return
        access.finished = True
        self.policy.finished(access)

    def reset_cache(self) -> None:
        self.policy.clear()
        self.generation += 1
