"""`LinkerMachine`: Hypothesis's rule-based machine over one linker inside SGLang's cache.

Subclass it with the operator's launch JSON, and it is a test::

    class TestMyLinker(LinkerMachine):
        config = {"linker": "MyLinker", "linker_module_path": "my_pkg.linker",
                  "linker_extra_config": {"root": "/tmp/pages"}}

    TestCase = TestMyLinker.TestCase

Rules (each one `Step` of the session's program, so a failure shrinks to the shortest
program and `report.write_program` turns it into a pytest file): requests with shared
prefixes compute, load, cancel before and after start; polls, quiesces, evictions,
resets with loads queued or started, restarts of the worker (a new linker on the same
backing store), a second instance, a second model; and, when the linker offers a
`BackendFaults` (and ``faults`` names them), lost / corrupted / truncated pages, a
failed write, an outage. Every linker call is checked (`CheckedLinker`): the first
broken obligation fails the run with `LinkerViolation`.

`explore(config, seconds, seed, ...)` runs the machine for a wall-clock budget, as
``check-linker`` does, one seeded Hypothesis run after another; it returns the
verdicts, the steps run, and on a violation the shrunk program.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Any, ClassVar

import attrs
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.integrations.linker_kit.faults import FAULT_KINDS
from unicache_fsm.integrations.linker_kit.ledger import Ledger
from unicache_fsm.integrations.linker_kit.obligations import LinkerViolation, Verdicts
from unicache_fsm.integrations.linker_kit.session import PROMPTS, Session, Step

__all__ = ["Exploration", "LinkerMachine", "explore"]

_PROMPT = st.integers(0, PROMPTS - 1)


class LinkerMachine(RuleBasedStateMachine):
    """The linker of `config` under random scheduler steps (module docstring)."""

    config: ClassVar[dict[str, Any]] = {}
    faults: ClassVar[frozenset[str]] = frozenset(FAULT_KINDS)
    swa: ClassVar[bool] = False
    #: every session this class ran, newest last (the shrunk failure is the last)
    sessions: ClassVar[list[Session]] = []
    #: the truth every session of this class shares (None: one per session)
    ledger: ClassVar[Ledger | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.session = Session(
            self.config, faults=self.faults, swa=self.swa, ledger=type(self).ledger
        )
        type(self).sessions.append(self.session)
        self.down = False

    def _offers(self, kind: str) -> bool:
        return self.session.offers(kind)

    @rule(n=_PROMPT)
    def compute(self, n: int) -> None:
        self.session.do(Step("compute", (n,)))

    @rule()
    def poll(self) -> None:
        self.session.do(Step("poll"))

    @precondition(lambda self: not self.down)
    @rule()
    def quiesce(self) -> None:
        self.session.do(Step("quiesce"))

    @rule()
    def evict(self) -> None:
        self.session.do(Step("evict"))

    @rule(n=_PROMPT)
    def load(self, n: int) -> None:
        self.session.do(Step("load", (n,)))

    @rule(n=_PROMPT)
    def cancel(self, n: int) -> None:
        self.session.do(Step("cancel", (n,)))

    @rule(n=_PROMPT, m=_PROMPT)
    def cancel_beside(self, n: int, m: int) -> None:
        self.session.do(Step("cancel_beside", (n, m)))

    @rule(n=_PROMPT)
    def cancel_started(self, n: int) -> None:
        self.session.do(Step("cancel_started", (n,)))

    @rule(n=_PROMPT, started=st.booleans())
    def reset_with_load(self, n: int, started: bool) -> None:
        self.session.do(Step("reset_started" if started else "reset_queued", (n,)))

    @rule()
    def restart(self) -> None:
        self.session.do(Step("restart"))

    @precondition(lambda self: not self.down)
    @rule(n=_PROMPT)
    def second_instance(self, n: int) -> None:
        self.session.do(Step("second_instance", (n,)))

    @precondition(lambda self: not self.down)
    @rule(n=_PROMPT)
    def other_model(self, n: int) -> None:
        self.session.do(Step("other_model", (n,)))

    @rule(kind=st.sampled_from(("lose", "corrupt", "truncate")), n=_PROMPT)
    def damage(self, kind: str, n: int) -> None:
        if self._offers(kind):
            self.session.do(Step("damage", (kind, n)))

    @rule(kind=st.sampled_from(("lose", "corrupt", "truncate")), n=_PROMPT)
    def load_damaged(self, kind: str, n: int) -> None:
        if self._offers(kind):
            self.session.do(Step("load_damaged", (n, kind)))

    @rule()
    def fail_next_write(self) -> None:
        if self._offers("write"):
            self.session.do(Step("fail_next_write"))

    @rule()
    def outage(self) -> None:
        if self._offers("unreachable") and not self.down:
            self.session.do(Step("outage"))
            self.down = True

    @rule()
    def recover(self) -> None:
        if self.down:
            self.session.do(Step("recover"))
            self.down = False

    def teardown(self) -> None:
        if self.down:
            with contextlib.suppress(LinkerViolation):  # the run's verdict holds it
                self.session.do(Step("recover"))
        self.session.close()


@attrs.define
class Exploration:
    """What `explore` ran: verdicts, counts, and the shrunk failing program if any."""

    verdicts: Verdicts
    coverage: Coverage
    runs: int = 0
    steps: int = 0
    seconds: float = 0.0
    violation: LinkerViolation | None = None
    program: list[Step] = attrs.Factory(list)


def explore(
    config: dict[str, Any],
    seconds: float,
    *,
    seed_value: int = 0,
    faults: Iterable[str] = FAULT_KINDS,
    swa: bool = False,
    verdicts: Verdicts | None = None,
    coverage: Coverage | None = None,
    ledger: Ledger | None = None,
    examples_per_run: int = 5,
    steps_per_example: int = 20,
) -> Exploration:
    """Run `LinkerMachine` on `config` for about `seconds` (module docstring)."""
    out = Exploration(verdicts or Verdicts(), coverage or Coverage())
    machine: type[LinkerMachine] = type(
        "CheckLinkerMachine",
        (LinkerMachine,),
        {
            "config": config,
            "faults": frozenset(faults),
            "swa": swa,
            "sessions": [],
            "ledger": ledger if ledger is not None else Ledger(),
        },
    )
    options = settings(
        max_examples=examples_per_run,
        stateful_step_count=steps_per_example,
        deadline=None,
        database=None,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )
    started = time.monotonic()
    while time.monotonic() - started < seconds:

        def factory() -> LinkerMachine:
            return machine()

        seed(seed_value * 1_000_003 + out.runs)(factory)  # Hypothesis reads it off the factory
        out.runs += 1
        try:
            run_state_machine_as_test(factory, settings=options)  # type: ignore[arg-type]
        except LinkerViolation as exc:
            out.violation = exc
        except HypothesisException:
            # the backing store outlives an example, so a replay during shrinking may
            # differ (Flaky): report the first session that broke an obligation, unshrunk
            broke = [s for s in machine.sessions if s.violation is not None]
            if not broke:
                raise
            machine.sessions.append(broke[0])
            out.violation = broke[0].violation
        finally:
            for session in machine.sessions:
                out.steps += len(session.program)
                out.coverage.merge(session.coverage)
                for ob, n in session.verdicts.checks.items():
                    out.verdicts.checked(ob, n)
                for ob, why in session.verdicts.not_applicable.items():
                    out.verdicts.skip(ob, why)
            last = machine.sessions[-1] if machine.sessions else None
            machine.sessions.clear()
        if out.violation is not None:
            out.verdicts.fail(out.violation)
            out.program = list(last.program) if last is not None else []
            break
    out.seconds = time.monotonic() - started
    return out
