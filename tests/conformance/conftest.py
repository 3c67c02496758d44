"""The differential suite's pytest wiring: the oracle check, examples per profile, and
which configurations run.

- **Never a silent pass.** When SGLang 0.5.23 cannot be imported, every test here fails
  in CI (``CI`` set) and is skipped elsewhere, with the reason in each result, in the
  report header and in a banner at the end of the run.
- **Sequences per configuration** follow ``UNICACHE_FSM_PROFILE``: dev 30, ci 200,
  fuzz 3000; ``UNICACHE_CONFORMANCE_EXAMPLES=N`` overrides.
- **Configurations**: all 12, or the comma-separated names in
  ``UNICACHE_CONFORMANCE_CONFIGS`` (e.g. ``swa8-p4,full-p1-offload``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import unicache_fsm
from conformance.model import CONFIGS, Config, config_named
from conformance.sglang_side import SglangUnavailable, load_sglang
from unicache_fsm.testing.profiles import ENV_VAR

EXAMPLES_BY_PROFILE = {"dev": 30, "ci": 200, "fuzz": 3000}

try:
    _SG = load_sglang()
    UNAVAILABLE: str | None = None
except SglangUnavailable as exc:
    _SG = None
    UNAVAILABLE = str(exc)


CHECKOUT = Path(__file__).resolve().parents[2]
PROJECT_FROM = Path(unicache_fsm.__file__).resolve().parents[1]


def examples() -> int:
    override = os.environ.get("UNICACHE_CONFORMANCE_EXAMPLES")
    if override:
        return int(override)
    return EXAMPLES_BY_PROFILE[os.environ.get(ENV_VAR, "ci")]


def selected_configs() -> list[Config]:
    names = os.environ.get("UNICACHE_CONFORMANCE_CONFIGS", "").strip()
    if not names:
        return list(CONFIGS)
    return [config_named(name.strip()) for name in names.split(",") if name.strip()]


def _oracle_line() -> str:
    if UNAVAILABLE is not None:
        where = "FAILING (CI is set)" if os.environ.get("CI") else "SKIPPED"
        return f"conformance oracle UNAVAILABLE -- every conformance test {where}: {UNAVAILABLE}"
    import sglang

    return (
        f"conformance oracle: SGLang {_SG.version} (UnifiedRadixCache, python tree core) "
        f"from {os.path.dirname(sglang.__file__)}; {examples()} sequences per configuration; "
        f"project tree from {PROJECT_FROM}"
    )


def pytest_report_header(config: pytest.Config) -> str:
    return _oracle_line()


@pytest.fixture(autouse=True)
def _require_oracle() -> None:
    # the tree under test must be this checkout's, whatever the venv's editable install says
    assert PROJECT_FROM == CHECKOUT, (
        f"unicache_fsm is imported from {PROJECT_FROM}, not from this checkout {CHECKOUT}: "
        "run the suite from the checkout's root (python -m pytest tests/conformance)"
    )
    if UNAVAILABLE is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"SGLang oracle unavailable in CI: {UNAVAILABLE}", pytrace=False)
    pytest.skip(f"SGLANG ORACLE UNAVAILABLE (nothing was compared): {UNAVAILABLE}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if UNAVAILABLE is not None:
        bar = "!" * 78
        terminalreporter.write_line(bar, red=True, bold=True)
        terminalreporter.write_line(_oracle_line(), red=True, bold=True)
        terminalreporter.write_line(
            "build it: bash scripts/sglang_env.sh, then run scripts/conformance.sh",
            red=True,
            bold=True,
        )
        terminalreporter.write_line(bar, red=True, bold=True)
