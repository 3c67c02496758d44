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
or opened is refused at start. A command that needs the ``kv`` extra on a core-only
install gets one line naming it.

One module per subcommand, each holding its arguments, input checks and printing and
exporting its `Command` as ``COMMAND`` (a new subcommand is a new module and one entry
in `COMMANDS`):

- `cli.diagram` — ``diagram``: draw machines as Mermaid, DOT, SVG or PNG.
- `cli.docs` — ``docs``: regenerate ``<machine>.md`` next to every spec (and, from a
  checkout, ``spec_enums.py``); ``--check``.
- `cli.check_trace` — ``check-trace``: replay a JSONL trace against the specs.
- `cli.fuzz` — ``fuzz``: fuzz the whole system for M minutes.
- `cli.explore` — ``explore``: every state of a tiny system, breadth-first.
- `cli.simulate` — ``simulate``: serve a workload through the reference scheduler loop.
- `cli.check_linker` — ``check-linker``: check any SGLang 0.5.23 linker.

Beneath them, `cli.arguments` holds what every subcommand's arguments may be (the
typed argparse ``type``s and their ranges, the input and output probes, the one-line
error parser and the help formatter that states each default) and `cli.command` what a
subcommand is and the exit codes. ``--version`` prints the package version.

Every ``--help`` states each option's default. Progress goes to stderr and is drawn
only on a terminal (one final line otherwise, so CI logs stay plain); results are
printed on stdout as aligned rich tables.

Commands that never touch a tensor (``--help``, ``diagram``, ``docs``,
``check-trace``) never import torch: the heavy modules are imported inside the
commands that use them, so importing this package (every subcommand module) does not.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from unicache_fsm import __version__

# ``X as X``: the public names of the single-module CLI, re-exported at their old path
from unicache_fsm.cli import check_linker, check_trace, diagram, docs, explore, fuzz, simulate
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
from unicache_fsm.cli.arguments import DefaultsHelpFormatter, OneLineParser, one_line
from unicache_fsm.cli.command import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, Command
from unicache_fsm.cli.command import PROG as PROG
from unicache_fsm.cli.diagram import DEFAULT_DIAGRAM_FOLDER as DEFAULT_DIAGRAM_FOLDER
from unicache_fsm.cli.explore import DEFAULT_EXPLORE_FAULTS as DEFAULT_EXPLORE_FAULTS
from unicache_fsm.cli.fuzz import FUZZ_EXAMPLES as FUZZ_EXAMPLES
from unicache_fsm.cli.fuzz import FUZZ_STEPS as FUZZ_STEPS
from unicache_fsm.cli.simulate import DEFAULT_POOL_TOKENS as DEFAULT_POOL_TOKENS
from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = ["COMMANDS", "EXIT_BAD_INPUT", "EXIT_CHECK_FAILED", "EXIT_OK", "Command", "main"]

# what the ``kv`` extra adds to the core install: a command that needs one of them on
# a core-only install gets one line naming the extra, not a traceback
KV_EXTRA_MODULES = frozenset({"torch", "numpy", "hypothesis", "xxhash"})

COMMANDS: tuple[Command, ...] = (
    diagram.COMMAND,
    docs.COMMAND,
    check_trace.COMMAND,
    fuzz.COMMAND,
    explore.COMMAND,
    simulate.COMMAND,
    check_linker.COMMAND,
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
