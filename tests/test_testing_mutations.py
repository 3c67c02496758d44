"""Mutation check: bugs planted in the library are caught by the public kit.

Each test plants one bug with monkeypatch, runs the kit (the whole-system machine, or
the rank-agreement property), and asserts that it fails on the invariant that bug
breaks. Shrinking is off: finding the failure is what is checked here.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis.errors import FailedHealthCheck
from hypothesis.stateful import run_state_machine_as_test

from unicache_fsm.linker import linker as linker_mod
from unicache_fsm.linker import ranks
from unicache_fsm.linker.load import LoadState
from unicache_fsm.pools.transfer import ComponentType, ExternalLinkerLoadPhase
from unicache_fsm.store.checked import CheckedStore
from unicache_fsm.store.faults import FaultKind
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import LoadBatchResult
from unicache_fsm.testing.invariants import InvariantViolation
from unicache_fsm.testing.machines import SystemMachine
from unicache_fsm.testing.ranks import check_rank_agreement
from unicache_fsm.tree import components
from unicache_fsm.tree.errors import TreeError
from unicache_fsm.tree.tree import RadixTree

HUNT = settings(
    max_examples=1500,  # after other tests in one process, some hunts needed more than 400
    stateful_step_count=40,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
)


def _machine(
    p: int,
    swa: bool,
    faults: bool,
    *,
    rate: float = 0.25,
    capacities: tuple[int | None, ...] = (None,),
    kinds: tuple[FaultKind, ...] = tuple(FaultKind),
) -> type[SystemMachine]:
    attrs = {
        "page_sizes": (p,),
        "swa_choices": (swa,),
        "fault_rates": (rate,) if faults else (0.0,),
        "store_capacities": capacities,
        "fault_kinds": kinds,
    }
    return type(f"Hunt_P{p}_{swa}_{faults}", (SystemMachine,), attrs)


def _caught(machine: type[SystemMachine], hunt: settings = HUNT) -> BaseException:
    with pytest.raises((AssertionError, TreeError, FailedHealthCheck)) as info:
        run_state_machine_as_test(machine, settings=hunt)
    return info.value


def test_abort_that_forgets_the_swa_slots_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    swa_hook = components.SwaComponent.update_external_linker_load
    full_hook = components.FullComponent.update_external_linker_load

    def swa_leaky(self: Any, phase: Any, transfer: Any, ctx: Any) -> Any:
        if phase is ExternalLinkerLoadPhase.ABORT:
            return None  # forgets to free the window's SWA pages ...
        return swa_hook(self, phase, transfer, ctx)

    def full_only(self: Any, phase: Any, transfer: Any, ctx: Any) -> Any:
        if phase is ExternalLinkerLoadPhase.ABORT and self.tree.component(ComponentType.SWA):
            self.tree.allocator.free_full_only(transfer.device_indices)
            return None  # ... and frees FULL without the SWA it maps to
        return full_hook(self, phase, transfer, ctx)

    monkeypatch.setattr(components.SwaComponent, "update_external_linker_load", swa_leaky)
    monkeypatch.setattr(components.FullComponent, "update_external_linker_load", full_only)
    err = _caught(_machine(4, True, True))
    assert "slot conservation" in str(err) or "leaked" in str(err), err


def test_commit_that_keeps_a_non_adopted_page_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = components.FullComponent.update_external_linker_load

    def greedy(self: Any, phase: Any, transfer: Any, ctx: Any) -> Any:
        if phase is ExternalLinkerLoadPhase.COMMIT:
            return transfer  # keeps every loaded page, duplicates included
        return real(self, phase, transfer, ctx)

    monkeypatch.setattr(components.FullComponent, "update_external_linker_load", greedy)
    err = _caught(_machine(1, False, False))
    assert "COMMIT soundness" in str(err), err


def test_split_that_drops_the_pending_offload_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = RadixTree.split

    def forgetful(self: RadixTree, node: Any, k: int) -> Any:
        ticket = node.pending_offload
        top = real(self, node, k)
        if ticket is not None:  # the new half loses its place in the publish list
            ticket.publish.remove(top)
            top.pending_offload = None
        return top

    monkeypatch.setattr(RadixTree, "split", forgetful)
    err = _caught(_machine(4, False, False))
    assert "offload" in str(err), err


def test_eviction_that_ignores_locks_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def careless(self: RadixTree, node: Any) -> bool:
        return (
            node.parent is not None
            and node.device_resident
            and not node.offloading
            and not any(c.device_resident for c in node.children.values())
        )

    monkeypatch.setattr(RadixTree, "evictable_leaf", careless)
    err = _caught(_machine(4, False, False))  # a locked prefix vanishes under its request
    assert "not in the tree" in str(err) or "lock" in str(err), err


def test_failed_loads_committed_as_landed_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def optimist(self: Any, load: Any, verdict: object = False) -> bool:
        return True  # every batch verdict passes LAND: failed batches get published

    monkeypatch.setattr(linker_mod.ExternalLinker, "landed_everywhere", optimist)
    err = _caught(_machine(4, False, True))
    assert "loads landed" in str(err) or "KV bytes" in str(err) or "stored pages" in str(err), err


def test_intersection_by_minimum_of_maxima_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def min_of_maxima(group: Any, restorable: Any, num_pages: int) -> int:
        best = max(restorable, default=0)
        return group.all_reduce_min([best])[0]

    monkeypatch.setattr(ranks, "intersect_restorable", min_of_maxima)
    hunt = settings(max_examples=300, database=None, phases=[Phase.generate])
    with pytest.raises(InvariantViolation, match="restorable intersection"):
        check_rank_agreement(with_settings=hunt)


# -- the bugs of issue 12, planted back --------------------------------------------------


def test_load_back_on_a_stale_prefix_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """1. load_back trusts the prefix matched earlier (evicted, reloaded from host or
    re-filled since): the commit builds on stale slots or a dead SWA window."""
    monkeypatch.setattr(linker_mod.ExternalLinker, "_prefix_current", lambda self, load: True)
    err = _caught(_machine(4, True, False))
    assert "COMMIT soundness" in str(err) or "KV bytes" in str(err), err


def test_a_failed_load_call_left_queued_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """2. A load whose store call failed stays queued, and the next batch's completion
    settles every load the linker put in the batch (named by the store or not): its
    never-written slots get committed."""

    def keeps_it(self: Any, load: Any) -> None:
        self.calls.load(load.rid, load.transfers)  # a refusal or a fault is ignored

    def settles_all(self: Any) -> None:
        for _ in range(self.calls.num_completed_loads() or 0):
            result = self.calls.pop_completed_load()
            head = self.batches.popleft() if self.batches else None
            for load in head.loads if head is not None else ():
                if load.state == LoadState.LOADING and load.settled is None:
                    load.settled = result is not None and result.success

    monkeypatch.setattr(linker_mod.ExternalLinker, "queue_store_load", keeps_it)
    monkeypatch.setattr(linker_mod.ExternalLinker, "_take_completions", settles_all)
    kinds = (FaultKind.REFUSE_LOAD, FaultKind.RAISE_ERROR, FaultKind.GARBAGE_ANSWER)
    err = _caught(_machine(4, False, True, kinds=kinds))
    caught_by = ("loads landed", "KV bytes", "stored pages landed")
    assert any(name in str(err) for name in caught_by), err


def test_a_failed_offload_left_offloading_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """3. A refused or failed offload never rolls its nodes back: they stay offloading,
    their lock held forever."""
    monkeypatch.setattr(linker_mod.ExternalLinker, "roll_back_nodes", lambda self, rec, v=0: None)
    err = _caught(_machine(4, False, True))
    assert "lock balance" in str(err) or "offloading" in str(err), err


def test_a_verdict_taken_by_its_truthiness_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """4. An ill-typed verdict is trusted: the string "false" counts as landed."""

    def lax(self: CheckedStore) -> LoadBatchResult | None:
        try:
            result = self.store.pop_completed_load()
        except Exception as exc:
            self.on_fault("pop_completed_load", exc)
            return None
        if not isinstance(result, LoadBatchResult):
            return None
        return LoadBatchResult(result.batch, result.rids, bool(result.success))

    monkeypatch.setattr(CheckedStore, "pop_completed_load", lax)
    kinds = (FaultKind.FAIL_BATCH_BEFORE_START, FaultKind.GARBAGE_ANSWER)
    err = _caught(_machine(4, False, True, rate=0.5, kinds=kinds))
    caught_by = ("loads landed", "KV bytes", "COMMIT soundness")
    assert any(name in str(err) for name in caught_by), err


def test_a_chain_offloaded_without_its_link_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """5. A chain goes to the store without the link to its stored parent: capacity
    eviction takes the parent's last page while the chain below it stays."""
    monkeypatch.setattr(linker_mod.ExternalLinker, "_link_page", lambda self, chain: None)
    err = _caught(_machine(4, False, False, capacities=(6, 24)))
    assert "store chains whole" in str(err), err


def test_a_corrupt_page_kept_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """6. A page that failed its checksum stays stored: every later load retries it."""
    monkeypatch.setattr(MemoryStore, "_drop_rejected", lambda self, ident, entry: None)
    err = _caught(_machine(1, False, False))
    assert "failed verification but are still stored" in str(err), err
