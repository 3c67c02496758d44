"""Coverage: which machines' transitions the search fires, counted per machine.

- `system_executors(s)` — the executors a system's operations drive: its own three
  (node residency, load, offload; in that order) and the store's two job machines.
- `observing(s, observer)` / `observing_globals(observer)` — a ``with`` block during
  which `observer` sees every transition of those executors (of the store's job
  machines only, for the second: module-level executors every system shares).
- `Gate` — an observer counting transitions only while ``on`` (off during a replay, so
  only the transitions each new operation fires are counted).
- `counter_of(counts)` — a `TransitionCounter` holding merged counts (from workers).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from unicache_fsm.fsm.executor import Executor, ExecutorBase
from unicache_fsm.fsm.trace import TransitionCounter
from unicache_fsm.serving.system import System
from unicache_fsm.store import jobs


def system_executors(s: System) -> list[Executor]:
    """`s`'s residency, load and offload executors, then the store's two job machines."""
    return [
        s.tree.residency.executor,
        s.linker.load_machine,
        s.linker.offload_machine,
        jobs.LOAD_MACHINE,
        jobs.OFFLOAD_MACHINE,
    ]


@contextlib.contextmanager
def observing(s: System, observer: Callable[..., None]) -> Iterator[None]:
    """Observe every executor of `system_executors(s)` inside the block."""
    executors = system_executors(s)
    for ex in executors:
        ex.add_observer(observer)
    try:
        yield
    finally:
        for ex in executors:
            ex.remove_observer(observer)


@contextlib.contextmanager
def observing_globals(observer: Callable[..., None]) -> Iterator[None]:
    """Observe the store's job machines (module-level executors, shared by all systems)."""
    executors = [jobs.LOAD_MACHINE, jobs.OFFLOAD_MACHINE]
    for ex in executors:
        ex.add_observer(observer)
    try:
        yield
    finally:
        for ex in executors:
            ex.remove_observer(observer)


class Gate:
    """An observer that counts transitions only while `on` (not during a replay)."""

    def __init__(self) -> None:
        self.counter = TransitionCounter()
        self.on = False

    def __call__(self, ex: ExecutorBase, model: Any, source: str, trigger: str, dest: str) -> None:
        if self.on:
            self.counter(ex, model, source, trigger, dest)


def counter_of(counts: Counter[Any]) -> TransitionCounter:
    """A `TransitionCounter` holding `counts`."""
    counter = TransitionCounter()
    counter.counts.update(counts)
    return counter
