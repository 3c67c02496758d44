"""The conformance kit for vLLM: does an `OffloadingSpec`'s manager keep vLLM's contract?

`check_offloading_spec(extra_config, *, seeds=range(8), steps=200)` builds the spec the
way vLLM's offloading connector does (`OffloadingSpecFactory.get_spec_cls` on the
connector's extra config: ``spec_name``, and ``spec_module_path`` for an out-of-tree
spec, plus the spec's own keys such as ``cpu_bytes_to_use`` or ``eviction_policy``),
then, once per seed, takes a fresh manager, wraps it in a `MonitoredManager` (raise
mode) and lets a `Driver` seeded with that seed play the connector for `steps` steps.
The monitor checks vLLM's obligations (docs/vllm.md): lock discipline, loads only of
HIT blocks, no eviction of blocks a load or a store holds, failed stores not loadable,
no block lost or found behind the books' back, answers of the right types. The first
breach of each program is a `Finding` (its seed and step, the violation, and the
program's last answers); an exception of the manager on a legal call is one too.

Then, with ``worker=True``, the worker: `spec.get_worker` on CPU tensors (random bytes,
eight blocks, two tensors), three blocks stored through the manager and the worker
(inside `MonitoredWorker`), the KV tensors zeroed, the blocks loaded back into other
GPU blocks: every byte must come back where the load spec put it ("wrong bytes"
otherwise). A spec whose worker cannot run here (vLLM's own CPU worker needs CUDA) is
noted in `KitReport.notes`, not judged.

`KitReport.ok` is True when no program found anything; `str(report)` is the report.
A config that does not name a loadable spec is an `OffloadingKitConfigError` naming
the key at fault; nothing runs.

From a shell: ``python -m unicache_fsm.integrations.vllm.kit '{"spec_name": ...}'``
prints the report and exits 0 (conforms), 1 (findings) or 2 (bad config, one line).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    OffloadingSpec,
    ReqContext,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.integrations.vllm.driver import Driver, offload_keys
from unicache_fsm.integrations.vllm.machines import OffloadingViolation, WrongAnswerError
from unicache_fsm.integrations.vllm.monitor import MonitoredManager, MonitoredWorker

__all__ = [
    "Finding",
    "KitReport",
    "OffloadingKitConfigError",
    "check_offloading_spec",
    "offloading_config",
]


class OffloadingKitConfigError(UnicacheFsmError, ValueError):
    """The kit's config names no usable `OffloadingSpec`; `key` is the culprit."""

    def __init__(self, msg: str, *, key: str, value: object) -> None:
        self.key = key
        self.value = value
        super().__init__(msg)


@attrs.frozen
class Finding:
    """The first breach of one seeded program."""

    seed: int
    step: int
    kind: str  # "violation", "wrong answer" or "raised"
    message: str
    last_answers: tuple[tuple[Any, ...], ...]

    def __str__(self) -> str:
        tail = "\n".join(f"    {a!r}" for a in self.last_answers) or "    (none)"
        return (
            f"seed {self.seed}, step {self.step}: {self.kind}\n  {self.message}\n"
            f"  last answers:\n{tail}"
        )


@attrs.frozen
class KitReport:
    """What the kit found for one spec config."""

    spec: str
    programs: int
    steps: int
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.findings

    def __str__(self) -> str:
        head = f"{self.spec}: {self.programs} program(s) of {self.steps} step(s): "
        notes = "".join(f"\n  note: {n}" for n in self.notes)
        if self.ok:
            return head + "no breach of vLLM 0.33.0's offloading contract" + notes
        found = "\n".join(map(str, self.findings))
        return head + f"{len(self.findings)} breach(es)\n{found}{notes}"


def offloading_config(
    extra_config: Mapping[str, Any], *, worker_kv_bytes_per_block: int = 4096
) -> OffloadingConfig:
    """A one-worker `OffloadingConfig` carrying `extra_config` (two KV-cache groups)."""
    groups = tuple(
        OffloadingGroupConfig(tokens_per_block=16, layer_names=(f"layer.{g}",), group_id=g)
        for g in range(2)
    )
    return OffloadingConfig(
        groups=groups,
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=False,
        extra_config=dict(extra_config),
        engine_id="unicache-fsm-kit",
        model=OffloadingModelConfig(name="unicache-fsm-kit", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )


def _spec_class(extra_config: Mapping[str, Any]) -> type[OffloadingSpec]:
    name = extra_config.get("spec_name", "CPUOffloadingSpec")
    try:
        cls: type[OffloadingSpec] = OffloadingSpecFactory.get_spec_cls(extra_config)
    except ModuleNotFoundError as exc:
        msg = f"spec_module_path {extra_config.get('spec_module_path')!r} cannot be imported: {exc}"
        raise OffloadingKitConfigError(msg, key="spec_module_path", value=exc.name) from None
    except AttributeError:
        msg = f"spec_module_path {extra_config.get('spec_module_path')!r} has no class {name!r}"
        raise OffloadingKitConfigError(msg, key="spec_name", value=name) from None
    except (ValueError, AssertionError):
        msg = (
            f"spec_name {name!r} is neither registered with vLLM nor found through "
            "spec_module_path, or is not an OffloadingSpec subclass"
        )
        raise OffloadingKitConfigError(msg, key="spec_name", value=name) from None
    return cls


def check_offloading_spec(
    extra_config: Mapping[str, Any],
    *,
    seeds: Iterable[int] = range(8),
    steps: int = 200,
    worker: bool = True,
) -> KitReport:
    """Run one seeded program per seed against fresh managers of the spec, then check
    its worker's bytes (module docstring)."""
    cls = _spec_class(extra_config)
    findings: list[Finding] = []
    notes: list[str] = []
    seeds = list(seeds)
    for seed in seeds:
        _spec, manager = _build(cls, extra_config)
        finding = _run(Driver(manager, random.Random(seed).randrange), seed, steps)
        if finding is not None:
            findings.append(finding)
    if worker:
        spec, manager = _build(cls, extra_config)
        try:
            finding = _check_worker(spec, manager)
        except _NotHere as exc:
            notes.append(str(exc))
        else:
            if finding is not None:
                findings.append(finding)
    return KitReport(cls.__name__, len(seeds), steps, tuple(findings), tuple(notes))


def _build(
    cls: type[OffloadingSpec], extra_config: Mapping[str, Any]
) -> tuple[OffloadingSpec, MonitoredManager]:
    try:
        spec = cls(offloading_config(extra_config))
        return spec, MonitoredManager(spec.get_manager(), mode="raise")
    except Exception as exc:
        msg = f"building {cls.__name__} and its manager failed: {exc!r}"
        raise OffloadingKitConfigError(msg, key="extra_config", value=dict(extra_config)) from exc


class _NotHere(Exception):
    """The worker cannot be checked in this process (a note, not a finding)."""


_BLOCKS = 8
_STORE_FROM = [5, 2, 7]
_LOAD_INTO = [0, 4, 6]


def _gpu(block_ids: list[int]) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(block_ids, group_sizes=[len(block_ids)], block_indices=[0])


def _await(worker: MonitoredWorker, job: int) -> bool:
    """The job's success, driving the worker a bounded number of rounds."""
    for _ in range(100):
        worker.wait({job})
        for result in worker.get_finished():
            if result.job_id == job:
                return bool(result.success)
    raise WrongAnswerError(f"get_finished() for job {job}", None, "the job reported")


def _caches() -> CanonicalKVCaches:
    gen = torch.Generator().manual_seed(36)
    sizes = (96, 160)
    tensors = [
        CanonicalKVCacheTensor(
            torch.randint(-128, 128, (_BLOCKS, size), dtype=torch.int8, generator=gen), size
        )
        for size in sizes
    ]
    refs = [[CanonicalKVCacheRef(i, size)] for i, size in enumerate(sizes)]
    return CanonicalKVCaches(tensors=tensors, group_data_refs=refs)


def _check_worker(spec: OffloadingSpec, manager: MonitoredManager) -> Finding | None:
    caches = _caches()
    try:
        inner = spec.get_worker(caches)
    except Exception as exc:
        raise _NotHere(f"worker not checked: get_worker on CPU tensors failed: {exc}") from None
    worker = MonitoredWorker(inner, protocol=manager.protocol)
    before = [t.tensor.clone() for t in caches.tensors]
    keys = offload_keys(len(_STORE_FROM), 1)
    ctx = ReqContext("kit-worker")
    done: list[tuple[Any, ...]] = []
    try:
        with manager.lock:
            manager.on_new_request(ctx)
            out = manager.prepare_store(keys, ctx)
        if out is None or list(out.keys_to_store) != keys:
            raise _NotHere("worker not checked: the manager would not store three blocks")
        ok = worker.submit_store(1, _gpu(_STORE_FROM), out.store_spec) and _await(worker, 1)
        done.append(("store", ok))
        with manager.lock:
            manager.complete_store(keys, ctx, ok)
            load = manager.prepare_load(keys, ctx) if ok else None
        if load is None:
            raise _NotHere("worker not checked: the worker failed the store")
        for t in caches.tensors:
            t.tensor.zero_()
        ok = worker.submit_load(2, load, _gpu(_LOAD_INTO)) and _await(worker, 2)
        done.append(("load", ok))
        with manager.lock:
            manager.complete_load(keys, ctx)
            manager.on_request_finished(ctx)
    except (OffloadingViolation, WrongAnswerError) as exc:
        return Finding(-1, len(done), "worker", str(exc), tuple(done))
    if not ok:
        raise _NotHere("worker not checked: the worker failed the load")
    for t, then in zip(caches.tensors, before, strict=True):
        for src, dst in zip(_STORE_FROM, _LOAD_INTO, strict=True):
            if not torch.equal(t.tensor[dst], then[src]):
                msg = f"block {src}'s bytes did not come back into block {dst}"
                return Finding(-1, len(done), "wrong bytes", msg, tuple(done))
    return None


def _run(driver: Driver, seed: int, steps: int) -> Finding | None:
    for step in range(steps):
        try:
            driver.step()
        except OffloadingViolation as exc:
            return _finding(driver, seed, step, "violation", str(exc))
        except WrongAnswerError as exc:
            return _finding(driver, seed, step, "wrong answer", str(exc))
        except Exception as exc:  # the manager failed a legal call: a finding too
            return _finding(driver, seed, step, "raised", f"{type(exc).__name__}: {exc}")
    return None


def _finding(driver: Driver, seed: int, step: int, kind: str, message: str) -> Finding:
    return Finding(seed, step, kind, message, tuple(driver.transcript[-5:]))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(
            "usage: python -m unicache_fsm.integrations.vllm.kit EXTRA_CONFIG_JSON", file=sys.stderr
        )
        return 2
    try:
        extra = json.loads(args[0])
        if not isinstance(extra, dict):
            raise OffloadingKitConfigError("the config must be a JSON object", key="", value=extra)
        report = check_offloading_spec(extra)
    except json.JSONDecodeError as exc:
        print(f"error: the config is not JSON: {exc}", file=sys.stderr)
        return 2
    except OffloadingKitConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
