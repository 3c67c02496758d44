"""The mutation check's planted bugs, shared by both fuzz drivers' checks.

Each `Bug` plants one bug with monkeypatch (`plant`), names the `SystemMachine`
configuration that hunts it (`attrs`: class attributes), and lists what the failure
must mention (`names`: the invariant, or the culprit, that bug breaks; any one of them).
`tests/test_testing_mutations.py` hunts each with Hypothesis, `tests/test_testing_walk.py`
with the random walk.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from unicache_fsm.linker import linker as linker_mod
from unicache_fsm.linker.load import LoadState, LoadTrigger
from unicache_fsm.linker.offload import OffloadTrigger
from unicache_fsm.linker.state import Batch
from unicache_fsm.pools.transfer import (
    ComponentType,
    ExternalLinkerLoadPhase,
    LinkerTransferPhase,
)
from unicache_fsm.store.checked import CheckedStore
from unicache_fsm.store.faults import LYING, FaultKind
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import LoadBatchResult
from unicache_fsm.testing.machines import SystemMachine
from unicache_fsm.tree import components
from unicache_fsm.tree.tree import RadixTree


def _swa_leak(monkeypatch: pytest.MonkeyPatch) -> None:
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


def _greedy_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    real = components.FullComponent.update_external_linker_load

    def greedy(self: Any, phase: Any, transfer: Any, ctx: Any) -> Any:
        if phase is ExternalLinkerLoadPhase.COMMIT:
            return transfer  # keeps every loaded page, duplicates included
        return real(self, phase, transfer, ctx)

    monkeypatch.setattr(components.FullComponent, "update_external_linker_load", greedy)


def _forgetful_split(monkeypatch: pytest.MonkeyPatch) -> None:
    real = RadixTree.split

    def forgetful(self: RadixTree, node: Any, k: int) -> Any:
        ticket = node.pending_offload
        top = real(self, node, k)
        if ticket is not None:  # the new half loses its place in the publish list
            ticket.publish.remove(top)
            top.pending_offload = None
        return top

    monkeypatch.setattr(RadixTree, "split", forgetful)


def _careless_eviction(monkeypatch: pytest.MonkeyPatch) -> None:
    def careless(self: RadixTree, node: Any) -> bool:
        return (
            node.parent is not None
            and node.device_resident
            and not node.offloading
            and not any(c.device_resident for c in node.children.values())
        )

    monkeypatch.setattr(RadixTree, "evictable_leaf", careless)


def _optimist(monkeypatch: pytest.MonkeyPatch) -> None:
    def optimist(self: Any, load: Any, verdict: object = False) -> bool:
        return True  # every batch verdict passes LAND: failed batches get published

    monkeypatch.setattr(linker_mod.ExternalLinker, "landed_everywhere", optimist)


def _stale_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linker_mod.ExternalLinker, "_prefix_current", lambda self, load: True)


def _failed_load_queued(monkeypatch: pytest.MonkeyPatch) -> None:
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


def _stuck_offload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linker_mod.ExternalLinker, "roll_back_nodes", lambda self, rec, v=0: None)


def _truthy_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
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


def _chain_without_link(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linker_mod.ExternalLinker, "_link_page", lambda self, chain: None)


def _corrupt_page_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MemoryStore, "_drop_rejected", lambda self, ident, entry: None)


# -- issue 31: "free on a miscount" -------------------------------------------------------
# Each is an independent rewrite of one piece of the linker's completion handling that
# trusts what a lying store says about its work, so it frees (or unlocks) slots the store
# still writes into or reads from. Each is caught by data: the store's late write lands in
# slots another request owns (KV bytes), or a record ends on a completion that was not its
# own (stored pages landed, loads landed).


def _free_on_overcount(monkeypatch: pytest.MonkeyPatch) -> None:
    def trusting(self: Any) -> None:
        for _ in range(self.calls.num_completed_loads() or 0):
            result = self.calls.pop_completed_load()  # None: the count was a lie
            head = self.batches.popleft() if self.batches else None
            for load in head.loads if head is not None else ():
                if load.state == LoadState.LOADING and load.settled is None:
                    # the oldest batch ends on the count alone: its slots are freed
                    named = result is not None and load.rid in (result.rids or ())
                    load.settled = named and result.success is True  # type: ignore[union-attr]

    monkeypatch.setattr(linker_mod.ExternalLinker, "_take_completions", trusting)


def _release_on_overcount(monkeypatch: pytest.MonkeyPatch) -> None:
    def trusting(self: Any) -> list[Any]:
        while self.offloads and self.offloads[0] is None and self.calls.num_completed_offloads():
            self.calls.pop_completed_offload()
            self.offloads.popleft()
        run = 0
        for record in self.offloads:
            if record is None:
                break
            run += 1
        count = min(self.calls.num_completed_offloads() or 0, run)  # believed
        done = []
        for _ in range(count):
            record = self.offloads.popleft()
            # a pop that fails ends the record failed: its nodes unlock under the store
            ok = self.calls.pop_completed_offload()
            self.offload_machine.fire(record, OffloadTrigger.COMPLETE, ok)
            done.append(record)
        return done

    monkeypatch.setattr(linker_mod.ExternalLinker, "poll_offloads", trusting)


def _free_after_lost_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def trusting(self: Any) -> int:
        queued = [ld for ld in self.held.values() if ld.state == LoadState.QUEUED]
        batch = self.calls.start_loading()
        if batch is None:
            return -1  # the reply was lost: the loads are taken to be queued still
        if batch < 0:  # "nothing queued": the loads it started are settled failed
            for load in queued:
                if load.settled is None:
                    load.settled = False
            return -1
        started = [ld for ld in queued if ld.settled is None]
        for load in started:
            self.load_machine.fire(load, LoadTrigger.START)
            load.batch = batch
        self.batches.append(Batch(batch, started))
        return batch

    monkeypatch.setattr(linker_mod.ExternalLinker, "start_loading", trusting)


def _checkpoint_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = components.SwaComponent.adopt

    def frees_it(self: Any, node: Any, ctx: Any, *, new_leaf: bool) -> Any:
        out = real(self, node, ctx, new_leaf=new_leaf)
        for a, b in ctx.params.swa_kept_ranges:  # a checkpoint window's SWA goes back to
            walk: Any = out  # the pool while its node still claims it
            while walk is not None and walk.parent is not None:
                swa = walk.data.get(ComponentType.SWA)
                if swa is not None and a <= walk.start and walk.start + len(walk.key) <= b:
                    self.allocator.free_swa(swa)
                walk = walk.parent
        return out

    monkeypatch.setattr(components.SwaComponent, "adopt", frees_it)


def _checkpoint_offload_shifted(monkeypatch: pytest.MonkeyPatch) -> None:
    real = components.SwaComponent.build_external_linker_transfer

    def shifted(self: Any, phase: Any, node: Any, keys: Any) -> Any:
        out = real(self, phase, node, keys)
        if phase is LinkerTransferPhase.OFFLOAD and out is not None and node.children:
            # a checkpoint window (live SWA inside a path) sent with its pages one off
            # their hashes: each page stored under its neighbour's key
            k = out.keys
            return attrs.evolve(out, keys=(*k[1:], *k[:1]))
        return out

    monkeypatch.setattr(components.SwaComponent, "build_external_linker_transfer", shifted)


def _config(
    p: int,
    swa: bool,
    faults: bool,
    *,
    rate: float = 0.25,
    capacities: tuple[int | None, ...] = (None,),
    kinds: tuple[FaultKind, ...] = tuple(k for k in FaultKind if k not in LYING),
    checkpoints: tuple[int, ...] = (0, 1, 2),
) -> dict[str, Any]:
    return {
        "page_sizes": (p,),
        "swa_choices": (swa,),
        "swa_checkpoints": checkpoints,
        "fault_rates": (rate,) if faults else (0.0,),
        "store_capacities": capacities,
        "fault_kinds": kinds,
    }


@attrs.frozen
class Bug:
    name: str
    plant: Any  # (monkeypatch) -> None
    attrs: dict[str, Any]
    names: tuple[str, ...]

    def machine(self) -> type[SystemMachine]:
        """A fresh `SystemMachine` subclass configured to hunt this bug."""
        return type(f"Hunt_{self.name}", (SystemMachine,), dict(self.attrs))


K = FaultKind
BUGS = [
    # an ABORT forgets the window's SWA slots and frees FULL without the SWA it maps to
    Bug("swa_leak", _swa_leak, _config(4, True, True), ("slot conservation", "leaked")),
    # COMMIT keeps every loaded page, duplicates included
    Bug("greedy_commit", _greedy_commit, _config(1, False, False), ("COMMIT soundness",)),
    # a split drops the pending offload of its new upper half
    Bug("forgetful_split", _forgetful_split, _config(4, False, False), ("offload",)),
    # eviction ignores locks: a locked prefix vanishes under its request
    Bug(
        "careless_eviction",
        _careless_eviction,
        _config(4, False, False),
        # a locked anchor evicted under a load: the commit finds the tree's path short
        ("not in the tree", "lock", "in flight evicted", "canonical tail length"),
    ),
    # every batch verdict passes LAND: failed loads get committed as landed
    Bug(
        "optimist",
        _optimist,
        _config(4, False, True),
        ("loads landed", "KV bytes", "stored pages"),
    ),
    # issue 12's bugs, planted back:
    # 1. load_back trusts the prefix matched earlier (evicted, reloaded or re-filled since)
    Bug("stale_prefix", _stale_prefix, _config(4, True, False), ("COMMIT soundness", "KV bytes")),
    # 2. a load whose store call failed stays queued; a completion settles every load of
    # the batch, named by the store or not: never-written slots get committed
    Bug(
        "failed_load_queued",
        _failed_load_queued,
        _config(4, False, True, kinds=(K.REFUSE_LOAD, K.RAISE_ERROR, K.GARBAGE_ANSWER)),
        ("loads landed", "KV bytes", "stored pages landed"),
    ),
    # 3. a refused or failed offload never rolls its nodes back: their lock held forever
    Bug("stuck_offload", _stuck_offload, _config(4, False, True), ("lock balance", "offloading")),
    # 4. an ill-typed verdict is trusted: the string "false" counts as landed
    Bug(
        "truthy_verdict",
        _truthy_verdict,
        # both ways a batch fails, at a rate that still lets loads reach their completion
        # (measured, programs to the first failure over 12 hunts: median 700, at most
        # 2,100; at rate 0.5 without FAIL_BATCH_MIDWAY: median 1,400, one over 4,000)
        _config(
            4,
            False,
            True,
            rate=0.35,
            kinds=(K.FAIL_BATCH_BEFORE_START, K.FAIL_BATCH_MIDWAY, K.GARBAGE_ANSWER),
        ),
        # a failed batch taken as landed: its loads commit, their nodes count as stored
        ("loads landed", "KV bytes", "COMMIT soundness", "stored pages landed"),
    ),
    # 5. a chain goes to the store without the link to its stored parent
    Bug(
        "chain_without_link",
        _chain_without_link,
        _config(4, False, False, capacities=(6, 24)),
        ("store chains whole",),
    ),
    # 6. a page that failed its checksum stays stored: every later load retries it
    Bug(
        "corrupt_page_kept",
        _corrupt_page_kept,
        _config(1, False, False),
        ("failed verification but are still stored",),
    ),
    # issue 31's "free on a miscount", each hunted with the one lie that exposes it:
    # 1. a completion count the store cannot back still ends the oldest batch in flight
    Bug(
        "free_on_overcount",
        _free_on_overcount,
        _config(4, False, True, kinds=(K.OVERCOUNT_COMPLETIONS,)),
        ("KV bytes", "loads landed", "COMMIT soundness", "slot conservation"),
    ),
    # 2. ... ends the oldest offload failed: its nodes unlock while the store reads them
    Bug(
        "release_on_overcount",
        _release_on_overcount,
        _config(4, False, True, kinds=(K.OVERCOUNT_COMPLETIONS,)),
        ("KV bytes", "stored pages landed", "slot conservation"),
    ),
    # 3. a start whose reply was lost, then "nothing queued": the loads it started fail
    Bug(
        "free_after_lost_start",
        _free_after_lost_start,
        _config(4, False, True, rate=0.5, kinds=(K.LOST_REPLY,)),
        ("KV bytes", "loads landed", "COMMIT soundness", "slot conservation"),
    ),
    # issue 37's SWA checkpoints: a checkpoint window's SWA freed while its node keeps it
    Bug(
        "checkpoint_freed",
        _checkpoint_freed,
        _config(4, True, False, checkpoints=(1, 2)),
        ("slot conservation", "KV bytes"),
    ),
    # ... and a checkpoint window offloaded with its pages under the wrong hashes
    Bug(
        "checkpoint_offload_shifted",
        _checkpoint_offload_shifted,
        _config(4, True, False, checkpoints=(1,)),
        ("KV bytes", "loads landed"),
    ),
]
