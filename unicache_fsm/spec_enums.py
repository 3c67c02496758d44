# Generated from specs/load_transaction.toml, specs/node_residency.toml, specs/offload.toml,
# specs/sglang_linker.toml, specs/sglang_load.toml, specs/sglang_offload.toml,
# specs/store_load.toml, specs/store_offload.toml, specs/vllm_block.toml, specs/vllm_manager.toml,
# specs/vllm_request.toml, specs/vllm_transfer.toml by `unicache-fsm docs`: do not edit. Edit the
# specs, then run `unicache-fsm docs` (tests/test_spec_enums.py fails while this file differs from
# what it writes).
"""The states and triggers of every bundled machine, generated from its spec.

Each enum names exactly what its spec declares: a trigger enum every trigger, in declaration
order; a state enum every configuration (what a record's state slot holds), in document order.
A member's value is the spec's name (``str`` enums: they compare equal to the names the
executors use), its name that name's last dotted segment upper-cased (``prepared.queued`` ->
``QUEUED``), its docstring the spec's description. Import them from the module that uses them
(it re-exports them)."""

import enum


class LoadTrigger(str, enum.Enum):
    """The triggers of the `load_transaction` machine, in declaration order."""

    PREPARE = "prepare"
    """idle -> prepared: LOAD + PREPARE: re-check the prefix, allocate (evicting the shortfall),
      map FULL->SWA, queue."""
    START = "start"
    """prepared.queued -> prepared.loading: The store acknowledged a started batch holding the
      load."""
    LAND = "land"
    """prepared.loading -> prepared.landed: The batch verdict (the argument), agreed across ranks
      (MIN), says every page landed."""
    COMMIT = "commit"
    """prepared.landed -> committed: COMMIT: insert with adopted-range tracking, keep adopted
      pages, mark stored."""
    ABORT = "abort"
    """idle -> aborted: ABORT before PREPARE: nothing was reserved, nothing to undo.
    prepared.queued -> aborted: ABORT while queued: the store gives the load back first, then
      its slots are freed.
    prepared.loading, prepared.landed -> aborted: ABORT after the batch ended (the store
      writes no more): free, unmap SWA, unlock."""


class LoadState(str, enum.Enum):
    """The configurations of the `load_transaction` machine (a record's state slot)."""

    IDLE = "idle"
    """LOOKUP found a restorable prefix; nothing is reserved yet."""
    QUEUED = "prepared.queued"
    """The store holds the load in its queue."""
    LOADING = "prepared.loading"
    """The store is writing pages into the reserved slots."""
    LANDED = "prepared.landed"
    """Every rank reports every page landed."""
    COMMITTED = "committed"
    """The tail is in the tree; duplicates are freed; the path is stored."""
    ABORTED = "aborted"
    """Everything reserved is freed; nothing was published. The request recomputes."""


class ResidencyTrigger(str, enum.Enum):
    """The triggers of the `node_residency` machine, in declaration order."""

    EVICT = "evict"
    """device.resident -> device.evicted: Free the device slots, keep the host copy (the SWA
      window went first)."""
    LOAD_BACK = "load_back"
    """device.evicted -> device.resident: Copy the host backup back into fresh device slots."""
    UNEVICT = "unevict"
    """device.evicted -> device.resident: An insert walked the evicted node and gave it the
      caller's slots."""
    DELETE = "delete"
    """device.resident, device.evicted -> device.deleted: Remove the node from the tree (nothing
      may be in flight)."""
    START_OFFLOAD = "start_offload"
    """external.unstored -> external.offloading: Write-through chose the node; its pages and
      hashes go to the store."""
    OFFLOAD_SUCCEEDED = "offload_succeeded"
    """external.offloading -> external.stored"""
    OFFLOAD_FAILED = "offload_failed"
    """external.offloading -> external.unstored: Eligible for offload again."""
    MARK_STORED = "mark_stored"
    """external.unstored -> external.stored: A committed load published the node: the store
      already holds its pages."""
    DEMOTE = "demote"
    """external.stored -> external.unstored: A LOOKUP found the node's pages missing (store-side
      eviction)."""
    START_BACKUP = "start_backup"
    """backup.none -> backup.backing_up"""
    BACKUP_SUCCEEDED = "backup_succeeded"
    """backup.backing_up -> backup.backed_up"""
    BACKUP_FAILED = "backup_failed"
    """backup.backing_up -> backup.none"""
    DROP_BACKUP = "drop_backup"
    """backup.backed_up -> backup.none: Free the host copy (the device copy remains)."""
    ADOPT_SWA = "adopt_swa"
    """swa.tombstone -> swa.live: The node took SWA slots: a new or unevicted node inside the
      inserting request's window, or an insert that gave a tombstone the caller's SWA."""
    TOMBSTONE_SWA = "tombstone_swa"
    """swa.live -> swa.tombstone: SWA eviction freed the node's SWA slots (FULL stays), or its
      device copy is going."""


class OffloadTrigger(str, enum.Enum):
    """The triggers of the `offload` machine, in declaration order."""

    SUBMIT = "submit"
    """queued -> pending: The store queued the transfer (the argument, agreed across ranks).
    queued -> failed: The store refused the transfer, or the call failed: roll the nodes back."""
    COMPLETE = "complete"
    """pending -> published: The verdict (the argument, MIN across ranks) is success: the nodes
      are stored.
    pending -> failed: The verdict is failure: roll the nodes back."""


class OffloadState(str, enum.Enum):
    """The configurations of the `offload` machine (a record's state slot)."""

    QUEUED = "queued"
    """The chain is chosen and its nodes are locked."""
    PENDING = "pending"
    """The store accepted the pages and hashes; completion is awaited."""
    PUBLISHED = "published"
    """Every rank stored every page; the nodes are marked stored."""
    FAILED = "failed"
    """The store refused or lost the offload; the nodes are unstored again."""


class SglangLinkerTrigger(str, enum.Enum):
    """The triggers of the `sglang_linker` machine, in declaration order."""

    LOOKUP = "lookup"
    """open -> open: `lookup(rid, transfers)`: restorable prefix lengths of a request's tail."""
    LOAD = "load"
    """open -> open: `load(rid, transfers)`: queue a load into request-private slots."""
    START = "start"
    """open -> open: `start_layer_wise_loading()`: every queued load joins one batch."""
    START_ANSWER = "start_answer"
    """open -> open: `start_layer_wise_loading()` answered an int index that is not in flight."""
    FINISH = "finish"
    """open -> open: `finish_layer_wise_loading(index)` of a started, unfinished batch."""
    CANCEL = "cancel"
    """open -> open: `cancel_queued_load(rid)`: withdraw a load that has not started."""
    OFFLOAD = "offload"
    """open -> open: `offload(transfers, session_id)`: queue one node's pages for persistence."""
    COUNT = "count"
    """open -> open: `num_completed_offloads()`: how many completions may be popped."""
    COUNT_ANSWER = "count_answer"
    """open -> open: `num_completed_offloads()` answered an int from 0 to the offloads in flight."""
    POP = "pop"
    """open -> open: `pop_completed_offload()` of a completion that was reported and not popped."""
    RESET = "reset"
    """open -> open: `reset()`: quiesce; every load and offload in flight is dropped."""
    CLOSE = "close"
    """open -> closed: `close()`: quiesce and release; nothing may be called afterwards."""


class SglangLinkerState(str, enum.Enum):
    """The configurations of the `sglang_linker` machine (a record's state slot)."""

    OPEN = "open"
    """Attached to the cache; every call of the protocol is allowed."""
    CLOSED = "closed"
    """`close` quiesced every transfer and released the backend."""


class SglangLoadTrigger(str, enum.Enum):
    """The triggers of the `sglang_load` machine, in declaration order."""

    ANSWER = "answer"
    """requested -> queued: `load` answered True (the argument).
    requested -> refused: `load` answered False (the argument), or raised."""
    START = "start"
    """queued -> started: `start_layer_wise_loading` took it into a batch."""
    FINISH = "finish"
    """started -> landed: Its batch's `finish_layer_wise_loading` answered True (the argument).
    started -> failed: Its batch's `finish_layer_wise_loading` answered False (the argument)."""
    CANCEL = "cancel"
    """queued -> cancelled: `cancel_queued_load(rid)` answered True (the argument)."""
    DROP = "drop"
    """queued, started -> dropped: `reset` or `close` quiesced the linker."""


class SglangLoadState(str, enum.Enum):
    """The configurations of the `sglang_load` machine (a record's state slot)."""

    REQUESTED = "requested"
    """`load` was called; its answer is awaited."""
    QUEUED = "queued"
    """Accepted; waits for the next `start_layer_wise_loading`."""
    STARTED = "started"
    """In a started batch; the backend writes its pages into the slots."""
    LANDED = "landed"
    """Its batch finished with every layer landed."""
    FAILED = "failed"
    """Its batch finished with a layer missing: the request is aborted."""
    REFUSED = "refused"
    """`load` answered False (or raised): nothing was queued."""
    CANCELLED = "cancelled"
    """`cancel_queued_load` withdrew it before its batch started."""
    DROPPED = "dropped"
    """`reset` or `close` quiesced it before its batch finished."""


class SglangOffloadTrigger(str, enum.Enum):
    """The triggers of the `sglang_offload` machine, in declaration order."""

    ANSWER = "answer"
    """requested -> pending: `offload` answered True (the argument).
    requested -> refused: `offload` answered False (the argument), or raised."""
    REPORT = "report"
    """pending -> completed: `num_completed_offloads` counted it among the oldest completed
      offloads."""
    POP = "pop"
    """completed -> stored: `pop_completed_offload` answered True (the argument).
    completed -> failed: `pop_completed_offload` answered False (the argument)."""
    DROP = "drop"
    """pending, completed -> dropped: `reset` or `close` quiesced the linker."""


class SglangOffloadState(str, enum.Enum):
    """The configurations of the `sglang_offload` machine (a record's state slot)."""

    REQUESTED = "requested"
    """`offload` was called; its answer is awaited."""
    PENDING = "pending"
    """Accepted; the node is locked and pending until its completion is popped."""
    COMPLETED = "completed"
    """`num_completed_offloads` counted it; it may be popped."""
    STORED = "stored"
    """Popped with success: the node is stored."""
    FAILED = "failed"
    """Popped with failure: the node is unstored and eligible again."""
    REFUSED = "refused"
    """`offload` answered False (or raised): nothing was queued."""
    DROPPED = "dropped"
    """`reset` or `close` quiesced it before it was popped."""


class StoreLoadTrigger(str, enum.Enum):
    """The triggers of the `store_load` machine, in declaration order."""

    START = "start"
    """queued -> started: `start_loading` took the load into a batch."""
    FINISH = "finish"
    """started -> landed: Every page of the batch was present and matched its checksum.
    started -> failed: Some page of the batch was missing or failed its checksum."""
    CANCEL = "cancel"
    """queued -> cancelled: `cancel_queued_load` before the batch started."""
    ABANDON = "abandon"
    """queued, started -> failed: `reset` or `close` quiesced the store; the load completes as
      failed."""


class StoreLoadState(str, enum.Enum):
    """The configurations of the `store_load` machine (a record's state slot)."""

    QUEUED = "queued"
    """Validated and queued; its keys are pinned against capacity eviction."""
    STARTED = "started"
    """Part of a started batch; the store is writing its pages."""
    LANDED = "landed"
    """Every page of the batch was present and intact and is in the slots."""
    FAILED = "failed"
    """A page of the batch was missing or corrupt, or the store was reset."""
    CANCELLED = "cancelled"
    """Cancelled before its batch started; nothing was written."""


class StoreOffloadTrigger(str, enum.Enum):
    """The triggers of the `store_offload` machine, in declaration order."""

    START = "start"
    """queued -> started: The store took the offload up."""
    FINISH = "finish"
    """started -> landed: Every new page was read, checksummed and published.
    started -> failed: The pages could not all be persisted; none was published."""
    ABANDON = "abandon"
    """queued, started -> failed: `reset` or `close` quiesced the store; the offload completes as
      failed."""


class StoreOffloadState(str, enum.Enum):
    """The configurations of the `store_offload` machine (a record's state slot)."""

    QUEUED = "queued"
    """Validated and queued; the caller keeps the device pages alive."""
    STARTED = "started"
    """The store is reading the device pages into its own memory."""
    LANDED = "landed"
    """Every page is persisted and visible to lookups."""
    FAILED = "failed"
    """Nothing of this offload became visible (no room, a read error, a reset)."""


class BlockTrigger(str, enum.Enum):
    """The triggers of the `vllm_block` machine, in declaration order."""

    STORE = "store"
    """absent -> storing: `prepare_store` listed it in `keys_to_store`."""
    COMPLETE = "complete"
    """storing -> stored: `complete_store(keys, success=True)` named it: now loadable.
    storing -> failed: `complete_store(keys, success=False)` named it: removed."""
    FOUND = "found"
    """absent -> stored: `lookup` answered HIT for a key the books never saw stored."""
    LOSE = "lose"
    """stored -> lost: `lookup` answered MISS for a stored block no load holds."""
    LOAD = "load"
    """stored, loading -> loading: `prepare_load` named it: one more load holds it."""
    UNLOAD = "unload"
    """loading -> loading: `complete_load` named it and another load still holds it.
    loading -> stored: `complete_load` named it and released its last load."""
    EVICT = "evict"
    """stored -> evicted: A `prepare_store` evicted it (only a stored block no load holds)."""
    CLEAR = "clear"
    """storing, stored, loading -> cleared: `reset_cache()` dropped every block."""


class BlockState(str, enum.Enum):
    """The configurations of the `vllm_block` machine (a record's state slot)."""

    ABSENT = "absent"
    """Not in the manager: `lookup` answers MISS; no load may name it."""
    STORING = "storing"
    """Listed in `keys_to_store`; its bytes are being written. HIT_PENDING; not loadable, not
      evictable."""
    STORED = "stored"
    """Its store completed: HIT, loadable, evictable (no load holds it)."""
    LOADING = "loading"
    """Stored and held by at least one `prepare_load` not yet completed: HIT, not evictable."""
    EVICTED = "evicted"
    """A `prepare_store` listed it in `evicted_keys` to make room."""
    FAILED = "failed"
    """`complete_store(success=False)` removed it before it became loadable."""
    LOST = "lost"
    """`lookup` answered MISS for it while no load held it: the store dropped it."""
    CLEARED = "cleared"
    """`reset_cache` dropped it."""


class ManagerTrigger(str, enum.Enum):
    """The triggers of the `vllm_manager` machine, in declaration order."""

    ACQUIRE = "acquire"
    """unlocked -> locked: A caller entered `manager.lock` (entering it again while held is a
      violation)."""
    RELEASE = "release"
    """locked -> unlocked: The caller left `manager.lock`."""
    CALL = "call"
    """locked -> locked: Any manager method but `shutdown`, under the lock."""
    SHUTDOWN = "shutdown"
    """unlocked -> shut_down: `shutdown()`, the one call made without the lock."""


class ManagerState(str, enum.Enum):
    """The configurations of the `vllm_manager` machine (a record's state slot)."""

    UNLOCKED = "unlocked"
    """Nobody holds `manager.lock`; no manager method may be called but `shutdown`."""
    LOCKED = "locked"
    """A caller holds `manager.lock`; it may call any method but `shutdown`."""
    SHUT_DOWN = "shut_down"
    """`shutdown()` returned: the manager serves nothing more."""


class RequestTrigger(str, enum.Enum):
    """The triggers of the `vllm_request` machine, in declaration order."""

    BEGIN = "begin"
    """unseen -> active: `on_new_request(ctx)` (once per request)."""
    SUBMIT = "submit"
    """active -> active: `lookup`, `prepare_load`, `prepare_store` or `touch` on its behalf."""
    FINISH = "finish"
    """active -> finished: `on_request_finished(ctx)` (once per request)."""


class RequestState(str, enum.Enum):
    """The configurations of the `vllm_request` machine (a record's state slot)."""

    UNSEEN = "unseen"
    """The manager has not been told of it yet."""
    ACTIVE = "active"
    """`on_new_request` returned; submit-side calls may name it."""
    FINISHED = "finished"
    """`on_request_finished` returned; only completions may still name it."""


class TransferTrigger(str, enum.Enum):
    """The triggers of the `vllm_transfer` machine, in declaration order."""

    ANSWER = "answer"
    """submitted -> running: The submit answered True (the argument).
    submitted -> refused: The submit answered False or raised."""
    FINISH = "finish"
    """running -> done: `get_finished()` reported it, success=True (the argument).
    running -> failed: `get_finished()` reported it, success=False."""


class TransferState(str, enum.Enum):
    """The configurations of the `vllm_transfer` machine (a record's state slot)."""

    SUBMITTED = "submitted"
    """`submit_store` or `submit_load` was called; its answer is awaited."""
    RUNNING = "running"
    """Accepted; the worker moves its bytes asynchronously."""
    DONE = "done"
    """`get_finished()` reported it with success=True."""
    FAILED = "failed"
    """`get_finished()` reported it with success=False."""
    REFUSED = "refused"
    """The submit answered False (or raised): nothing was queued."""
