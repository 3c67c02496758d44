"""The fast paths of this pass answer as the general paths they skip."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.trace import TransitionCounter
from unicache_fsm.linker.ranks import (
    RankGroupError,
    SingleRank,
    ThreadRankGroup,
    agree,
    intersect_restorable,
)
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.store.faults import FaultPolicy
from unicache_fsm.testing.system import System
from unicache_fsm.tree.components import TreeComponent
from unicache_fsm.tree.components.full import FullComponent


def test_single_rank_answers_as_a_world_of_one_thread() -> None:
    """`SingleRank` skips the reduction; a one-rank `ThreadRankGroup` runs it."""
    rng = random.Random(7)
    single, world = SingleRank(), ThreadRankGroup.create(1)[0]
    for _ in range(300):
        n = rng.randrange(0, 9)
        found = rng.sample(range(1, n + 1), rng.randrange(0, n + 1)) if n else []
        assert intersect_restorable(single, found, n) == intersect_restorable(world, found, n)
    for flag in (True, False, 1, 0, "x", "", None, [0]):
        assert agree(single, flag) is agree(world, flag)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [[0], [3], [True], [1.0], [1, "2"]])
def test_single_rank_still_refuses_bad_boundaries(bad: list[object]) -> None:
    with pytest.raises(RankGroupError, match=r"outside 1\.\.2"):
        intersect_restorable(SingleRank(), bad, 2)  # type: ignore[arg-type]


class _Load:
    __slots__ = ("state",)


class _Work:
    """A handler for `load_transaction` whose callbacks do nothing (guards pass)."""

    def reserve_slots(self, load: _Load) -> None: ...
    def queue_store_load(self, load: _Load) -> None: ...
    def publish(self, load: _Load) -> None: ...
    def withdraw_store_load(self, load: _Load, reason: object = None) -> None: ...
    def free_reservation(self, load: _Load, reason: object = None) -> None: ...
    def record_abort(self, load: _Load, reason: object = None) -> None: ...

    def landed_everywhere(self, load: _Load, verdict: object = False) -> bool:
        return verdict is True


LIFE = (("prepare", ()), ("start", ()), ("land", (True,)), ("commit", ()))


def _run(ex: CompiledExecutor, n: int) -> None:
    for _ in range(n):
        load = _Load()
        ex.initialize(load)
        for trigger, args in LIFE:
            ex.fire(load, trigger, *args)


def _executor() -> CompiledExecutor:
    return CompiledExecutor("load_transaction", _Load, handler=_Work())


def test_a_lone_counter_counts_as_when_it_is_called() -> None:
    """A lone `TransitionCounter` is counted inline; beside another observer it is
    called; either way it ends with the same counts, and changes of observers between
    firings switch the dispatch without losing or doubling a count."""
    inline, called = TransitionCounter(), TransitionCounter()
    a, b = _executor(), _executor()
    a.add_observer(inline)
    seen: list[tuple[str, str, str]] = []
    b.add_observer(called)
    b.add_observer(lambda ex, m, s, t, d: seen.append((s, t, d)))
    _run(a, 3)
    _run(b, 3)
    assert inline.counts == called.counts and inline.total() == 12 == len(seen) - 3
    other = TransitionCounter()  # a second counter: a loop again, then a new lone one
    a.add_observer(other)
    _run(a, 1)
    a.remove_observer(inline)
    _run(a, 2)
    assert inline.total() == 16 and other.total() == 12
    a.remove_observer(other)
    _run(a, 1)
    assert other.total() == 12 and a.compile_all() >= 0


def test_a_counter_subclass_is_called() -> None:
    """Only the `TransitionCounter` class itself is counted inline: a subclass with its
    own ``__call__`` is called for every transition."""
    calls: list[str] = []

    class Loud(TransitionCounter):
        def __call__(self, ex: Any, model: Any, source: str, trigger: str, dest: str) -> None:
            calls.append(trigger)
            super().__call__(ex, model, source, trigger, dest)

    ex = _executor()
    loud = Loud()
    ex.add_observer(loud)
    _run(ex, 2)
    assert calls == ["<init>", "prepare", "start", "land", "commit"] * 2
    assert loud.total() == 8


def test_a_counted_executor_copies_with_its_counter_shared() -> None:
    counter = TransitionCounter()
    ex = _executor()
    ex.add_observer(counter)
    _run(ex, 1)
    twin = copy.deepcopy(ex)
    _run(twin, 1)
    assert counter.total() == 8


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_a_components_own_offload_transfer_is_the_merged_one(swa: bool) -> None:
    """FULL builds a one-node OFFLOAD transfer (with or without the link page) at once;
    it is the transfer the default merge of the node's own transfer gives."""
    s = System.build(4, swa=swa, faults=FaultPolicy())
    s.compute("A", tuple(range(100, 132)), settle=False)
    s.compute("B", (*range(100, 116), *range(700, 716)), settle=False)
    nodes = [n for n in s.tree.nodes() if n.parent is not None]
    assert len(nodes) >= 3
    for comp in s.tree.components:
        for node in nodes:
            slots = node.slots(comp.component_type)
            page = None if slots is None or slots.numel() < 4 else (slots[-4:], "ab" * 32)
            for link in (None, page):
                mine = comp.build_external_linker_offload([node], link)
                merged = TreeComponent.build_external_linker_offload(comp, [node], link)
                if merged is None:
                    assert mine is None
                    continue
                assert mine is not None and mine.device_indices is not None
                assert merged.device_indices is not None
                assert torch.equal(mine.device_indices, merged.device_indices)
                assert (mine.name, mine.keys, mine.hit_policy) == (
                    merged.name,
                    merged.keys,
                    merged.hit_policy,
                )
                assert mine.num_pages == len(node.hashes or ()) + (link is not None)


@pytest.mark.parametrize("swa", [False, True], ids=["full", "swa"])
def test_a_requests_slots_are_its_paths_in_the_tree(swa: bool) -> None:
    """`req.slots` (given as the insert's value when the walk ended at the prefix) is
    the tree's path to the request's last node: fresh keys, a shared prefix, a key
    inserted again from scratch, and a request completed after another inserted its
    tail meanwhile."""
    s = System.build(4, swa=swa, faults=FaultPolicy())
    x, y = tuple(range(100, 132)), (*range(100, 116), *range(700, 716))
    reqs = [s.compute("A", x), s.compute("B", y), s.compute("C", x, from_scratch=True)]
    late = s.begin("D", (*x, *range(900, 908)))
    reqs.append(s.compute("E", (*x, *range(900, 908))))
    s.drive()
    reqs.append(s.complete(late))
    for req in reqs:
        assert req.slots is not None and req.last_node is not None
        assert torch.equal(req.slots, s.tree.path_slots(req.last_node))
    s.audit()


@pytest.mark.parametrize("page_size", [1, 2, 4, 16])
def test_full_books_each_pages_id(page_size: int) -> None:
    """FULL's ownership books (read off a strided view past a few pages) mark and clear
    each page's id, the first slot over the page size, for any number of pages."""
    s = System.build(page_size, faults=FaultPolicy())
    full = s.tree.components[0]
    assert isinstance(full, FullComponent) and full.owned is not None
    assert isinstance(s.allocator, PagedAllocator)
    total = s.allocator.size // page_size
    held = set(full.owned.marked())
    for pages in (0, 1, 4, 5, 9, 40):
        ids = [i for i in torch.randperm(total).tolist() if i not in held][:pages]
        slots = torch.tensor(ids, dtype=torch.int64).repeat_interleave(page_size) * page_size
        slots += torch.arange(len(ids) * page_size) % page_size
        node: Any = SimpleNamespace(data={})
        full.take_slots(node, slots)
        assert set(full.owned.marked()) == held | set(ids)
        assert full.drop_slots(node) is slots
        assert set(full.owned.marked()) == held


def test_observers_change_only_through_add_and_remove() -> None:
    """The observers are a tuple: an in-place edit, which a compiled executor's
    specialised steps would not see, fails at once instead of being ignored."""
    counter, seen = TransitionCounter(), []
    ex = _executor()
    ex.add_observer(counter)
    with pytest.raises(AttributeError):
        ex.observers.append(lambda *args: seen.append(args))  # type: ignore[attr-defined]
    _run(ex, 1)
    assert ex.observers == (counter,) and counter.total() == 4 and not seen
    ex.remove_observer(counter)
    assert ex.observers == ()
