"""Review of issue 33 (rev33): `ContractMonitor` in record mode around a linker that
misbehaves (raises, answers None or a string) never raises into SGLang and never
changes an answer; raise mode raises; what record mode keeps stays bounded.
"""

from __future__ import annotations

from typing import Any

import pytest

from sglang_linker.engine import Engine
from unicache_fsm.integrations.protocol import ProtocolViolation
from unicache_fsm.integrations.sglang import ContractMonitor
from unicache_fsm.store.memory import MemoryStore

TOKENS = list(range(1, 17))

#: (call, its arguments) for every call SGLang makes that answers something
CALLS: list[tuple[str, tuple[Any, ...]]] = [
    ("lookup", ("r1", [])),
    ("load", ("r1", [])),
    ("start_layer_wise_loading", ()),
    ("finish_layer_wise_loading", (0,)),
    ("cancel_queued_load", ("r1",)),
    ("offload", ([],)),
    ("num_completed_offloads", ()),
    ("pop_completed_offload", ()),
]


class Broken:
    """A real `StoreLinker` whose `call` answers `answer` (or raises it) instead."""

    def __init__(self, real: Any, call: str, answer: object) -> None:
        self.real, self.call, self.answer = real, call, answer

    def __getattr__(self, name: str) -> Any:
        if name != self.call:
            return getattr(self.real, name)

        def planted(*args: Any, **kwargs: Any) -> object:
            if isinstance(self.answer, BaseException):
                raise self.answer
            return self.answer

        return planted


@pytest.fixture
def engine() -> Any:
    engine = Engine(MemoryStore(background=False), monitored=False)
    yield engine
    engine.store_linker.close()


@pytest.mark.parametrize(("call", "args"), CALLS, ids=[c for c, _ in CALLS])
@pytest.mark.parametrize(
    "answer", [None, "yes", RuntimeError("boom")], ids=["none", "str", "raises"]
)
def test_rev33_record_mode_never_raises_its_own_and_never_changes_an_answer(
    engine: Engine, call: str, args: tuple[Any, ...], answer: object
) -> None:
    monitor = ContractMonitor.around(
        Broken(engine.store_linker, call, answer), mode="record", summary_every_s=3600
    )
    for _ in range(2):  # the second call meets the state the first one's answer left
        if isinstance(answer, BaseException):
            with pytest.raises(RuntimeError) as info:
                getattr(monitor, call)(*args)
            assert info.value is answer  # the wrapped linker's own, untouched
        else:
            assert getattr(monitor, call)(*args) is answer
    assert monitor.counts().get("monitor_errors", 0) == 0


def test_rev33_raise_mode_raises_on_a_string_answer(engine: Engine) -> None:
    monitor = ContractMonitor.around(Broken(engine.store_linker, "load", "yes"), mode="raise")
    with pytest.raises(ProtocolViolation):
        monitor.load("r1", [])


def test_rev33_record_mode_keeps_a_bounded_number_of_violations(engine: Engine) -> None:
    # defect: record mode (a deployment's) appends every violation, with its history,
    # to a list that is never trimmed: a linker that misbehaves on every call grows the
    # worker's memory without bound while `counts()` stays right
    monitor = ContractMonitor.around(
        Broken(engine.store_linker, "finish_layer_wise_loading", True),
        mode="record",
        summary_every_s=3600,
    )
    calls = 3000
    for index in range(calls):
        monitor.finish_layer_wise_loading(10_000 + index)  # never started: a violation each
    assert monitor.counts()["violations"] == calls
    kept = monitor.monitor.violations
    assert len(kept) < calls // 2, f"{len(kept)} violations kept in memory"
