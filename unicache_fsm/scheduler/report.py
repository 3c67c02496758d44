"""What a simulation reports, and how the FSM layer's share of the time is measured.

- `SimReport` — counters filled by the loop; `as_dict()` for ``--json``, `rows()`
  the (label, text) lines the terminal table and the HTML report show, `format()`
  those rows as plain text.
- `ABORT_REASONS` — what each load-abort reason code means, in words.
- `swa_note(config)` — why a run with an SWA window has the hit rates it has (the
  terminal and the HTML report print it beside them); None without a window.
- `calibrate_dispatch(executor)` — the executor's own cost per transition, measured
  in this process on the same spec with callbacks that do nothing (a random walk over
  legal triggers). The FSM share of a run is transitions fired times this cost, over
  the wall time: callbacks do the cache's work and are not the FSM's cost.
- `dispatch_cost(executor)` — `calibrate_dispatch`, measured once per process for each
  kind of executor and machine (a run reuses what an earlier run in the process
  measured: the cost belongs to the code, not to the run).
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Mapping
from typing import Any

import attrs

from unicache_fsm.fsm.executor import Executor

__all__ = ["ABORT_REASONS", "SimReport", "calibrate_dispatch", "dispatch_cost", "swa_note"]

#: A load-abort reason code (`unicache_fsm.linker.load.AbortReason`) in words.
ABORT_REASONS: dict[str, str] = {
    "no_slots": "no device slots to load into",
    "stale_prefix": "the matched device prefix changed before the load",
    "store_refused": "the store refused the load",
    "load_failed": "the store's load failed",
    "released": "the request went away first",
    "reset": "the linker was reset",
    "peer_aborted": "another rank could not load",
}


def swa_note(config: Mapping[str, Any]) -> str | None:
    """Why an SWA run's hit rates look as they do (None without an SWA window)."""
    window = config.get("swa_window")
    if not window:
        return None
    checkpoint = config.get("swa_checkpoint")
    tail = (
        f"This run kept SWA checkpoints every {checkpoint} tokens (--swa-checkpoint), so a "
        "prefix ending at a checkpoint can hit again."
        if checkpoint
        else "simulate --swa-checkpoint K (issue 37) keeps SWA KV at checkpoints every K "
        "tokens, so a prefix ending at a checkpoint can hit; compare a run with it."
    )
    return (
        f"SWA is on (window {window} tokens). SGLang 0.5.23 keeps a request's SWA KV only "
        "for its trailing window; below it the tree holds tombstones. A prefix is usable "
        "only if the SWA KV of its last window is live, so a new request whose shared "
        "prefix ends inside an earlier request (few-shot examples, a system prompt, a "
        "conversation's earlier turns) finds no live window there: its device, host and "
        "external hits stop at the first tombstone and fall to 0 on such workloads, while "
        "the host tier still backs up finished requests (it fills and does not hit). " + tail
    )


def _reason(code: str) -> str:
    return ABORT_REASONS.get(code, code)


@attrs.define(slots=True)
class SimReport:
    config: dict[str, Any] = attrs.field(factory=dict)
    requests_served: int = 0
    steps: int = 0
    prompt_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
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
    leaked_slots: dict[str, int] = attrs.field(factory=dict)
    wall_seconds: float = 0.0
    fsm_seconds: float = 0.0

    @property
    def device_hit_rate(self) -> float:
        return self.device_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def external_hit_rate(self) -> float:
        return self.loaded_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def requests_per_second(self) -> float:
        return self.requests_served / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def host_hit_rate(self) -> float:
        return self.host_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def fsm_share(self) -> float:
        return self.fsm_seconds / self.wall_seconds if self.wall_seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["device_hit_rate"] = round(self.device_hit_rate, 4)
        out["external_hit_rate"] = round(self.external_hit_rate, 4)
        out["host_hit_rate"] = round(self.host_hit_rate, 4)
        out["fsm_share"] = round(self.fsm_share, 4)
        out["requests_per_second"] = round(self.requests_per_second, 1)
        return out

    def aborts(self) -> str:
        """The aborted loads with their reasons spelled out ("none" when none)."""
        total = sum(self.loads_aborted.values())
        if not total:
            return "none aborted"
        parts = [f"{v} {_reason(k)} ({k})" for k, v in sorted(self.loads_aborted.items())]
        return f"{total} aborted: " + "; ".join(parts)

    def rows(self) -> list[tuple[str, str]]:
        """The report as (label, text) rows, in the order they are shown."""
        c = self.config
        machines = ", ".join(f"{k} {v}" for k, v in self.transitions.items())
        if not any(self.transitions.values()):
            machines = f"none fired ({machines})" if machines else "none fired"
        leaked = sum(self.leaked_slots.values())
        pools = ", ".join(f"{k} {v}" for k, v in self.leaked_slots.items())
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
                f"host tier {c.get('host_tokens') or 'off'}, "
                f"SWA window {c.get('swa_window') or 'off'}, executor {c.get('executor')}",
            ),
            ("requests served", f"{self.requests_served} in {self.steps} steps"),
            ("device hit rate", f"{self.device_hit_rate:.1%} of prompt tokens"),
            ("host hit rate", f"{self.host_hit_rate:.1%} of prompt tokens"),
            ("external hit rate", f"{self.external_hit_rate:.1%} of prompt tokens"),
            (
                "prompt tokens",
                f"{self.prompt_tokens}: {self.device_hit_tokens} device, "
                f"{self.host_hit_tokens} from host, "
                f"{self.loaded_tokens} loaded, {self.computed_tokens} recomputed",
            ),
            (
                "loads",
                f"{self.loads_committed} committed ({self.loads_verified} KV-verified, "
                f"{self.loads_mismatched} mismatched), {self.aborts()}",
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
            ("leaked slots", f"{leaked}" + (f" ({pools})" if pools else "")),
            (
                "wall time",
                f"{self.wall_seconds:.2f} s ({self.requests_per_second:.0f} "
                f"requests/s); FSM layer {self.fsm_share:.2%} of it",
            ),
        ]
        return rows

    def format(self) -> str:
        """`rows()` as aligned plain text."""
        rows = self.rows()
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


#: `dispatch_cost`'s measurements: (executor class, spec) -> seconds per transition
_DISPATCH_COSTS: dict[tuple[type, object], float] = {}


def dispatch_cost(executor: Executor) -> float:
    """`calibrate_dispatch(executor)`, measured on the first call for its executor class
    and spec in this process, then reused."""
    key = (type(executor), executor.spec)  # (a spec is a frozen value: hashed by content)
    cost = _DISPATCH_COSTS.get(key)
    if cost is None:
        cost = _DISPATCH_COSTS[key] = calibrate_dispatch(executor)
    return cost
