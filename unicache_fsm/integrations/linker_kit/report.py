"""What `check-linker` prints and writes: the obligations table, the failing program,
and the protocol machines' coverage.

- `table(verdicts)` — a rich `Table`: each obligation, pass / FAIL / n/a, and why (the
  violation, how often it was checked, or why it did not apply).
- `program_text(config, steps, ...)` — a runnable pytest file replaying `steps`
  (`session.replay`) and expecting no violation: it fails exactly as the run did.
- `write_report(directory, ...)` — ``obligations.txt`` (the table), ``coverage.json``
  (``unicache-fsm diagram --coverage`` reads it), ``coverage.md`` (the Mermaid
  diagrams of ``sglang_linker``, ``sglang_load`` and ``sglang_offload`` coloured by what
  the run took) and, on a violation, ``test_shortest_failing_program.py``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.diagram import render_mermaid
from unicache_fsm.fsm.loader import bundled_spec
from unicache_fsm.integrations.linker_kit.obligations import Obligation, Outcome, Verdicts
from unicache_fsm.integrations.linker_kit.session import Step

__all__ = ["PROTOCOL_MACHINES", "program_text", "table", "table_text", "write_report"]

PROTOCOL_MACHINES = ("sglang_linker", "sglang_load", "sglang_offload")
_STYLE = {Outcome.PASS: "green", Outcome.FAIL: "bold red", Outcome.NOT_APPLICABLE: "yellow"}


def table(verdicts: Verdicts, title: str = "linker obligations") -> Table:
    out = Table(title=title)
    out.add_column("obligation")
    out.add_column("verdict")
    out.add_column("why")
    for obligation in Obligation:
        outcome, why = verdicts.outcome(obligation)
        out.add_row(obligation.value, f"[{_STYLE[outcome]}]{outcome.value}[/]", why)
    return out


def table_text(verdicts: Verdicts, title: str = "linker obligations", width: int = 120) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table(verdicts, title))
    return console.export_text()


def program_text(
    config: dict[str, Any], steps: Sequence[Step], *, faults: Iterable[str], swa: bool, why: str
) -> str:
    listed = ",\n".join(f"    {step!r}" for step in steps)
    return f'''"""The shortest failing program check-linker found: {why}

Run it where SGLang 0.5.23 and unicache_fsm import: python -m pytest THIS_FILE
"""

from unicache_fsm.integrations.linker_kit.session import Step, replay

CONFIG = {json.dumps(config, indent=4)}

STEPS = [
{listed},
]


def test_shortest_failing_program() -> None:
    replay(CONFIG, STEPS, faults={sorted(faults)!r}, swa={swa!r})
'''


def _diagram(name: str, coverage: Coverage) -> str:
    spec = bundled_spec(name)
    return render_mermaid(spec, None, coverage.declared(spec))


def write_report(
    directory: Path,
    *,
    verdicts: Verdicts,
    coverage: Coverage,
    program: str | None,
    summary: str,
) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    text = directory / "obligations.txt"
    text.write_text(f"{table_text(verdicts)}\n{summary}\n", encoding="utf-8")
    written.append(text)
    cov = directory / "coverage.json"
    coverage.save(cov)
    written.append(cov)
    diagrams = [
        f"## {name}\n\n```mermaid\n{_diagram(name, coverage)}```\n" for name in PROTOCOL_MACHINES
    ]
    md = directory / "coverage.md"
    md.write_text("# Protocol coverage of the check\n\n" + "\n".join(diagrams), encoding="utf-8")
    written.append(md)
    if program is not None:
        test = directory / "test_shortest_failing_program.py"
        test.write_text(program, encoding="utf-8")
        written.append(test)
    return written
