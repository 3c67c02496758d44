"""The random-walk driver (`testing.walk`): it finds the mutation check's planted bugs,
its shrunk program replays them as a script, and its mechanics hold on a toy machine
(checks after every step, teardown after every run, determinism by seed, shrinking to
the smallest failing program, typed errors for bad arguments)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from planted_bugs import BUGS, Bug
from unicache_fsm.cli import main
from unicache_fsm.testing import walk
from unicache_fsm.testing.walk import DATA, Ints, Program, Step


def _replayed(source: str) -> BaseException:
    """Run a reproduction script; return what it raised."""
    with pytest.raises(Exception) as info:
        exec(compile(source, "<reproduction>", "exec"), {})
    return info.value


@pytest.mark.parametrize("bug", BUGS, ids=[b.name for b in BUGS])
def test_the_walk_finds_the_planted_bug_and_its_script_replays_it(
    bug: Bug, monkeypatch: pytest.MonkeyPatch
) -> None:
    bug.plant(monkeypatch)
    with pytest.raises(walk.WalkFailure) as info:
        walk.fuzz(bug.machine(), seed=0, runs=6000, steps=40)  # as the Hypothesis hunts
    failure = info.value
    assert any(name in str(failure.error) for name in bug.names), failure.error
    assert failure.replays and len(failure.program.steps) <= failure.found
    again = _replayed(failure.source)
    assert type(again) is type(failure.error)
    assert any(name in str(again) for name in bug.names), again


def test_without_a_bug_the_walk_runs_every_run() -> None:
    machine = type("Clean", (BUGS[0].machine(),), {})
    assert walk.fuzz(machine, seed=3, runs=4, steps=20) == 4
    assert machine.steps > 4  # every run audited after its setup and after each move
    assert machine.coverage.counts


# -- the driver's mechanics on a toy machine -----------------------------------------------


class Stack(RuleBasedStateMachine):
    """A stack that must never hold `limit` items one of which is 5 or more (the bug)."""

    checks = 0
    teardowns = 0
    walk_config = ("limit",)
    limit = 3

    def __init__(self) -> None:
        super().__init__()
        self.items: list[int] = []

    @walk.setup_move(data=DATA)
    def start(self, data: Any) -> None:
        self.items = [walk.choose_int(data, 0, 0)]
        self.items.clear()

    @walk.move(value=Ints(0, 9))
    def push(self, value: int) -> None:
        self.items.append(value)

    @walk.move(when=lambda self: bool(self.items), data=DATA)
    def drop(self, data: Any) -> None:
        del self.items[walk.choose(data, range(len(self.items)))]

    @walk.check()
    def small(self) -> None:
        type(self).checks += 1
        assert not (len(self.items) >= type(self).limit and max(self.items) >= 5), self.items

    def teardown(self) -> None:
        type(self).teardowns += 1


def test_checks_run_after_the_setup_and_every_move_and_teardown_after_every_run() -> None:
    clean = type("Clean", (Stack,), {"limit": 10**6})
    for seed in range(5):
        program, error = walk.run_walk(clean, random.Random(seed), 12)
        assert error is None and len(program.steps) == 12
    assert clean.checks == 5 * 13 and clean.teardowns == 5


def test_the_same_seed_walks_the_same_program() -> None:
    a = walk.run_walk(Stack, random.Random(7), 30)
    b = walk.run_walk(Stack, random.Random(7), 30)
    assert a[0] == b[0]


def test_a_failure_shrinks_to_the_smallest_program_and_its_script_replays() -> None:
    with pytest.raises(walk.WalkFailure) as info:
        walk.fuzz(Stack, seed=1, runs=200, steps=30)
    failure = info.value
    steps = failure.program.steps
    # three pushes, the simplest values that still fail: 0, 0, 5 in some order
    assert [s.move for s in steps] == ["push"] * 3
    assert sorted(dict(s.args)["value"] for s in steps) == [0, 0, 5]
    assert "state.push(value=" in failure.source and "state.teardown()" in failure.source
    assert isinstance(_replayed(failure.source), AssertionError)
    with pytest.raises(AssertionError):
        walk.run_program(Stack, failure.program)


def test_replay_skips_moves_whose_precondition_fails_and_reports_the_program_as_run() -> None:
    start = Step("start", choices=(0,))
    program = Program((start,), (Step("drop", choices=(0,)), Step("push", (("value", 2),))))
    ran = walk.run_program(Stack, program)
    assert ran.steps == (Step("push", (("value", 2),)),)


def test_the_reproduction_pins_the_configuration_of_a_local_subclass() -> None:
    tight = type("Tight", (Stack,), {"limit": 2})
    with pytest.raises(walk.WalkFailure) as info:
        walk.fuzz(tight, seed=0, runs=200, steps=30)
    source = info.value.source
    assert "class Machine(Stack):" in source and "limit = 2" in source
    assert len(info.value.program.steps) == 2


def test_the_same_machine_still_runs_under_hypothesis() -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(Stack, settings=settings(max_examples=200, database=None))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({}, "give runs or seconds"), ({"runs": 1, "steps": 0}, "steps must be at least 1")],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        walk.fuzz(Stack, seed=0, **kwargs)


def test_a_machine_without_moves_is_refused() -> None:
    class Empty(RuleBasedStateMachine):
        pass

    with pytest.raises(TypeError, match="declares no move"):
        walk.fuzz(Empty, seed=0, runs=1)


def test_the_fuzz_command_prints_a_replaying_script_on_a_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    greedy = next(b for b in BUGS if b.name == "greedy_commit")
    greedy.plant(monkeypatch)
    argv = ["fuzz", "--minutes", "1", "--page-size", "1", "--swa", "off", "--seed", "0"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "COMMIT soundness" in out and "seed 0" in out
    script = out[out.index("\nfrom unicache_fsm") : out.index("state.teardown()") + 16]
    assert "COMMIT soundness" in str(_replayed(script))


def test_the_fuzz_command_refuses_a_seed_for_hypothesis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["fuzz", "--minutes", "0.01", "--driver", "hypothesis", "--seed", "1"]) == 2
    assert "--seed drives the walk" in capsys.readouterr().err


def test_bad_domains_are_refused_naming_the_culprit() -> None:
    with pytest.raises(TypeError, match="argument 'n' has domain 3"):

        @walk.move(n=3)  # type: ignore[arg-type]
        def bad(self: Any, n: int) -> None: ...

    with pytest.raises(ValueError, match=r"Ints\(5, 1\)"):
        Ints(5, 1)
    with pytest.raises(ValueError, match="no options"):
        walk.OneOf(())
