"""Shared pytest configuration: Hypothesis profiles and markers.

Profiles (choose with ``UNICACHE_FSM_PROFILE``; CI sets nothing and gets ``ci``):
``dev`` (quick local runs), ``ci`` (the whole suite within minutes on 2 cores),
``fuzz`` (long campaigns).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "fuzz", max_examples=5_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("UNICACHE_FSM_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
