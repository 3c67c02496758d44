"""Any vLLM 0.33.0 `OffloadingManager` or `OffloadingWorker`, every call checked.

`MonitoredManager(manager, *, mode="raise", trace=None, shared=False, protocol=None)` is a real
`OffloadingManager` that forwards every call to `manager` and drives an
`OffloadingProtocol` (`machines`) from it:

- its `lock` enters the wrapped manager's lock and tells the protocol (entering it while
  held is a violation, reported before the wrapped lock is touched, so no deadlock);
- every method but `shutdown` must run under that lock, `shutdown` outside it;
- `lookup`, `prepare_load`, `prepare_store`, `touch` must name a request that
  `on_new_request` announced and `on_request_finished` has not ended;
- `prepare_load` only of blocks whose store completed (HIT), `complete_load` only of
  blocks a load holds; `prepare_store` may evict only stored blocks no load holds, and
  lists in `keys_to_store` only keys it was offered, each once, none already stored;
- `lookup` answers HIT only for blocks whose store completed and MISS only for blocks
  that left through a reported eviction, a failed store or a reset (with
  ``shared=True``, for a store other processes write, blocks may also appear and, when
  no load holds them, vanish);
- every answer has the type the contract names (`LookupResult`, `LoadStoreSpec`,
  `PrepareStoreOutput | None` with lists of keys, `RequestOffloadingContext`,
  `OffloadingEvent` items, a bool from `has_pending_work`).

A violation of a call's preconditions is reported before the wrapped manager is called:
raised (`OffloadingViolation`) in ``raise`` mode, so nothing changes; logged and kept in
`protocol.violations` in ``record`` mode, and the call goes through. A wrong answer
(`WrongAnswerError`) is reported after the call. Exceptions of the wrapped manager pass
through unchanged and leave the books as they were.

`MonitoredWorker(worker, *, protocol)` does the same for a worker: job ids are not
reused while in flight, submits answer a bool, `get_finished` reports only jobs in
flight, each once, as `TransferResult`s, and `wait` names only submitted jobs. Give it
the manager's `protocol` so one trace holds both sides.

With `trace` the machines' transitions go to that JSONL file (``unicache-fsm
check-trace`` accepts it); `coverage()` gives what ``unicache-fsm diagram --coverage``
draws.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TransferResult,
)

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.integrations.vllm.machines import OffloadingProtocol

__all__ = ["MonitoredManager", "MonitoredWorker"]


def _keys(keys: Iterable[Any]) -> list[bytes]:
    return [bytes(k) for k in keys]


def _is_key_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(k, bytes) for k in value)


class MonitoredManager(OffloadingManager):  # type: ignore[misc]
    """`manager`, with every call checked against vLLM 0.33.0's contract."""

    def __init__(
        self,
        manager: OffloadingManager,
        *,
        mode: str = "raise",
        trace: str | Path | None = None,
        shared: bool = False,
        protocol: OffloadingProtocol | None = None,
    ) -> None:
        self.manager = manager
        if protocol is None:
            protocol = OffloadingProtocol(mode=mode, trace=trace, shared=shared)
        self.protocol = protocol

    def coverage(self) -> Coverage:
        return self.protocol.coverage()

    @property
    def lock(self) -> AbstractContextManager[Any]:
        return self._locked()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        if not self.protocol.acquire():  # recorded re-entry: do not re-enter the real lock
            yield
            return
        try:
            with self.manager.lock:
                yield
        finally:
            self.protocol.release()

    def _call(self, call: str, ctx: ReqContext | None = None) -> None:
        self.protocol.call(call)
        if ctx is not None:
            self.protocol.submit(ctx.req_id, call)

    # -- the contract's primitives ----------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        call = f"lookup({bytes(key).hex()[:16]})"
        self._call(call, req_context)
        answer = self.manager.lookup(key, req_context)
        if self.protocol.check_answer(
            call, answer, isinstance(answer, LookupResult), "a LookupResult"
        ):
            self.protocol.after_lookup(bytes(key), answer.name)
        return answer

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> Any:
        self._call("get_load_source(...)")
        return self.manager.get_load_source(key, req_context)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        ks = _keys(keys)
        call = f"prepare_load({len(ks)} key(s))"
        self._call(call, req_context)
        self.protocol.before_load(ks, call)
        spec = self.manager.prepare_load(keys, req_context)
        self.protocol.check_answer(call, spec, isinstance(spec, LoadStoreSpec), "a LoadStoreSpec")
        self.protocol.after_load(ks, call)
        return spec

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._call(f"touch({len(keys)} key(s))", req_context)
        self.manager.touch(keys, req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        ks = _keys(keys)
        call = f"complete_load({len(ks)} key(s))"
        self._call(call)
        self.protocol.before_unload(ks, call)
        self.manager.complete_load(keys, req_context)
        self.protocol.after_unload(ks, call)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        ks = _keys(keys)
        call = f"prepare_store({len(ks)} key(s))"
        self._call(call, req_context)
        out = self.manager.prepare_store(keys, req_context)
        if out is None:
            return None
        ok = (
            isinstance(out, PrepareStoreOutput)
            and _is_key_list(out.keys_to_store)
            and _is_key_list(out.evicted_keys)
            and isinstance(out.store_spec, LoadStoreSpec)
        )
        expected = "None or a PrepareStoreOutput (lists of keys, a LoadStoreSpec)"
        if self.protocol.check_answer(call, out, ok, expected):
            self.protocol.after_store(ks, _keys(out.keys_to_store), _keys(out.evicted_keys))
        return out

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        ks = _keys(keys)
        self._call(f"complete_store({len(ks)} key(s), success={success})")
        self.manager.complete_store(keys, req_context, success)
        self.protocol.after_complete_store(ks, success)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        call = f"on_new_request({req_context.req_id!r})"
        self._call(call)
        self.protocol.begin_request(req_context.req_id)
        answer = self.manager.on_new_request(req_context)
        self.protocol.check_answer(
            call, answer, isinstance(answer, RequestOffloadingContext), "a RequestOffloadingContext"
        )
        return answer

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._call(f"on_request_finished({req_context.req_id!r})")
        self.protocol.finish_request(req_context.req_id)
        self.manager.on_request_finished(req_context)

    def take_events(self) -> Iterable[OffloadingEvent]:
        self._call("take_events()")
        events = list(self.manager.take_events())
        ok = all(isinstance(e, OffloadingEvent) for e in events)
        self.protocol.check_answer("take_events()", events, ok, "OffloadingEvent items")
        return events

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._call("on_schedule_end(...)")
        self.manager.on_schedule_end(context)

    def has_pending_work(self) -> bool:
        self._call("has_pending_work()")
        answer = self.manager.has_pending_work()
        self.protocol.check_answer("has_pending_work()", answer, isinstance(answer, bool), "a bool")
        return bool(answer)

    def reset_cache(self) -> None:
        self._call("reset_cache()")
        self.manager.reset_cache()
        self.protocol.after_reset()

    def on_reset_flushed(self) -> None:
        self._call("on_reset_flushed()")
        self.manager.on_reset_flushed()

    def get_stats(self) -> Any:
        self._call("get_stats()")
        return self.manager.get_stats()

    def config_info(self) -> Sequence[Any]:
        self._call("config_info()")
        info: Sequence[Any] = self.manager.config_info()
        return info

    def shutdown(self) -> None:
        self.protocol.shutdown()
        try:
            self.manager.shutdown()
        finally:
            self.protocol.close_trace()


class MonitoredWorker(OffloadingWorker):  # type: ignore[misc]
    """`worker`, with every job checked against `specs/vllm_transfer.toml`."""

    def __init__(self, worker: OffloadingWorker, *, protocol: OffloadingProtocol) -> None:
        self.worker = worker
        self.protocol = protocol

    def _submit(self, kind: str, job_id: int, submit: Any, *args: Any) -> bool:
        call = f"{kind}({job_id})"
        self.protocol.before_submit(job_id, call)
        try:
            answer = submit(job_id, *args)
        except BaseException:
            self.protocol.after_submit(job_id, f"{call} raised", False)
            raise
        ok = self.protocol.check_answer(call, answer, isinstance(answer, bool), "a bool")
        self.protocol.after_submit(job_id, f"{call} -> {answer}", ok and answer)
        return bool(answer)

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: LoadStoreSpec) -> bool:
        return self._submit("submit_store", job_id, self.worker.submit_store, src_spec, dst_spec)

    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: Any, expedited: bool = False
    ) -> bool:
        return self._submit(
            "submit_load", job_id, self.worker.submit_load, src_spec, dst_spec, expedited
        )

    def get_finished(self) -> list[TransferResult]:
        results = list(self.worker.get_finished())
        for r in results:
            ok = isinstance(r, TransferResult) and isinstance(r.success, bool)
            if self.protocol.check_answer("get_finished()", r, ok, "TransferResult items"):
                self.protocol.after_finished(r.job_id, r.success)
        return results

    def wait(self, job_ids: set[int]) -> None:
        self.protocol.check_wait(job_ids)
        self.worker.wait(job_ids)

    def shutdown(self) -> None:
        self.worker.shutdown()
