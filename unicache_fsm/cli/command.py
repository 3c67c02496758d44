"""What a subcommand of ``unicache-fsm`` is, and the exit codes every one returns.

- `Command` — one subcommand: its name, one-line help, the function that adds its
  arguments to its parser, and the function that runs it.
- `EXIT_OK` (0) — the command did what was asked and found nothing wrong.
- `EXIT_CHECK_FAILED` (1) — a check found something (a stale doc, an illegal trace step,
  a broken invariant, a linker obligation not held).
- `EXIT_BAD_INPUT` (2) — bad input: one ``unicache-fsm: error:`` line on stderr, nothing
  written.

Imports nothing of the package: every module of `unicache_fsm.cli` may import it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import attrs

__all__ = ["EXIT_BAD_INPUT", "EXIT_CHECK_FAILED", "EXIT_OK", "PROG", "Command"]

PROG = "unicache-fsm"
EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


@attrs.frozen
class Command:
    """One subcommand: its name, one-line help, argument setup and body.

    `run` gets the parsed arguments, prints its results on stdout and returns the
    exit code; it reports bad input by raising `UnicacheFsmError` (or `OSError`),
    which `main` turns into one error line and exit code 2.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
