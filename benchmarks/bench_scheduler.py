"""Scheduler benchmark: the reference loop with the compiled vs the reference executor.

The same multi-turn workload (2,000 requests; 300 with ``--quick``) runs in one
process with each executor, alternately (best of ``--repeats`` runs each), with
per-step audits and KV verification off (they are tests, not serving work). Printed:

- wall time and requests/s per executor, and the end-to-end ratio;
- the FSM layer's share of the wall time: transitions fired times the executor's own
  per-transition cost (calibrated in this process, no-op callbacks), over wall time;
- the cross-check: the wall-time difference between the runs against the difference
  predicted from the calibrated costs;
- ``simulate`` at its defaults (400 requests, audits every 20 steps, every load
  KV-verified): requests/s by wall time and by this process's CPU time (on shared
  cores the CPU figure is the steadier one), target 1,000;
- ``fuzz`` at its defaults (the whole-system `SystemMachine`, every invariant after
  every step), by both drivers, interleaved batch by batch: the random walk that
  ``fuzz`` runs by default (`testing.walk`, runs of 50 steps), target 2,000 rule
  steps/s, and Hypothesis's stateful engine (``fuzz --driver hypothesis``: batches of
  25 programs of 50 steps), beside the floor Hypothesis itself sets: the same number of
  rules with the same kinds of arguments and bodies that do nothing.

Run: ``python benchmarks/bench_scheduler.py [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import time
from collections.abc import Callable
from typing import Any

import attrs
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from unicache_fsm.cli import FUZZ_EXAMPLES, FUZZ_STEPS
from unicache_fsm.console import print_table
from unicache_fsm.scheduler import SimConfig, SimReport, Simulation
from unicache_fsm.testing import walk
from unicache_fsm.testing.machines import SystemMachine
from unicache_fsm.tree.residency import ExecutorKind

#: the settings `unicache-fsm fuzz --driver hypothesis` runs its batches with
FUZZ_BATCH = settings(
    max_examples=FUZZ_EXAMPLES, stateful_step_count=FUZZ_STEPS, deadline=None, database=None
)


def run_once(requests: int, executor: ExecutorKind) -> SimReport:
    config = SimConfig(
        requests=requests,
        pool_tokens=4096,
        executor=executor,
        audit_every=10**9,  # one audit at the end only
        verify_loads=False,
    )
    gc.collect()
    return Simulation(config).run()


def simulate_defaults(repeats: int) -> tuple[float, float, int]:
    """Best wall and CPU seconds of `simulate` at its defaults, and requests served."""
    best_wall = best_cpu = float("inf")
    served = 0
    for _ in range(repeats):
        gc.collect()
        sim = Simulation(SimConfig())
        c0 = time.process_time()
        r = sim.run()
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, r.wall_seconds)
        served = r.requests_served
    return best_wall, best_cpu, served


class _Floor(RuleBasedStateMachine):
    """Hypothesis's own cost per step: as many rules as `SystemMachine`, with the same
    kinds of arguments (integers, booleans, `data()` draws), bodies that do nothing."""

    steps = 0

    def __init__(self) -> None:
        super().__init__()
        self.open = 0

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        for strategy in (
            st.sampled_from((1, 4)),
            st.booleans(),
            st.sampled_from((0.0, 0.1, 0.25)),
            st.integers(0, 2**16),
            st.sampled_from((None, 24, 6)),
        ):
            data.draw(strategy)

    @rule(doc=st.integers(0, 2), pages=st.integers(1, 8), a=st.booleans(), b=st.booleans())
    def r1(self, doc: int, pages: int, a: bool, b: bool) -> None:
        pass

    @precondition(lambda self: self.open < 3)
    @rule(doc=st.integers(0, 2), pages=st.integers(1, 8), extra=st.integers(0, 3), a=st.booleans())
    def r2(self, doc: int, pages: int, extra: int, a: bool) -> None:
        self.open += 1

    @precondition(lambda self: self.open < 3)
    @rule(doc=st.integers(0, 2), pages=st.integers(2, 8), tail=st.integers(1, 3))
    def r3(self, doc: int, pages: int, tail: int) -> None:
        self.open += 1

    @precondition(lambda self: self.open < 3)
    @rule(doc=st.integers(0, 2), pages=st.integers(1, 8))
    def r4(self, doc: int, pages: int) -> None:
        self.open += 1

    @precondition(lambda self: self.open > 0)
    @rule(data=st.data())
    def r5(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from(range(self.open)))
        self.open -= 1

    @rule(data=st.data())
    def r6(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from((1, 2, 3)))

    @rule(data=st.data())
    def r7(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from((1, 2, 3, 4, 5)))
        for _ in range(data.draw(st.integers(1, 3))):
            data.draw(st.sampled_from(range(8)))
            data.draw(st.booleans())

    @rule(pages=st.integers(1, 16), swa_pages=st.integers(0, 8))
    def r8(self, pages: int, swa_pages: int) -> None:
        pass

    @rule(pages=st.integers(1, 8))
    def r9(self, pages: int) -> None:
        pass

    @rule()
    def r10(self) -> None:
        pass

    @rule()
    def r11(self) -> None:
        pass

    @invariant()
    def counted(self) -> None:
        type(self).steps += 1


@attrs.define
class Rate:
    """Rule steps run, and the wall and CPU seconds they took."""

    steps: int = 0
    wall: float = 0.0
    cpu: float = 0.0

    def line(self) -> str:
        return (
            f"{self.steps / self.wall:.0f} steps/s by wall time, "
            f"{self.steps / self.cpu:.0f} by CPU time"
        )


def timed(rate: Rate, machine: Any, run: Callable[[], object]) -> None:
    """Run one batch, adding the rule steps it ran and the time it took to `rate`."""
    machine.steps = 0
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    run()
    rate.cpu += time.process_time() - c0
    rate.wall += time.perf_counter() - t0
    rate.steps += machine.steps


def fuzz_rates(batches: int) -> tuple[Rate, Rate, Rate]:
    """The walk, Hypothesis's engine and its floor, `batches` batches each after one
    uncounted batch each, interleaved batch by batch (a walk batch: as many runs as a
    Hypothesis batch has programs; walk batch ``b`` walks seed ``b``)."""
    walker = type("FuzzWalk", (SystemMachine,), {})
    hypo = type("FuzzHypothesis", (SystemMachine,), {})
    rates = Rate(), Rate(), Rate()
    warm = Rate(), Rate(), Rate()  # one batch each first, not counted (one-off costs)
    for b in range(-1, batches):
        walk_batch = functools.partial(
            walk.fuzz, walker, seed=b, runs=FUZZ_EXAMPLES, steps=FUZZ_STEPS
        )
        into = warm if b < 0 else rates
        timed(into[0], walker, walk_batch)
        timed(into[1], hypo, lambda: run_state_machine_as_test(hypo, settings=FUZZ_BATCH))
        timed(into[2], _Floor, lambda: run_state_machine_as_test(_Floor, settings=FUZZ_BATCH))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compiled vs reference executor, end to end")
    parser.add_argument("--quick", action="store_true", help="300 requests instead of 2,000")
    parser.add_argument("--repeats", type=int, default=2, help="runs per executor (best kept)")
    args = parser.parse_args(argv)
    requests = 300 if args.quick else 2000
    torch.set_num_threads(1)  # what `simulate` runs with by default (--torch-threads)
    reports: dict[ExecutorKind, SimReport] = {}
    for _ in range(args.repeats):  # alternate the executors; keep each one's best run
        for kind in ExecutorKind:
            r = run_once(requests, kind)
            if kind not in reports or r.wall_seconds < reports[kind].wall_seconds:
                reports[kind] = r
    comp, ref = reports[ExecutorKind.COMPILED], reports[ExecutorKind.REFERENCE]
    print(f"multi-turn workload, {requests} requests, P=16, pool 4096 tokens, memory store")
    print_table(
        None,
        ("executor", "wall s", "req/s", "transitions", "FSM s", "FSM share"),
        [
            (
                kind.value,
                f"{r.wall_seconds:.2f}",
                f"{r.requests_served / r.wall_seconds:.1f}",
                f"{sum(r.transitions.values())}",
                f"{r.fsm_seconds:.3f}",
                f"{r.fsm_share:.2%}",
            )
            for kind, r in reports.items()
        ],
    )
    ratio = ref.wall_seconds / comp.wall_seconds
    fsm_ratio = ref.fsm_seconds / comp.fsm_seconds if comp.fsm_seconds else float("inf")
    print(f"end-to-end: compiled {ratio:.2f}x faster (the FSM layer's share below is what counts)")
    print(f"FSM layer alone: compiled {fsm_ratio:.1f}x faster")
    share = comp.fsm_share
    verdict = "met" if share <= 0.1 else "MISSED"
    print(f"FSM share of step time, compiled: {share:.3%} (target <= 10%: {verdict})")
    predicted = ref.fsm_seconds - comp.fsm_seconds
    print(
        f"cross-check: wall-time difference {ref.wall_seconds - comp.wall_seconds:+.3f} s, "
        f"predicted from calibrated dispatch costs {predicted:+.3f} s"
    )
    wall, cpu, served = simulate_defaults(1 if args.quick else 3)
    verdict = "met" if served / wall >= 1000 else "MISSED"
    print(
        f"simulate at defaults ({served} requests, audits every 20 steps, loads verified): "
        f"{served / wall:.0f} req/s by wall time, {served / cpu:.0f} by CPU time "
        f"(target >= 1,000: {verdict})"
    )
    walked, engine, floor = fuzz_rates(1 if args.quick else 4)
    verdict = "met" if walked.steps / walked.wall >= 2000 else "MISSED"
    print(
        f"fuzz at defaults, the walk ({walked.steps} rule steps, every invariant after "
        f"each): {walked.line()} (target >= 2,000: {verdict})"
    )
    print(f"fuzz --driver hypothesis ({engine.steps} rule steps): {engine.line()}")
    print(f"Hypothesis alone, bodies that do nothing ({floor.steps} steps): {floor.line()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
