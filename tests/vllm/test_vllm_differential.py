"""The differential suite: vLLM 0.33.0's own CPU manager (LRU and ARC) against the
project's executable model of it (`ModelManager`), on the same Hypothesis programs.

One `Driver` per side plays vLLM's connector; the model's side replays the choices the
vLLM side drew, step by step, and every observable answer (lookup results, what
`prepare_store` stores and evicts or that it refused, what is loadable after
`complete_store`) must be equal. Both managers run inside a `MonitoredManager` in
raise mode, so either breaking the contract fails the test too. There is no named
deviation: on this program domain (keys without end-token positions, no store
threshold, events off) the model agrees with vLLM on every answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from unicache_fsm.integrations.vllm import MonitoredManager
from unicache_fsm.integrations.vllm.driver import Driver
from unicache_fsm.integrations.vllm.model import ModelManager

POLICIES = ["lru", "arc"]


def _pair(policy: str, chunks: int) -> tuple[MonitoredManager, MonitoredManager]:
    theirs = MonitoredManager(CPUOffloadingManager(num_chunks=chunks, cache_policy=policy))
    ours = MonitoredManager(ModelManager(chunks, policy))
    return theirs, ours


def run_side_by_side(
    policy: str, chunks: int, steps: int, draw: Callable[[int], int]
) -> list[tuple[object, ...]]:
    """Run one program on both sides; the vLLM side's transcript when they agree."""
    theirs, ours = _pair(policy, chunks)
    drawn: list[int] = []

    def choose(n: int) -> int:
        drawn.append(draw(n))
        return drawn[-1]

    replayed = 0

    def replay(n: int) -> int:
        nonlocal replayed
        assert replayed < len(drawn), "the model side asked for a choice vLLM's did not"
        replayed += 1
        assert drawn[replayed - 1] < n
        return drawn[replayed - 1]

    vllm_side = Driver(theirs, choose)
    model_side = Driver(ours, replay)
    for _ in range(steps):
        vllm_side.step()
        model_side.step()
        assert model_side.transcript == vllm_side.transcript
        assert replayed == len(drawn), "the model side asked for fewer choices than vLLM's"
    return vllm_side.transcript


@pytest.mark.parametrize("policy", POLICIES)
@seed(36)
@settings(
    max_examples=60, deadline=None, derandomize=False, suppress_health_check=list(HealthCheck)
)
@given(data=st.data(), chunks=st.integers(1, 6), steps=st.integers(1, 40))
def test_the_model_answers_as_vllms_cpu_manager(
    policy: str, data: st.DataObject, chunks: int, steps: int
) -> None:
    run_side_by_side(policy, chunks, steps, lambda n: data.draw(st.integers(0, n - 1)))


@pytest.mark.parametrize("chunks", [3, 6])
@pytest.mark.parametrize("policy", POLICIES)
def test_longer_seeded_programs_agree_and_reach_every_path(policy: str, chunks: int) -> None:
    # ARC's adaptation only shows over long runs (ghost hits with |B2| > |B1|, a T1 at
    # exactly its target): twenty fixed 300-step programs per size reach them
    transcript: list[tuple[object, ...]] = []
    for program in range(20):
        transcript += run_side_by_side(policy, chunks, 300, random.Random(program).randrange)
    evictions = [e for e in transcript if e[0] == "store" and len(e) == 5 and e[4]]
    refusals = [e for e in transcript if e[0] == "store" and e[-1] is None]
    failed = [e for e in transcript if e[0] == "complete_store" and e[2] is False]
    assert evictions and refusals and failed
