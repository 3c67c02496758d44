"""The vLLM tests' wiring: vLLM 0.33.0, or nothing collected (a failure in CI).

These tests run with the vLLM venv's python (scripts/vllm_integration.sh, which builds
or reuses it with scripts/vllm_env.sh); the main pytest run ignores this folder.
"""

from __future__ import annotations

import os

import pytest

from unicache_fsm.integrations.errors import VllmUnavailableError

try:
    import unicache_fsm.integrations.vllm  # noqa: F401

    UNAVAILABLE: str | None = None
except VllmUnavailableError as exc:
    UNAVAILABLE = str(exc)
    if os.environ.get("CI"):
        raise  # CI must not pass with nothing run
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header(config: pytest.Config) -> str:
    if UNAVAILABLE is not None:
        return f"vLLM integration: UNAVAILABLE (nothing collected) -- {UNAVAILABLE}"
    import vllm

    return f"vLLM integration: vLLM from {os.path.dirname(vllm.__file__)}"
