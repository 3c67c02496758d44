"""A store that breaks the protocol fails whichever of the kit's machines its author
picks: `StoreMachine` (the store alone) and `SystemMachine` (the store in the whole
system, whose `TestCase` also runs the store contract on the same `make_store`).

Two leaks, in two independently written stores: the example's `LeakyStore` (a
`MemoryStore` whose pool-less `evict` drops only the KV pages: its SWA and Mamba pages
stay, still offered) and `tests/dict_store.py`'s `LeakyDictStore` (a dict store whose
index forgets evictions: lookups promise pages whose bytes are gone, so its loads fail,
which the system contains as faults, so only the contract sees it). Correct stores pass.
"""

from __future__ import annotations

import importlib.util
import unittest
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, Phase, settings

from unicache_fsm import MemoryStore
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing import StoreMachine, SystemMachine, check_store

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(
    max_examples=20,
    deadline=None,
    database=None,
    derandomize=True,
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)
HUNT = settings(FAST, max_examples=100)  # a hunt stops at its first failure


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_leaky_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _load(ROOT / "examples" / "fuzz_your_store.py")
DICT_STORE = _load(ROOT / "tests" / "dict_store.py")


def _machines(make: type[ExternalStore]) -> tuple[type[StoreMachine], type[SystemMachine]]:
    class Alone(StoreMachine):
        def make_store(self) -> ExternalStore:
            return make()

    class InTheSystem(SystemMachine):
        def make_store(self) -> ExternalStore:
            return make()

    return Alone, InTheSystem


def _run(machine: type, budget: settings = FAST) -> unittest.TestResult:
    """Every test of `machine.TestCase`, under `budget`."""
    case = type("Fast", (machine.TestCase,), {"settings": budget})
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(case).run(result)
    assert not result.errors, result.errors
    return result


LEAKY = [EXAMPLE.LeakyStore, DICT_STORE.LeakyDictStore]


@pytest.mark.parametrize("store", LEAKY, ids=lambda s: s.__name__)
def test_a_leaky_store_fails_both_machines(store: type[ExternalStore]) -> None:
    for machine in _machines(store):
        failures = _run(machine, HUNT).failures
        assert len(failures) == 1, (machine.__name__, failures)
        assert "the test evicted it" in failures[0][1], failures[0][1]


@pytest.mark.parametrize("store", [DICT_STORE.DictStore], ids=lambda s: s.__name__)
def test_a_correct_store_passes_both_machines(store: type[ExternalStore]) -> None:
    for machine in _machines(store):
        result = _run(machine)
        assert result.wasSuccessful(), result.failures
        assert result.testsRun == (2 if issubclass(machine, SystemMachine) else 1)


def test_the_system_machine_alone_keeps_its_single_test() -> None:
    """The embedded store needs no contract run here (`MemoryStoreMachine` checks it)."""
    assert SystemMachine.store_contract() is None
    names = unittest.defaultTestLoader.getTestCaseNames(SystemMachine.TestCase)
    assert "test_store_contract" not in names


def test_a_make_store_that_returns_none_is_named() -> None:
    class Nothing(SystemMachine):
        def make_store(self) -> ExternalStore | None:
            return None

    contract = Nothing.store_contract()
    assert contract is not None
    with pytest.raises(TypeError, match=r"Nothing\.make_store\(\) returned None"):
        contract().make_store()


@pytest.mark.parametrize("store", LEAKY, ids=lambda s: s.__name__)
def test_check_store_names_the_machine_and_the_page(store: type[ExternalStore]) -> None:
    failure = check_store(store, examples=100)
    assert failure is not None and failure.startswith("StoreMachine: ")
    assert "the test evicted it" in failure


@pytest.mark.parametrize("examples", [0, -1, True, 2.5, "20"])
def test_check_store_refuses_a_nonsense_budget(examples: object) -> None:
    with pytest.raises(ValueError, match="examples must be an int >= 1"):
        check_store(MemoryStore, examples=examples)  # type: ignore[arg-type]


class _RaisingStore(MemoryStore):
    def progress(self) -> int:
        raise RuntimeError("backend down")


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (lambda: None, "StoreMachine: TypeError: make_store() returned None, not an ExternalStore"),
        (lambda: "store", "StoreMachine: TypeError: make_store() returned 'store'"),
        (_RaisingStore, "StoreMachine: RuntimeError: backend down"),
    ],
    ids=["none", "a string", "raises"],
)
def test_check_store_reports_a_broken_collaborator_as_a_failure(make: object, expect: str) -> None:
    failure = check_store(make, examples=5)  # type: ignore[arg-type]
    assert failure is not None and failure.startswith(expect), failure


def test_check_store_refuses_what_is_not_callable() -> None:
    with pytest.raises(TypeError, match="make_store must be callable"):
        check_store(MemoryStore(), examples=5)  # type: ignore[arg-type]
