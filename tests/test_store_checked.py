"""`CheckedStore`: every exception and every ill-typed answer of a store call is a fault
of that call — reported once (typed, naming the call and the value), answered as a
refusal — and never raised at the caller."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.store.checked import CheckedStore
from unicache_fsm.store.errors import StoreProtocolError
from unicache_fsm.store.protocol import LoadBatchResult

KEYS = tuple(f"{i:064x}" for i in range(1, 4))
LOOKUP = [PoolTransfer(PoolName.KV, keys=KEYS)]


class Answers:
    """A stand-in store whose every call returns (or raises) what the test set."""

    def __init__(self) -> None:
        self.answer: Any = None
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            if isinstance(self.answer, BaseException):
                raise self.answer
            return self.answer

        return call


def checked() -> tuple[CheckedStore, Answers, list[tuple[str, BaseException]]]:
    store = Answers()
    faults: list[tuple[str, BaseException]] = []
    return CheckedStore(store, lambda op, err: faults.append((op, err))), store, faults  # type: ignore[arg-type]


# (call, args, ill-typed answers, what a fault answers, a good answer and its result)
CALLS: list[tuple[str, tuple[Any, ...], list[Any], Any, Any, Any]] = [
    ("lookup", ("r", LOOKUP, 3), [None, "12", [1, "2"], [True], 3], None, [1, 3], [1, 3]),
    ("load", ("r", LOOKUP), [None, "true", 1, [True]], False, True, True),
    ("start_loading", (), [None, "0", 1.0, -2, True], None, 4, 4),
    ("num_completed_loads", (), [None, -1, "2", 2.0, True], None, 2, 2),
    (
        "pop_completed_load",
        (),
        [
            None,
            0,
            LoadBatchResult(1, ("r",), "false"),  # type: ignore[arg-type]
            LoadBatchResult("1", (), True),  # type: ignore[arg-type]
            LoadBatchResult(1, None, True),  # type: ignore[arg-type]
            LoadBatchResult(1, ("r", 3), True),  # type: ignore[arg-type]
            LoadBatchResult(1, "r", True),  # type: ignore[arg-type]
        ],
        None,
        LoadBatchResult(1, ("r",), False),
        LoadBatchResult(1, ("r",), False),
    ),
    ("cancel_queued_load", ("r",), [None, "no", 0], None, False, False),
    ("num_completed_offloads", (), [None, -3, "1"], None, 1, 1),
    ("pop_completed_offload", (), [None, "false", 1, "true"], None, True, True),
]


@pytest.mark.parametrize(
    ("name", "args", "bad", "refusal", "good", "result"), CALLS, ids=[c[0] for c in CALLS]
)
def test_each_call_contains_exceptions_and_ill_typed_answers(
    name: str, args: tuple[Any, ...], bad: list[Any], refusal: Any, good: Any, result: Any
) -> None:
    store, answers, faults = checked()
    call = getattr(store, name)
    answers.answer = good
    assert call(*args) == result and not faults
    for error in (
        ConnectionError("gone"),
        KeyError("x"),
        StoreProtocolError("m", operation="o", value=1),
    ):
        answers.answer = error
        assert call(*args) == refusal
        assert faults[-1] == (name, error)
    for value in bad:
        answers.answer = value
        assert call(*args) == refusal, value
        op, err = faults[-1]
        assert op == name and isinstance(err, StoreProtocolError), err
        assert err.operation == name and err.value is value
        assert name in str(err) and repr(value) in str(err)
    assert len(answers.calls) == 1 + 3 + len(bad)


def test_offload_tells_a_refusal_from_a_reply_that_may_have_been_lost() -> None:
    """The store's own error changed nothing (False: refused); a lost reply (a timeout, a
    broken connection) or an answer that is no bool may hide a queued offload (None)."""
    store, answers, faults = checked()
    answers.answer = True
    assert store.offload(LOOKUP) is True and not faults
    for error, verdict in (
        (KeyError("x"), False),
        (StoreProtocolError("m", operation="o", value=1), False),
        (RuntimeError("disk"), False),
        (ConnectionError("gone"), None),
        (TimeoutError("slow"), None),
    ):
        answers.answer = error
        assert store.offload(LOOKUP) is verdict, error
        assert faults[-1] == ("offload", error)
    for value in (None, "ok", 1, 0, [True]):
        answers.answer = value
        assert store.offload(LOOKUP) is None, value
        op, err = faults[-1]
        assert op == "offload" and isinstance(err, StoreProtocolError) and err.value is value


def test_out_of_range_boundaries_are_dropped_and_reported() -> None:
    store, answers, faults = checked()
    answers.answer = [0, 1, 3, 4, -1]
    assert store.lookup("r", LOOKUP, 3) == [1, 3]
    ((op, err),) = faults
    assert op == "lookup" and isinstance(err, StoreProtocolError) and "1..3" in str(err)


def test_reset_reports_a_failure_and_keyboard_interrupt_passes() -> None:
    store, answers, faults = checked()
    answers.answer = RuntimeError("stuck")
    assert store.reset() is False and faults[-1][0] == "reset"
    answers.answer = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        store.load("r", LOOKUP)


def test_a_count_above_what_can_be_in_flight_is_capped_and_reported() -> None:
    store, _, faults = checked()
    assert store.bounded("num_completed_loads", 10**6, 3) == 3
    ((op, err),) = faults
    assert op == "num_completed_loads" and isinstance(err, StoreProtocolError)
    assert err.value == 10**6 and "at most 3" in str(err)
    assert store.bounded("num_completed_loads", None, 3) == 0
    assert store.bounded("num_completed_loads", 2, 3) == 2 and len(faults) == 1


def test_drain_stops_when_the_count_never_drops() -> None:
    store, _, faults = checked()
    pops: list[int] = []
    store.drain(lambda: 5, lambda: pops.append(1), 4)  # always 5 more, pops change nothing
    assert len(pops) == 4
    assert faults and faults[-1][0] == "reset"
    asked: list[int] = []
    store.drain(lambda: asked.append(1), lambda: pops.append(1), 4)  # a count that fails
    assert len(asked) == 32 and len(pops) == 4
