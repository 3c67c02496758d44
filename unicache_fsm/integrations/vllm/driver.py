"""A caller that drives an `OffloadingManager` as vLLM 0.33.0's offloading connector does.

`Driver(manager, choose, *, keys=12, groups=2)` plays the scheduler side of the
contract correctly, one `step()` at a time, each under ``manager.lock``: it announces
requests, looks keys up, loads only blocks that answered HIT and completes every load
it prepared, offers keys for storing and completes every store it was given (with
success or failure), touches keys, finishes requests, and now and then resets the cache
(forgetting its transfers in flight, as the connector's stale-job threshold does).
`choose(n)` picks every decision (an int in ``range(n)``): `random.Random.randrange`
for the conformance kit, a Hypothesis draw for the differential suite, so a failing
program shrinks.

`transcript` holds every observable answer as plain data (`LookupResult` names, key
lists, None), so two managers driven by the same choices can be compared entry by
entry. The driver tolerates wrong answers (a monitor in ``record`` mode reports them):
it only acts on what a correct answer would mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    make_offload_key,
)

__all__ = ["Choose", "Driver", "offload_keys"]

Choose = Callable[[int], int]

#: step kinds and their weights (out of the draw's range)
_KINDS = (
    ("new", 2),
    ("lookup", 3),
    ("load", 3),
    ("complete_load", 3),
    ("store", 4),
    ("complete_store", 4),
    ("touch", 2),
    ("finish", 2),
    ("reset", 1),
)
_WHEEL = [kind for kind, weight in _KINDS for _ in range(weight)]


def offload_keys(n: int, groups: int = 2) -> list[OffloadKey]:
    """`n` distinct keys, spread over `groups` KV-cache groups."""
    return [make_offload_key(i.to_bytes(8, "big"), i % groups) for i in range(n)]


class Driver:
    """The connector's side of the contract, one step at a time (module docstring)."""

    def __init__(
        self, manager: OffloadingManager, choose: Choose, *, keys: int = 12, groups: int = 2
    ) -> None:
        self.manager = manager
        self.choose = choose
        self.keys = offload_keys(keys, groups)
        self.live: list[ReqContext] = []
        self.loads: list[tuple[ReqContext, list[OffloadKey]]] = []
        self.stores: list[tuple[ReqContext, list[OffloadKey]]] = []
        self.transcript: list[tuple[Any, ...]] = []
        self._made = 0

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def step(self) -> str:
        kind = _WHEEL[self.choose(len(_WHEEL))]
        getattr(self, f"_{kind}")()
        return kind

    # -- choices ----------------------------------------------------------------------

    def _request(self) -> ReqContext:
        if not self.live:
            self._new()
        return self.live[self.choose(len(self.live))]

    def _some_keys(self) -> list[OffloadKey]:
        """A run of distinct keys: a request's prefix or a slice of one."""
        start = self.choose(len(self.keys))
        length = 1 + self.choose(min(4, len(self.keys) - start))
        return self.keys[start : start + length]

    # -- steps -------------------------------------------------------------------------

    def _new(self) -> None:
        self._made += 1
        ctx = ReqContext(f"req-{self._made}")
        with self.manager.lock:
            self.manager.on_new_request(ctx)
        self.live.append(ctx)
        self.transcript.append(("new", ctx.req_id))

    def _lookups(self, ctx: ReqContext, keys: Sequence[OffloadKey]) -> list[str]:
        answers = [self.manager.lookup(k, ctx) for k in keys]
        return [getattr(a, "name", repr(a)) for a in answers]

    def _lookup(self) -> None:
        ctx, keys = self._request(), self._some_keys()
        with self.manager.lock:
            found = self._lookups(ctx, keys)
        self.transcript.append(("lookup", ctx.req_id, found))

    def _load(self) -> None:
        ctx, keys = self._request(), self._some_keys()
        with self.manager.lock:
            found = self._lookups(ctx, keys)
            hits = [k for k, a in zip(keys, found, strict=True) if a == LookupResult.HIT.name]
            hits = hits[: 1 + self.choose(len(hits))] if hits else []
            if hits:
                self.manager.prepare_load(hits, ctx)
                self.loads.append((ctx, hits))
        self.transcript.append(("load", ctx.req_id, found, [bytes(k) for k in hits]))

    def _complete_load(self) -> None:
        if not self.loads:
            return
        ctx, keys = self.loads.pop(self.choose(len(self.loads)))
        with self.manager.lock:
            self.manager.complete_load(keys, ctx)
        self.transcript.append(("complete_load", ctx.req_id, [bytes(k) for k in keys]))

    def _store(self) -> None:
        ctx, keys = self._request(), self._some_keys()
        with self.manager.lock:
            out = self.manager.prepare_store(keys, ctx)
        if not isinstance(out, PrepareStoreOutput):
            self.transcript.append(("store", ctx.req_id, [bytes(k) for k in keys], None))
            return
        stored = [k for k in out.keys_to_store if isinstance(k, bytes)]
        evicted = [k for k in out.evicted_keys if isinstance(k, bytes)]
        self.transcript.append(
            (
                "store",
                ctx.req_id,
                [bytes(k) for k in keys],
                [bytes(k) for k in stored],
                [bytes(k) for k in evicted],
            )
        )
        if stored:
            self.stores.append((ctx, stored))

    def _complete_store(self) -> None:
        if not self.stores:
            return
        ctx, keys = self.stores.pop(self.choose(len(self.stores)))
        success = self.choose(4) != 0
        with self.manager.lock:
            self.manager.complete_store(keys, ctx, success)
            found = self._lookups(ctx, keys) if ctx in self.live else []
        self.transcript.append(("complete_store", ctx.req_id, success, found))

    def _touch(self) -> None:
        ctx, keys = self._request(), self._some_keys()
        with self.manager.lock:
            self.manager.touch(keys, ctx)
        self.transcript.append(("touch", ctx.req_id, [bytes(k) for k in keys]))

    def _finish(self) -> None:
        if not self.live:
            return
        ctx = self.live.pop(self.choose(len(self.live)))
        with self.manager.lock:
            self.manager.on_request_finished(ctx)
        self.transcript.append(("finish", ctx.req_id))

    def _reset(self) -> None:
        if self.choose(3) != 0:  # rarer than the other steps
            return
        with self.manager.lock:
            self.manager.reset_cache()
        self.loads.clear()
        self.stores.clear()
        self.transcript.append(("reset",))
