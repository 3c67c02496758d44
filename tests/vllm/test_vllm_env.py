"""The vLLM venv (scripts/vllm_env.sh) holds vLLM 0.33.0's offloading code beside the
project, on CPU torch: a smoke test of the import chain and one manager round."""

from __future__ import annotations

import importlib.metadata

import torch
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

import unicache_fsm.integrations.vllm as ours


def test_vllm_0_33_0_on_cpu_torch() -> None:
    assert importlib.metadata.version("vllm") == ours.VLLM_VERSION == "0.33.0"
    # the project's CPU torch, not the CUDA torch 2.14.0 vLLM's wheel pins
    assert torch.__version__.startswith("2.13.0")


def test_a_lookup_through_vllms_own_cpu_manager() -> None:
    manager = CPUOffloadingManager(num_chunks=2)
    ctx = ReqContext("r")
    key = make_offload_key(b"\x01" * 8, 0)
    manager.on_new_request(ctx)
    assert manager.lookup(key, ctx) is LookupResult.MISS
    out = manager.prepare_store([key], ctx)
    assert out is not None and out.keys_to_store == [key]
    assert manager.lookup(key, ctx) is LookupResult.HIT_PENDING
    manager.complete_store([key], ctx)
    assert manager.lookup(key, ctx) is LookupResult.HIT
