"""The vLLM machines' mirror enums name exactly what their specs declare (the vllm_*
half of tests/test_spec_mirrors.py, which cannot import them without vLLM)."""

from __future__ import annotations

import enum

import pytest

from unicache_fsm.fsm.flat import flatten
from unicache_fsm.fsm.loader import bundled_machines, bundled_spec
from unicache_fsm.integrations.vllm.machines import (
    BlockState,
    BlockTrigger,
    ManagerState,
    ManagerTrigger,
    RequestState,
    RequestTrigger,
    TransferState,
    TransferTrigger,
)

MIRRORS: dict[str, tuple[type[enum.Enum], type[enum.Enum]]] = {
    "vllm_manager": (ManagerTrigger, ManagerState),
    "vllm_block": (BlockTrigger, BlockState),
    "vllm_request": (RequestTrigger, RequestState),
    "vllm_transfer": (TransferTrigger, TransferState),
}


def test_every_vllm_spec_has_its_mirrors_listed() -> None:
    assert set(MIRRORS) == {m for m in bundled_machines() if m.startswith("vllm_")}


@pytest.mark.parametrize("machine", sorted(MIRRORS))
def test_mirror_enums_match_the_spec(machine: str) -> None:
    spec = bundled_spec(machine)
    triggers, states = MIRRORS[machine]
    assert sorted(m.value for m in triggers) == sorted(spec.triggers())
    assert sorted(m.value for m in states) == sorted(flatten(spec).configs)
