"""Review of issue 33 (rev33): the launch JSON through SGLang 0.5.23's own
`UnifiedCacheLinkerConfig.from_dict` and `create_unified_cache_linker`, attacked where
a serving engineer's configuration or model differs from the tests' defaults.

Each test names the defect it found in a one-line comment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_cache.linker_config import UnifiedCacheLinkerConfig
from sglang.srt.mem_cache.unified_cache.linker_factory import create_unified_cache_linker
from sglang.srt.runtime_context import get_parallel
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

import sglang_linker.engine  # noqa: F401  (SGLang's logging quieted, as every test here)
from sglang_linker.engine import Engine
from unicache_fsm.fsm.conformance import check_trace, read_trace
from unicache_fsm.fsm.loader import bundled_spec
from unicache_fsm.integrations.errors import LinkerConfigError
from unicache_fsm.store import FaultPolicy, FaultyStore, MemoryStore, StoreOffload

MODULE = "unicache_fsm.integrations.sglang"
PAGE, TOKENS = 4, 64


def _store_linker(**extra: Any) -> dict[str, Any]:
    return {"linker": "StoreLinker", "linker_module_path": MODULE, "linker_extra_config": extra}


def _monitor(wrap: dict[str, Any], **extra: Any) -> dict[str, Any]:
    extra = {"wrap": wrap, **extra}
    return {"linker": "ContractMonitor", "linker_module_path": MODULE, "linker_extra_config": extra}


def _mha(dtype: torch.dtype) -> MHATokenToKVPool:
    return MHATokenToKVPool(
        size=TOKENS,
        page_size=PAGE,
        dtype=dtype,
        head_num=2,
        head_dim=4,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
    )


def _mla() -> MLATokenToKVPool:
    return MLATokenToKVPool(
        size=TOKENS,
        page_size=PAGE,
        dtype=torch.bfloat16,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
    )


def launch(config: dict[str, Any], kv: Any, components: set[Any] | None = None) -> Any:
    """The linker a worker launched with backend ``dynamic`` and `config` builds over
    the KV pool `kv` (Full only unless `components` says otherwise)."""
    components = components or {ComponentType.FULL}
    args = ServerArgs(
        model_path="dummy",
        page_size=PAGE,
        enable_unified_cache_external_linker=True,
        unified_cache_external_linker_backend="dynamic",
        unified_cache_external_linker_config=config,
    )
    set_global_server_args_for_scheduler(args)
    allocator = PagedTokenToKVPoolAllocator(
        size=TOKENS, page_size=PAGE, dtype=kv.dtype, device="cpu", kvcache=kv, need_sort=False
    )
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=ReqToTokenPool(
            size=4, max_context_len=256, device="cpu", enable_memory_saver=False
        ),
        token_to_kv_pool_allocator=allocator,
        page_size=PAGE,
        tree_components=tuple(sorted(components, key=int)),
        tree_core_backend="python",
    )
    UnifiedCacheLinkerConfig.from_dict(config)  # what SGLang's argument check runs
    return create_unified_cache_linker(
        args,
        params,
        backend="dynamic",
        config=config,
        components=components,
        forward_stream=None,
    )


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_rev33_fp8_e4m3_and_e5m2_caches_never_share_a_namespace(tmp_path: Path) -> None:
    # defect: SGLang stores every fp8 KV cache as uint8, so the identity's dtype (read
    # from the buffers) is "torch.uint8" for both fp8 formats: same digest, shared pages
    config = _store_linker(store=f"file:{tmp_path / 'kv'}", namespace="team")
    one = launch(config, _mha(torch.float8_e4m3fn))
    two = launch(config, _mha(torch.float8_e5m2))
    try:
        assert one.namespace != two.namespace
    finally:
        one.close()
        two.close()


def test_rev33_an_mla_pool_is_one_typed_line_naming_the_pool() -> None:
    # defect: the identity reads k_buffer / v_buffer before the pool is checked, so an
    # MLA model (DeepSeek's pool has kv_buffer only) stops the worker with AttributeError
    with pytest.raises(LinkerConfigError) as info:
        launch(_store_linker(), _mla())
    assert info.value.argument == "pools"
    assert "MLATokenToKVPool" in str(info.value) and len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("where", ["missing_dir", "a_directory"])
def test_rev33_a_trace_path_that_cannot_be_opened_is_one_typed_line(
    tmp_path: Path, where: str
) -> None:
    # defect: `trace` is opened unchecked: a missing folder or a directory stops the
    # worker with a bare FileNotFoundError / IsADirectoryError, not a LinkerConfigError
    trace = tmp_path / "no" / "such" / "t.jsonl" if where == "missing_dir" else tmp_path
    before = _open_fds()
    config = _store_linker(store=f"file:{tmp_path / 'kv'}", trace=str(trace))
    with pytest.raises(LinkerConfigError) as info:
        launch(config, _mha(torch.bfloat16))
    assert info.value.argument == "linker_extra_config.trace"
    assert len(str(info.value).splitlines()) == 1
    assert _open_fds() <= before  # the store it opened was closed (its lock file too)


def test_rev33_a_monitor_trace_that_cannot_be_opened_closes_the_wrapped_linker(
    tmp_path: Path,
) -> None:
    # defect: ContractMonitor builds the wrapped linker, then opens its trace: a missing
    # folder raises a bare FileNotFoundError and leaves the wrapped linker's store open
    wrap = _store_linker(store=f"file:{tmp_path / 'kv'}")
    before = _open_fds()
    with pytest.raises(LinkerConfigError) as info:
        launch(
            _monitor(wrap, mode="record", trace=str(tmp_path / "no" / "t.jsonl")),
            _mha(torch.bfloat16),
        )
    assert info.value.argument == "linker_extra_config.trace"
    assert len(str(info.value).splitlines()) == 1
    assert _open_fds() <= before  # the wrapped StoreLinker's store was closed


def test_rev33_a_component_it_cannot_serve_is_refused_at_start() -> None:
    # defect: SGLang 0.5.23's wrapper sends a transfer for every tree component (Mamba
    # included, no skip as for SWA); StoreLinker accepts a MAMBA component at start and
    # then raises LinkerConfigError from the first lookup, killing the worker mid-serving
    config = _store_linker()
    with pytest.raises(LinkerConfigError) as info:
        launch(config, _mha(torch.bfloat16), components={ComponentType.FULL, ComponentType.MAMBA})
    assert "MAMBA" in str(info.value) and len(str(info.value).splitlines()) == 1


def _rank(tp: int, config: dict[str, Any]) -> Engine:
    """Tensor-parallel rank `tp` of two, launched with `config` (SGLang publishes the
    rank in its runtime context before the cache and its linker are built)."""
    with get_parallel().override(tp_rank=tp, tp_size=2, attn_tp_size=2, moe_tp_size=2):
        return Engine.launched(config, monitored=False)


def _checked_lines(path: Path) -> int:
    """The records in the trace at `path`, every one replayed by check-trace's checker."""
    records = list(read_trace(path))
    assert records and check_trace(records, bundled_spec).violation is None
    return len(records)


def test_rev33_two_ranks_launched_with_one_trace_path_keep_a_readable_trace(
    tmp_path: Path,
) -> None:
    # defect: every rank of a TP/PP deployment gets the same launch JSON, and each
    # StoreLinker opened `trace` with "w": the ranks truncated and overwrote each
    # other's records. Each rank now writes its own file, PATH.tp{tp}.pp{pp}.cp{cp}
    trace = tmp_path / "linker.jsonl"
    config = _store_linker(trace=str(trace))
    first = _rank(0, config)
    first.compute(list(range(1, 17)))
    first.settle_offloads()
    second = _rank(1, config)  # the next rank starts
    first.compute(list(range(100, 116)))
    first.settle_offloads()
    second.compute(list(range(1, 17)))
    second.settle_offloads()
    wrote = [e.store_linker.trace.seq for e in (first, second)]
    first.close()
    second.close()
    files = [tmp_path / f"linker.tp{tp}.pp0.cp0.jsonl" for tp in (0, 1)]
    assert sorted(tmp_path.iterdir()) == sorted(files)
    assert [_checked_lines(f) for f in files] == wrote


def test_rev33_two_ranks_of_a_monitor_launched_with_one_trace_path_write_one_file_each(
    tmp_path: Path,
) -> None:
    # the same defect in ContractMonitor: its protocol trace is per rank too
    config = _monitor(_store_linker(), mode="record", trace=str(tmp_path / "monitor.jsonl"))
    ranks = [_rank(tp, config) for tp in (0, 1)]
    for engine in ranks:
        engine.compute(list(range(1, 17)))
        engine.settle_offloads()
    for engine in ranks:
        engine.close()
    wrote = [e.linker.monitor.trace.seq for e in ranks]  # (close records too)
    files = [tmp_path / f"monitor.tp{tp}.pp0.cp0.jsonl" for tp in (0, 1)]
    assert [_checked_lines(f) for f in files] == wrote


def test_rev33_a_single_rank_writes_the_trace_path_it_was_given(tmp_path: Path) -> None:
    # one rank: the operator's path as given (no rank in the name)
    trace = tmp_path / "linker.jsonl"
    engine = Engine.launched(_store_linker(trace=str(trace)), monitored=False)
    engine.compute(list(range(1, 17)))
    engine.settle_offloads()
    wrote = engine.store_linker.trace.seq
    engine.close()
    assert _checked_lines(trace) == wrote


def test_rev33_a_linker_counts_and_traces_only_its_own_stores_jobs(tmp_path: Path) -> None:
    # defect: StoreLinker attaches its counter and trace to the process-wide store job
    # machines, so each linker's `coverage()` and trace also hold every other linker's
    # store jobs (two models, a draft beside a target, the check-linker kit's rigs)
    first = Engine.launched(_store_linker(trace=str(tmp_path / "first.jsonl")), monitored=False)
    second = Engine.launched(_store_linker(), monitored=False)
    before = first.store_linker.trace.seq
    second.compute(list(range(1, 17)))
    second.settle_offloads()
    seen = first.store_linker.trace.seq - before
    first.close()
    second.close()
    assert seen == 0, f"the first linker recorded {seen} transitions of the second's store"


def test_rev33_a_linker_counts_its_own_stores_jobs_behind_a_wrapper(tmp_path: Path) -> None:
    # the other half of the filter: a store behind a wrapper (a FaultyStore injecting
    # nothing) is still the linker's own, and every transition of its jobs is counted
    inner = MemoryStore()
    own = Engine(FaultyStore(inner, FaultPolicy()), monitored=False)
    other = Engine.launched(_store_linker(), monitored=False)
    other.compute(list(range(1, 17)))
    other.settle_offloads()
    own.compute(list(range(1, 17)))
    own.compute(list(range(100, 116)))
    own.settle_offloads()
    offloads = [job for job in inner.recent_jobs() if isinstance(job, StoreOffload)]
    counted = own.store_linker.counter.per_machine()
    own.close()
    other.close()
    assert len(offloads) >= 2
    assert counted == {"store_offload": 2 * len(offloads)}  # START and FINISH of each
