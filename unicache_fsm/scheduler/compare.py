"""A run's JSON summary, and two runs side by side (``simulate --baseline RUN.json``).

- `run_summary(report, requests, model)` — what ``simulate --json`` prints or writes:
  `SimReport.as_dict()` plus the per-request figures (tokens saved, the modelled time
  to first token's mean and 95th percentile, `TtftModel`) and ``summary_format``.
- `read_baseline(path)` — a summary written by an earlier run, checked: a file that is
  not JSON, not an object, or lacks the figures a comparison needs raises
  `BaselineError` naming the file and the culprit (a summary from before the
  per-request figures lacks only those; they show as "-").
- `compare(baseline, current)` — `Comparison`: the settings that differ and one
  `CompareRow` (metric, baseline, this run, delta) per figure, the same rows the
  terminal table and the run report's compare section show.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.scheduler.report import SimReport
from unicache_fsm.scheduler.requests import RequestRecord, TtftModel

__all__ = [
    "SUMMARY_FORMAT",
    "BaselineError",
    "CompareRow",
    "Comparison",
    "compare",
    "read_baseline",
    "run_summary",
]

SUMMARY_FORMAT = 1

#: (key, label, kind): kind "rate" (a share, compared in percentage points), "count",
#: "ms" or "s"; the figures a baseline must hold come first
_METRICS: tuple[tuple[str, str, str], ...] = (
    ("requests_served", "requests served", "count"),
    ("prompt_tokens", "prompt tokens", "count"),
    ("device_hit_rate", "device hit rate", "rate"),
    ("external_hit_rate", "external hit rate", "rate"),
    ("host_hit_rate", "host hit rate", "rate"),
    ("computed_tokens", "tokens recomputed", "count"),
    ("tokens_saved", "tokens saved", "count"),
    ("ttft_mean_ms", "modelled TTFT, mean", "ms"),
    ("ttft_p95_ms", "modelled TTFT, p95", "ms"),
    ("loads_committed", "loads committed", "count"),
    ("offloads_published", "offloads published", "count"),
    ("offloads_failed", "offloads failed", "count"),
    ("steps", "scheduler steps", "count"),
    ("wall_seconds", "wall time", "s"),
)
_REQUIRED = ("requests_served", "prompt_tokens", "device_hit_rate", "external_hit_rate")
#: the settings compared (a difference is shown above the figures)
_SETTINGS = (
    "workload",
    "requests",
    "seed",
    "page_size",
    "pool_tokens",
    "host_tokens",
    "swa_window",
    "swa_checkpoint",
    "store",
    "faults",
    "chunk_size",
)


class BaselineError(UnicacheFsmError, ValueError):
    """A ``--baseline`` file that is not a run summary; names the file and the culprit."""


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def run_summary(
    report: SimReport, requests: Iterable[RequestRecord], model: TtftModel | None = None
) -> dict[str, Any]:
    """The run's JSON summary (see the module docstring)."""
    model = model or TtftModel()
    records = list(requests)
    ttft = [model.seconds(r) * 1e3 for r in records]
    out = report.as_dict()
    out["summary_format"] = SUMMARY_FORMAT
    out["tokens_saved"] = sum(r.saved for r in records)
    out["ttft_mean_ms"] = round(sum(ttft) / len(ttft), 4) if ttft else 0.0
    out["ttft_p95_ms"] = round(_percentile(ttft, 0.95), 4)
    out["ttft_model"] = model.describe()
    return out


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_baseline(path: str | Path) -> dict[str, Any]:
    """A run summary from `path` (see the module docstring)."""
    where = f"--baseline {str(path)!r}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        msg = f"{where} is not UTF-8 text (give the file `simulate --json PATH` wrote)"
        raise BaselineError(msg) from None
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        msg = (
            f"{where} is not JSON ({getattr(exc, 'msg', exc)}); give `simulate --json PATH`'s file"
        )
        raise BaselineError(msg) from None
    if not isinstance(data, dict):
        msg = f"{where} holds a JSON {type(data).__name__}, not a run summary (an object)"
        raise BaselineError(msg)
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        msg = f"{where} is not a simulate summary: it lacks {', '.join(missing)}"
        raise BaselineError(msg)
    for key, _, _ in _METRICS:
        if key in data and not _number(data[key]):
            msg = f"{where}: {key} must be a finite number, got {json.dumps(data[key])[:40]}"
            raise BaselineError(msg)
    if "config" in data and not isinstance(data["config"], dict):
        msg = f"{where}: config must be an object, got {json.dumps(data['config'])[:40]}"
        raise BaselineError(msg)
    return data


@attrs.frozen
class CompareRow:
    metric: str
    baseline: str
    current: str
    delta: str


@attrs.frozen
class Comparison:
    """Settings that differ (name, baseline, this run) and the figures side by side."""

    settings: tuple[tuple[str, str, str], ...]
    rows: tuple[CompareRow, ...]


def _shown(value: object, kind: str) -> str:
    if not _number(value):
        return "-"
    assert isinstance(value, int | float)
    if kind == "rate":
        return f"{value:.1%}"
    if kind == "ms":
        return f"{value:.2f} ms"
    if kind == "s":
        return f"{value:.2f} s"
    return f"{int(value):,}"


def _delta(base: object, cur: object, kind: str) -> str:
    if not (_number(base) and _number(cur)):
        return "-"
    assert isinstance(base, int | float) and isinstance(cur, int | float)
    diff = cur - base
    if kind == "rate":
        return f"{diff * 100:+.1f} pp"
    rel = f" ({diff / base:+.0%})" if base else ""
    if kind == "ms":
        return f"{diff:+.2f} ms{rel}"
    if kind == "s":
        return f"{diff:+.2f} s{rel}"
    return f"{int(diff):+,}{rel}"


def _setting(value: object) -> str:
    return "off" if value is None or value == 0 else str(value)


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> Comparison:
    """The two summaries side by side (see the module docstring)."""
    bc, cc = baseline.get("config") or {}, current.get("config") or {}
    settings = tuple(
        (k, _setting(bc.get(k)), _setting(cc.get(k)))
        for k in _SETTINGS
        if (k in bc or k in cc) and _setting(bc.get(k)) != _setting(cc.get(k))
    )
    rows = tuple(
        CompareRow(
            label,
            _shown(baseline.get(k), kind),
            _shown(current.get(k), kind),
            _delta(baseline.get(k), current.get(k), kind),
        )
        for k, label, kind in _METRICS
    )
    return Comparison(settings, rows)
