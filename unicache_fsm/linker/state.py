"""The external linker's state, made in one place, and its store-fault accounting.

`LinkerState` is the base every part of `ExternalLinker` builds on (the concept modules
beside this one hold its operations as mixins and functions): it holds the tree, the
store behind its `CheckedStore`, the rank group, the configuration, the two machines it
is the handler of, and every record in flight — the loads by request, the prepared loads
in the order `load_back` prepared them, the draining loads, the store batches, the
offload FIFO, the quarantine and the batch ids owed their own completion — plus the
counters (`LinkerStats`). Nothing else holds linker state, and nothing here changes it
but `store_fault` / `protocol_fault`, which count a store call that failed or answered
outside the protocol and keep the last one (`last_store_fault`); they never raise.

`LinkerConfig` and `LinkerStats` are public (re-exported by `unicache_fsm.linker.linker`);
`Batch`, `COUNT_SLACK` and the two fault functions are shared by the concept modules.
"""

from __future__ import annotations

from collections import deque

import attrs

from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.executor import Executor
from unicache_fsm.fsm.reference import ReferenceExecutor
from unicache_fsm.linker.load import ExternalLoad, LoadState, LoadTrigger
from unicache_fsm.linker.offload import OffloadState, OffloadTrigger, PendingOffload
from unicache_fsm.linker.quarantine import Quarantine
from unicache_fsm.linker.ranks import RankGroup, SingleRank
from unicache_fsm.store.checked import CheckedStore
from unicache_fsm.store.errors import StoreProtocolError
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.tree.components import components_for
from unicache_fsm.tree.residency import ExecutorKind
from unicache_fsm.tree.tree import RadixTree

__all__ = [
    "COUNT_SLACK",
    "Batch",
    "LinkerConfig",
    "LinkerState",
    "LinkerStats",
    "protocol_fault",
    "store_fault",
]

# completions a store may report beyond those the linker knows in flight (a batch
# started by a `start_loading` whose answer was lost); more is a miscount, a fault
COUNT_SLACK = 2
# ids of batches ended by a fault kept for their own completion (the quarantine's key)
_UNCONFIRMED_KEPT = 64


@attrs.define(slots=True, eq=False)
class Batch:
    """A batch the store acknowledged starting: its id and the loads it holds."""

    id: int
    loads: list[ExternalLoad]
    waited: int = 0  # `finish_loads` calls that found no completion while it was oldest


@attrs.frozen
class LinkerConfig:
    """`executor` picks the executor that drives the load and offload machines.

    `reset_when_idle`: when the quarantine holds something and nothing of the linker's
    is in flight in the store (no prepared load, no batch of ours, no offload), the end
    of `finish_loads` / `poll_offloads` resets the store — its reset returning is the
    trusted signal that releases the quarantine, and with nothing in flight it ends
    nothing else. Off, the quarantine waits for the store's own completions or for an
    explicit `reset` / `close` (a store that consumed a completion it never answered
    then holds its slots until one). `serving.System` (the test and fuzzing harness)
    builds its linker with it off unless asked; `simulate` turns it on.
    """

    executor: ExecutorKind = ExecutorKind.COMPILED
    reset_when_idle: bool = True


@attrs.define(slots=True)
class LinkerStats:
    """Counters of what the linker did (all monotonic)."""

    lookups: int = 0
    lookup_faults: int = 0
    hit_pages: int = 0
    loads_prepared: int = 0
    loads_committed: int = 0
    loads_aborted: dict[str, int] = attrs.field(factory=dict)
    pages_loaded: int = 0  # pages whose loaded bytes the tree adopted
    pages_duplicate: int = 0  # loaded pages freed at COMMIT (the tree had them)
    offloads_submitted: int = 0
    offloads_published: int = 0
    offloads_failed: int = 0
    pages_offloaded: int = 0
    nodes_demoted: int = 0
    store_faults: dict[str, int] = attrs.field(factory=dict)  # by store call
    loads_quarantined: int = 0  # loads whose slots went to the quarantine
    offloads_quarantined: int = 0  # offloads held in the quarantine (nodes locked)
    quarantine_released: int = 0  # loads and offloads the trusted signal released
    idle_resets: int = 0  # store resets made to release the quarantine (`reset_when_idle`)


class LinkerState:
    """Everything one rank's linker holds, built once from its tree, store, group and
    config; the handler of the load and offload machines it builds (their spec callbacks
    are methods of the class composed on top of this one, `ExternalLinker`).

    Contract: the fields below are the whole of the linker's state; the concept modules
    read and change them, and hold none of their own.
    """

    def __init__(
        self,
        tree: RadixTree,
        store: ExternalStore,
        *,
        group: RankGroup | None = None,
        config: LinkerConfig | None = None,
    ) -> None:
        self.tree = tree
        self.store = store
        self.calls = CheckedStore(store, self._on_store_fault)
        self.last_store_fault: BaseException | None = None
        self.group: RankGroup = group if group is not None else SingleRank()
        self.config = config or LinkerConfig()
        self.components = components_for(tree)
        self.page_size = tree.page_size
        kind: type[Executor] = (
            CompiledExecutor if self.config.executor is ExecutorKind.COMPILED else ReferenceExecutor
        )
        # the records are data; this linker is the handler of both machines
        self.load_machine = kind(
            "load_transaction", ExternalLoad, triggers=LoadTrigger, states=LoadState, handler=self
        )
        self.offload_machine = kind(
            "offload", PendingOffload, triggers=OffloadTrigger, states=OffloadState, handler=self
        )
        self.loads: dict[str, ExternalLoad] = {}  # every load not yet final, by rid
        # released loads the store may still write into: they still own slots and a lock
        self.draining: list[ExternalLoad] = []
        # every prepared load not yet ended, in the order load_back prepared them (the
        # same on every rank): what `finish_loads` agrees on, one value per load
        self.held: dict[int, ExternalLoad] = {}
        # batches the store acknowledged starting, oldest first (completions are FIFO)
        self.batches: deque[Batch] = deque()
        # accepted offloads not completed, FIFO; None marks a store offload this rank
        # queued but the group refused: its completion is popped and dropped locally
        self.offloads: deque[PendingOffload | None] = deque()
        # what the store may still touch after it broke the protocol (`quarantine`)
        self.quarantine = Quarantine()
        # ids of batches ended without their own completion (a fault), newest last: the
        # completion, when it comes, releases what they hold and is no fault
        self.unconfirmed: deque[int] = deque(maxlen=_UNCONFIRMED_KEPT)
        self.stats = LinkerStats()
        self.offload_ids = 0
        self.prepared_seq = 0

    def _on_store_fault(self, operation: str, error: BaseException) -> None:
        """The `CheckedStore`'s fault hook (a bound method: a copy of the linker rebinds
        it to the copy)."""
        store_fault(self, operation, error)


def store_fault(linker: LinkerState, operation: str, error: BaseException) -> None:
    """A store call failed or answered outside the protocol: count it, keep it."""
    faults = linker.stats.store_faults
    faults[operation] = faults.get(operation, 0) + 1
    if operation == "lookup":
        linker.stats.lookup_faults += 1
    linker.last_store_fault = error


def protocol_fault(linker: LinkerState, operation: str, value: object, msg: str) -> None:
    """The store broke the protocol in a way only the linker can see."""
    store_fault(linker, operation, StoreProtocolError(msg, operation=operation, value=value))
