"""The one drift test: every enum that mirrors a spec names exactly what the spec declares.

Code fires triggers and compares states through enums, never free strings; each enum is
written by hand next to the records it belongs to, so this test holds every one of them
to its TOML: trigger enums to the spec's triggers, state enums to the spec's flat
configurations (what a record's state slot holds). Every bundled spec must be listed
here, so a new machine cannot arrive without its mirrors. (The executors check the same
when they are bound; this test fails before anything is built.)
"""

from __future__ import annotations

import enum

import pytest

from unicache_fsm.fsm.flat import flatten
from unicache_fsm.fsm.loader import bundled_machines, bundled_spec
from unicache_fsm.integrations.protocol import (
    SglangLinkerState,
    SglangLinkerTrigger,
    SglangLoadState,
    SglangLoadTrigger,
    SglangOffloadState,
    SglangOffloadTrigger,
)
from unicache_fsm.linker.load import LoadState, LoadTrigger
from unicache_fsm.linker.offload import OffloadState, OffloadTrigger
from unicache_fsm.store.jobs import (
    StoreLoadState,
    StoreLoadTrigger,
    StoreOffloadState,
    StoreOffloadTrigger,
)
from unicache_fsm.tree.residency import ResidencyTrigger

#: spec -> (trigger enum, state enum or None when the configurations are not mirrored:
#: node residency has dozens, read through precomputed sets instead)
MIRRORS: dict[str, tuple[type[enum.Enum], type[enum.Enum] | None]] = {
    "load_transaction": (LoadTrigger, LoadState),
    "offload": (OffloadTrigger, OffloadState),
    "store_load": (StoreLoadTrigger, StoreLoadState),
    "store_offload": (StoreOffloadTrigger, StoreOffloadState),
    "node_residency": (ResidencyTrigger, None),
    "sglang_linker": (SglangLinkerTrigger, SglangLinkerState),
    "sglang_load": (SglangLoadTrigger, SglangLoadState),
    "sglang_offload": (SglangOffloadTrigger, SglangOffloadState),
}


def test_every_bundled_spec_has_its_mirrors_listed() -> None:
    # vllm_* mirror enums live in unicache_fsm.integrations.vllm, which imports only
    # beside vLLM: tests/vllm/test_spec_mirrors.py holds them to their specs
    assert set(MIRRORS) == {m for m in bundled_machines() if not m.startswith("vllm_")}


@pytest.mark.parametrize("machine", sorted(MIRRORS))
def test_mirror_enums_match_the_spec(machine: str) -> None:
    spec = bundled_spec(machine)
    triggers, states = MIRRORS[machine]
    assert sorted(str(m.value) for m in triggers) == sorted(spec.triggers()), triggers
    if states is not None:
        configs = flatten(spec).configs
        assert sorted(str(m.value) for m in states) == sorted(configs), states
    for mirror in (triggers, states):
        if mirror is not None:  # str enums: they compare equal to the names executors use
            assert all(isinstance(m, str) for m in mirror), mirror
