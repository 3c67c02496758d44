"""`check_linker`: one whole check of a linker config, as ``check-linker`` runs it.

1. `build.parse_config` and `build.linker_class` -- bad input raises `BadLinkerError`
   before anything runs; then one worker is built through SGLang's factory (a
   constructor that raises is bad input too).
2. The scenario suite on a Full cache, then on Full + SWA when the linker builds there
   (when it does not, the SWA half is skipped and the summary says why).
3. If every scenario held: `LinkerMachine` for `seconds` (two thirds Full, one third
   Full + SWA).

`CheckResult` holds the verdicts, the coverage, a one-line summary of what was covered,
and on a violation the shortest failing program as pytest source.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.loader import bundled_spec
from unicache_fsm.integrations.linker_kit.build import linker_class, parse_config
from unicache_fsm.integrations.linker_kit.faults import FAULT_KINDS
from unicache_fsm.integrations.linker_kit.ledger import Ledger
from unicache_fsm.integrations.linker_kit.machine import explore
from unicache_fsm.integrations.linker_kit.obligations import (
    BadLinkerError,
    LinkerViolation,
    Obligation,
    Verdicts,
)
from unicache_fsm.integrations.linker_kit.report import PROTOCOL_MACHINES, program_text
from unicache_fsm.integrations.linker_kit.scenarios import SCENARIOS, run_scenarios
from unicache_fsm.integrations.linker_kit.session import Session

__all__ = ["CheckResult", "check_linker"]


@attrs.define
class CheckResult:
    verdicts: Verdicts
    coverage: Coverage
    summary: str
    program: str | None = None
    violation: LinkerViolation | None = None


def _builds(config: dict[str, Any], swa: bool, ledger: Ledger) -> str | None:
    """None when the linker builds on this cache shape; else why not (one line: "building
    it through SGLang's factory raised ..." or "... did not return within ... s")."""
    session = Session(config, faults=(), swa=swa, ledger=ledger)
    try:
        session.rig  # noqa: B018 -- builds the worker
    except LinkerViolation as exc:  # the constructor raised, or did not return
        return exc.detail
    except Exception as exc:  # the worker around it could not be built
        return f"building the worker raised {type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        session.close()
    return None


def _coverage_line(coverage: Coverage) -> str:
    parts = []
    for name in PROTOCOL_MACHINES:
        declared = coverage.declared(bundled_spec(name))
        taken = sum(1 for n in declared.values() if n)
        parts.append(f"{name} {taken}/{len(declared)}")
    return "protocol arrows taken: " + ", ".join(parts)


def check_linker(
    config_text: str,
    *,
    seconds: float = 60.0,
    seed_value: int = 0,
    faults: Iterable[str] = FAULT_KINDS,
) -> CheckResult:
    """Check the linker of `config_text` (module docstring)."""
    faults = frozenset(faults)
    config = parse_config(config_text)
    cls = linker_class(config)
    verdicts = Verdicts()
    verdicts.checked(Obligation.SIGNATURES)
    coverage = Coverage()
    ledger = Ledger()
    why_not = _builds(config, False, ledger)
    if why_not is not None:
        where = f"{cls.__module__}.{cls.__qualname__}"
        msg = f"{where}: {why_not}"
        raise BadLinkerError(msg)
    shapes = [False]
    swa_why = _builds(config, True, ledger)
    if swa_why is None:
        shapes.append(True)
    covered = []
    for swa in shapes:
        failures = run_scenarios(
            config, faults=faults, swa=swa, verdicts=verdicts, coverage=coverage, ledger=ledger
        )
        covered.append(f"{len(SCENARIOS)} scenarios on {'Full+SWA' if swa else 'Full'}")
        if failures:
            first = failures[0]
            program = program_text(
                config,
                first.scenario.steps,
                faults=faults,
                swa=swa,
                why=f"scenario {first.scenario.name}: {first.violation}",
            )
            summary = f"covered {'; '.join(covered)}; violated in scenario {first.scenario.name}"
            return CheckResult(verdicts, coverage, summary, program, first.violation)
    if swa_why is not None:
        covered.append(f"Full+SWA skipped (the linker does not build there: {swa_why})")
    budget = {False: seconds * 2 / 3, True: seconds / 3} if len(shapes) == 2 else {False: seconds}
    for swa in shapes:
        found = explore(
            config,
            budget[swa],
            seed_value=seed_value,
            faults=faults,
            swa=swa,
            verdicts=verdicts,
            coverage=coverage,
            ledger=ledger,
        )
        covered.append(
            f"machine on {'Full+SWA' if swa else 'Full'}: {found.runs} runs, {found.steps} steps "
            f"in {found.seconds:.0f} s"
        )
        if found.violation is not None:
            program = program_text(
                config, found.program, faults=faults, swa=swa, why=str(found.violation)
            )
            summary = f"covered {'; '.join(covered)}; violated by the machine"
            return CheckResult(verdicts, coverage, summary, program, found.violation)
    summary = f"covered {'; '.join(covered)}; {_coverage_line(coverage)}"
    return CheckResult(verdicts, coverage, summary)
