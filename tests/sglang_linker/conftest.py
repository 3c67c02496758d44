"""The SGLang integration tests' wiring: SGLang 0.5.23 or a loud skip (a failure in CI),
and the three stores every flow runs on.

These tests run with the SGLang oracle venv's python (scripts/sglang_integration.sh);
the main pytest run ignores this folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from unicache_fsm.integrations.errors import SglangUnavailableError

try:
    import unicache_fsm.integrations.sglang  # noqa: F401

    UNAVAILABLE: str | None = None
except SglangUnavailableError as exc:
    UNAVAILABLE = str(exc)

from sglang_linker.stores import STORES


def pytest_report_header(config: pytest.Config) -> str:
    if UNAVAILABLE is not None:
        return f"SGLang integration: UNAVAILABLE -- {UNAVAILABLE}"
    import sglang

    return f"SGLang integration: SGLang from {os.path.dirname(sglang.__file__)}"


@pytest.fixture(autouse=True)
def _require_sglang() -> None:
    if UNAVAILABLE is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"SGLang 0.5.23 unavailable in CI: {UNAVAILABLE}", pytrace=False)
    pytest.skip(f"SGLANG 0.5.23 UNAVAILABLE (nothing was run): {UNAVAILABLE}")


@pytest.fixture(params=STORES)
def store_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis" and not os.environ.get("CI"):
        from unicache_fsm.testing.redis_server import available

        if not available():
            pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    yield request.param
