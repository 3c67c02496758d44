"""Shared pytest configuration: Hypothesis profiles and markers.

Profiles (choose with ``UNICACHE_FSM_PROFILE``; CI sets nothing and gets ``ci``):
``dev`` (quick local runs), ``ci`` (the whole suite within minutes on 2 cores),
``fuzz`` (long campaigns).
"""

from __future__ import annotations

import pytest
import torch

from unicache_fsm.testing.profiles import load_profile

load_profile()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
