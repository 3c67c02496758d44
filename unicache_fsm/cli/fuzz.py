"""``unicache-fsm fuzz --minutes M [--driver walk|hypothesis] [--seed S] [--page-size P]
[--swa on|off|both] [--coverage F]``: fuzz the whole system for a while.

Fuzzes `SystemMachine` (tree, linker, store, host tier; every invariant after every
step) for M minutes: by default a seeded random walk through its rules
(`unicache_fsm.testing.walk`, runs of `FUZZ_STEPS` steps), or Hypothesis's stateful
engine (batches of `FUZZ_EXAMPLES` programs of `FUZZ_STEPS` steps). Prints a summary of
runs, steps, steps/s and transition coverage (a progress bar on stderr while it runs);
exits 1 (`EXIT_CHECK_FAILED`) on a failure, after printing the shrunk program as a
Python script that replays it (the walk) or Hypothesis's falsifying program.

The system's modules (torch among them) are imported when the command runs, never
when this module is.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from unicache_fsm.cli.arguments import (
    MAX_MINUTES,
    MAX_SEED,
    CliError,
    int_in,
    minutes,
    output_file,
    path_arg,
)
from unicache_fsm.cli.command import EXIT_CHECK_FAILED, EXIT_OK, Command
from unicache_fsm.console import print_summary, progress
from unicache_fsm.fsm import loader
from unicache_fsm.fsm.coverage import Coverage

__all__ = ["COMMAND", "FUZZ_EXAMPLES", "FUZZ_STEPS"]

#: steps per run (walk) or per program (Hypothesis) of `fuzz`; Hypothesis's batches
FUZZ_STEPS = 50
FUZZ_EXAMPLES = 25


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--minutes",
        type=minutes,
        default=1.0,
        metavar="M",
        help=f"how long (default 1; above 0, at most {MAX_MINUTES:.0f})",
    )
    p.add_argument(
        "--page-size",
        type=int,
        choices=[1, 4, 16],
        default=None,
        metavar="P",
        help="one page size (default: 1 and 4)",
    )
    p.add_argument(
        "--swa",
        choices=["on", "off", "both"],
        default="both",
        help="run with the SWA component, without, or both (default)",
    )
    p.add_argument(
        "--coverage",
        type=path_arg,
        default=None,
        metavar="FILE.json",
        help="write the transitions taken (for diagram --coverage; default: not written)",
    )
    p.add_argument(
        "--driver",
        choices=["walk", "hypothesis"],
        default="walk",
        help="a seeded random walk through the rules (default), or Hypothesis's engine",
    )
    p.add_argument(
        "--seed",
        type=int_in(0, MAX_SEED),
        default=None,
        metavar="S",
        help="the walk's seed, 0 to 2**64-1 (default: a random one, printed)",
    )


def _run(args: argparse.Namespace) -> int:
    import random
    import time

    from unicache_fsm.testing.machines import SystemMachine

    if args.seed is not None and args.driver != "walk":
        msg = "--seed drives the walk; Hypothesis chooses its own programs (--driver walk)"
        raise CliError(msg)
    if args.coverage is not None:  # before the campaign, not after it
        output_file("--coverage", args.coverage)
    swa = {"on": (True,), "off": (False,), "both": (False, True)}[args.swa]
    pages = (args.page_size,) if args.page_size else SystemMachine.page_sizes
    machine: type[SystemMachine] = type(
        "Fuzz", (SystemMachine,), {"page_sizes": pages, "swa_choices": swa}
    )
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    total = args.minutes * 60.0
    start = time.perf_counter()
    with progress("fuzzing (seconds)", int(total)) as advance:

        def tick(_done: int) -> None:
            advance(int(min(time.perf_counter() - start, total)), int(total))

        if args.driver == "walk":
            runs, failure = _fuzz_walk(machine, seed, total, tick)
            what = ("runs", f"{runs} of up to {FUZZ_STEPS} steps (seed {seed}")
        else:
            runs, failure = _fuzz_hypothesis(machine, start, total, tick)
            what = ("examples", f"{runs} (Hypothesis's engine")
        advance(int(total), int(total))
    elapsed = time.perf_counter() - start
    cov = Coverage.from_counter(machine.coverage)
    arrows = missing = 0
    for name in loader.bundled_machines():
        spec = loader.bundled_spec(name)
        arrows += len(cov.declared(spec))
        missing += len(cov.missing(spec))
    if args.coverage is not None:
        cov.save(args.coverage)
    rows = [
        (
            what[0],
            f"{what[1]}; {machine.steps} rule steps, {machine.steps / elapsed:.0f} steps/s, "
            f"{elapsed:.0f} s)",
        ),
        ("coverage", f"{arrows - missing}/{arrows} declared transitions taken"),
        ("result", "FAILED (below)" if failure is not None else "no invariant broken"),
    ]
    print_summary(rows)
    if failure is not None:  # the replaying script, as it is (never laid out as a table)
        print(f"\nFAILED {failure}")
        return EXIT_CHECK_FAILED
    return EXIT_OK


def _fuzz_walk(
    machine: type, seed: int, seconds: float, tick: Callable[[int], None]
) -> tuple[int, str | None]:
    """Runs done, and on a failure its text (the error, then the replaying script)."""
    from unicache_fsm.testing import walk

    done = [0]

    def counted(runs: int) -> None:
        done[0] = runs
        tick(runs)

    try:
        walk.fuzz(machine, seed=seed, seconds=seconds, steps=FUZZ_STEPS, on_run=counted)
    except walk.WalkFailure as failure:
        return done[0], str(failure)
    return done[0], None


def _fuzz_hypothesis(
    machine: type, start: float, seconds: float, tick: Callable[[int], None]
) -> tuple[int, str | None]:
    """Examples run, and on a failure its first line (Hypothesis printed the program)."""
    import time

    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    batch = settings(
        max_examples=FUZZ_EXAMPLES, stateful_step_count=FUZZ_STEPS, deadline=None, database=None
    )
    examples = 0
    while time.perf_counter() - start < seconds:
        try:
            run_state_machine_as_test(machine, settings=batch)
        except Exception as exc:  # the kit found a bug: Hypothesis printed the program
            return examples, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        examples += FUZZ_EXAMPLES
        tick(examples)
    return examples, None


COMMAND = Command(
    "fuzz", "fuzz the whole system (tree, linker, store, host tier) for a while", _arguments, _run
)
