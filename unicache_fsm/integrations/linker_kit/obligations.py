"""The obligations a SGLang 0.5.23 linker owes, each with a name the kit reports.

docs/contract.md ("A linker's obligations") states them in prose; this module is
their list, in the order `check-linker` prints them:

- `Obligation` — one member per obligation (``value`` is the name printed, the
  ``describe()`` line says what is checked).
- `LinkerViolation` — raised at the first broken obligation: ``obligation`` names it,
  ``detail`` says what was seen (one line).
- `BadLinkerError` — the linker cannot even be built (not importable, not a
  `UnifiedCacheLinker`, abstract, a signature SGLang cannot call): bad input, exit 2.
- `Verdicts` — pass / fail / not applicable (with why) per obligation, for the table.
"""

from __future__ import annotations

import enum

import attrs

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = ["BadLinkerError", "LinkerViolation", "Obligation", "Outcome", "Verdicts"]


class Obligation(enum.Enum):
    """An obligation of the linker contract (``value``: the name `check-linker` prints)."""

    SIGNATURES = "signatures"
    ANSWERS = "answers"
    NO_ESCAPE = "no-escape"
    LANDED_BYTES = "landed-bytes"
    LOOKUP_TRUTHFUL = "lookup-truthful"
    COMPLETIONS_BOUNDED = "completions-bounded"
    COMPLETIONS_ORDERED = "completions-ordered"
    COMPLETIONS_ARRIVE = "completions-arrive"
    NOTHING_QUEUED = "nothing-queued"
    BOUNDED_LIFECYCLE = "bounded-lifecycle"
    MODEL_ISOLATION = "model-isolation"
    SHARING = "sharing"

    def describe(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Obligation.SIGNATURES: (
        "the class SGLang's factory builds: a concrete UnifiedCacheLinker whose constructor "
        "and methods accept the arguments 0.5.23 passes"
    ),
    Obligation.ANSWERS: (
        "answer types and ranges: lookup a list of page counts in 1..tail pages, load / "
        "finish / cancel / offload / pop a bool, start an int, the count an int >= 0"
    ),
    Obligation.NO_ESCAPE: (
        "no exception escapes a linker call (0.5.23 has no handler: the worker dies)"
    ),
    Obligation.LANDED_BYTES: (
        "a load finished as landed holds the model's bytes in every layer of every slot"
    ),
    Obligation.LOOKUP_TRUTHFUL: (
        "lookup claims only pages an accepted offload of this model submitted"
    ),
    Obligation.COMPLETIONS_BOUNDED: (
        "the completion count never exceeds the offloads accepted and not yet popped "
        "(checked at the linker: SGLang's wrapper caps it)"
    ),
    Obligation.COMPLETIONS_ORDERED: (
        "completions pop oldest first, each with its own offload's result"
    ),
    Obligation.COMPLETIONS_ARRIVE: "every accepted offload completes within the poll budget",
    Obligation.NOTHING_QUEUED: (
        "a failed, cancelled or reset load leaves nothing queued: a cancelled load writes "
        "nothing, and a later batch of intact pages lands"
    ),
    Obligation.BOUNDED_LIFECYCLE: (
        "every call, reset and close among them, returns in bounded time; reset and close "
        "leave nothing in flight (no completion counted after reset; close twice is harmless)"
    ),
    Obligation.MODEL_ISOLATION: (
        "two models under one namespace string never see each other's pages"
    ),
    Obligation.SHARING: (
        "a second instance on the same backing store loads what the first stored, "
        "byte for byte (where the linker shares)"
    ),
}


class Outcome(enum.Enum):
    """One obligation's verdict in a run."""

    PASS = "pass"
    FAIL = "FAIL"
    NOT_APPLICABLE = "n/a"


class LinkerViolation(UnicacheFsmError, AssertionError):
    """The linker under test broke `obligation`; `detail` says how (one line)."""

    def __init__(self, obligation: Obligation, detail: str) -> None:
        self.obligation = obligation
        self.detail = detail
        super().__init__(f"{obligation.value}: {detail}")


class BadLinkerError(UnicacheFsmError, ValueError):
    """The configured linker cannot be built as SGLang builds it (bad input)."""


@attrs.define
class Verdicts:
    """Per obligation: checked (how often), failed (the first violation), or n/a (why)."""

    checks: dict[Obligation, int] = attrs.Factory(dict)
    failed: dict[Obligation, str] = attrs.Factory(dict)
    not_applicable: dict[Obligation, str] = attrs.Factory(dict)

    def checked(self, obligation: Obligation, times: int = 1) -> None:
        self.checks[obligation] = self.checks.get(obligation, 0) + times

    def fail(self, violation: LinkerViolation) -> None:
        self.failed.setdefault(violation.obligation, violation.detail)

    def skip(self, obligation: Obligation, why: str) -> None:
        self.not_applicable.setdefault(obligation, why)

    def outcome(self, obligation: Obligation) -> tuple[Outcome, str]:
        if obligation in self.failed:
            return Outcome.FAIL, self.failed[obligation]
        if self.checks.get(obligation):
            return Outcome.PASS, f"checked {self.checks[obligation]} times"
        why = self.not_applicable.get(obligation, "never exercised in this run")
        return Outcome.NOT_APPLICABLE, why

    @property
    def ok(self) -> bool:
        return not self.failed
