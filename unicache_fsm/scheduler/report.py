"""What a simulation reports, and how the FSM layer's share of the time is measured.

- `SimReport` — counters filled by the loop; `as_dict()` for ``--json``, `format()`
  for the terminal.
- `calibrate_dispatch(executor)` — the executor's own cost per transition, measured
  in this process on the same spec with callbacks that do nothing (a random walk over
  legal triggers). The FSM share of a run is transitions fired times this cost, over
  the wall time: callbacks do the cache's work and are not the FSM's cost.
"""

from __future__ import annotations

import functools
import random
import time
from typing import Any

import attrs

from unicache_fsm.fsm.executor import Executor

__all__ = ["SimReport", "calibrate_dispatch"]


@attrs.define(slots=True)
class SimReport:
    config: dict[str, Any] = attrs.field(factory=dict)
    requests_served: int = 0
    steps: int = 0
    prompt_tokens: int = 0
    device_hit_tokens: int = 0
    loaded_tokens: int = 0
    computed_tokens: int = 0
    decoded_tokens: int = 0
    loads_committed: int = 0
    loads_aborted: dict[str, int] = attrs.field(factory=dict)
    loads_verified: int = 0
    loads_mismatched: int = 0
    offloads_published: int = 0
    offloads_failed: int = 0
    nodes_demoted: int = 0
    bytes_loaded: int = 0
    bytes_offloaded: int = 0
    transitions: dict[str, int] = attrs.field(factory=dict)
    faults_injected: dict[str, int] = attrs.field(factory=dict)
    audits_passed: int = 0
    wall_seconds: float = 0.0
    fsm_seconds: float = 0.0

    @property
    def device_hit_rate(self) -> float:
        return self.device_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def external_hit_rate(self) -> float:
        return self.loaded_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def fsm_share(self) -> float:
        return self.fsm_seconds / self.wall_seconds if self.wall_seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["device_hit_rate"] = round(self.device_hit_rate, 4)
        out["external_hit_rate"] = round(self.external_hit_rate, 4)
        out["fsm_share"] = round(self.fsm_share, 4)
        out["requests_per_second"] = round(self.requests_served / self.wall_seconds, 1)
        return out

    def format(self) -> str:
        c = self.config
        aborted = sum(self.loads_aborted.values())
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.loads_aborted.items())) or "-"
        machines = ", ".join(f"{k} {v}" for k, v in self.transitions.items())
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults_injected.items())) or "none"
        mib = 1024 * 1024
        rows = [
            (
                "workload",
                f"{c.get('workload')} ({c.get('requests')} requests, seed {c.get('seed')})",
            ),
            (
                "setup",
                f"P={c.get('page_size')}, pool {c.get('pool_tokens')} tokens, "
                f"SWA window {c.get('swa_window') or 'off'}, executor {c.get('executor')}",
            ),
            ("requests served", f"{self.requests_served} in {self.steps} steps"),
            ("device hit rate", f"{self.device_hit_rate:.1%} of prompt tokens"),
            ("external hit rate", f"{self.external_hit_rate:.1%} of prompt tokens"),
            (
                "prompt tokens",
                f"{self.prompt_tokens}: {self.device_hit_tokens} device, "
                f"{self.loaded_tokens} loaded, {self.computed_tokens} recomputed",
            ),
            (
                "loads",
                f"{self.loads_committed} committed ({self.loads_verified} KV-verified, "
                f"{self.loads_mismatched} mismatched), {aborted} aborted ({reasons})",
            ),
            (
                "offloads",
                f"{self.offloads_published} published, {self.offloads_failed} failed; "
                f"{self.nodes_demoted} nodes demoted",
            ),
            (
                "bytes moved",
                f"{self.bytes_loaded / mib:.1f} MiB loaded, "
                f"{self.bytes_offloaded / mib:.1f} MiB offloaded",
            ),
            ("faults injected", faults),
            ("FSM transitions", machines),
            (
                "invariant audits",
                f"{self.audits_passed} passed (every {c.get('audit_every')} steps and at the end)",
            ),
            (
                "wall time",
                f"{self.wall_seconds:.2f} s ({self.requests_served / self.wall_seconds:.0f} "
                f"requests/s); FSM layer {self.fsm_share:.2%} of it",
            ),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _noop(self: object, *args: object, **kwargs: object) -> bool:
    return True


@functools.cache
def _calibration_model(spec_name: str, names: tuple[str, ...], attr: str) -> type:
    methods: dict[str, Any] = dict.fromkeys(names, _noop)
    return type(f"_Calibrate_{spec_name}", (), {"__slots__": (attr,), **methods})


def calibrate_dispatch(executor: Executor, transitions: int = 3000) -> float:
    """Seconds per transition of `executor` alone (no-op callbacks, guards true)."""
    cls = _calibration_model(
        executor.name, executor.spec.callback_names(), executor.state_attribute
    )
    kind = type(executor)
    twin = kind(executor.spec, cls, state_attribute=executor.state_attribute)
    rng = random.Random(0)
    model = cls()
    twin.initialize(model)
    plan: list[tuple[bool, str]] = []
    state = twin.state_of(model)
    for _ in range(transitions):  # a legal walk, restarting from the initial state
        allowed = twin.flat.triggers_from(state)
        if not allowed:
            plan.append((True, ""))
            state = twin.flat.initial
            continue
        trigger = rng.choice(allowed)
        plan.append((False, trigger))
        state = twin.flat.table[(state, trigger)][0].dest
    fire, init = twin.fire, twin.initialize
    t0 = time.perf_counter()
    for restart, trigger in plan:
        if restart:
            init(model)
        else:
            fire(model, trigger)
    return (time.perf_counter() - t0) / transitions
