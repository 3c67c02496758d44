"""Build benchmark: what a spec costs before its first event, as the spec grows.

For each generated spec, in a fresh Python process (so the peak memory is the spec's
and nothing else's):

- ``load+validate``: `parse_spec` (TOML, the spec model, every structural check);
- ``compile``: building a `CompiledExecutor` on it (binding check, dispatch tables);
- ``load MB`` / ``peak MB``: the process's peak resident memory growth over an idle
  interpreter that imported the library, after load+validate and after compile.

The specs:

- ``ring N``: N atomic states in a cycle, one trigger ``advance``;
- ``parallel K``: K parallel regions of two states each (``off``/``on``, triggers
  ``flip_i``/``flop_i``) — 2**K configurations if they were multiplied out, and
  about 8*K lines of TOML.

Sizes double so that the ratio of successive times shows the growth (2.0 = linear,
4.0 = quadratic). Nothing here asserts timings. Run: ``python benchmarks/bench_build.py
[--quick]`` (or ``python benchmarks/run.py build``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from unicache_fsm.console import print_table

RING = (500, 1000, 2000)
PARALLEL = (10, 12, 14)
QUICK_RING = (100, 200)
QUICK_PARALLEL = (4, 6)


def ring_spec(n: int) -> str:
    """TOML of an n-state ring driven by one trigger."""
    lines = ['machine = "ring"', 'initial = "s0"']
    lines += [f"[states.s{i}]" for i in range(n)]
    for i in range(n):
        lines += [
            "[[transitions]]",
            'trigger = "advance"',
            f'source = "s{i}"',
            f'dest = "s{(i + 1) % n}"',
        ]
    return "\n".join(lines) + "\n"


def parallel_spec(k: int) -> str:
    """TOML of k parallel regions of two states each."""
    lines = ['machine = "regions"', "parallel = true"]
    for i in range(k):
        lines += [f"[states.r{i}]", f"[states.r{i}.states.off]", f"[states.r{i}.states.on]"]
    for i in range(k):
        for trigger, src, dst in ((f"flip_{i}", "off", "on"), (f"flop_{i}", "on", "off")):
            lines += [
                "[[transitions]]",
                f'trigger = "{trigger}"',
                f'source = "r{i}.{src}"',
                f'dest = "r{i}.{dst}"',
            ]
    return "\n".join(lines) + "\n"


_CHILD = """
import json, resource, sys, time
from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.loader import parse_spec

class Model:
    __slots__ = ("state",)

text = sys.stdin.read()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
spec = parse_spec(text, "<bench>")
t1 = time.perf_counter()
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ex = CompiledExecutor(spec, Model)
m = Model()
ex.initialize(m)
ex.fire(m, ex.allowed_triggers(m)[0])
t2 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = {"load": t1 - t0, "compile": t2 - t1, "load_kb": loaded - base, "peak_kb": peak - base}
print(json.dumps(out))
"""


def measure(text: str, timeout: float) -> dict[str, float] | None:
    """Load+validate and compile `text` in a fresh process; None when it ran past `timeout`."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return None
    result: dict[str, float] = json.loads(proc.stdout)
    return result


COLUMNS = ("spec", "lines", "load+valid", "load MB", "compile", "peak MB", "growth")


def _row(
    name: str, lines: int, m: dict[str, float] | None, prev: dict[str, float] | None
) -> list[str]:
    if m is None:
        return [name, f"{lines}", "gave up: over the time limit", "", "", "", ""]
    growth = ""
    if prev is not None and prev["load"] > 0:
        growth = (
            f"x{m['load'] / prev['load']:.1f} / x{m['compile'] / max(prev['compile'], 1e-9):.1f}"
        )
    return [
        name,
        f"{lines}",
        f"{m['load']:.3f}",
        f"{m['load_kb'] / 1024:.1f}",
        f"{m['compile']:.3f}",
        f"{m['peak_kb'] / 1024:.1f}",
        growth,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per spec before giving up"
    )
    args = parser.parse_args(argv)
    rings = QUICK_RING if args.quick else RING
    regions = QUICK_PARALLEL if args.quick else PARALLEL
    rows: list[list[str]] = []
    started = time.perf_counter()
    for label, sizes, make in (("ring", rings, ring_spec), ("parallel", regions, parallel_spec)):
        prev = None
        for size in sizes:
            text = make(size)
            m = measure(text, args.timeout)
            rows.append(_row(f"{label} {size}", text.count("\n"), m, prev))
            prev = m
            if m is None:
                break
    print_table(None, COLUMNS, rows)
    print(
        f"(times in s, each spec in a fresh process; total {time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
