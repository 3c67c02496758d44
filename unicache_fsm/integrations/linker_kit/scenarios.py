"""The scenario suite: one named program per obligation of the linker contract.

Each `Scenario` is data -- a name, the obligation it targets, the backend faults it
needs, and its steps (`session.Step`) -- run in a fresh `Session` by `run_scenarios`,
before the random machine, because most broken linkers fall to one of them within a
second. The sessions of a run share the backing store, so each scenario has prompts of
its own (numbers ``10 * k + ...``, past the machine's). A scenario needing a fault the
linker does not offer (or ``--faults`` left out) is skipped and its obligation reported
not applicable, with why. The list, in
docs/contract.md's words, is `SCENARIOS`; a failing scenario's steps are its own
shortest failing program.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.integrations.linker_kit.faults import FAULT_KINDS
from unicache_fsm.integrations.linker_kit.ledger import Ledger
from unicache_fsm.integrations.linker_kit.obligations import (
    LinkerViolation,
    Obligation,
    Verdicts,
)
from unicache_fsm.integrations.linker_kit.session import Session, Step

__all__ = ["SCENARIOS", "Scenario", "ScenarioFailure", "run_scenarios"]


@attrs.frozen
class Scenario:
    """A named program aimed at one obligation."""

    name: str
    obligation: Obligation
    steps: tuple[Step, ...]
    needs: frozenset[str] = frozenset()


def _s(*steps: tuple[Any, ...] | str) -> tuple[Step, ...]:
    return tuple(Step(s) if isinstance(s, str) else Step(s[0], tuple(s[1:])) for s in steps)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "round_trip_after_device_eviction",
        Obligation.LANDED_BYTES,
        _s(
            ("compute", 10),
            "quiesce",
            "evict",
            ("compute", 12),
            "quiesce",
            "evict",
            ("load", 10),
            ("load", 12),
        ),
    ),
    Scenario(
        "round_trip_after_flush",
        Obligation.LANDED_BYTES,
        _s(("compute", 21), "quiesce", "reset", ("load", 21)),
    ),
    Scenario(
        "lookup_of_a_partly_stored_prompt",
        Obligation.LOOKUP_TRUTHFUL,
        _s(("compute", 30), "quiesce", "evict", ("load", 32)),
    ),
    Scenario(
        "two_offloads_complete_before_one_poll",
        Obligation.COMPLETIONS_ARRIVE,
        _s(("compute", 40), ("compute", 43), "quiesce"),
    ),
    Scenario(
        "completion_count_per_offload",
        Obligation.COMPLETIONS_BOUNDED,
        _s(("compute", 52), "poll", "quiesce"),
    ),
    Scenario(
        "round_trip_from_a_second_instance",
        Obligation.SHARING,
        _s(("compute", 63), "quiesce", ("second_instance", 63)),
    ),
    Scenario(
        "cancel_before_start",
        Obligation.NOTHING_QUEUED,
        _s(("compute", 70), "quiesce", "evict", ("cancel", 70), ("load", 70)),
    ),
    Scenario(
        "cancel_one_of_two_queued",
        Obligation.NOTHING_QUEUED,
        _s(
            ("compute", 200),
            ("compute", 203),
            "quiesce",
            "evict",
            ("cancel_beside", 200, 203),
            ("load", 200),
        ),
    ),
    Scenario(
        "cancel_after_start",
        Obligation.NOTHING_QUEUED,
        _s(("compute", 80), "quiesce", "evict", ("cancel_started", 80), ("load", 80)),
    ),
    Scenario(
        "reset_with_loads_queued",
        Obligation.BOUNDED_LIFECYCLE,
        _s(
            ("compute", 94), "quiesce", "evict", ("compute", 95), ("reset_queued", 94), ("load", 94)
        ),
    ),
    Scenario(
        "reset_with_loads_in_flight",
        Obligation.BOUNDED_LIFECYCLE,
        _s(
            ("compute", 104),
            "quiesce",
            "evict",
            ("reset_started", 104),
            ("compute", 101),
            "quiesce",
            "evict",
            ("load", 101),
            ("load", 104),
        ),
    ),
    Scenario(
        "close_twice", Obligation.BOUNDED_LIFECYCLE, _s(("compute", 110), "quiesce", "close_twice")
    ),
    Scenario(
        "two_models_one_namespace",
        Obligation.MODEL_ISOLATION,
        _s(("compute", 127), "quiesce", ("other_model", 127)),
    ),
    Scenario(
        "offload_failure",
        Obligation.COMPLETIONS_ORDERED,
        _s(
            "fail_next_write",
            ("compute", 130),
            ("compute", 133),
            "quiesce",
            "evict",
            ("load", 133),
            ("load", 130),
        ),
        frozenset({"write"}),
    ),
    Scenario(
        "page_lost_before_the_load",
        Obligation.NO_ESCAPE,
        _s(("compute", 140), "quiesce", "evict", ("damage", "lose", 140), ("load", 140)),
        frozenset({"lose"}),
    ),
    Scenario(
        "page_lost_between_load_and_start",
        Obligation.NO_ESCAPE,
        _s(
            ("compute", 150),
            ("compute", 153),
            "quiesce",
            "evict",
            ("load_damaged", 150, "lose"),
            ("load", 153),
        ),
        frozenset({"lose"}),
    ),
    Scenario(
        "failed_batch_then_an_intact_one",
        Obligation.NOTHING_QUEUED,
        _s(
            ("compute", 160),
            ("compute", 163),
            "quiesce",
            "evict",
            ("load_damaged", 160, "corrupt"),
            ("load", 163),
        ),
        frozenset({"corrupt"}),
    ),
    Scenario(
        "flipped_bit_in_a_stored_page",
        Obligation.LANDED_BYTES,
        _s(("compute", 170), "quiesce", "evict", ("damage", "corrupt", 170), ("load", 170)),
        frozenset({"corrupt"}),
    ),
    Scenario(
        "truncated_page",
        Obligation.NO_ESCAPE,
        _s(
            ("compute", 180),
            "quiesce",
            "evict",
            ("damage", "truncate", 180),
            ("load", 180),
            ("load", 180),
        ),
        frozenset({"truncate"}),
    ),
    Scenario(
        "backend_outage",
        Obligation.NO_ESCAPE,
        _s(
            ("compute", 190),
            "quiesce",
            "outage",
            "evict",
            ("load", 190),
            ("compute", 193),
            "poll",
            "recover",
            "quiesce",
            ("compute", 195),
            "quiesce",
            "evict",
            ("load", 195),
        ),
        frozenset({"unreachable"}),
    ),
)


@attrs.define
class ScenarioFailure:
    """The scenario that broke an obligation, and its violation."""

    scenario: Scenario
    violation: LinkerViolation


def run_scenarios(
    config: dict[str, Any],
    *,
    faults: Iterable[str] = FAULT_KINDS,
    swa: bool = False,
    verdicts: Verdicts,
    coverage: Coverage,
    ledger: Ledger,
    only: Iterable[str] | None = None,
) -> list[ScenarioFailure]:
    """Run the scenarios (or those named in `only`) up to the first that fails; the
    failure, if any, in a list."""
    wanted = set(only) if only is not None else None
    faults = frozenset(faults)
    failures = []
    offered: bool | None = None
    for scenario in SCENARIOS:
        if wanted is not None and scenario.name not in wanted:
            continue
        session = Session(config, faults=faults, swa=swa, ledger=ledger)
        try:
            if offered is None:
                offered = session.rig.faults is not None
            missing = scenario.needs - faults
            if scenario.needs and (not offered or missing):
                why = (
                    "the linker offers no backend_faults()"
                    if not offered
                    else f"--faults leaves out {', '.join(sorted(missing))}"
                )
                verdicts.skip(scenario.obligation, f"{scenario.name}: {why}")
                continue
            session.run(scenario.steps)
        except LinkerViolation as exc:
            failures.append(ScenarioFailure(scenario, exc))
        finally:
            session.close()
            coverage.merge(session.coverage)
            for ob, n in session.verdicts.checks.items():
                verdicts.checked(ob, n)
            for ob, detail in session.verdicts.failed.items():
                verdicts.failed.setdefault(ob, detail)
            for ob, why in session.verdicts.not_applicable.items():
                verdicts.skip(ob, why)
        if failures:
            break
    return failures
