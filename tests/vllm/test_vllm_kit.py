"""The conformance kit for vLLM (`check_offloading_spec`): vLLM's own CPU spec (LRU,
ARC) and a correct out-of-tree policy conform; each of the eight planted mutants
(tests/vllm/vllm_mutants.py), selected through vLLM's own factories by the connector's
extra config, is caught; a bad config is a typed error naming the key, exit 2 from the
shell. Fixed seeds, short programs."""

from __future__ import annotations

import json

import pytest
from vllm_mutants import CORRECT_CONFIGS, MUTANT_CONFIGS

from unicache_fsm.integrations.vllm.kit import (
    OffloadingKitConfigError,
    check_offloading_spec,
    main,
)

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


def test_eight_mutants_are_planted() -> None:
    assert len(MUTANT_CONFIGS) == 8


def test_the_worker_check_catches_wrong_bytes_and_notes_a_worker_it_cannot_run() -> None:
    report = check_offloading_spec(
        MUTANT_CONFIGS["a worker lands bytes in the wrong block"], seeds=[], steps=0
    )
    assert [f.kind for f in report.findings] == ["wrong bytes"]
    cpu = check_offloading_spec(CORRECT_CONFIGS["vLLM's CPU spec, LRU"], seeds=[], steps=0)
    assert cpu.ok and "worker not checked" in cpu.notes[0]  # vLLM's CPU worker needs CUDA


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


def test_the_shell_entry_point_exits_2_on_a_bad_config_and_1_on_findings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["[1]"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(['{"spec_name": "NoSuchSpec"}']) == 2
    assert "spec_name" in capsys.readouterr().err
    assert main([json.dumps(MUTANT_CONFIGS["HIT before the store completed"])]) == 1
    assert "found" in capsys.readouterr().out
    assert main([json.dumps(CORRECT_CONFIGS["vLLM's CPU spec, ARC"])]) == 0
