"""Hypothesis profiles for fuzzing with the kit: ``dev``, ``ci`` and ``fuzz``.

`register_profiles()` registers them; `load_profile()` loads the one named by the
``UNICACHE_FSM_PROFILE`` environment variable (default ``ci``):

- ``dev`` — quick local runs (30 examples);
- ``ci`` — what the test suite runs: enough examples that every transition of every
  spec is reached, and the whole suite stays within minutes on 2 cores;
- ``fuzz`` — long campaigns (thousands of examples, no health checks); usually driven
  by ``unicache-fsm fuzz --minutes M``.

No deadlines: a rule that allocates torch tensors may be slow the first time.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["ENV_VAR", "PROFILES", "load_profile", "register_profiles"]

ENV_VAR = "UNICACHE_FSM_PROFILE"
PROFILES = ("dev", "ci", "fuzz")


def register_profiles() -> None:
    settings.register_profile("dev", max_examples=30, deadline=None)
    settings.register_profile(
        "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.register_profile(
        "fuzz", max_examples=5_000, deadline=None, suppress_health_check=list(HealthCheck)
    )


def load_profile(name: str | None = None) -> str:
    """Register the profiles and load `name` (default: the environment's, else ``ci``)."""
    register_profiles()
    chosen = name or os.environ.get(ENV_VAR, "ci")
    if chosen not in PROFILES:
        msg = f"{ENV_VAR}={chosen!r} is not a profile; choose one of {', '.join(PROFILES)}"
        raise ValueError(msg)
    settings.load_profile(chosen)
    return chosen
