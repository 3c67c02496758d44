"""The ``unicache-fsm`` command line.

``main(argv)`` parses the arguments, runs one subcommand and returns the exit code:
0 on success, 1 when a check found something (``docs --check``), 2 on bad input
(unknown machine or state, invalid spec file, Graphviz missing, bad arguments). Bad
input prints exactly one line, ``unicache-fsm: error: ...``, on stderr and never a
traceback, and is refused before any work, so nothing is written: every numeric
argument has a range (stated in ``--help``, checked while parsing), every input file
must be a regular file and whatever a malformed one does to its parser becomes that
line, every output is probed for a place to write before the run, and ``simulate``
opens (and closes) its ``--store`` before the run, so a store that cannot be reached
or opened is refused at start.

Subcommands (one `Command` each in `COMMANDS`; a new one is a function that adds
its arguments, a function that runs it, and one entry in the table):

- ``diagram [MACHINE] --format mermaid|dot|svg|png [--highlight STATE] [--coverage F]
  [-o PATH]`` —
  draw one machine (a bundled name or a ``.toml`` spec file) or, without MACHINE,
  every bundled machine. Text formats go to stdout (several machines one after the
  other, each preceded by a comment naming it) or to ``-o FILE``. Images need
  Graphviz; with one machine ``-o`` is the file (default ``<machine>.<fmt>``), with
  several it is a directory (default ``unicache-fsm-diagrams``, created if missing; a
  missing path with a suffix such as ``all.png`` is refused as a file name) receiving
  one file per machine; the paths written are printed.
- ``docs [--check] [--specs-dir DIR]`` — regenerate ``<machine>.md`` next to every
  ``<machine>.toml`` (default: the bundled specs of a source checkout; an installed
  package's copy is never rewritten); ``--check`` writes nothing and exits 1 listing
  the stale files.
- ``--version`` prints the package version.
- ``check-trace FILE.jsonl [--spec FILE_OR_DIR ...]`` — replay a trace against the
  bundled specs and those given (a progress bar on stderr); exit 1 with the first
  illegal step and its context, 2 when the trace cannot be read (not JSON lines, a
  malformed record, a machine with no spec).
- ``fuzz --minutes M [--driver walk|hypothesis] [--seed S] [--coverage F]`` — fuzz the
  whole system (`SystemMachine`, every invariant after every step) for M minutes: by
  default a seeded random walk through its rules (`testing.walk`, runs of 50 steps),
  or Hypothesis's stateful engine (batches of 25 programs of 50 steps); a summary of
  runs, steps, steps/s and transition coverage (a progress bar on stderr while it
  runs); exit 1 on a failure, after printing the shrunk program as a Python script
  that replays it (the walk) or Hypothesis's falsifying program.
- ``explore [--pages N] [--requests R] [--page-size P] [--key-pages K] [--swa-window W]
  [--swa-checkpoint C] [--faults F] [--unpinned] [--corrupt] [--store-pages S] [--unrelated]
  [--depth D] [--minutes M] [--workers J] [--coverage F] [--test-out F]`` — breadth-first
  search of every state of a tiny system (`unicache_fsm.testing.explore`); shows its
  progress (depth, states, time left under ``--minutes``) on stderr, then prints the
  distinct states, transitions, states/s, depth, the declared transitions reached and
  what ended it (exhausted, "depth limit D reached" or "time limit T s reached");
  ``--swa-window`` is in tokens as in ``simulate`` (a multiple of the page size); on a
  violation prints the shortest operation
  sequence as a pytest test and the machines' diagrams along it, and exits 1. Its
  defaults are a scope that exhausts in minutes (4 pages, 2 requests of one one-page
  key, FULL+SWA with a one-page window, `refuse_load` and `fail_batch_midway`).
- ``simulate [...]`` — serve a workload through the reference scheduler loop and print
  the report as a table (``--json``: the run's summary as JSON instead; ``--json
  PATH``: into that file as well as the table); progress bars with elapsed time and ETA
  go to stderr while the workload is generated and served. ``--baseline RUN.json``
  puts an earlier run's summary beside this one (figures and deltas). ``--trace``
  records every transition (with its scheduler step and time), ``--coverage`` writes
  transition counts that ``diagram --coverage`` draws, ``--host-tokens`` adds the host
  tier, ``--swa-checkpoint K`` (with ``--swa-window``) keeps the SWA window ending
  every K pages too (`tree.swa_checkpoints`), ``--report DIR`` writes
  ``DIR/index.html`` (`scheduler.html_report`: per-request figures, charts over time,
  the compare section, the coverage-coloured diagrams; needs Graphviz). With an SWA
  window a note says why hit rates fall.
- ``check-linker CONFIG_JSON_OR_@FILE [--minutes M] [--seed S] [--faults K] [--report
  DIR]`` — check any SGLang 0.5.23 linker inside SGLang's real cache
  (`unicache_fsm.integrations.linker_kit.cli`).

Every ``--help`` states each option's default. Progress goes to stderr and is drawn
only on a terminal (one final line otherwise, so CI logs stay plain); results are
printed on stdout as aligned rich tables.

Commands that never touch a tensor (``--help``, ``diagram``, ``docs``,
``check-trace``) never import torch: the heavy modules are imported inside the
commands that use them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from unicache_fsm import __version__
from unicache_fsm.cli import check_trace, diagram, docs, explore, fuzz, simulate
from unicache_fsm.cli.arguments import MAX_CONTEXT as MAX_CONTEXT
from unicache_fsm.cli.arguments import MAX_EXPLORE_PAGES as MAX_EXPLORE_PAGES
from unicache_fsm.cli.arguments import MAX_MINUTES as MAX_MINUTES
from unicache_fsm.cli.arguments import MAX_REQUESTS as MAX_REQUESTS
from unicache_fsm.cli.arguments import MAX_SEED as MAX_SEED
from unicache_fsm.cli.arguments import MAX_STEPS as MAX_STEPS
from unicache_fsm.cli.arguments import MAX_TOKENS as MAX_TOKENS
from unicache_fsm.cli.arguments import MAX_TORCH_THREADS as MAX_TORCH_THREADS
from unicache_fsm.cli.arguments import MAX_WORKERS as MAX_WORKERS
from unicache_fsm.cli.arguments import CliError as CliError
from unicache_fsm.cli.arguments import (
    DefaultsHelpFormatter,
    OneLineParser,
    input_file,
    int_in,
    machine_minutes,
    one_line,
    output_folder,
    path_arg,
)
from unicache_fsm.cli.command import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, PROG, Command
from unicache_fsm.cli.diagram import DEFAULT_DIAGRAM_FOLDER as DEFAULT_DIAGRAM_FOLDER
from unicache_fsm.cli.explore import DEFAULT_EXPLORE_FAULTS as DEFAULT_EXPLORE_FAULTS
from unicache_fsm.cli.fuzz import FUZZ_EXAMPLES as FUZZ_EXAMPLES
from unicache_fsm.cli.fuzz import FUZZ_STEPS as FUZZ_STEPS
from unicache_fsm.cli.simulate import DEFAULT_POOL_TOKENS as DEFAULT_POOL_TOKENS
from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.integrations.linker_kit import cli as check_linker_cli

__all__ = ["COMMANDS", "EXIT_BAD_INPUT", "EXIT_CHECK_FAILED", "EXIT_OK", "Command", "main"]

# what the ``kv`` extra adds to the core install: a command that needs one of them on
# a core-only install gets one line naming the extra, not a traceback
KV_EXTRA_MODULES = frozenset({"torch", "numpy", "hypothesis", "xxhash"})


def _check_linker_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        metavar="CONFIG_JSON_OR_@FILE",
        help="the linker launch JSON (--unified-cache-external-linker-config), or @FILE",
    )
    p.add_argument(
        "--minutes",
        type=machine_minutes,
        default=1.0,
        help=f"machine budget, 0 (scenarios only) to {MAX_MINUTES:.0f} (default: 1)",
    )
    p.add_argument(
        "--seed",
        type=int_in(0, MAX_SEED),
        default=0,
        help="seed of the machine, 0 to 2**64-1 (default: 0)",
    )
    kinds = ",".join(check_linker_cli.FAULT_KINDS)
    p.add_argument(
        "--faults",
        type=check_linker_cli.fault_kinds,
        default=frozenset(check_linker_cli.FAULT_KINDS),
        help=f"backend faults to inject: a comma list of {kinds}, all or none (default: all)",
    )
    p.add_argument(
        "--report",
        type=path_arg,
        default=Path("check-linker-report"),
        help="report directory, created if missing (default: check-linker-report)",
    )


def _run_check_linker(args: argparse.Namespace) -> int:
    config = str(args.config)
    if config.startswith("@"):
        input_file("CONFIG", Path(config[1:]))
    output_folder("--report", args.report)
    return check_linker_cli.run(args)


# -- entry point -----------------------------------------------------------------------


COMMANDS: tuple[Command, ...] = (
    diagram.COMMAND,
    docs.COMMAND,
    check_trace.COMMAND,
    fuzz.COMMAND,
    explore.COMMAND,
    simulate.COMMAND,
    Command("check-linker", check_linker_cli.HELP, _check_linker_arguments, _run_check_linker),
)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        formatter_class=DefaultsHelpFormatter,
        description="Simulation, diagrams, docs and checks for the unicache_fsm machines.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            formatter_class=DefaultsHelpFormatter,
        )
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` (default ``sys.argv[1:]``); return the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already reported on stderr
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in KV_EXTRA_MODULES:
            raise
        print(
            f"{PROG}: error: {args.command} needs the KV-cache extra ({missing} is not "
            "installed): pip install 'unicache-fsm[kv]'",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    except (UnicacheFsmError, OSError) as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
