"""No request ever reads KV that did not land: stale prefixes, phantom commits, stranded
offloads and ill-typed store answers.

Each test drives the public API (`System`, the linker, a store backend) the way an
adversarial scheduler or a misbehaving backend would, and checks that every request
ends with the bytes of its own tokens, that nothing stays locked or reserved, and that
every store fault is contained (typed, recorded, never raised at the caller).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from unicache_fsm.fsm.trace import TransitionCounter
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.errors import StoreProtocolError
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import LoadBatchResult
from unicache_fsm.testing.system import System, kv_bytes, run_ranks
from unicache_fsm.tree import EvictParams, InsertParams

P = 4


def key_of(pages: int, base: int = 100) -> tuple[int, ...]:
    return tuple(range(base, base + pages * P))


def finish_request(s: System, req: Any) -> None:
    """Complete `req`; its slots must hold exactly the KV of its own tokens."""
    s.complete(req)
    s.audit()
    assert req.slots is not None
    assert torch.equal(s.full_bytes(req.slots), kv_bytes(s.aligned(req.key), 0))


def prefix_then_tail(s: System, x: tuple[int, ...], prefix_tokens: int) -> None:
    """`x[:prefix_tokens]` resident on the device, the rest of `x` only in the store."""
    s.compute("prefix", x[:prefix_tokens])
    s.compute("whole", x)
    s.tree.evict(EvictParams(num_tokens=len(x) - prefix_tokens))
    assert s.tree.match_prefix(x).prefix_len == prefix_tokens


# -- 1. the match -> load_back gap ---------------------------------------------------
def test_prefix_reloaded_from_host_between_match_and_load_back() -> None:
    """(a) The unpinned prefix is backed up, evicted and loaded back into new slots."""
    s = System.build(P, host_pages=16)
    x = key_of(8)
    prefix_then_tail(s, x, 4 * P)
    r = s.begin("r", x, lock=False, load=False)
    assert r.load is not None and r.load.device_hit_len == 4 * P
    anchor = r.load.anchor
    s.tree.backup(anchor)
    s.tree.evict(EvictParams(num_tokens=4 * P))
    s.compute("other", key_of(4, base=5000), offload=False)  # takes the freed slots
    assert s.tree.load_back(anchor)
    assert not torch.equal(s.tree.path_slots(anchor), r.load.device_prefix)
    s.linker.load_back(r.load)
    s.drive()
    assert r.load.state in ("aborted", "committed")
    if r.load.state == "aborted":
        assert r.load.abort_reason is not None
        assert r.load.abort_reason.value == "stale_prefix"
    finish_request(s, r)
    s.assert_quiet()


def test_tombstone_replaced_inside_the_prefix_between_match_and_load_back() -> None:
    """(b) Another request's insert replaces an unlocked SWA tombstone in the prefix,
    freeing its old FULL slots, which the load's own reservation may then receive."""
    s = System.build(P, swa=True)  # window: 2 pages
    x = key_of(8)
    a = x[: 6 * P]
    prefix_then_tail(s, x, 6 * P)
    r = s.begin("r", x, lock=False, load=False)
    assert r.load is not None and r.load.device_hit_len == 6 * P
    # a request that computed `a` from scratch inserts it with live SWA everywhere
    fresh = s.alloc(len(a))
    s.kv.write_pages(fresh, kv_bytes(a, 0))
    sw = s.alloc_swa(len(a))
    assert s.swa_kv is not None and hasattr(s.allocator, "set_full_to_swa_mapping")
    s.allocator.set_full_to_swa_mapping(fresh, sw)
    s.swa_kv.write_pages(sw, kv_bytes(a, 0, swa=True))
    s.tree.insert(InsertParams(key=a, value=fresh, prev_prefix_len=0, swa_evicted_seqlen=0))
    assert not torch.equal(s.tree.path_slots(r.load.anchor), r.load.device_prefix)
    s.audit()
    s.linker.load_back(r.load)
    s.drive()
    assert r.load.state in ("aborted", "committed")
    finish_request(s, r)
    s.assert_quiet()


def test_swa_window_tombstoned_between_match_and_load_back() -> None:
    """(c) SWA eviction tombstones the prefix's window; the tail is shorter than a
    window, so a commit would leave the request's last window partly dead."""
    s = System.build(P, swa=True, window_pages=3)
    x = key_of(7)
    prefix_then_tail(s, x, 6 * P)
    r = s.begin("r", x, lock=False, load=False)
    assert r.load is not None and r.load.prefix_len - r.load.device_hit_len == P
    s.tree.evict(EvictParams(swa_num_tokens=10**6))
    s.linker.load_back(r.load)
    s.drive()
    if r.load.state == "committed":
        assert r.load.slots is not None
        live, _ = s.swa_bytes_of(r.load.slots[-s.window :])
        assert bool(live.all()), "the committed request's last window is not live"
    finish_request(s, r)
    s.assert_quiet()


# -- 2.-4. store calls that raise or answer ill-typed -------------------------------
class Scripted(MemoryStore):
    """A memory store whose answers a test can replace, one call name at a time.

    ``script[name] = fn`` makes call `name` return ``fn(real_call, *args)``.
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.script: dict[str, Callable[..., Any]] = {}

    def _via(self, name: str, real: Callable[..., Any], *args: Any) -> Any:
        hook = self.script.get(name)
        return real(*args) if hook is None else hook(real, *args)

    def lookup(self, rid: str, transfers: Sequence[PoolTransfer]) -> list[int]:
        result: list[int] = self._via("lookup", super().lookup, rid, transfers)
        return result

    def load(self, rid: str, transfers: Sequence[PoolTransfer]) -> bool:
        return bool(self._via("load", super().load, rid, transfers))

    def offload(self, transfers: Sequence[PoolTransfer]) -> bool:
        return bool(self._via("offload", super().offload, transfers))

    def pop_completed_load(self) -> LoadBatchResult:
        result: LoadBatchResult = self._via("pop_completed_load", super().pop_completed_load)
        return result

    def start_loading(self) -> int:
        return int(self._via("start_loading", super().start_loading))

    def cancel_queued_load(self, rid: str) -> bool:
        return bool(self._via("cancel_queued_load", super().cancel_queued_load, rid))


def scripted(**kw: Any) -> tuple[System, Scripted]:
    store = Scripted()
    s = System.build(P, store_factory=lambda: store, **kw)
    return s, store


def raising(exc: BaseException) -> Callable[..., Any]:
    def hook(real: Callable[..., Any], *args: Any) -> Any:
        raise exc

    return hook


def answering(value: Any, *, call_real: bool = True) -> Callable[..., Any]:
    def hook(real: Callable[..., Any], *args: Any) -> Any:
        if call_real:
            real(*args)
        return value

    return hook


def stored_then_evicted(s: System, x: tuple[int, ...]) -> None:
    s.compute("A", x)
    assert all(n.external_cache_stored for n in s.tree.nodes())
    s.evict_all()


def last_fault(s: System, operation: str) -> BaseException:
    fault = s.linker.last_store_fault
    assert fault is not None, "the fault was not recorded"
    assert s.linker.stats.store_faults.get(operation, 0) >= 1, s.linker.stats.store_faults
    return fault


@pytest.mark.parametrize(
    "exc", [ConnectionError("peer reset"), KeyError("rid"), TimeoutError()], ids=type
)
def test_load_that_raises_aborts_and_never_commits(exc: BaseException) -> None:
    """2. The load aborts at once: its slots are never swept into another batch."""
    s, store = scripted()
    x, y = key_of(6), key_of(6, base=700)
    stored_then_evicted(s, x)
    s.compute("Y", y)
    s.evict_all()
    free = s.allocator.available_size()
    store.script["load"] = raising(exc)
    a = s.begin("a", x)
    assert a.load is not None and not a.prepared and a.load.state == "aborted"
    assert a.load.abort_reason is not None and a.load.abort_reason.value == "store_refused"
    assert s.allocator.available_size() == free, "the aborted load kept slots"
    assert last_fault(s, "load") is exc
    del store.script["load"]
    b = s.begin("b", y)  # another request's batch must not carry a's slots
    assert b.prepared
    ended = s.drive()
    assert [ld.rid for ld in ended] == ["b"]
    finish_request(s, a)
    finish_request(s, b)
    s.assert_quiet()


@pytest.mark.parametrize(
    "make",
    ["raise", "closed", "unattached", "page_size"],
)
def test_offload_that_raises_fails_and_unlocks(make: str) -> None:
    """3. Any exception from `offload` fails that offload: nodes unstored, unlocked."""
    if make == "page_size":  # a KV pool with other pages than the allocator's
        from unicache_fsm.pools import KVPool

        s, store = scripted()
        store.attach({PoolName.KV: KVPool(64 * 2 * P, 2 * P, 2, 4)})
    else:
        s, store = scripted()
        if make == "raise":
            store.script["offload"] = raising(RuntimeError("disk full"))
        elif make == "unattached":
            store.attach({})
    x = key_of(6)
    if make == "closed":
        store.close()
        s.check_stored = False  # a closed store answers nothing
    a = s.compute("A", x, settle=False)
    assert a.offload is not None and a.offload.state == "failed"
    assert not any(n.offloading or n.external_cache_stored for n in s.tree.nodes())
    assert not any(n.lock_ref for n in s.tree.nodes()), "the failed offload kept its lock"
    assert s.linker.stats.offloads_failed == 1
    assert last_fault(s, "offload") is not None
    s.linker.reset()  # a store that fails its reset too changes nothing here
    s.evict_all()
    assert not list(s.tree.nodes()), "eviction freed nothing: the chain is still pinned"
    s.assert_quiet()


def test_lookup_answering_none_is_a_miss() -> None:
    s, store = scripted()
    x = key_of(4)
    stored_then_evicted(s, x)
    store.script["lookup"] = answering(None)
    r = s.begin("r", x)
    assert r.load is None
    fault = last_fault(s, "lookup")
    assert isinstance(fault, StoreProtocolError)
    assert fault.operation == "lookup" and fault.value is None
    finish_request(s, r)
    s.assert_quiet()


@pytest.mark.parametrize(
    "answer",
    [None, "false", 0, LoadBatchResult(12345, ("r",), True), "garbage"],
    ids=["none", "str-verdict", "int", "unknown-batch", "str"],
)
def test_ill_typed_load_completion_aborts_the_batch(answer: Any) -> None:
    """4. A completion that is not a `LoadBatchResult` with a real bool verdict for the
    batch in flight is a protocol error: the batch ends failed, its loads abort."""
    s, store = scripted()
    x = key_of(4)
    stored_then_evicted(s, x)
    r = s.begin("r", x)
    assert r.load is not None and r.prepared

    def hook(real: Callable[..., Any]) -> Any:
        result = real()
        if answer == "false":
            return LoadBatchResult(result.batch, result.rids, "false")  # type: ignore[arg-type]
        return answer

    store.script["pop_completed_load"] = hook
    ended = s.drive()
    assert ended == [r.load] and r.load.state == "aborted"
    assert r.load.abort_reason is not None and r.load.abort_reason.value == "load_failed"
    fault = last_fault(s, "pop_completed_load")
    assert isinstance(fault, StoreProtocolError) and fault.operation == "pop_completed_load"
    del store.script["pop_completed_load"]
    finish_request(s, r)
    s.assert_quiet()


def test_out_of_range_boundary_on_one_rank_is_ignored_on_every_rank() -> None:
    """4. A boundary outside 1..n on one rank: every rank treats it as not restorable,
    at once (no rank raises alone, nobody waits for the barrier timeout)."""
    x = key_of(4)

    def step(rank: int, group: Any) -> tuple[int, bool]:
        store = Scripted()
        s = System.build(P, store_factory=lambda: store, group=group)
        stored_then_evicted(s, x)
        if rank == 1:
            store.script["lookup"] = lambda real, *a: [*real(*a), 99]
        r = s.begin("r", x)
        assert r.load is not None
        hit = r.load.prefix_len
        s.drive(5, fixed=True)
        finish_request(s, r)
        s.assert_quiet()
        return hit, isinstance(s.linker.last_store_fault, StoreProtocolError)

    results = run_ranks(2, step, timeout=5.0)
    assert results == [(4 * P, False), (4 * P, True)]


def test_out_of_range_boundaries_only_is_a_miss_everywhere() -> None:
    x = key_of(4)

    def step(rank: int, group: Any) -> bool:
        store = Scripted()
        s = System.build(P, store_factory=lambda: store, group=group)
        stored_then_evicted(s, x)
        if rank == 0:
            store.script["lookup"] = answering([0, 5, -1])
        r = s.begin("r", x)
        finish_request(s, r)
        s.assert_quiet()
        return r.load is None

    assert run_ranks(2, step, timeout=5.0) == [True, True]


# -- 5.-6. what the store keeps -------------------------------------------------------
def test_chain_offloaded_in_two_parts_shrinks_from_its_end() -> None:
    """5. Pages 0-3, then 4-7 under the now-stored ancestor: one page of pressure costs
    the chain its last page, never a page in its middle."""
    s = System.build(P, capacity_pages=8)
    x = key_of(8)
    s.compute("head", x[: 4 * P])
    s.compute("whole", x)
    assert s.memory.num_pages == 8
    s.compute("pressure", key_of(1, base=900))  # the store must drop one page
    assert s.memory.num_pages == 8
    s.evict_all()
    r = s.begin("r", x)
    assert r.load is not None
    assert r.load.prefix_len == 7 * P, "capacity eviction punched a hole in the chain"
    s.drive()
    finish_request(s, r)
    s.assert_quiet()


def test_corrupt_page_is_not_retried_forever() -> None:
    """6. A page that fails its checksum is dropped, so the next request does not load
    it again (it recomputes, and its offload stores good bytes)."""
    s = System.build(P)
    x = key_of(4)
    stored_then_evicted(s, x)
    node_hashes = s.memory.stored_keys(PoolName.KV)
    bad = sorted(node_hashes)[0]
    view = s.memory.stored_bytes(PoolName.KV, bad)
    assert view is not None
    view[:8] ^= 0xFF
    s.check_stored = False  # the store lost integrity on purpose
    first = s.begin("first", x)
    s.drive()
    assert first.load is not None and first.load.state == "aborted"
    assert not s.memory.contains(PoolName.KV, bad), "the corrupt page is still reported"
    s.complete(first)
    s.check_stored = True
    s.audit()
    s.evict_all()
    again = s.serve("again", x)
    assert again.outcome == "committed", "a corrupt page was loaded (and aborted) again"
    s.assert_quiet()


# -- records are data ------------------------------------------------------------------
def test_records_hold_no_reference_to_the_linker() -> None:
    """`ExternalLoad` and `PendingOffload` are data: the linker is their executors'
    handler, so no record field leads back to it."""
    import attrs

    from unicache_fsm.linker.load import ExternalLoad
    from unicache_fsm.linker.offload import PendingOffload

    s = System.build(P)
    x = key_of(4)
    a = s.compute("A", x)
    s.evict_all()
    r = s.serve("r", x)
    assert a.offload is not None and r.load is not None
    for record, cls in ((r.load, ExternalLoad), (a.offload, PendingOffload)):
        values = [getattr(record, f.name) for f in attrs.fields(cls)]
        assert all(v is not s.linker for v in values), cls
        assert "linker" not in {f.name for f in attrs.fields(cls)}
    assert s.linker.load_machine.handler is s.linker
    assert s.linker.offload_machine.handler is s.linker


# -- what a lost answer may leave in the store ------------------------------------------
def test_release_while_the_cancel_fails_frees_nothing_the_store_may_write() -> None:
    """The store may still hold a queued load whose cancel raised: its slots stay
    reserved until the store is done with it (here: it runs the load), then it aborts."""
    s, store = scripted()
    x = key_of(4)
    stored_then_evicted(s, x)
    r = s.begin("r", x)
    assert r.load is not None and r.prepared
    reserved = r.load.transfers[0].device_indices
    assert reserved is not None
    store.script["cancel_queued_load"] = raising(TimeoutError("no answer"))
    s.linker.release_request("r")
    assert r.load.state == "prepared.queued" and r.load.abort_pending is not None
    other = s.compute("other", key_of(6, base=700), offload=False)
    assert other.slots is not None
    assert not set(other.slots.tolist()) & set(reserved.tolist()), "slots reused too early"
    s.audit()
    del store.script["cancel_queued_load"]
    s.drive()
    assert r.load.state == "aborted" and r.load.abort_reason is not None
    assert r.load.abort_reason.value == "released"
    s.unlock(r.lock)
    s.requests.pop("r")
    s.assert_quiet()


def test_start_loading_failing_on_one_rank_keeps_the_ranks_together() -> None:
    """One rank's store fails to start the batch once: that rank starts it a round
    later, and both ranks commit the load together (per-load agreement)."""
    x = key_of(4)

    def step(rank: int, group: Any) -> tuple[str, int]:
        store = Scripted()
        s = System.build(P, store_factory=lambda: store, group=group)
        stored_then_evicted(s, x)
        if rank == 1:
            calls = {"n": 0}

            def once(real: Callable[..., Any]) -> Any:
                calls["n"] += 1
                if calls["n"] == 1:
                    raise ConnectionError("start lost")
                return real()

            store.script["start_loading"] = once
        r = s.begin("r", x)
        assert r.load is not None and r.prepared
        s.drive(5, fixed=True)
        state = r.load.state
        finish_request(s, r)
        s.assert_quiet()
        return state, s.linker.stats.store_faults.get("start_loading", 0)

    assert run_ranks(2, step, timeout=10.0) == [("committed", 0), ("committed", 1)]


def test_a_load_released_while_loading_lands_then_aborts() -> None:
    """The request goes while its batch runs; the batch lands: the load takes LAND (the
    pages are there) and then ABORT (nobody wants them), freeing its reservation."""
    s, store = scripted()
    seen = TransitionCounter()
    s.linker.load_machine.add_observer(seen)
    x = key_of(4)
    stored_then_evicted(s, x)
    r = s.begin("r", x)
    assert r.load is not None and r.prepared
    assert s.linker.start_loading() >= 0 and r.load.state == "prepared.loading"
    s.linker.release_request("r")
    assert r.load.state == "prepared.loading" and r.load.abort_pending is not None
    store.progress()
    assert s.linker.finish_loads() == [r.load]
    assert r.load.state == "aborted" and r.load.abort_reason is not None
    assert r.load.abort_reason.value == "released"
    arrows = {(src, trigger, dest) for (_, src, trigger, dest) in seen.counts}
    assert ("prepared.loading", "land", "prepared.landed") in arrows
    assert ("prepared.landed", "abort", "aborted") in arrows
    assert not any(trigger == "commit" for (_, trigger, _) in arrows)
    s.unlock(r.lock)
    s.requests.pop("r")
    s.assert_quiet()
