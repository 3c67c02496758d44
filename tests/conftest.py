"""Shared pytest configuration: Hypothesis profiles and markers.

Profiles (choose with ``UNICACHE_FSM_PROFILE``; CI sets nothing and gets ``ci``):
``dev`` (quick local runs), ``ci`` (the whole suite within minutes on 2 cores),
``fuzz`` (long campaigns).

Every module of the package is imported before any test runs. Hypothesis biases some
draws towards literal constants of the "local" modules loaded at the time (those
outside site-packages and the test folders), so a derandomized hunt otherwise
generated different programs depending on which modules earlier tests happened to
import: the planted-bug hunts found their bug alone and missed it in the full suite.
With the whole package loaded up front, a hunt draws the same programs in any order.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil

import pytest
import torch
from hypothesis.internal.conjecture import providers as _providers

import unicache_fsm
from unicache_fsm.testing.profiles import load_profile

load_profile()

for _module in pkgutil.walk_packages(unicache_fsm.__path__, "unicache_fsm."):
    if _module.name != "unicache_fsm.__main__":
        with contextlib.suppress(ImportError):  # an optional dependency absent here
            importlib.import_module(_module.name)


@pytest.hookimpl(trylast=True)  # after Hypothesis's own plugin ends its initialization
def pytest_sessionstart(session: pytest.Session) -> None:
    frozen = _providers._get_local_constants()
    _providers._get_local_constants = lambda: frozen


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
