"""`check_store`: fuzz a store backend with both of the kit's machines, from a script.

``check_store(make_store, examples=N)`` runs `StoreMachine` (the store alone against
the protocol's model) and then `SystemMachine` (the store inside the whole system:
tree, linker, host tier, injected faults), each for `N` programs, derandomized (the
same programs every run, no database) and without shrinking (a first failure is
reported as found), with Hypothesis's working files in a temporary directory removed
at the end (nothing is left in the current directory). It returns None when both
pass, else one line naming the machine and the first line of its failure.
`make_store` is called for each program and must return a fresh, unattached
`ExternalStore`. (Hypothesis's home directory is its default again afterwards.)

In a test suite, subclass the machines instead (their `TestCase` runs under the loaded
Hypothesis profile and prints a pasteable program on a failure); this is the short
route for a script or a first look.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing.machines import SystemMachine
from unicache_fsm.testing.store_machine import StoreMachine

__all__ = ["check_store"]


def check_store(make_store: Callable[[], ExternalStore], *, examples: int = 30) -> str | None:
    """Fuzz the stores `make_store` returns; None when they keep the contract, else
    ``"<Machine>: <what broke>"`` — an assertion of the machine, or an exception the
    store (or `make_store`) raised, named by its type. Raises `TypeError` when
    `make_store` is not callable and `ValueError` for `examples` not an int >= 1, before
    running anything."""
    given: object = make_store  # checked at run time: callers pass anything
    if not callable(given):
        msg = f"check_store: make_store must be callable, got {make_store!r}"
        raise TypeError(msg)
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        msg = f"check_store: examples must be an int >= 1, got {examples!r}"
        raise ValueError(msg)

    def fresh() -> ExternalStore:
        store: object = make_store()
        if not isinstance(store, ExternalStore):
            msg = f"make_store() returned {store!r}, not an ExternalStore"
            raise TypeError(msg)
        return store

    class Alone(StoreMachine):
        def make_store(self) -> ExternalStore:
            return fresh()

    class InTheSystem(SystemMachine):
        def make_store(self) -> ExternalStore:
            return fresh()

    budget = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
    )
    machine: type[RuleBasedStateMachine]
    with tempfile.TemporaryDirectory(prefix="unicache-check-store-") as scratch:
        set_hypothesis_home_dir(scratch)
        try:
            for label, machine in (("StoreMachine", Alone), ("SystemMachine", InTheSystem)):
                try:
                    run_state_machine_as_test(machine, settings=budget)
                except AssertionError as exc:
                    return f"{label}: {_first_line(exc)}"
                except Exception as exc:  # the store's (or make_store's) own exception
                    return f"{label}: {type(exc).__name__}: {_first_line(exc)}"
        finally:
            set_hypothesis_home_dir(None)
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or ["(no message)"])[0]
