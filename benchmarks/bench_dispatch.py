"""Dispatch benchmark: what one load lifecycle costs through each way of running it.

The lifecycle is the happy path of ``specs/load_transaction.toml``: prepare (two
callbacks), start, land (one guard, the verdict as the trigger's argument), commit (one
callback) — four transitions, four callbacks, one guard. The record is plain data and a
handler object does the work (as the linker does for its loads); every variant makes the
same calls:

- ``hand-written``: an enum state and a ``{(state, trigger): (dest, guard, callbacks)}``
  dict, the dispatch one would write by hand, calling the handler's methods;
- ``compiled``: `CompiledExecutor` on the spec, bound to the handler;
- ``compiled/model``: `CompiledExecutor` with the callbacks as methods of the model
  (the binding before handlers existed: shows what the handler binding costs);
- ``reference``: `ReferenceExecutor` bound to the handler (one shared `transitions`
  machine, no registration);
- ``transitions/object``: plain `transitions`, one `Machine` per model (construction
  included, as a load is a fresh object), the pattern docs/design.md rules out.

Then the first lap of a ring of 10,000 states (one trigger, ``next``, from each state to
the following one; a `MachineSpec` built in Python): a fresh `CompiledExecutor` fires
``next`` 10,000 times, compiling each pair at its first use, against a fresh plain
`transitions` ``Machine`` of the same ring firing as many times (construction of either
printed apart, not in the lap).

Then bytes per tracked model (tracemalloc over many models), compared with the same
model class without FSM state. Ratios are of times measured in this one run; targets:
compiled <= 1.1x hand-written, a ring's first lap <= 2x transitions'.

Run: ``python benchmarks/bench_dispatch.py [--quick]`` (or ``python benchmarks/run.py``).
"""

from __future__ import annotations

import argparse
import enum
import gc
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from transitions import Machine

from unicache_fsm.console import print_table
from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.flat import flatten
from unicache_fsm.fsm.loader import bundled_spec
from unicache_fsm.fsm.reference import ReferenceExecutor
from unicache_fsm.fsm.spec import MachineSpec, StateKind, StateSpec, TransitionSpec

LIFECYCLE: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("prepare", ()),
    ("start", ()),
    ("land", (True,)),
    ("commit", ()),
)


class Load:
    """A load record as a scheduler would hold it (the FSM adds only `state`)."""

    __slots__ = ("reserved", "rid", "state")
    state: Any  # the FSM's state slot

    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.reserved = 0


class Handler:
    """Does the work of every callback, the record passed first (as the linker does)."""

    __slots__ = ()

    def reserve_slots(self, load: Load) -> None:
        load.reserved += 1

    def queue_store_load(self, load: Load) -> None:
        load.reserved += 1

    def landed_everywhere(self, load: Load, verdict: bool = False) -> bool:
        return verdict is True

    def publish(self, load: Load) -> None:
        load.reserved -= 2

    def withdraw_store_load(self, load: Load, reason: object = None) -> None:
        load.reserved -= 1

    def free_reservation(self, load: Load, reason: object = None) -> None:
        load.reserved = 0

    def record_abort(self, load: Load, reason: object = None) -> None:
        pass


HANDLER = Handler()


class ModelLoad(Load):
    """The same record with the callbacks as its own methods (model-bound)."""

    __slots__ = ()

    def reserve_slots(self) -> None:
        self.reserved += 1

    def queue_store_load(self) -> None:
        self.reserved += 1

    def landed_everywhere(self, verdict: bool = False) -> bool:
        return verdict is True

    def publish(self) -> None:
        self.reserved -= 2

    def withdraw_store_load(self, reason: object = None) -> None:
        self.reserved -= 1

    def free_reservation(self, reason: object = None) -> None:
        self.reserved = 0

    def record_abort(self, reason: object = None) -> None:
        pass


class BareLoad:
    """`Load` without the state slot: the baseline for FSM memory."""

    __slots__ = ("reserved", "rid")

    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.reserved = 0


class LoadState(enum.Enum):
    IDLE = 0
    QUEUED = 1
    LOADING = 2
    LANDED = 3
    COMMITTED = 4
    ABORTED = 5


_HAND: dict[tuple[LoadState, str], tuple[LoadState, Any, tuple[Any, ...], tuple[Any, ...]]] = {
    (LoadState.IDLE, "prepare"): (
        LoadState.QUEUED,
        None,
        (HANDLER.reserve_slots,),
        (HANDLER.queue_store_load,),
    ),
    (LoadState.QUEUED, "start"): (LoadState.LOADING, None, (), ()),
    (LoadState.LOADING, "land"): (LoadState.LANDED, HANDLER.landed_everywhere, (), ()),
    (LoadState.LANDED, "commit"): (LoadState.COMMITTED, None, (HANDLER.publish,), ()),
}


def hand_fire(load: Load, trigger: str, *args: Any) -> None:
    """Hand-written enum/dict dispatch with the same calls as the spec."""
    entry = _HAND.get((load.state, trigger))
    if entry is None:
        msg = f"cannot {trigger} load {load.rid} in state {load.state}"
        raise RuntimeError(msg)
    dest, guard, before, after = entry
    if guard is not None and not guard(load, *args):
        msg = f"guard rejected {trigger}"
        raise RuntimeError(msg)
    for cb in before:
        cb(load, *args)
    load.state = dest
    for cb in after:
        cb(load, *args)


def _best(fn: Callable[[], None], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _per_object_machine(spec_name: str) -> Callable[[Load], Machine]:
    flat = flatten(bundled_spec(spec_name))
    transitions = []
    for (config, trigger), group in flat.table.items():
        for ft in group:
            t = ft.spec
            transitions.append(
                {
                    "trigger": trigger,
                    "source": config,
                    "dest": ft.dest,
                    "conditions": list(t.conditions),
                    "before": list(t.before),
                    "after": list(t.after),
                }
            )
    states = list(flat.configs)

    def build(load: Load) -> Machine:
        return Machine(
            model=load,
            states=states,
            transitions=transitions,
            initial=flat.initial,
            auto_transitions=False,
            model_attribute="state",
        )

    return build


class _DictLoad:
    """transitions needs a __dict__ on its models (it sets trigger methods)."""

    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.reserved = 0

    reserve_slots = ModelLoad.reserve_slots
    queue_store_load = ModelLoad.queue_store_load
    landed_everywhere = ModelLoad.landed_everywhere
    publish = ModelLoad.publish
    withdraw_store_load = ModelLoad.withdraw_store_load
    free_reservation = ModelLoad.free_reservation
    record_abort = ModelLoad.record_abort


def time_lifecycles(n: int, repeats: int) -> dict[str, float]:
    """Seconds per lifecycle for each variant."""
    compiled = CompiledExecutor("load_transaction", Load, handler=HANDLER)
    by_model = CompiledExecutor("load_transaction", ModelLoad)
    reference = ReferenceExecutor("load_transaction", Load, handler=HANDLER)
    results: dict[str, float] = {}

    def hand() -> None:
        for i in range(n):
            load = Load(i)
            load.state = LoadState.IDLE
            for trig, args in LIFECYCLE:
                hand_fire(load, trig, *args)

    def runner(ex: Executor, cls: type[Load]) -> Callable[[], None]:
        def run() -> None:
            fire, init = ex.fire, ex.initialize
            for i in range(n):
                load = cls(i)
                init(load)
                for trig, args in LIFECYCLE:
                    fire(load, trig, *args)

        return run

    build = _per_object_machine("load_transaction")
    small = max(n // 10, 50)

    def per_object() -> None:
        for i in range(small):
            load = _DictLoad(i)
            build(load)  # type: ignore[arg-type]
            for trig, args in LIFECYCLE:
                load.trigger(trig, *args)  # type: ignore[attr-defined]

    results["hand-written"] = _best(hand, repeats) / n
    results["compiled"] = _best(runner(compiled, Load), repeats) / n
    results["compiled/model"] = _best(runner(by_model, ModelLoad), repeats) / n
    results["reference"] = _best(runner(reference, Load), max(1, repeats // 2)) / n
    results["transitions/object"] = _best(per_object, max(1, repeats // 2)) / small
    return results


def ring_spec(n: int) -> MachineSpec:
    """A ring of `n` states ``s0 .. s<n-1>``: ``next`` leads from each to the following."""
    states = [StateSpec(f"s{i}", f"s{i}") for i in range(n)]
    return MachineSpec(
        f"ring{n}",
        StateSpec("", "", StateKind.COMPOUND, states, "s0"),
        [TransitionSpec("next", f"s{i}", f"s{(i + 1) % n}", i) for i in range(n)],
    )


class RingModel:
    __slots__ = ("state",)
    state: str


def time_ring(n: int, repeats: int) -> dict[str, float]:
    """Seconds for the first lap of an `n`-state ring (compiled, transitions), each on a
    freshly built executor or machine, and what building one costs."""
    spec = ring_spec(n)
    CompiledExecutor(spec, RingModel)  # validation and flattening: once per spec
    results: dict[str, float] = {}

    def compiled_lap() -> float:
        ex = CompiledExecutor(spec, RingModel)
        model = RingModel()
        ex.initialize(model)
        fire = ex.fire
        t0 = time.perf_counter()
        for _ in range(n):
            fire(model, "next")
        return time.perf_counter() - t0

    def transitions_machine() -> Machine:
        machine = Machine(
            model=None,
            states=[f"s{i}" for i in range(n)],
            initial="s0",
            auto_transitions=False,
        )
        for i in range(n):
            machine.add_transition("next", f"s{i}", f"s{(i + 1) % n}")
        return machine

    def transitions_lap() -> float:
        event = transitions_machine().events["next"]
        model = RingModel()
        model.state = "s0"
        t0 = time.perf_counter()
        for _ in range(n):
            event.trigger(model)
        return time.perf_counter() - t0

    def best_of(fn: Callable[[], float]) -> float:
        gc.collect()
        return min(fn() for _ in range(repeats))

    results["compiled first lap"] = best_of(compiled_lap)
    results["transitions first lap"] = best_of(transitions_lap)

    def compiled_build() -> None:
        CompiledExecutor(spec, RingModel)

    def transitions_build() -> None:
        transitions_machine()

    results["compiled build (cached spec)"] = _best(compiled_build, repeats)
    results["transitions build"] = _best(transitions_build, repeats)
    return results


def bytes_per_model(n: int) -> dict[str, float]:
    """Bytes per tracked model, and the part of it that the FSM adds."""
    compiled = CompiledExecutor("load_transaction", Load, handler=HANDLER)
    build = _per_object_machine("load_transaction")

    def measure(make: Callable[[int], Any]) -> float:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        keep = [make(i) for i in range(n)]
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del keep
        return (after - before) / n

    def with_fsm(i: int) -> Load:
        load = Load(i)
        compiled.initialize(load)
        return load

    def with_machine(i: int) -> tuple[Any, Machine]:
        load = _DictLoad(i)
        return load, build(load)  # type: ignore[arg-type]

    bare = measure(BareLoad)
    return {
        "model without FSM": bare,
        "model + compiled/reference FSM": measure(with_fsm),
        "model + transitions Machine/object": measure(with_machine) if n <= 20_000 else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args(argv)
    n, repeats = (2_000, 3) if args.quick else (20_000, 7)

    times = time_lifecycles(n, repeats)
    hand = times["hand-written"]
    print(f"load lifecycle ({len(LIFECYCLE)} transitions, 4 callbacks + 1 guard), n={n}")
    print_table(
        None,
        ("variant", "us/lifecycle", "x hand", "compiled faster by"),
        [
            (name, f"{sec * 1e6:.2f}", f"{sec / hand:.2f}", f"{sec / times['compiled']:.1f}x")
            for name, sec in times.items()
        ],
    )
    ratio_hand = times["compiled"] / hand
    ratio_ref = times["reference"] / times["compiled"]
    ratio_model = times["compiled"] / times["compiled/model"]
    print(f"handler binding vs model methods (compiled): {ratio_model:.2f}x the time")
    print(
        f"targets: compiled <= 1.1x hand-written: {ratio_hand:.2f}x "
        f"({'met' if ratio_hand <= 1.1 else 'MISSED'}); "
        f">= 8x faster than reference: {ratio_ref:.1f}x ({'met' if ratio_ref >= 8 else 'MISSED'})"
    )

    ring_n = 2_000 if args.quick else 10_000
    ring = time_ring(ring_n, 3)
    print()
    print(f"ring of {ring_n} states, first lap ({ring_n} firings, each pair new)")
    print_table(
        None,
        ("variant", "ms", "x transitions"),
        [
            (name, f"{sec * 1e3:.1f}", f"{sec / ring['transitions first lap']:.2f}")
            for name, sec in ring.items()
        ],
    )
    ratio_ring = ring["compiled first lap"] / ring["transitions first lap"]
    print(
        f"target: first lap <= 2x transitions': {ratio_ring:.2f}x "
        f"({'met' if ratio_ring <= 2 else 'MISSED'})"
    )

    mem = bytes_per_model(2_000 if args.quick else 10_000)
    print()
    print_table(
        None, ("memory per tracked load", "bytes"), [(n, f"{b:.0f}") for n, b in mem.items()]
    )
    fsm_bytes = mem["model + compiled/reference FSM"] - mem["model without FSM"]
    verdict = "met" if fsm_bytes <= 256 else "MISSED"
    print(f"FSM share per load: {fsm_bytes:.0f} bytes (target <= 256: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
