"""OFFLOAD: handing written-through nodes to the store and completing them in order.

`offload_nodes` hands a root-first chain to the store one node at a time, as SGLang
0.5.23 does: one store call, one lock and one `PendingOffload` per node, acceptance
agreed across ranks (MIN). The KV transfer of a node starts with the last page of its
parent when that parent is on the device (stored, offloading or backed up), so the store
links the node to it and its capacity eviction shrinks a path from its end.
`poll_offloads` completes offloads FIFO with verdicts agreed across ranks. An offload
completion carries no id: after a lost `offload` answer or a faulty pop, every offload
in flight is held in the quarantine (nodes locked, published never) and each later
well-formed completion releases the oldest held, failed.

`Offloading` holds these two calls and the spec callbacks of the ``offload`` machine
(`store_accepted`, `succeeded`, `publish_nodes`, `roll_back_nodes`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from unicache_fsm.linker.lifecycle import reclaim
from unicache_fsm.linker.offload import OffloadTrigger, PendingOffload
from unicache_fsm.linker.ranks import SingleRank
from unicache_fsm.linker.state import LinkerState
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.tree.node import TreeNode

__all__ = ["Offloading"]

OFF = OffloadTrigger


class Offloading(LinkerState):
    """`offload_nodes` and `poll_offloads` (collective calls), and the ``offload``
    machine's spec callbacks (``callback(record, *trigger_args)``; called by
    `offload_machine` only).

    Contract: a node's offload publishes only on a verdict every rank agreed is its own
    success; nodes the store may still read stay locked; every accepted offload ends
    exactly once (published, failed, or released failed from the quarantine).
    """

    def offload_nodes(self, chain: Sequence[TreeNode]) -> PendingOffload | None:
        """Offload a root-first chain (e.g. `InsertResult.write_through`) as SGLang
        0.5.23 does: one store call, one lock and one pending record per node, each
        settled by its own verdict. Returns the last node's record (None: empty chain)."""
        record = None
        for node in chain:
            record = self._offload_one([node])
        return record

    def _offload_one(self, chain: Sequence[TreeNode]) -> PendingOffload | None:
        if not chain:
            return None
        transfers, chain_pages = self._offload_transfers(chain)
        ticket = self.tree.begin_offload(chain)
        self.offload_ids += 1
        record = PendingOffload(
            id=self.offload_ids, ticket=ticket, transfers=transfers, chain_pages=chain_pages
        )
        self.offload_machine.initialize(record)
        queued = self.calls.offload(transfers)  # None: the reply was lost
        # agreed across ranks: whether all queued it, whether any may have (lost reply)
        lost = queued is None
        all_queued, none_lost = (
            (queued is True, not lost)
            if type(self.group) is SingleRank
            else (v == 1 for v in self.group.all_reduce_min([int(queued is True), int(not lost)]))
        )
        self.stats.offloads_submitted += 1
        if not none_lost:  # a store may read the nodes' slots later: hold them locked
            self.offload_machine.fire(record, OFF.SUBMIT, True)
            self._hold_offloads()
            self.quarantine.offloads.append(record)
            self.stats.offloads_quarantined += 1
            return record
        if queued and not all_queued:  # drop its completion when it comes
            (self.quarantine.offloads or self.offloads).append(None)
        self.offload_machine.fire(record, OFF.SUBMIT, all_queued)
        if all_queued:
            self._queue_offload(record)
        return record

    def _hold_offloads(self) -> None:
        """Which offload a completion ends is unknown from here on: every offload in
        flight moves to the quarantine (nodes locked, published never)."""
        held = self.quarantine.offloads
        while self.offloads:
            moved = self.offloads.popleft()
            held.append(moved)
            self.stats.offloads_quarantined += moved is not None

    def _queue_offload(self, record: PendingOffload) -> None:
        """Behind the quarantined offloads while any is held (their completions come
        first, and cannot be told from this one's), else in the FIFO."""
        if self.quarantine.offloads:
            self.quarantine.offloads.append(record)
            self.stats.offloads_quarantined += 1
        else:
            self.offloads.append(record)

    def _link_page(self, chain: Sequence[TreeNode]) -> TreeNode | None:
        """The chain's parent, whose last page links the chain in the store, when there is
        one (not the root; on the device and hashed), else None.

        The chain stopped there because the parent is stored, being offloaded or backed
        up: its last page is usually held already (then the store only links to it); if
        not, the store keeps that page too, so the chain never starts in mid-air.
        """
        parent = chain[0].parent
        if (
            parent is None
            or parent.parent is None
            or not parent.device_resident
            or not parent.digest_bytes  # (its hashes, without spelling them all in hex)
            or parent.slots(self.components[0].component_type) is None  # the backbone
        ):
            return None
        return parent

    def _offload_transfers(self, chain: Sequence[TreeNode]) -> tuple[list[PoolTransfer], int]:
        """One transfer per component over the chain (root first) and the chain's KV
        page count; the KV transfer starts with the link page (see the module docstring)."""
        merged: list[PoolTransfer] = []
        chain_pages = 0
        link = self._link_page(chain)
        for c in self.components:
            linked = None
            if c.pool is PoolName.KV and link is not None:
                link_slots = link.slots(c.component_type)
                link_key = link.last_hash()
                if link_slots is not None and link_key is not None:
                    linked = (link_slots[-self.page_size :], link_key)
            transfer = c.build_external_linker_offload(chain, linked)
            if transfer is None:
                continue
            if c.pool is PoolName.KV:
                chain_pages = transfer.num_pages - (linked is not None)
            merged.append(transfer)
        return merged, chain_pages

    def poll_offloads(self) -> list[PendingOffload]:
        """Complete the offloads every rank has finished, FIFO, with agreed verdicts
        (a collective call: one count all-reduce, then one verdict per offload).

        A faulty pop (an exception, not a bool, more completions reported than can be
        in flight) tells nothing about which offload ended: every offload in flight is
        quarantined (its nodes stay locked and offloading, the store may still read
        them) and each later well-formed completion releases the oldest held, failed.
        """
        calls = self.calls
        held = self.quarantine.offloads
        while True:  # this rank's offloads the group refused: popped and dropped locally
            fifo = held if held else self.offloads
            if not fifo or fifo[0] is not None or not calls.num_completed_offloads():
                break
            calls.pop_completed_offload()
            fifo.popleft()
        run = 0
        for record in itertools.chain(held, self.offloads):
            if record is None:
                break
            run += 1
        outstanding = len(held) + len(self.offloads)
        reported = calls.bounded(
            "num_completed_offloads", calls.num_completed_offloads(), outstanding
        )
        count = self.group.all_reduce_min([min(reported, run)])[0]
        done = []
        for _ in range(count):
            verdict = calls.pop_completed_offload()
            # 0: a faulty pop on some rank; 1: failed; 2: succeeded (MIN across ranks)
            value = self.group.all_reduce_min([0 if verdict is None else 1 + verdict])[0]
            if value == 0:
                self._hold_offloads()
                continue
            if held:  # the store is done with the oldest held (FIFO); its verdict is unknown
                record, success = held.popleft(), False
                self.stats.quarantine_released += 1
            else:
                record, success = self.offloads.popleft(), value == 2
            assert record is not None  # (`count` stops before the first placeholder)
            self.offload_machine.fire(record, OFF.COMPLETE, success)
            done.append(record)
        reclaim(self)
        return done

    # -- spec callbacks of offload (called by `offload_machine` only) -----------------
    def store_accepted(self, record: PendingOffload, accepted: object = False) -> bool:
        """Guard of ``submit``: the store's answer agreed across ranks (the argument)."""
        return accepted is True

    def succeeded(self, record: PendingOffload, success: object = False) -> bool:
        """Guard of ``complete``: the verdict agreed across ranks (the argument)."""
        return success is True

    def publish_nodes(self, record: PendingOffload, success: object = True) -> None:
        """After ``complete`` to published: the chain's nodes become stored, unlocked."""
        self.tree.finish_offload(record.ticket, True)
        self.stats.offloads_published += 1
        self.stats.pages_offloaded += record.chain_pages

    def roll_back_nodes(self, record: PendingOffload, verdict: object = False) -> None:
        """After ``submit``/``complete`` to failed: the nodes become unstored, unlocked."""
        self.tree.finish_offload(record.ticket, False)
        self.stats.offloads_failed += 1
