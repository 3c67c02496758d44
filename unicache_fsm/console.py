"""Terminal output of the command line and the benchmarks: progress and tables.

Built on `rich`:

- `progress(description, total)` — a context manager yielding `update(done, total)`;
  it draws one bar on stderr with the count, elapsed time and the time remaining.
  When stderr is not a terminal nothing is drawn while it runs and one final line is
  printed at the end, so logs stay readable.
- `table(title, columns, rows)` — a `rich.table.Table` (a column whose cells all read
  as numbers is right-aligned); `print_table(...)` prints one on stdout (plain columns
  when stdout is not a terminal). Every benchmark prints its tables with it.
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
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

__all__ = ["print_table", "progress", "table"]


@contextlib.contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int, int], None]]:
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
    if not live:
        t = bar.tasks[0]
        elapsed = t.finished_time if t.finished_time is not None else t.elapsed or 0.0
        print(
            f"{description}: {int(t.completed)}/{int(t.total or 0)} in {elapsed:.1f} s",
            file=sys.stderr,
        )


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    """A table with `columns` headers (numbers right-aligned) and one row per item."""
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for i, name in enumerate(columns):
        cells = [row[i] for row in rows if i < len(row)]
        numeric = bool(cells) and all(_numeric(v) for v in cells)
        t.add_column(name, justify="right" if numeric else "left")
    for row in rows:
        t.add_row(*(str(v) for v in row))
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
