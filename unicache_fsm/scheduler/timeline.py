"""A per-step record of a simulation: the series a run report plots.

`Timeline.record(step, report=..., stats=..., occupancy=..., faults=...)` is called
once at the end of every scheduler step. It keeps cumulative counters (so any window
can be differenced later) and one `Occupancy` per pool:

- tokens: prompt tokens admitted, of them served from the device, loaded back from
  the host tier, loaded from the store, and recomputed — `hit_rates()` turns them
  into running (cumulative) rates, `windowed_hit_rates(w)` into the rates of the
  tokens admitted within each window of `w` steps (None for a window that admitted
  none);
- load outcomes (committed, and aborted per reason) and offload verdicts (submitted,
  published, failed) — `per_step(name)` differences them into per-step counts,
  `per_window(name, w)` into per-window counts;
- fault events: store faults injected per kind and store-call faults the linker
  contained, per call;
- occupancy per pool (`scheduler.occupancy`).

It reads only the values handed to it; it never touches the system.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from unicache_fsm.linker.linker import LinkerStats
from unicache_fsm.scheduler.occupancy import Occupancy
from unicache_fsm.scheduler.report import SimReport

__all__ = ["Timeline"]


def _diff(series: list[int]) -> list[int]:
    return [b - a for a, b in zip([0, *series], series, strict=False)]


def _at_window_ends(series: list[int], w: int) -> list[int]:
    """The value at the end of each window of `w` entries (the last may be shorter)."""
    return [series[min(i + w, len(series)) - 1] for i in range(0, len(series), w)]


@attrs.define
class Timeline:
    """Series indexed by the position of `steps` (see the module docstring)."""

    steps: list[int] = attrs.field(factory=list)
    counters: dict[str, list[int]] = attrs.field(factory=dict)
    occupancy: dict[str, list[Occupancy]] = attrs.field(factory=dict)

    def _put(self, name: str, value: int) -> None:
        series = self.counters.setdefault(name, [])
        if len(series) < len(self.steps) - 1:  # a name first seen now: zeros before
            series.extend([0] * (len(self.steps) - 1 - len(series)))
        series.append(value)

    def record(
        self,
        step: int,
        *,
        report: SimReport,
        stats: LinkerStats,
        occupancy: Mapping[str, Occupancy],
        faults: Mapping[str, int],
    ) -> None:
        """Append one step's cumulative counters and pool occupancy."""
        self.steps.append(step)
        values = {
            "tokens.prompt": report.prompt_tokens,
            "tokens.device": report.device_hit_tokens,
            "tokens.host": report.host_hit_tokens,
            "tokens.external": report.loaded_tokens,
            "tokens.recomputed": report.computed_tokens,
            "loads.committed": stats.loads_committed,
            "offloads.submitted": stats.offloads_submitted,
            "offloads.published": stats.offloads_published,
            "offloads.failed": stats.offloads_failed,
        }
        values |= {f"loads.aborted.{k}": v for k, v in stats.loads_aborted.items()}
        values |= {f"faults.injected.{k}": v for k, v in faults.items()}
        values |= {f"faults.contained.{k}": v for k, v in stats.store_faults.items()}
        for name in self.counters.keys() - values.keys():
            values[name] = self.counters[name][-1]  # cumulative: it stays where it was
        for name, value in values.items():
            self._put(name, value)
        for pool, occ in occupancy.items():
            self.occupancy.setdefault(pool, []).append(occ)

    def names(self, prefix: str) -> list[str]:
        """The counters under `prefix` (e.g. ``loads.aborted.``), without it, sorted."""
        return sorted(n.removeprefix(prefix) for n in self.counters if n.startswith(prefix))

    def per_step(self, name: str) -> list[int]:
        """How much counter `name` grew in each step."""
        return _diff(self.counters.get(name, [0] * len(self.steps)))

    def window(self, most: int = 60) -> int:
        """The fewest steps per window that cut the run into at most `most` windows."""
        return max(1, -(-len(self.steps) // max(1, most)))

    def window_ends(self, w: int) -> list[int]:
        """The last step of each window of `w` steps (the last window may be shorter)."""
        return _at_window_ends(self.steps, w)

    def per_window(self, name: str, w: int) -> list[int]:
        """How much counter `name` grew in each window of `w` steps."""
        return _diff(_at_window_ends(self.counters.get(name, [0] * len(self.steps)), w))

    def windowed_hit_rates(self, w: int) -> dict[str, list[float | None]]:
        """Device / host / external / recomputed share of the prompt tokens admitted in
        each window of `w` steps (None where a window admitted none). Tokens count in
        the step that served them: a load commits a step or two after its request was
        admitted, so a window's external share may hold an earlier window's request."""
        prompt = self.per_window("tokens.prompt", w)
        out: dict[str, list[float | None]] = {}
        for kind in ("device", "host", "external", "recomputed"):
            got = self.per_window(f"tokens.{kind}", w)
            out[kind] = [g / p if p else None for g, p in zip(got, prompt, strict=True)]
        return out

    def hit_rates(self) -> dict[str, list[float]]:
        """Running device / host / external / recomputed share of the prompt tokens."""
        prompt = self.counters.get("tokens.prompt", [])
        out: dict[str, list[float]] = {}
        for kind in ("device", "host", "external", "recomputed"):
            got = self.counters.get(f"tokens.{kind}", [0] * len(prompt))
            out[kind] = [g / p if p else 0.0 for g, p in zip(got, prompt, strict=True)]
        return out
