"""What the arguments of ``unicache-fsm`` may be: the checks every subcommand shares.

Bad input is refused before any work, as one ``unicache-fsm: error: ...`` line and exit
code 2 (`EXIT_BAD_INPUT`), so nothing is written:

- `OneLineParser` — the parser of the command and its subcommands: a usage error is one
  line naming the argument, never a usage dump; `DefaultsHelpFormatter` makes every
  option's ``--help`` state its default.
- `int_in`, `minutes`, `machine_minutes`, `path_arg` — argparse ``type``s: every numeric
  argument has a range (stated in ``--help``, checked while parsing), a path is never
  empty nor holds a NUL.
- `reading` — wraps a parser run over an input: what a malformed file does to it (not
  UTF-8, nested past the recursion limit, a number of 5,000 digits) becomes one
  `CliError` naming the argument.
- `input_file`, `spec_input` — an input must be a regular file (a FIFO blocks, a device
  never ends).
- `output_file`, `output_folder` — an output is probed for a place to write before the
  run (a temporary file made and removed), leaving nothing behind.
- `one_line` — any error `main` reports, as the one line it prints.
- `CliError` — bad command-line input that no library error describes.

Imports no subcommand and nothing heavy (no torch): every subcommand imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from unicache_fsm.cli.command import EXIT_BAD_INPUT, PROG
from unicache_fsm.fsm.errors import InvalidSpecError, UnicacheFsmError

__all__ = [
    "MAX_CONTEXT",
    "MAX_EXPLORE_PAGES",
    "MAX_MINUTES",
    "MAX_REQUESTS",
    "MAX_SEED",
    "MAX_STEPS",
    "MAX_TOKENS",
    "MAX_TORCH_THREADS",
    "MAX_WORKERS",
    "CliError",
    "DefaultsHelpFormatter",
    "OneLineParser",
    "input_file",
    "int_in",
    "machine_minutes",
    "minutes",
    "one_line",
    "output_file",
    "output_folder",
    "path_arg",
    "reading",
    "spec_input",
]


class CliError(UnicacheFsmError, ValueError):
    """Bad command-line input that no library error describes (e.g. a bad ``-o``)."""

    # its public path (the error hierarchy in `unicache_fsm.fsm.errors` and a traceback
    # name it so), where callers have always caught it
    __module__ = "unicache_fsm.cli"


class OneLineParser(argparse.ArgumentParser):
    """Reports usage errors as one ``unicache-fsm: error:`` line, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        # "argument --pages: must be ..." (a bound below) reads "--pages must be ..."
        message = re.sub(r"^argument (?:\S+/)?(\S+): must be ", r"\1 must be ", message)
        message = " ".join(message.split())
        self.exit(EXIT_BAD_INPUT, f"{PROG}: error: {message} (see {self.prog} --help)\n")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help states its default: one whose help does not mention it gets
    `` (default: VALUE)`` (flags and options without a value have none to state)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text
            or not action.option_strings
            or action.default in (None, argparse.SUPPRESS)
            or isinstance(action.default, bool)
        ):
            return text
        return f"{text} (default: %(default)s)"


#: the most simulated requests, explored pages and processes, torch threads: beyond
#: these a run cannot finish (or the process cannot start) on any machine we target
MAX_REQUESTS = 1_000_000
MAX_TOKENS = 1 << 22  # = the scheduler's MAX_POOL_TOKENS (a test keeps them equal)
MAX_EXPLORE_PAGES = 64
MAX_WORKERS = 64
MAX_TORCH_THREADS = 256
MAX_MINUTES = 24 * 60.0
MAX_SEED = 2**64 - 1
MAX_CONTEXT = 10_000
MAX_STEPS = 1_000_000


def _shown(text: str) -> str:
    """An argument as quoted in an error line (a long one cut short)."""
    return repr(text if len(text) <= 40 else text[:37] + "...")


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse `type`: an integer from `lo` to `hi`, else one line naming it."""

    def integer(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:  # not a number, or more digits than Python converts
            value = None
        if value is None or not lo <= value <= hi:
            msg = f"must be {lo} or more and at most {hi}, got {_shown(text)}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return integer


def minutes(text: str) -> float:
    """An argparse `type`: a finite number of minutes above 0, at most a day."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_MINUTES:  # also refuses nan and inf
        msg = (
            f"must be a number of minutes above 0 and at most {MAX_MINUTES:.0f}, got {_shown(text)}"
        )
        raise argparse.ArgumentTypeError(msg)
    return value


def machine_minutes(text: str) -> float:
    """An argparse `type`: minutes for check-linker's machine, 0 (the scenarios alone) to
    a day; nan and inf refused."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_MINUTES:
        msg = f"must be a number of minutes from 0 to {MAX_MINUTES:.0f}, got {_shown(text)}"
        raise argparse.ArgumentTypeError(msg)
    return value


def path_arg(text: str) -> Path:
    """An argparse `type`: a path (an empty one or one holding NUL names nothing)."""
    if not text or "\0" in text:
        msg = f"must be a path, got {_shown(text)}"
        raise argparse.ArgumentTypeError(msg)
    return Path(text)


@contextlib.contextmanager
def reading(flag: str, path: object) -> Iterator[None]:
    """Run a parser over the input `flag` names; what a malformed input makes it raise
    (beyond the library's own typed errors and `OSError`) becomes one `CliError`."""
    try:
        yield
    except (UnicacheFsmError, OSError):
        raise
    except (ValueError, RecursionError, OverflowError, MemoryError) as exc:
        if isinstance(exc, RecursionError):
            reason = "nested too deeply"
        elif isinstance(exc, UnicodeDecodeError):
            reason = f"not UTF-8 (byte {exc.start})"
        else:
            reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        msg = f"{flag} {str(path)!r} cannot be read: {reason}"
        raise CliError(msg) from None


def input_file(flag: str, path: Path) -> None:
    """Refuse an input that is not a regular file (a FIFO blocks, a device never ends)."""
    if not path.exists():
        msg = f"{flag} {str(path)!r}: no such file"
        raise CliError(msg)
    if not path.is_file():
        msg = f"{flag} {str(path)!r} is not a regular file"
        raise CliError(msg)


def spec_input(flag: str, path: Path) -> None:
    """Refuse a spec path, or a spec folder holding a ``*.toml``, that is no regular file."""
    if path.is_dir():
        for file in path.glob("*.toml"):
            input_file(flag, file)
    else:
        input_file(flag, path)


def output_file(flag: str, path: Path) -> None:
    """Refuse an output file that cannot be written, before the run (nothing is left)."""
    folder = path.parent
    if not folder.is_dir():
        msg = f"{flag} {str(path)!r}: no folder {str(folder)!r} to write it in"
        raise CliError(msg)
    if path.exists() and not path.is_file():  # a FIFO would block, a device swallow
        what = "is a directory," if path.is_dir() else "exists and is"
        msg = f"{flag} {str(path)!r} {what} not a regular file"
        raise CliError(msg)
    _probe(flag, path, folder)


def output_folder(flag: str, path: Path) -> None:
    """Refuse an output folder (created if missing) that cannot be made or written."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == path else f"is under the file {str(existing)!r}"
        msg = f"{flag} {str(path)!r} {what}; give a directory (created if missing)"
        raise CliError(msg)
    _probe(flag, path, existing)


def _probe(flag: str, path: Path, folder: Path) -> None:
    """Create and remove a temporary file in `folder` (permission bits do not bind root;
    a read-only or pseudo file system does)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        msg = f"{flag} {str(path)!r} cannot be written: {exc.strerror or exc}"
        raise CliError(msg) from None


def one_line(exc: BaseException) -> str:
    """An error as one line (an `InvalidSpecError` lists its problems after a colon)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror or exc}: {exc.filename}"
    lines = [line.strip().removeprefix("- ") for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, InvalidSpecError) and len(lines) > 1:
        return f"{lines[0]} {'; '.join(lines[1:])}"
    return " ".join(lines) or type(exc).__name__
