"""The conformance kit for vLLM (`check_offloading_spec`): vLLM's own CPU spec (LRU,
ARC) and a correct out-of-tree policy conform; each of the seven planted mutants
(tests/vllm/vllm_mutants.py), selected through vLLM's own factories by the connector's
extra config, is caught; a bad config is a typed error naming the key, exit 2 from the
shell. Fixed seeds, short programs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_mutants import CORRECT_CONFIGS, MUTANT_CONFIGS

from unicache_fsm.integrations.vllm.kit import OffloadingKitConfigError, check_offloading_spec

SEEDS = range(4)
STEPS = 150


@pytest.mark.parametrize("name", sorted(CORRECT_CONFIGS))
def test_correct_specs_conform(name: str) -> None:
    report = check_offloading_spec(CORRECT_CONFIGS[name], seeds=SEEDS, steps=STEPS)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", sorted(MUTANT_CONFIGS))
def test_every_mutant_is_caught(name: str) -> None:
    report = check_offloading_spec(MUTANT_CONFIGS[name], seeds=SEEDS, steps=STEPS)
    assert not report.ok, f"{name}: not caught"
    assert "seed" in str(report)


def test_seven_mutants_are_planted() -> None:
    assert len(MUTANT_CONFIGS) >= 6


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"spec_name": "NoSuchSpec"}, "spec_name"),
        ({"spec_name": "X", "spec_module_path": "no_such_module_here"}, "spec_module_path"),
        ({"spec_name": "NoSuchSpec", "spec_module_path": "vllm_mutants"}, "spec_name"),
        ({"spec_name": "CPUOffloadingSpec"}, "extra_config"),  # no cpu_bytes_to_use
    ],
)
def test_a_bad_config_is_a_typed_error_naming_the_key(extra: dict[str, str], key: str) -> None:
    with pytest.raises(OffloadingKitConfigError) as info:
        check_offloading_spec(extra, seeds=[0], steps=1)
    assert info.value.key == key


def test_the_shell_entry_point_exits_2_on_a_bad_config_and_1_on_findings() -> None:
    run = [sys.executable, "-m", "unicache_fsm.integrations.vllm.kit"]
    bad = subprocess.run([*run, "[1]"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    found = subprocess.run(
        [*run, json.dumps(MUTANT_CONFIGS["HIT before the store completed"])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,
    )
    assert found.returncode == 1, found.stdout + found.stderr
    assert "found" in found.stdout
