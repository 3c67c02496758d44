"""Issue 11's behaviours 1-9, one short program each (`behaviours.BEHAVIOURS`): the
project's tree must agree with SGLang 0.5.23 on every one of them."""

from __future__ import annotations

import pytest

from conformance.behaviours import BEHAVIOURS, Behaviour
from conformance.harness import run_program
from conformance.model import config_named
from conformance.project_side import ProjectSide


@pytest.mark.parametrize("behaviour", BEHAVIOURS, ids=lambda b: f"behaviour-{b.number}")
def test_behaviour_matches_sglang_0_5_23(behaviour: Behaviour) -> None:
    from conformance.sglang_side import SglangSide

    config = config_named(behaviour.config)
    run_program(config, behaviour.program, SglangSide(config), ProjectSide(config))
