"""Terminal output of the command line and the benchmarks: progress and tables.

Built on `rich`:

- `progress(description, total, final_line=True)` — a context manager yielding
  `update(done, total)`; it draws one bar on stderr with the count, elapsed time and
  the time remaining. When stderr is not a terminal nothing is drawn while it runs and
  one final line is printed at the end (unless `final_line` is false: the caller
  prints its own result), so logs stay readable.
- `search_progress(description, seconds=, depth=)` — a context manager yielding
  `update(depth, states, frontier)` for a level-by-level search: a spinner with the
  depth reached (of the depth limit), the states found, the elapsed time and, under a
  time limit, the time left. Quiet while it runs when stderr is not a terminal; one
  final line then.
- `table(title, columns, rows)` — a `rich.table.Table` (a column whose cells all read
  as numbers is right-aligned; cells are text as given, never rich markup);
  `print_table(...)` prints one on stdout (plain columns when stdout is not a
  terminal). Every benchmark prints its tables with it.
- `print_summary(rows)` — (label, text) rows as two aligned columns without rules
  (labels bold on a terminal); the text is printed as given, never read as markup.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

__all__ = ["print_summary", "print_table", "progress", "search_progress", "table"]


@contextlib.contextmanager
def progress(
    description: str, total: int, *, final_line: bool = True
) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr; yields `update(done, total)` (see the module docstring)."""
    console = Console(file=sys.stderr)
    live = console.is_terminal
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        disable=not live,
    )
    task = bar.add_task(description, total=total)

    def update(done: int, new_total: int) -> None:
        bar.update(task, completed=done, total=new_total)

    with bar:
        yield update
    if not live and final_line:
        t = bar.tasks[0]
        elapsed = t.finished_time if t.finished_time is not None else t.elapsed or 0.0
        print(
            f"{description}: {int(t.completed)}/{int(t.total or 0)} in {elapsed:.1f} s",
            file=sys.stderr,
        )


class _TimeLeft(ProgressColumn):
    """The time left under a time limit of `seconds` (from the task's start)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def render(self, task: Task) -> Text:
        left = max(0.0, self.seconds - (task.elapsed or 0.0))
        return Text(f"{left:.0f} s left")


@contextlib.contextmanager
def search_progress(
    description: str, *, seconds: float | None = None, depth: int | None = None
) -> Iterator[Callable[[int, int, int], None]]:
    """A search's progress on stderr; yields `update(depth, states, frontier)` (see the
    module docstring)."""
    console = Console(file=sys.stderr)
    live = console.is_terminal
    columns: list[ProgressColumn] = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[status]}"),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
    ]
    if seconds is not None:
        columns.append(_TimeLeft(seconds))
    bar = Progress(*columns, console=console, disable=not live)
    of = f" of {depth}" if depth is not None else ""
    task = bar.add_task(description, total=None, status=f"depth 0{of}")
    status = [f"depth 0{of}"]

    def update(reached: int, states: int, frontier: int) -> None:
        status[0] = f"depth {reached}{of}: {states} states, {frontier} new"
        bar.update(task, status=status[0])

    with bar:
        yield update
    if not live:
        elapsed = bar.tasks[0].elapsed or 0.0
        print(f"{description}: {status[0]} in {elapsed:.1f} s", file=sys.stderr)


def print_summary(rows: Sequence[tuple[str, str]]) -> None:
    """Print (label, text) rows as two aligned columns on stdout (see the module
    docstring), each line without trailing blanks."""
    t = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    for label, text in rows:
        t.add_row(Text(label), Text(text))
    console = Console(file=sys.stdout, soft_wrap=False, width=_width())
    with console.capture() as captured:
        console.print(t)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    """A table with `columns` headers (numbers right-aligned) and one row per item."""
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for i, name in enumerate(columns):
        cells = [row[i] for row in rows if i < len(row)]
        numeric = bool(cells) and all(_numeric(v) for v in cells)
        t.add_column(name, justify="right" if numeric else "left")
    for row in rows:
        t.add_row(*(Text(str(v)) for v in row))  # as given: "[x]" in a path is not markup
    return t


def _numeric(value: object) -> bool:
    """A number, or text that starts like one ("1.2x (0.9-1.4)", "-3", "12,000")."""
    if isinstance(value, int | float):
        return True
    text = str(value).lstrip("+-")
    return bool(text) and (text[0].isdigit() or (text[0] == "." and text[1:2].isdigit()))


def print_table(
    title: str | None, columns: Sequence[str], rows: Sequence[Sequence[object]]
) -> None:
    """Print `title` (one plain line, never wrapped) and then `table(None, ...)` on stdout,
    each line without trailing blanks."""
    console = Console(file=sys.stdout, soft_wrap=False, width=_width())
    with console.capture() as captured:
        console.print(table(None, columns, rows))
    if title:
        print(title)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


def _width() -> int | None:
    """The terminal's width, or a wide page when stdout is not a terminal."""
    return None if sys.stdout.isatty() else 160
