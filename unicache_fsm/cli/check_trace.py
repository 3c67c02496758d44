"""``unicache-fsm check-trace FILE.jsonl [--spec FILE_OR_DIR ...] [--context N]``:
replay a trace against the specs.

Replays a trace (``simulate --trace``, or a user machine's `TraceRecorder`) against
the bundled specs and those ``--spec`` gives, drawing a progress bar on stderr. Exit 0
with a summary when every step is legal; 1 (`EXIT_CHECK_FAILED`) with the first
illegal step and the N records before it; 2 when the trace cannot be read (not JSON
lines, a malformed record, a machine with no spec: the line says which ``--spec`` to
give) or holds no record at all.

Needs no torch: part of the core install.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from unicache_fsm.cli.arguments import (
    MAX_CONTEXT,
    CliError,
    input_file,
    int_in,
    path_arg,
    reading,
    spec_input,
)
from unicache_fsm.cli.command import EXIT_CHECK_FAILED, EXIT_OK, Command
from unicache_fsm.console import print_summary, progress
from unicache_fsm.fsm import loader
from unicache_fsm.fsm.conformance import check_trace, read_trace, spec_lookup
from unicache_fsm.fsm.errors import TraceInputError

__all__ = ["COMMAND"]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", type=path_arg, metavar="FILE.jsonl", help="a trace from --trace")
    p.add_argument(
        "--spec",
        type=path_arg,
        action="append",
        default=[],
        metavar="FILE_OR_DIR",
        help="a .toml spec, or a folder of them, for machines of your own (repeatable; "
        "the bundled machines stay known)",
    )
    p.add_argument(
        "--context",
        type=int_in(0, MAX_CONTEXT),
        default=5,
        metavar="N",
        help=f"previous records shown (default 5; 0-{MAX_CONTEXT})",
    )


def _run(args: argparse.Namespace) -> int:
    specs = []
    for path in args.spec:
        spec_input("--spec", path)
        with reading("--spec", path):
            specs.extend(loader.load_specs(path))
    input_file("FILE.jsonl", args.trace)
    try:
        with (
            reading("FILE.jsonl", args.trace),
            progress("checking records", 0, final_line=False) as update,
        ):
            lines = _count_lines(args.trace)
            records = _counted(read_trace(args.trace), lambda n: update(n, lines))
            result = check_trace(records, spec_lookup(specs), context=args.context)
    except TraceInputError as exc:
        if exc.machine is None:
            raise
        msg = f"{exc}; give the spec of {exc.machine!r} with --spec FILE_OR_DIR"
        raise CliError(msg) from None
    if result.violation is not None:
        print(result.violation.describe())
        return EXIT_CHECK_FAILED
    if result.records == 0:
        msg = f"{str(args.trace)!r} holds no trace records (an empty file checks nothing)"
        raise CliError(msg)
    print_summary(
        [
            ("trace", str(args.trace)),
            ("result", f"{result.records} records, {result.models} models: every step is legal"),
        ]
    )
    return EXIT_OK


def _count_lines(path: Path) -> int:
    """Lines of a file (the progress bar's total), read in blocks of 1 MiB."""
    with path.open("rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def _counted(items: Iterable[Any], note: Callable[[int], None], every: int = 1000) -> Iterator[Any]:
    """`items`, calling `note(done)` every `every` items and at the end."""
    done = 0
    for done, item in enumerate(items, start=1):
        if done % every == 0:
            note(done)
        yield item
    note(done)


COMMAND = Command(
    "check-trace",
    "replay a JSONL trace against the specs; report the first illegal step",
    _arguments,
    _run,
)
