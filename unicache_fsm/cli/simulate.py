"""``unicache-fsm simulate [...]``: serve a workload through the reference scheduler loop
and report.

Prints the report as a table (``--json``: the run's summary as JSON instead; ``--json
PATH``: into that file as well as the table); progress bars with elapsed time and ETA
go to stderr while the workload is generated and served. ``--baseline RUN.json`` puts
an earlier run's summary beside this one (figures and deltas). ``--trace`` records every
transition (with its scheduler step and time), ``--coverage`` writes transition counts
that ``diagram --coverage`` draws, ``--host-tokens`` adds the host tier,
``--swa-checkpoint K`` (with ``--swa-window``) keeps the SWA window ending every K pages
too (`tree.swa_checkpoints`), ``--report DIR`` writes ``DIR/index.html``
(`scheduler.html_report`: per-request figures, charts over time, the compare section,
the coverage-coloured diagrams; needs Graphviz). With an SWA window a note says why hit
rates fall.

Every check that needs no workload runs before the run, cheapest first, the store last:
it is opened and closed, so a store that cannot be reached or opened is refused at
start. The scheduler and torch are imported when the command runs, never when this
module is (``--help`` stays torch-free: hence `DEFAULT_POOL_TOKENS`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import attrs

from unicache_fsm.cli.arguments import (
    MAX_REQUESTS,
    MAX_SEED,
    MAX_STEPS,
    MAX_TOKENS,
    MAX_TORCH_THREADS,
    input_file,
    int_in,
    output_file,
    output_folder,
    path_arg,
    reading,
)
from unicache_fsm.cli.command import EXIT_OK, Command
from unicache_fsm.console import print_table, progress
from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.diagram import DiagramFormat, GraphvizNotFoundError, render_image

__all__ = ["COMMAND", "DEFAULT_POOL_TOKENS"]

#: The device pool of ``simulate`` (tokens); `SimConfig`'s default, restated here so
#: that ``--help`` does not import the scheduler (and torch). A test keeps them equal.
DEFAULT_POOL_TOKENS = 4096


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload", default="multi_turn", help="multi_turn (default), few_shot, agentic or random"
    )
    p.add_argument(
        "--requests",
        type=int_in(1, MAX_REQUESTS),
        default=400,
        metavar="N",
        help=f"default 400 (1 to {MAX_REQUESTS})",
    )
    p.add_argument(
        "--page-size",
        type=int_in(1, 1024),
        default=16,
        metavar="P",
        help="a power of two, at most 1024 (default 16)",
    )
    p.add_argument(
        "--store",
        default="memory",
        metavar="STORE",
        help="the external store: memory (default), file:DIR or redis://HOST:PORT "
        "(file and Redis stores are shared by every process that opens them)",
    )
    p.add_argument(
        "--pool-tokens",
        type=int_in(1, MAX_TOKENS),
        default=DEFAULT_POOL_TOKENS,
        metavar="T",
        help=f"device KV pool size in tokens (default {DEFAULT_POOL_TOKENS}, at most {MAX_TOKENS})",
    )
    p.add_argument(
        "--host-tokens",
        type=int_in(0, MAX_TOKENS),
        default=0,
        metavar="H",
        help="host tier size in tokens: back up finished requests to the host and load "
        f"them back on a hit (default 0: no host tier; at most {MAX_TOKENS})",
    )
    p.add_argument(
        "--swa-window",
        type=int_in(1, MAX_TOKENS),
        default=None,
        metavar="W",
        help=f"sliding window in tokens (1 to {MAX_TOKENS}): adds the SWA component "
        "(default: off, no SWA)",
    )
    p.add_argument(
        "--swa-checkpoint",
        type=int_in(0, MAX_TOKENS),
        default=None,
        metavar="K",
        help="with --swa-window: also keep the SWA window ending at every K pages of a "
        "request, so prefixes ending there stay reusable (default: off, SGLang 0.5.23's rule)",
    )
    p.add_argument(
        "--chunk-size",
        type=int_in(1, MAX_TOKENS),
        default=None,
        metavar="C",
        help=f"chunked prefill: tokens per step (a multiple of P, at most {MAX_TOKENS}; "
        "default: off, a whole prompt in one step)",
    )
    p.add_argument(
        "--faults",
        default=None,
        metavar="POLICY",
        help="fault injection, e.g. 'refuse_load=0.2,fail_batch_midway=every:5,seed=1' "
        "(default: none)",
    )
    p.add_argument(
        "--seed", type=int_in(0, MAX_SEED), default=0, metavar="S", help="0 (default) to 2**64-1"
    )
    p.add_argument(
        "--executor",
        choices=["compiled", "reference"],
        default="compiled",
        help="the FSM executor: generated code, or the reference interpreter",
    )
    p.add_argument(
        "--torch-threads",
        type=int_in(1, MAX_TORCH_THREADS),
        default=1,
        metavar="N",
        help=f"threads torch may use, 1 to {MAX_TORCH_THREADS} (default 1: a simulated step "
        "moves kilobytes, and more threads only contend; measured 5-7x slower with 2 on 2 "
        "shared cores)",
    )
    p.add_argument(
        "--trace",
        type=path_arg,
        default=None,
        metavar="FILE.jsonl",
        help="record every transition as JSON lines, with its scheduler step and time "
        "(default: no trace)",
    )
    p.add_argument(
        "--coverage",
        type=path_arg,
        default=None,
        metavar="FILE.json",
        help="write transition coverage (default with --trace: TRACE.coverage.json)",
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        type=path_arg,
        metavar="PATH",
        help="the run's summary as JSON: on stdout instead of the table, or with PATH "
        "into that file (the table still printed); a later run compares with it "
        "(--baseline) (default: the table only)",
    )
    p.add_argument(
        "--baseline",
        type=path_arg,
        default=None,
        metavar="RUN.json",
        help="a summary an earlier run wrote with --json PATH: both runs side by side "
        "(figures and deltas) in the terminal and in --report (default: no comparison)",
    )
    p.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip the throwaway run of a few requests before the timed one (by default "
        "the wall time leaves out the process's one-time costs: torch and NumPy entry "
        "points bound on first call, generated code compiled; see scheduler.warm_up)",
    )
    p.add_argument(
        "--audit-every",
        type=int_in(1, MAX_STEPS),
        default=None,
        metavar="N",
        help=f"check every invariant each N steps, and once at the end (default 20, at most "
        f"{MAX_STEPS})",
    )
    p.add_argument(
        "--report",
        type=path_arg,
        default=None,
        metavar="DIR",
        help="write DIR/index.html: a self-contained page (no script, works offline) of "
        "per-request figures, charts over time and the coverage-coloured machine "
        "diagrams (needs Graphviz; default: no report)",
    )


def _check_report_folder(folder: Path) -> None:
    """Refuse a --report DIR that cannot be written, before the run (not after it)."""
    output_folder("--report", folder)
    if shutil.which("dot") is None:
        raise GraphvizNotFoundError("svg")


def _check_simulate_inputs(args: argparse.Namespace, config: Any) -> dict[str, Any] | None:
    """Every check that needs no workload, cheapest first; the store last (it is opened
    and closed: one that cannot be reached or opened is refused before the run).
    Returns the ``--baseline`` summary, read and checked (None without one)."""
    from unicache_fsm.scheduler.compare import read_baseline
    from unicache_fsm.scheduler.workloads import WORKLOADS, UnknownWorkloadError
    from unicache_fsm.store.faults import FaultPolicy
    from unicache_fsm.store.spec import open_store

    config.validate_settings()
    if config.workload not in WORKLOADS:
        raise UnknownWorkloadError(config.workload)
    if config.faults:
        with reading("--faults", config.faults):
            FaultPolicy.parse(config.faults)
    if args.trace is not None:
        output_file("--trace", args.trace)
    coverage = args.coverage
    if coverage is None and args.trace is not None:
        coverage = Path(args.trace).with_suffix(".coverage.json")
    if coverage is not None:
        output_file("--coverage", coverage)
    if args.report is not None:
        _check_report_folder(args.report)
    if args.json is not None and str(args.json) != "-":
        output_file("--json", args.json)
    baseline = None
    if args.baseline is not None:
        input_file("--baseline", args.baseline)
        with reading("--baseline", args.baseline):
            baseline = read_baseline(args.baseline)
    with reading("--store", config.store):
        open_store(config.store).close()
    return baseline


def _run(args: argparse.Namespace) -> int:
    import json

    import torch

    from unicache_fsm.scheduler import SimConfig, Simulation, warm_up
    from unicache_fsm.scheduler.compare import compare, run_summary
    from unicache_fsm.scheduler.report import swa_note
    from unicache_fsm.tree.residency import ExecutorKind

    config = SimConfig(
        workload=args.workload,
        store=args.store,
        requests=args.requests,
        page_size=args.page_size,
        pool_tokens=args.pool_tokens,
        host_tokens=args.host_tokens,
        swa_window=args.swa_window,
        swa_checkpoint=args.swa_checkpoint,
        chunk_size=args.chunk_size,
        faults=args.faults,
        seed=args.seed,
        executor=ExecutorKind(args.executor),
    )
    if args.audit_every is not None:
        config = attrs.evolve(config, audit_every=args.audit_every)
    baseline = _check_simulate_inputs(args, config)
    torch.set_num_threads(args.torch_threads)
    with progress("generating workload", config.requests) as generated:
        sim = Simulation(
            config,
            trace_path=args.trace,
            timeline=args.report is not None,
            workload_progress=generated,
        )
    if args.warm_up:  # after the config passed its checks, before the clock
        warm_up(config)
    with progress("serving requests", len(sim.specs)) as served:
        report = sim.run(progress=served)
    coverage = Coverage.from_counter(sim.counter)
    coverage_path: Path | None = args.coverage
    if coverage_path is None and args.trace is not None:
        coverage_path = Path(args.trace).with_suffix(".coverage.json")
    if coverage_path is not None:
        coverage.save(coverage_path)
    summary = run_summary(report, sim.requests)
    text = json.dumps(summary, indent=2, sort_keys=True)
    to_stdout = args.json is not None and str(args.json) == "-"
    if args.json is not None and not to_stdout:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    if to_stdout:
        print(text)
    else:
        print_table(None, ["", "simulate"], report.rows())
        note = swa_note(report.config)
        if note is not None:
            print(f"note: {note}")
        if baseline is not None:
            c = compare(baseline, summary)
            if c.settings:
                print_table("settings that differ", ["setting", "baseline", "this run"], c.settings)
            rows = [(r.metric, r.baseline, r.current, r.delta) for r in c.rows]
            print_table(
                f"compared with {args.baseline}", ["", "baseline", "this run", "delta"], rows
            )
    if args.report is not None:
        from unicache_fsm.scheduler.html_report import write_report

        assert sim.timeline is not None
        diagrams = {
            ex.name: render_image(
                ex.spec, DiagramFormat.SVG, None, coverage.declared(ex.spec)
            ).decode("utf-8")
            for ex in sim.executors
        }
        page = write_report(
            args.report,
            report=report,
            timeline=sim.timeline,
            diagrams=diagrams,
            requests=sim.requests,
            summary=summary,
            baseline=baseline,
        )
        print(f"report: {page}", file=sys.stderr)
    return EXIT_OK


COMMAND = Command(
    "simulate", "serve a workload through the reference scheduler loop and report", _arguments, _run
)
