"""Issue 35, N3 and dispatch: lazy compilation, a bounded `compile_all`, the generated
`fire` (run-to-completion by model identity, copies bound to their own handler)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.errors import IllegalTransitionError
from unicache_fsm.fsm.reference import ReferenceExecutor
from unicache_fsm.fsm.spec import MachineSpec, StateKind, StateSpec, TransitionSpec


def _ring(n: int) -> MachineSpec:
    states = [StateSpec(f"s{i}", f"s{i}") for i in range(n)]
    return MachineSpec(
        f"ring{n}",
        StateSpec("", "", StateKind.COMPOUND, states, "s0"),
        [TransitionSpec("next", f"s{i}", f"s{(i + 1) % n}", i) for i in range(n)]
        + [TransitionSpec("jump", f"s{i}", "s0", n + i) for i in range(n)],
    )


def _regions(regions: int, states: int) -> MachineSpec:
    kids, transitions = [], []
    for r in range(regions):
        inner = [StateSpec(f"s{i}", f"r{r}.s{i}") for i in range(states)]
        kids.append(StateSpec(f"r{r}", f"r{r}", StateKind.COMPOUND, inner, "s0"))
        for i in range(states):
            dest = f"r{r}.s{(i + 1) % states}"
            transitions.append(TransitionSpec(f"t{r}", f"r{r}.s{i}", dest, len(transitions)))
    return MachineSpec("regions", StateSpec("", "", StateKind.PARALLEL, kids), transitions)


class Plain:
    __slots__ = ("state",)


def test_n3_a_first_use_compiles_only_the_trigger_fired() -> None:
    ex = CompiledExecutor(_ring(300), Plain)
    model = Plain()
    ex.initialize(model)
    for _ in range(300):
        ex.fire(model, "next")
    assert model.state == "s0"
    # one pair per configuration visited: `jump`, legal everywhere, was never built
    assert sorted(ex.sources) == sorted((f"s{i}", "next") for i in range(300))
    ex.fire(model, "jump")
    assert ("s0", "jump") in ex.sources and len(ex.sources) == 301


def test_n3_compile_all_is_bounded_on_a_huge_product() -> None:
    ex = CompiledExecutor(_regions(20, 3), Plain)  # 3**20 configurations
    assert ex.compile_all(limit=200) == 200
    assert ex.compile_all(limit=200) == 0  # the same 200 pairs, already built
    model = Plain()
    ex.initialize(model)
    ex.fire(model, "t19")  # a pair past the bound is built on first use
    assert model.state.split(",")[-1] == "r19.s1"


def test_compile_all_still_builds_every_pair_of_an_enumerated_machine() -> None:
    ex = CompiledExecutor(_ring(50), Plain)
    assert ex.compile_all() == 100
    assert ex.compile_all() == 0


class Greedy:
    """A model equal to every other: run-to-completion must go by identity."""

    __slots__ = ("peer", "seen", "state")

    def __init__(self, peer: Greedy | None = None) -> None:
        self.peer = peer
        self.seen: list[str] = []

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]

    def poke_peer(self) -> None:
        if self.peer is not None:
            EXECUTORS[-1].fire(self.peer, "go")
            self.seen.append(self.peer.state)  # the peer moved at once: not queued


RUN = """
machine = "run"
initial = "idle"
[states.idle]
[states.busy]
on_enter = ["poke_peer"]
[[transitions]]
trigger = "go"
source = "idle"
dest = "busy"
[[transitions]]
trigger = "stop"
source = "busy"
dest = "idle"
"""
EXECUTORS: list[Any] = []


@pytest.mark.parametrize("cls", (CompiledExecutor, ReferenceExecutor))
def test_another_model_that_compares_equal_is_not_queued(cls: type) -> None:
    from unicache_fsm.fsm.loader import parse_spec

    ex = cls(parse_spec(RUN), Greedy)
    EXECUTORS.append(ex)
    b = Greedy()
    a = Greedy(peer=b)
    ex.initialize(a)
    ex.initialize(b)
    ex.fire(a, "go")
    assert a.seen == ["busy"] and b.state == "busy"
    with pytest.raises(IllegalTransitionError):
        ex.fire(a, "go")
    ex.fire(a, "stop")  # the marks of the failed firing are gone
    assert a.state == "idle"


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def poke_peer(self, model: Any) -> None:
        self.calls += 1


def test_a_deep_copy_fires_through_its_own_handler() -> None:
    from unicache_fsm.fsm.loader import parse_spec

    handler = Counter()
    ex = CompiledExecutor(parse_spec(RUN), Plain, handler=handler)
    twin = copy.deepcopy(ex)
    model = Plain()
    twin.initialize(model)
    twin.fire(model, "go")
    assert (handler.calls, twin.handler.calls) == (0, 1)
    ex.initialize(model)
    ex.fire(model, "go")
    assert (handler.calls, twin.handler.calls) == (1, 1)


class Audited(CompiledExecutor):
    """A subclass that overrides `fire` keeps its override (and `super().fire` works)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.fired: list[str] = []
        super().__init__(*args, **kwargs)

    def fire(self, model: Any, trigger: str, /, *args: Any, **kwargs: Any) -> None:
        self.fired.append(trigger)
        super().fire(model, trigger, *args, **kwargs)


@pytest.mark.parametrize("lock", [False, True])
def test_a_subclass_override_of_fire_is_kept(lock: bool) -> None:
    ex = Audited(_ring(3), Plain, lock=lock)
    model = Plain()
    ex.initialize(model)
    ex.fire(model, "next")
    ex.fire(model, "jump")
    assert ex.fired == ["next", "jump"] and model.state == "s0"


LOOP = """
machine = "loop"
initial = "idle"
[states.idle]
[states.busy]
on_enter = ["entered"]
[[transitions]]
trigger = "go"
source = "idle"
dest = "busy"
[[transitions]]
trigger = "stop"
source = "busy"
dest = "idle"
"""


class Looper:
    """`entered` fires `stop` on itself (queued: run after `go` completes), can raise,
    and can wait for a signal (to hold a firing open while another thread fires)."""

    def __init__(self, ex: Any = None) -> None:
        self.ex = ex
        self.log: list[str] = []
        self.boom = False
        self.hold: Any = None  # (started, release) events

    def entered(self) -> None:
        if self.hold is not None:
            started, release = self.hold
            started.set()
            assert release.wait(10)
        if self.boom:
            raise RuntimeError("boom")
        self.ex.fire(self, "stop")
        self.log.append(f"after stop: {self.state}")  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", (CompiledExecutor, ReferenceExecutor))
def test_a_callback_error_leaves_no_mark_behind(cls: type) -> None:
    """After a firing that raised, the same model fires again at once, and what its
    callback fires is queued again (a stale mark would queue, then drop, the trigger)."""
    from unicache_fsm.fsm.loader import parse_spec

    ex = cls(parse_spec(LOOP), Looper)
    m = Looper(ex)
    ex.initialize(m)
    m.boom = True
    with pytest.raises(RuntimeError):
        ex.fire(m, "go")
    assert m.state == "busy"
    ex.fire(m, "stop")
    assert m.state == "idle"
    m.boom = False
    ex.fire(m, "go")
    assert m.log == ["after stop: busy"]  # queued while `go` ran ...
    assert m.state == "idle"  # ... and run after it


@pytest.mark.parametrize("cls", (CompiledExecutor, ReferenceExecutor))
def test_a_second_thread_fires_its_own_model_while_the_first_is_inside_a_callback(
    cls: type,
) -> None:
    """Thread 1 holds a firing of `a` open; thread 2's model `b` still runs at once and
    still queues what its own callback fires; then `a` finishes as if alone."""
    import threading

    from unicache_fsm.fsm.loader import parse_spec

    ex = cls(parse_spec(LOOP), Looper)
    a, b = Looper(ex), Looper(ex)
    ex.initialize(a)
    ex.initialize(b)
    started, release = threading.Event(), threading.Event()
    a.hold = (started, release)
    errors: list[BaseException] = []

    def run_a() -> None:
        try:
            ex.fire(a, "go")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    first = threading.Thread(target=run_a)
    first.start()
    assert started.wait(10)
    ex.fire(b, "go")
    assert b.log == ["after stop: busy"] and b.state == "idle"
    release.set()
    first.join(10)
    assert not errors and not first.is_alive()
    assert a.log == ["after stop: busy"] and a.state == "idle"
