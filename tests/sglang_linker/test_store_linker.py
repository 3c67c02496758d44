"""Whole request flows through SGLang 0.5.23's real `UnifiedRadixCache` on CPU, served
by `StoreLinker` on the memory, file and Redis stores, every call watched by a
`ContractMonitor` in raise mode (so each flow also shows the monitor finds it legal).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_linker.engine import Engine, MatchPrefixParams, PoolName, RadixKey
from sglang_linker.stores import make_store
from unicache_fsm.fsm.conformance import check_trace, read_trace
from unicache_fsm.fsm.loader import bundled_spec

CONFIGS = {"full": None, "swa8": 8}

TOKENS = list(range(1, 17))  # 4 pages of 4


@pytest.fixture(params=sorted(CONFIGS))
def engine(request: pytest.FixtureRequest, store_kind: str, tmp_path: Path) -> Engine:
    eng = Engine(
        make_store(store_kind, tmp_path),  # type: ignore[arg-type]
        swa_window=CONFIGS[request.param],
        trace=tmp_path / "monitor.jsonl",
    )
    yield eng
    eng.close()


def test_offload_evict_load_finish_insert_byte_for_byte(engine: Engine, tmp_path: Path) -> None:
    full_kv, swa_kv = engine.compute(TOKENS)
    assert engine.pending_offloads() > 0  # write-through queued by the insert
    engine.settle_offloads()
    engine.evict_all()
    assert engine.cache.match_prefix(MatchPrefixParams(key=RadixKey(TOKENS))).device_prefix_len == 0

    loaded = engine.load([*TOKENS, 99], "r1")
    assert (loaded.host_hit, loaded.loaded, loaded.failed) == (16, 16, ())
    assert loaded.slots is not None
    assert engine.read(loaded.slots).same(full_kv)  # the bytes SGLang reads
    if engine.swa:  # the trailing window's SWA pages came back too
        assert swa_kv is not None
        window = loaded.slots[-8:]
        got = engine.read_swa(window)
        assert torch.equal(got.k, swa_kv.k[:, -8:]) and torch.equal(got.v, swa_kv.v[:, -8:])

    result = engine.insert_loaded(loaded)
    assert result.prefix_len == 0  # a new leaf, like computed KV (no COMMIT in 0.5.23)
    assert engine.pending_offloads() > 0  # offloaded again (D1 in docs/deviations.md)
    engine.settle_offloads()
    assert (
        engine.cache.match_prefix(MatchPrefixParams(key=RadixKey(TOKENS))).device_prefix_len == 16
    )
    assert engine.store_linker.in_flight() == {"loads": 0, "batches": 0, "verdicts": 0}

    engine.cache.linker.close()
    records = list(read_trace(tmp_path / "monitor.jsonl"))
    assert check_trace(records, bundled_spec).violation is None
    taken = {(r["machine"], r["trigger"], r["dest"]) for r in records}
    assert {
        ("sglang_load", "answer", "queued"),
        ("sglang_load", "start", "started"),
        ("sglang_load", "finish", "landed"),
        ("sglang_offload", "answer", "pending"),
        ("sglang_offload", "report", "completed"),
        ("sglang_offload", "pop", "stored"),
        ("sglang_linker", "close", "closed"),
    } <= taken


def test_a_page_lost_before_the_load_is_a_refusal_and_sglang_recomputes(engine: Engine) -> None:
    engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    free = engine.allocator.available_size()
    req, result = engine.match(TOKENS, "r1")
    assert result.host_hit_length == 16
    engine.store_linker.store.evict(engine.cache.linker.hit_markers["r1"].tail_hashes)
    loaded, slots = engine.load_back(req, result)
    assert (loaded, slots) == (0, None)  # refused: SGLang aborted the load, freed its slots
    assert engine.allocator.available_size() == free
    counts = engine.monitor.monitor.counter.counts
    assert counts[("sglang_load", "requested", "answer", "refused")] == 1


def test_a_page_lost_after_the_load_queued_fails_the_batch_and_sglang_aborts(
    engine: Engine,
) -> None:
    engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    req, result = engine.match(TOKENS, "r1")
    loaded, slots = engine.load_back(req, result)
    assert loaded == 16 and slots is not None
    assert engine.store_linker.store.evict(_keys_of(engine, TOKENS)) > 0
    engine.cache.ready_to_load_host_cache()
    failed = engine.cache.finish_external_linker_loads([req])
    assert [r.rid for r in failed] == ["r1"] and req.skip_radix_cache_insert
    engine.free(slots)
    counts = engine.monitor.monitor.counter.counts
    assert counts[("sglang_load", "started", "finish", "failed")] == 1
    assert engine.store_linker.in_flight() == {"loads": 0, "batches": 0, "verdicts": 0}


def _keys_of(engine: Engine, tokens: list[int]) -> list[str]:
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    return list(get_storage_hash_str(RadixKey(tokens), None, page_size=engine.page))


def test_cancel_a_queued_load_then_reset(engine: Engine) -> None:
    engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    req, result = engine.match(TOKENS, "r1")
    loaded, slots = engine.load_back(req, result)
    assert loaded == 16 and slots is not None
    assert engine.store_linker.open_pages()["write"] > 0  # open to the store
    engine.cache.linker.release_request("r1")  # the request was aborted before its batch
    assert "r1" not in engine.cache.linker.inflight_load_rids
    assert engine.store_linker.open_pages()["write"] == 0  # closed to the store
    engine.free(slots)
    counts = engine.monitor.monitor.counter.counts
    assert counts[("sglang_load", "queued", "cancel", "cancelled")] == 1

    engine.compute(list(range(100, 116)))  # an offload in flight across the reset
    assert engine.store_linker.open_pages()["read"] > 0  # the offload's slots
    engine.cache.reset()
    assert engine.pending_offloads() == 0
    assert engine.store_linker.in_flight() == {"loads": 0, "batches": 0, "verdicts": 0}
    assert engine.store_linker.open_pages() == {"read": 0, "write": 0}
    assert counts[("sglang_linker", "open", "reset", "open")] == 1


def test_two_instances_share_one_store_directory_or_server(store_kind: str, tmp_path: Path) -> None:
    if store_kind == "memory":
        pytest.skip("a memory store is private to its process object")
    if store_kind == "file":
        from unicache_fsm.store import FileStore

        stores = [FileStore(tmp_path / "one_directory") for _ in range(2)]
    else:
        from redis_helpers import fresh_namespace, shared_server
        from unicache_fsm.store import RedisStore

        namespace = fresh_namespace()
        stores = [RedisStore(shared_server().url, namespace=namespace) for _ in range(2)]
    first = Engine(stores[0], monitored=False)
    wrote, _ = first.compute(TOKENS)
    first.settle_offloads()
    second = Engine(stores[1])
    loaded = second.load([*TOKENS, 7], "other")
    assert loaded.loaded == 16 and loaded.slots is not None
    assert second.read(loaded.slots).same(wrote)
    first.close()
    second.close()


def test_the_store_linkers_own_jobs_are_traced_and_counted(tmp_path: Path) -> None:
    from unicache_fsm.store import MemoryStore

    trace = tmp_path / "store.jsonl"
    engine = Engine(MemoryStore(), store_trace=trace, monitored=False)
    engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    assert engine.load([*TOKENS, 3], "r1").loaded == 16
    engine.close()
    records = list(read_trace(trace))
    assert check_trace(records, bundled_spec).violation is None
    ends = {(r["machine"], r["dest"]) for r in records if r["trigger"] == "finish"}
    assert ends == {("store_offload", "landed"), ("store_load", "landed")}
    per_machine = engine.store_linker.counter.per_machine()
    assert set(per_machine) == {"store_load", "store_offload"}
    cov = engine.store_linker.coverage()
    assert "start: queued -> started" not in cov.missing(bundled_spec("store_load"))


def test_bad_input_is_a_typed_error_naming_the_culprit() -> None:
    from unicache_fsm.integrations.errors import LinkerConfigError, UnknownBatchError
    from unicache_fsm.integrations.sglang import StoreLinker
    from unicache_fsm.store import MemoryStore

    engine = Engine(MemoryStore(), monitored=False)
    kv = engine.pools[PoolName.KV]
    with pytest.raises(LinkerConfigError) as info:
        StoreLinker.from_store(MemoryStore(), {PoolName.KV: kv, PoolName.MAMBA: kv})
    assert info.value.value == PoolName.MAMBA
    with pytest.raises(LinkerConfigError) as info:
        StoreLinker.from_store(MemoryStore(), {})
    assert info.value.argument == "pools"
    with pytest.raises(UnknownBatchError) as err:
        engine.store_linker.finish_layer_wise_loading(5)
    assert (err.value.index, err.value.started) == (5, ())
    engine.close()


def test_a_full_disk_under_the_trace_stops_the_trace_not_the_linker() -> None:
    """Every trace write fails (``/dev/full``): SGLang's calls and `close()` (which
    flushes the trace) go on, the load lands, and the failure is kept in
    `trace_error`."""
    from unicache_fsm.store import MemoryStore

    engine = Engine(MemoryStore(), store_trace="/dev/full", monitored=False)
    engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    assert engine.load([*TOKENS, 3], "r1").loaded == 16
    engine.close()
    assert isinstance(engine.store_linker.trace_error, OSError)
