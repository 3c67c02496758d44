"""`Session`: one check run of one linker config -- its workers, its truth, its program.

- `Session(config, faults=KINDS, swa=False)` — the run's `Ledger` and `Verdicts`, and a
  first `Rig` (model ``MODEL``) built on demand. Every step is recorded in `program`
  as a `Step` (a ``repr`` that is valid Python), so a failing run replays as a test.
- `do(step)` — run one `Step` on the current worker: ``compute`` / ``load`` /
  ``cancel`` / ``cancel_started`` / ``load_damaged`` (a prompt by number),
  ``cancel_beside`` (two prompts: the first cancelled beside the second's load),
  ``poll`` / ``quiesce`` / ``evict`` / ``reset`` / ``restart`` / ``close_twice``,
  ``damage`` (kind, prompt), ``fail_next_write``, ``outage`` / ``recover``,
  ``second_instance`` (prompt: a new worker on the same config loads it),
  ``other_model`` (prompt: a worker of another model, same config, loads it).
- `replay(config, steps, ...)` — a fresh session runs `steps`; raises the first
  `LinkerViolation` (what a written failing program calls).
The two models are ``MODEL`` and ``OTHER_MODEL``: SGLang 0.5.23 resolves a worker's
`ServerArgs` on CPU only for the placeholder model paths ``dummy`` and ``none``, and a
linker reads the model's identity where SGLang's own linkers do
(``get_model().model_path``). The sessions of one run share one `Ledger`, as they
share the backing store; a run (and a replayed program) expects the backing store
empty at its start.

- `prompt(n)` — request ``n``'s tokens: prompts share first pages in families, so
  lookups and loads see partial hits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
from unicache_fsm.integrations.linker_kit.rig import PAGE, Rig

__all__ = ["MODEL", "OTHER_MODEL", "PROMPTS", "Session", "Step", "prompt", "replay"]

MODEL = "dummy"
OTHER_MODEL = "none"
#: how many distinct prompts the steps choose from
PROMPTS = 8


def prompt(n: int) -> list[int]:
    """Request `n`'s tokens: page 0 from family ``n % 2``, then 1-3 pages of its own."""
    family = [1000 * (n % 2 + 1) + i for i in range(PAGE)]
    own = [100_000 + 1000 * n + i for i in range(PAGE * (1 + n % 3))]
    return family + own


@attrs.frozen
class Step:
    """One step of a check program: `op` with its arguments (``repr`` is Python)."""

    op: str
    args: tuple[Any, ...] = ()

    def __repr__(self) -> str:
        if not self.args:
            return f"Step({self.op!r})"
        return f"Step({self.op!r}, {self.args!r})"


class Session:
    """One check run (module docstring)."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        faults: Iterable[str] = FAULT_KINDS,
        swa: bool = False,
        ledger: Ledger | None = None,
    ) -> None:
        self.config = config
        self.faults = frozenset(faults)
        self.swa = swa
        self.ledger = ledger if ledger is not None else Ledger()
        self.ledger.write_fault_armed = self.ledger.unreachable = False
        self.verdicts = Verdicts()
        self.program: list[Step] = []
        self.violation: LinkerViolation | None = None
        self.rigs: list[Rig] = []
        self._rig: Rig | None = None
        self._rids = 0

    # -- workers --------------------------------------------------------------------------

    def new_rig(self, model: str = MODEL) -> Rig:
        rig = Rig(
            self.config,
            model=model,
            swa=self.swa,
            ledger=self.ledger,
            verdicts=self.verdicts,
        )
        self.rigs.append(rig)
        return rig

    @property
    def coverage(self) -> Coverage:
        """The protocol machines' transitions every worker of this session took."""
        out = Coverage()
        for rig in self.rigs:
            out.merge(rig.monitor.coverage())
        return out

    @property
    def rig(self) -> Rig:
        if self._rig is None:
            self._rig = self.new_rig()
        return self._rig

    def offers(self, kind: str) -> bool:
        """Whether fault `kind` is asked for and the linker has a fault interface."""
        return kind in self.faults and self.rig.faults is not None

    def close(self) -> None:
        """Close the current worker (errors are the run's verdict, not raised here)."""
        if self._rig is not None and not self._rig.closed:
            try:
                self._rig.close()
            except LinkerViolation as exc:
                self.verdicts.fail(exc)
        self._rig = None

    def _rid(self) -> str:
        self._rids += 1
        return f"req-{self._rids}"

    # -- steps ----------------------------------------------------------------------------

    def do(self, step: Step) -> Any:
        self.program.append(step)
        try:
            return getattr(self, f"_op_{step.op}")(*step.args)
        except LinkerViolation as exc:
            self.verdicts.fail(exc)
            if self.violation is None:
                self.violation = exc
            raise

    def run(self, steps: Sequence[Step]) -> None:
        for step in steps:
            self.do(step)

    def _op_compute(self, n: int) -> None:
        self.rig.compute(prompt(n))

    def _op_poll(self) -> None:
        self.rig.poll()

    def _op_quiesce(self) -> None:
        self.rig.quiesce()

    def _op_evict(self) -> None:
        self.rig.evict()

    def _op_load(self, n: int) -> int:
        return self.rig.load(prompt(n), self._rid())

    def _op_load_damaged(self, n: int, kind: str) -> int:
        return self.rig.load(prompt(n), self._rid(), damage=kind)

    def _op_cancel(self, n: int) -> bool:
        return self.rig.cancel(prompt(n), self._rid())

    def _op_cancel_beside(self, n: int, m: int) -> int:
        return self.rig.cancel_beside(prompt(n), self._rid(), prompt(m), self._rid())

    def _op_cancel_started(self, n: int) -> None:
        self.rig.cancel_started(prompt(n), self._rid())

    def _op_reset(self) -> None:
        self.rig.reset()

    def _op_reset_queued(self, n: int) -> None:
        self.rig.reset_with_load(prompt(n), self._rid(), started=False)

    def _op_reset_started(self, n: int) -> None:
        self.rig.reset_with_load(prompt(n), self._rid(), started=True)

    def _op_restart(self) -> None:
        self.close()
        self._rig = self.new_rig()

    def _op_close_twice(self) -> None:
        rig = self.rig
        rig.close()
        rig.checked.close()  # a second close, straight to the linker
        self._rig = None

    def _op_damage(self, kind: str, n: int) -> None:
        self.rig.damage(kind, self.rig.keys(prompt(n)))

    def _op_fail_next_write(self) -> None:
        self.rig.fail_next_write()

    def _op_outage(self) -> None:
        self.rig.set_reachable(False)

    def _op_recover(self) -> None:
        self.rig.set_reachable(True)

    def _op_second_instance(self, n: int) -> None:
        other = self.new_rig()
        try:
            loaded = other.load(prompt(n), self._rid())
        finally:
            other.close()
        if loaded:
            self.verdicts.checked(Obligation.SHARING)
        else:
            self.verdicts.skip(
                Obligation.SHARING,
                "a second instance on the same config found nothing the first stored "
                "(the linker does not share its backing store)",
            )

    def _op_other_model(self, n: int) -> None:
        other = self.new_rig(OTHER_MODEL)
        try:
            other.load(prompt(n), self._rid())
            self.verdicts.checked(Obligation.MODEL_ISOLATION)
        finally:
            other.close()


def replay(
    config: dict[str, Any],
    steps: Sequence[Step],
    *,
    faults: Iterable[str] = FAULT_KINDS,
    swa: bool = False,
) -> Session:
    """Run `steps` in a fresh session; the first `LinkerViolation` propagates."""
    session = Session(config, faults=faults, swa=swa)
    try:
        session.run(steps)
    finally:
        session.close()
    return session
