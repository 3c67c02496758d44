"""``unicache-fsm check-linker CONFIG_JSON_OR_@FILE [--minutes M] [--seed S]
[--faults KINDS] [--report DIR]``: check any SGLang 0.5.23 linker.

CONFIG is what an operator passes to ``--unified-cache-external-linker-config`` (JSON,
or ``@FILE``). The run: the linker class is checked before anything runs (module,
class, `UnifiedCacheLinker`, abstract methods, the signatures 0.5.23 calls); then the
scenario suite (`scenarios.SCENARIOS`) on a Full cache and, where the linker accepts
it, on Full + SWA; then `LinkerMachine` for ``--minutes`` (default 1; seeded by
``--seed``), two thirds Full, one third Full + SWA. ``--faults`` names the backend
faults to inject (``lose,corrupt,truncate,write,unreachable``; ``all`` the default,
``none``), used only where the linker offers ``backend_faults()``.

Prints the obligations table (pass / FAIL / n/a with why) and one line saying what the
run covered; writes ``--report DIR`` (default ``check-linker-report``): the table, the
protocol coverage (``coverage.json`` and Mermaid diagrams) and, on a violation, the
shortest failing program as ``test_shortest_failing_program.py``.

Exit 0: every obligation held; 1: a violation; 2: bad input (the config, the module or
class, an abstract class, a signature mismatch, a constructor that raises, or no SGLang
0.5.23 in this Python -- one line saying what is missing).

Importing this module imports neither SGLang nor torch; `run` does.
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["FAULT_KINDS", "HELP", "fault_kinds", "run"]

HELP = "check any SGLang 0.5.23 linker inside SGLang's real cache; obligations table"
FAULT_KINDS = ("lose", "corrupt", "truncate", "write", "unreachable")


def fault_kinds(text: str) -> frozenset[str]:
    """An argparse `type` for ``--faults``: a comma list of `FAULT_KINDS`, ``all`` or
    ``none``; an unknown kind is refused naming it."""
    if text == "all":
        return frozenset(FAULT_KINDS)
    if text == "none":
        return frozenset()
    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    unknown = sorted(kinds - set(FAULT_KINDS))
    if unknown:
        msg = f"unknown fault kind {unknown[0]!r} (known: {', '.join(FAULT_KINDS)}, all, none)"
        raise argparse.ArgumentTypeError(msg)
    return kinds


def run(args: argparse.Namespace) -> int:
    """Run the check `args` describes (``config``, ``minutes``, ``seed``, ``faults``,
    ``report``; the command line checks their ranges) and print it; the exit code."""
    importlib.import_module("unicache_fsm.integrations.sglang")  # no SGLang: one line, exit 2
    from unicache_fsm.integrations.linker_kit.check import check_linker

    result = check_linker(
        args.config,
        seconds=args.minutes * 60,
        seed_value=args.seed,
        faults=args.faults,
    )
    from rich.console import Console

    from unicache_fsm.integrations.linker_kit.report import table, write_report

    Console().print(table(result.verdicts))
    print(result.summary)
    written = write_report(
        args.report,
        verdicts=result.verdicts,
        coverage=result.coverage,
        program=result.program,
        summary=result.summary,
    )
    if result.program is not None:
        print(f"shortest failing program: {written[-1]}")
    print(f"report: {args.report}")
    return 0 if result.verdicts.ok else 1
