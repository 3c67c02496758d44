"""`System`: one serving system around one `ExternalLinker`, under both the reference
scheduler (`scheduler.simulation`) and the fuzzing kit (`testing`).

`System.build(page_size, swa=...)` wires a FULL-only (`PagedAllocator`) or FULL+SWA
(`SWAAllocator`) system: KV pools, a `RadixTree` in linker mode (write-through
threshold 1), optionally the host backup tier, a store (a `MemoryStore` unless
`store_factory` names another; optionally inside a `FaultyStore`) behind a
`StoreLedger`, attached to the pools, and the linker. KV bytes are `serving.kv`'s.

Building blocks a scheduler composes:

- `try_alloc(n)` / `try_alloc_swa(n)` — evict the shortfall, then allocate
  (`pools.room.alloc_making_room`); None when the pool stays short. `alloc` /
  `alloc_swa` assert instead.
- `write_kv(slots, tokens, start, swa=...)` / `expected(tokens, start, swa=...)` — the
  KV a request computes, written into a pool or returned.
- `lock(node)` / `unlock(node)` — a lock the system accounts for (the root needs none).
- `finish_loads()` — `linker.finish_loads()`, each committed request taking over the
  lock COMMIT left on its path; `release(req)` — the request's lock and its linker
  state go.

Requests then go through it the way a scheduler would drive them:

- `compute(rid, key)` — a request computes its KV: the device prefix from the tree,
  fresh FULL slots (and SWA slots for its window, mapped) for the rest, deterministic
  bytes written into the pools (`kv_bytes`), a non-chunked insert, and the
  write-through chain offloaded (settled at once unless ``settle=False``).
- `begin(rid, key)` — `match`, lock the device prefix, `load_back` (LOAD + PREPARE).
- `drive()` — `start_loading`, `store.progress()`, `finish_loads` (after which each
  committed request locks its loaded path at once), `poll_offloads` in a bounded loop
  until nothing is in flight (a load that never ends fails the test as stuck).
- `complete(req)` — the request uses the committed load (`load.slots`) or, after an
  abort or a miss, recomputes the tail from the device prefix; then releases its lock.
- `serve(rid, key)` — the three above in a row.
- `audit()` — `tree.check` with the slots held outside the tree, every
  lock accounted for, every stored node's pages acknowledged by the store once (the
  `StoreLedger` between linker and store records what it acknowledged) and, where the
  store loses nothing on its own (`check_stored`), still in it; with `check_chains`,
  the store's chains whole; the store's own books, and the bytes of every resident
  node equal to `kv_bytes` of its tokens (so a load that landed garbage, or landed
  into the wrong slots, is caught). Held outside the tree: the linker's reservations
  and the private slots of the requests in `requests`.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence

import attrs
import numpy as np
import torch

from unicache_fsm.linker.linker import ExternalLinker, LinkerConfig
from unicache_fsm.linker.load import ExternalLoad, LoadState
from unicache_fsm.linker.offload import PendingOffload
from unicache_fsm.linker.ranks import RankGroup
from unicache_fsm.pools import HostKVPool, KVPool, PagedAllocator, SWAAllocator
from unicache_fsm.pools.room import alloc_making_room
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.serving import invariants as inv
from unicache_fsm.serving.kv import NUM_LAYERS, POISON, WIDTH, kv_bytes, row_bytes
from unicache_fsm.serving.ledger import StoreLedger
from unicache_fsm.serving.request import Outcome, Request
from unicache_fsm.store.faults import FaultPolicy, FaultyStore
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.tree import (
    EvictParams,
    ExecutorKind,
    InsertParams,
    RadixTree,
    TreeConfig,
    TreeNode,
)
from unicache_fsm.tree.swa_checkpoints import check_interval, checkpoint_windows

__all__ = ["System"]

HUGE = 10**9

#: the audit's memo of expected rows holds the rows of at most this many tokens
_ROWS_MEMO_TOKENS = 1 << 16


@attrs.define(eq=False)
class System:
    """One rank's tree, pools, store and linker, plus the harness's own books."""

    page_size: int
    swa: bool
    window: int  # SWA window in tokens (page multiple); 0 without SWA
    swa_checkpoint: int  # SWA checkpoint interval in pages (`tree.swa_checkpoints`); 0: off
    allocator: PagedAllocator | SWAAllocator
    kv: KVPool
    swa_kv: KVPool | None
    tree: RadixTree
    backend: ExternalStore  # the store itself (inside `store`)
    store: ExternalStore  # what the linker talks to: the ledger (around the fault injector)
    linker: ExternalLinker
    ledger: StoreLedger  # every page the store acknowledged (see `serving.ledger`)
    faulty_store: FaultyStore | None = None
    locks: list[TreeNode] = attrs.field(factory=list)
    requests: dict[str, Request] = attrs.field(factory=dict)  # begun, not completed
    audits: int = 0
    check_stored: bool = True  # off while a test lets the store lose pages on purpose
    # on (from the start) while only capacity eviction removes stored pages; the audit
    # asks the store about stored nodes' pages only then and with `check_stored`
    check_chains: bool = False
    _stale: set[str] = attrs.field(factory=set)  # KV pages seen gone under "stored" nodes
    _restored_links: set[str] = attrs.field(factory=set)  # link pages offloaded in mid-air
    _committed: collections.Counter[str] = attrs.field(factory=collections.Counter)
    # the audit's expected KV rows by (key, start, swa), with their bytes (`row_bytes`)
    # where they have the pool's dtype and row shape: `expected` is a pure function of
    # them and a node's key and start never change, so each audit after the first
    # synthesises only new nodes' rows (cleared past `_ROWS_MEMO_TOKENS` tokens)
    _rows_memo: dict[tuple[tuple[int, ...], int, bool], tuple[torch.Tensor, bytes | None]] = (
        attrs.field(factory=dict, repr=False)
    )
    _rows_memo_tokens: int = attrs.field(default=0, repr=False)

    # -- construction --------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        page_size: int,
        *,
        swa: bool = False,
        full_pages: int = 64,
        swa_pages: int = 32,
        window_pages: int = 2,
        faults: FaultPolicy | None = None,
        executor: ExecutorKind = ExecutorKind.COMPILED,
        tree_executor: ExecutorKind = ExecutorKind.COMPILED,
        group: RankGroup | None = None,
        capacity_pages: int | None = None,
        store_factory: Callable[[], ExternalStore] | None = None,
        host_pages: int = 0,
        sliding_window: int | None = None,
        num_layers: int = NUM_LAYERS,
        width: int = WIDTH,
        reset_when_idle: bool = False,
        swa_checkpoint: int | None = None,
    ) -> System:
        """Wire a system; `store_factory` puts your own store backend in it (default: a
        `MemoryStore`), `host_pages` adds the host backup tier. With `swa`, the sliding
        window is `sliding_window` tokens (default: ``window_pages`` pages less half a
        page, so with P > 1 it is no page multiple); requests keep SWA KV for the
        window rounded up to whole pages. `num_layers` x `width` is a KV row's shape.
        `reset_when_idle` is the linker's (`LinkerConfig`), off here by default: a
        harness sees the quarantine wait for the store's own completions or an explicit
        reset (the store's behaviour, not the linker's resets, drives a fuzzer's search);
        `simulate` turns it on, as a deployed linker has it. `swa_checkpoint` (K pages;
        None or 0: off) makes requests also keep the SWA window ending at every K-page
        checkpoint of their tokens (`tree.swa_checkpoints`)."""
        interval = check_interval(swa_checkpoint)
        p = page_size
        kv = KVPool(full_pages * p, p, num_layers, width)
        pools = {PoolName.KV: kv}
        swa_kv: KVPool | None = None
        allocator: PagedAllocator | SWAAllocator
        window = 0
        if swa:
            allocator = SWAAllocator(full_pages * p, swa_pages * p, p)
            swa_kv = KVPool(swa_pages * p, p, num_layers, width, name="swa")
            pools[PoolName.SWA] = swa_kv
            sliding = window_pages * p - p // 2 if sliding_window is None else sliding_window
            window = math.ceil(sliding / p) * p
            config = TreeConfig(
                sliding_window_size=sliding, write_through_threshold=1, executor=tree_executor
            )
        else:
            allocator = PagedAllocator(full_pages * p, p)
            config = TreeConfig(write_through_threshold=1, executor=tree_executor)
        host_pool = HostKVPool(host_pages * p, p, num_layers, width) if host_pages else None
        host_alloc = PagedAllocator(host_pages * p, p, name="host") if host_pages else None
        tree = RadixTree(
            allocator, config, kv_pool=kv, host_pool=host_pool, host_allocator=host_alloc
        )
        backend: ExternalStore = (
            store_factory() if store_factory else MemoryStore(capacity_pages=capacity_pages)
        )
        faulty = None if faults is None else FaultyStore(backend, faults)
        ledger = StoreLedger(backend if faulty is None else faulty)
        store: ExternalStore = ledger
        store.attach(pools)
        linking = LinkerConfig(executor=executor, reset_when_idle=reset_when_idle)
        linker = ExternalLinker(tree, store, group=group, config=linking)
        return cls(
            page_size=p,
            swa=swa,
            window=window,
            swa_checkpoint=interval if swa else 0,
            allocator=allocator,
            kv=kv,
            swa_kv=swa_kv,
            tree=tree,
            backend=backend,
            store=store,
            linker=linker,
            ledger=ledger,
            faulty_store=faulty,
        )

    @property
    def memory(self) -> MemoryStore:
        """The backend, when it is the embedded `MemoryStore`."""
        assert isinstance(self.backend, MemoryStore), type(self.backend).__name__
        return self.backend

    @property
    def faulty(self) -> FaultyStore:
        """The fault injector (built with `faults`)."""
        assert self.faulty_store is not None, "this system was built without faults"
        return self.faulty_store

    # -- small helpers -------------------------------------------------------------------
    def aligned(self, key: Sequence[int]) -> tuple[int, ...]:
        n = len(key) // self.page_size * self.page_size
        return tuple(key[:n])

    def lock(self, node: TreeNode) -> TreeNode | None:
        if node is self.tree.root:
            return None
        self.tree.inc_lock_ref(node)
        self.locks.append(node)
        return node

    def unlock(self, node: TreeNode | None) -> None:
        if node is None:
            return
        self.locks.remove(node)
        self.tree.dec_lock_ref(node)

    def try_alloc(self, n: int) -> torch.Tensor | None:
        """`n` FULL slots, evicting the tree's shortfall first; None if still short."""
        a = self.allocator
        return alloc_making_room(n, a.available_size, a.alloc, self._evict_full)

    def try_alloc_swa(self, n: int) -> torch.Tensor | None:
        """`n` SWA slots, evicting the tree's SWA shortfall first; None if still short."""
        a = self.allocator
        assert isinstance(a, SWAAllocator), "this system has no SWA pool"
        return alloc_making_room(n, a.available_swa_size, a.alloc_swa, self._evict_swa)

    def _evict_full(self, short: int) -> None:
        self.tree.evict(EvictParams(num_tokens=short))

    def _evict_swa(self, short: int) -> None:
        self.tree.evict(EvictParams(swa_num_tokens=short))

    def alloc(self, n: int) -> torch.Tensor:
        slots = self.try_alloc(n)
        assert slots is not None, f"the FULL pool cannot hold {n} more tokens"
        return slots

    def alloc_swa(self, n: int) -> torch.Tensor:
        slots = self.try_alloc_swa(n)
        assert slots is not None, f"the SWA pool cannot hold {n} more tokens"
        return slots

    def expected(self, tokens: Sequence[int], start: int, *, swa: bool = False) -> torch.Tensor:
        """The KV rows of `tokens` at positions from `start`, in this system's shape."""
        kv = self.kv
        return kv_bytes(tokens, start, swa=swa, num_layers=kv.num_layers, width=kv.width)

    def _audit_rows(
        self, key: tuple[int, ...], start: int, swa: bool
    ) -> tuple[torch.Tensor, bytes | None]:
        """`expected(key, start, swa=swa)` for the audit, and its bytes where the rows
        have the pool's dtype and row shape; remembered (`_rows_memo`): the audit only
        reads them."""
        memo_key = (key, start, swa)
        got = self._rows_memo.get(memo_key)
        if got is None:
            rows = self.expected(key, start, swa=swa)
            pool = self.swa_kv if swa else self.kv
            plain = (
                pool is not None
                and rows.dtype == pool.dtype
                and rows.dim() == 3
                and rows.shape[1:] == (pool.num_layers, pool.width)
            )
            got = (rows, row_bytes(rows) if plain else None)
            if type(key) is tuple:
                if self._rows_memo_tokens + len(key) > _ROWS_MEMO_TOKENS:
                    self._rows_memo.clear()
                    self._rows_memo_tokens = 0
                self._rows_memo[memo_key] = got
                self._rows_memo_tokens += len(key)
        return got

    def write_kv(
        self, slots: torch.Tensor, tokens: Sequence[int], start: int, *, swa: bool = False
    ) -> None:
        """Write the KV of `tokens` (positions from `start`) into FULL (or SWA) `slots`;
        slots past the tokens (a partial last page) get zeros."""
        pool = self.swa_kv if swa else self.kv
        assert pool is not None, "this system has no SWA pool"
        rows = self.expected(tokens, start, swa=swa)
        n = int(slots.numel())
        if n != rows.shape[0]:  # (zeros and one slice copy in NumPy: rows are CPU memory)
            held = rows.numpy()
            padded = np.zeros((n, *held.shape[1:]), dtype=held.dtype)
            padded[: held.shape[0]] = held
            rows = torch.from_numpy(padded)
        pool.write_pages(slots, rows)

    def kept_windows(self, start: int, end: int, limit: int) -> tuple[tuple[int, int], ...]:
        """The checkpoint windows a request computing ``[start, end)`` keeps below
        `limit`, its trailing window's start (none with checkpoints off)."""
        interval = self.swa_checkpoint * self.page_size
        return checkpoint_windows(start, end, limit, self.window, interval)

    def try_map_swa(
        self,
        fresh: torch.Tensor,
        tokens: Sequence[int],
        start: int,
        spans: Sequence[tuple[int, int]],
    ) -> torch.Tensor | None:
        """SWA slots for the token `spans` of a request's `fresh` FULL slots (``fresh[i]``
        holds token ``start + i`` of `tokens`), evicting the SWA shortfall first: mapped
        from their FULL slots, each span's window KV written (zeros past the tokens).
        None, nothing allocated, when the SWA pool stays short."""
        a = self.allocator
        assert isinstance(a, SWAAllocator)
        sw = self.try_alloc_swa(sum(b - e for e, b in spans))
        if sw is None:
            return None
        a.set_full_to_swa_mapping(torch.cat([fresh[e - start : b - start] for e, b in spans]), sw)
        at = 0
        for e, b in spans:
            self.write_kv(sw[at : at + b - e], tokens[e:b], e, swa=True)
            at += b - e
        return sw

    def swa_boundary(self, n: int) -> int:
        """The request's SWA boundary: only the last window keeps SWA."""
        return max(0, n - self.window) if self.swa else 0

    # -- requests ------------------------------------------------------------------------
    def compute(
        self,
        rid: str,
        key: Sequence[int],
        *,
        namespace: str | None = None,
        offload: bool = True,
        settle: bool = True,
        swa_boundary: int | None = None,
        from_scratch: bool = False,
    ) -> Request:
        """Compute `key` from its device prefix (no external lookup) and insert it.

        With `from_scratch`, the request computed every token itself (it matched before
        the prefix was cached): the insert offers fresh slots for the whole key, so the
        tree frees the duplicates and replaces unlocked SWA tombstones in its window.
        """
        req = Request(rid, tuple(key), namespace)
        full = self.aligned(key)
        if from_scratch:
            prefix = torch.empty(0, dtype=torch.int64, device=self.tree.device)
        else:
            m = self.tree.match_prefix(full, namespace)
            req.lock = self.lock(m.last_device_node)
            prefix = m.device_indices
        self._compute_tail(req, prefix, offload, settle, swa_boundary)
        req.outcome = Outcome.COMPUTED
        return req

    def _compute_tail(
        self,
        req: Request,
        prefix: torch.Tensor,
        offload: bool,
        settle: bool,
        swa_boundary: int | None,
    ) -> None:
        """Compute the page-aligned key past `prefix`, insert, offload, release the lock."""
        key = self.aligned(req.key)
        n, h = len(key), int(prefix.numel())
        bound = self.swa_boundary(n) if swa_boundary is None else swa_boundary
        kept: tuple[tuple[int, int], ...] = ()
        if n > h:
            fresh = self.alloc(n - h)
            self.write_kv(fresh, key[h:], h)
            live_from = max(h, bound)
            if self.swa:
                kept = self.kept_windows(h, n, live_from)
            spans = [*kept, (live_from, n)] if n > live_from else list(kept)
            if self.swa and spans:
                sw = self.try_map_swa(fresh, key, h, spans)
                assert sw is not None, "the SWA pool cannot hold the request's windows"
            value = torch.cat([prefix, fresh])
        else:
            value = prefix
        result = self.tree.insert(
            InsertParams(
                key=key,
                value=value,
                prev_prefix_len=h,
                swa_evicted_seqlen=bound if self.swa else 0,
                namespace=req.namespace,
                swa_kept_ranges=kept,
            )
        )
        assert result.last_device_node is not None
        req.last_node = result.last_device_node
        if result.prefix_len == h:
            # the walk ended where the caller's prefix does: the nodes below hold the
            # prefix's slots (matched under our lock) and the new leaf copied `value`'s
            # past it, so the path's slots are `value` (not read back and joined again)
            req.slots = value
        else:  # the walk went on through nodes another request inserted: theirs
            req.slots = self.tree.path_slots(result.last_device_node)
        assert req.slots.numel() == n
        self.unlock(req.lock)
        req.lock = None
        if offload and result.write_through:
            # the linker offloads node by node (the same calls, in order, as one
            # offload_nodes of the chain). A node whose parent is not the node before it
            # in the chain (the chain's head, or a node below ancestors already flagged
            # stored, which the chain skips) is sent with its parent's last page as a
            # link page, so its record is checked for one stored again in mid-air
            previous: TreeNode | None = None
            for node in result.write_through:
                gone = self._missing_link(node) if node.parent is not previous else None
                record = self.linker.offload_nodes([node])
                self._note_link(record, gone)
                if record is not None:
                    req.offload = record
                previous = node
            if settle:
                self.store.progress()
                self.linker.poll_offloads()

    def _missing_link(self, head: TreeNode) -> str | None:
        """The last page of `head`'s parent when the store lacks it now (a stale
        "stored" flag, or the parent's own offload not run yet): the page an offload of
        `head` would store (again) as its link page."""
        parent = head.parent
        if parent is None or parent.parent is None or not parent.hashes:
            return None
        link = parent.hashes[-1]
        return None if self.store.contains(PoolName.KV, link) else link

    def _note_link(self, record: PendingOffload | None, missing: str | None) -> None:
        """A chain offloaded on top of a parent whose last page the store no longer held
        when the chain was sent (`_missing_link`) stores that link page again in
        mid-air: not a hole made by capacity eviction, so `store_chains_whole` exempts
        the seam above it. `record` is the offload of the chain's first node."""
        if record is None or missing is None:
            return
        for t in record.transfers:
            if t.name is PoolName.KV and t.keys and t.keys[0] == missing:
                self._restored_links.add(missing)

    def begin(
        self,
        rid: str,
        key: Sequence[int],
        *,
        namespace: str | None = None,
        load: bool = True,
        lock: bool = True,
    ) -> Request:
        """LOOKUP, lock the device prefix, and (with `load`) LOAD + PREPARE a hit."""
        req = Request(rid, tuple(key), namespace)
        self.requests[rid] = req
        req.match = self.linker.match(rid, req.key, namespace)  # (a tuple: not copied again)
        req.prefix_len = req.match.device.prefix_len
        hit = req.match.load  # a hit read the prefix's slots already (a fresh tensor)
        req.prefix_slots = hit.device_prefix if hit is not None else req.match.device.device_indices
        if lock:
            req.lock = self.lock(req.match.device.last_device_node)
        req.load = req.match.load
        if load and req.load is not None:
            req.prepared = self.linker.load_back(req.load)
            if req.prepared:
                self.poison_reserved(req.load)
        return req

    def poison_reserved(self, load: ExternalLoad) -> None:
        """Fill the slots a prepared load reserved with garbage, as a real engine's
        would hold: a load that commits without landing shows it (KV bytes)."""
        for t in load.transfers:
            assert t.device_indices is not None
            pool = self.swa_kv if t.name is PoolName.SWA else self.kv
            assert pool is not None
            pool.fill_pages(t.device_indices, POISON)

    def in_flight(self) -> bool:
        lk = self.linker
        return lk.busy() or any(ld.in_flight for ld in lk.loads.values())

    def drive(
        self, max_steps: int = 12, *, audit: bool = True, fixed: bool = False
    ) -> list[ExternalLoad]:
        """Run loads and offloads to completion; fail as stuck after `max_steps` rounds.

        With `fixed`, run exactly `max_steps` rounds whatever is in flight: ranks must
        make the same collective calls, so a multi-rank scheduler steps every rank alike.
        """
        ended: list[ExternalLoad] = []
        for _ in range(max_steps):
            if not fixed and not self.in_flight():
                return ended
            self.linker.start_loading()
            self.store.progress()
            ended += self.finish_loads()
            self.linker.poll_offloads()
            if audit:
                self.audit()
        assert not self.in_flight(), (
            f"stuck after {max_steps} rounds: loads {list(self.linker.loads.values())}, "
            f"batches {self.linker.batches}, offloads {list(self.linker.offloads)}"
        )
        return ended

    def finish_loads(self, *, check: bool = True) -> list[ExternalLoad]:
        """`linker.finish_loads()`, then each committed request takes over the lock
        COMMIT left on `load.endpoint` (the loaded path stays put until it is done).
        With `check`, each ended load is checked (`loads_landed`, COMMIT soundness,
        the shape of its adopted ranges)."""
        ended = self.linker.finish_loads()
        for load in ended:
            if load.committed_ok:
                self._committed[load.rid] += 1
                if check:  # the commits so far are checked: this rid's count is new
                    counted = {load.rid: self._committed[load.rid]}
                    inv.loads_landed(counted, self.ledger.landed_loads)
            if check:
                inv.committed_load_sound(self.tree, load)
            if check and load.ctx is not None:
                for ranges in load.ctx.adopted_ranges.values():
                    inv.adopted_ranges_shape(
                        ranges, self.page_size, load.device_hit_len, load.prefix_len
                    )
            req = self.requests.get(load.rid)
            if req is not None and req.load is load and load.state == LoadState.COMMITTED:
                self._hold_loaded_path(req)
        return ended

    def release(self, req: Request) -> None:
        """`req` is done: its lock goes, the linker forgets it, the system too."""
        self.unlock(req.lock)
        req.lock = None
        self.linker.release_request(req.rid)
        self.requests.pop(req.rid, None)

    def _hold_loaded_path(self, req: Request) -> None:
        """Take over the lock COMMIT handed us on the loaded path's end (once)."""
        load = req.load
        assert load is not None and load.committed_ok and load.endpoint is not None
        if req.lock is load.endpoint:
            return
        self.unlock(req.lock)
        self.locks.append(load.endpoint)
        req.lock = load.endpoint

    def complete(
        self,
        req: Request,
        *,
        offload: bool = True,
        settle: bool = True,
    ) -> Request:
        """Finish `req`: use its committed load, or recompute the tail; release its lock."""
        assert req.match is not None
        load = req.load
        if load is not None and load.state == LoadState.COMMITTED:
            assert load.slots is not None
            self._hold_loaded_path(req)  # the lock COMMIT handed over
            prefix = load.slots
            req.outcome = Outcome.COMMITTED
        else:
            if load is not None and load.state == LoadState.IDLE:
                self.linker.release_request(req.rid)
            assert load is None or load.state == LoadState.ABORTED or not load.awaited, (
                f"{load!r} is still in flight"
            )
            req.outcome = Outcome.MISS if load is None else Outcome.ABORTED
            # recompute from the device prefix as it is now (it may have grown or gone)
            self.unlock(req.lock)
            m = self.tree.match_prefix(self.aligned(req.key), req.namespace)
            req.lock = self.lock(m.last_device_node)
            prefix = m.device_indices
        self._compute_tail(req, prefix, offload, settle, None)
        self.requests.pop(req.rid, None)
        return req

    def serve(self, rid: str, key: Sequence[int], *, namespace: str | None = None) -> Request:
        req = self.begin(rid, key, namespace=namespace)
        self.audit()
        self.drive()
        self.complete(req)
        self.audit()
        return req

    # -- the audit -----------------------------------------------------------------------
    def chain_exemptions(self) -> tuple[frozenset[str], frozenset[str]]:
        """What the `check_chains` audit exempts, learnt so far: KV pages seen missing
        under a node still marked stored, and link pages stored again in mid-air (the
        audit's history, as plain values: state-space exploration compares them)."""
        return frozenset(self._stale), frozenset(self._restored_links)

    def lock_holders(self) -> list[TreeNode]:
        """The anchor of every outstanding lock: the linker's, ours, and those COMMIT
        handed to a request that has not taken them over yet."""
        handed = [  # COMMIT's lock on the loaded path, not yet taken over by its request
            r.load.endpoint
            for r in self.requests.values()
            if r.load is not None
            and r.load.committed_ok
            and r.load.endpoint is not None
            and r.lock is not r.load.endpoint
        ]
        return [*self.linker.locks_held(), *self.locks, *handed]

    def _held_now(self, kv_keys: frozenset[str] | None = None) -> Callable[[PoolName, str], bool]:
        """Whether the store holds a page, as one consistent view: a snapshot of the
        backend's books where it keeps them (a background worker may evict between two
        `contains` calls: a chain's end, then its start, reads as a hole), else `contains`.
        A pool's keys are listed when first asked about (`kv_keys`: the KV pool's,
        listed already in this audit).
        """
        stored_keys = getattr(self.backend, "stored_keys", None)
        if not callable(stored_keys):
            return self.store.contains
        snapshot: dict[PoolName, frozenset[str]] = {}
        if kv_keys is not None:
            snapshot[PoolName.KV] = kv_keys

        def held(pool: PoolName, key: str) -> bool:
            keys = snapshot.get(pool)
            if keys is None:
                keys = snapshot[pool] = frozenset(stored_keys(pool))
            return key in keys

        return held

    def audit(self) -> None:
        """Check every invariant of the system (`serving.invariants`); raise
        `InvariantViolation` naming the invariant and the culprit.

        One audit lists the tree's nodes once, and every node-level check reads that
        list (nothing changes the tree while it runs). Where the backend is a
        `MemoryStore` (whose `contains` answers from its books), "stored pages present"
        asks one snapshot of its keys, the same view the chain check reads, instead of
        a `contains` call per page through the ledger and the fault injector; other
        stores are asked page by page as before.
        """
        self.audits += 1
        tree, linker = self.tree, self.linker
        nodes = list(tree.nodes())
        full_out, swa_out = linker.reserved_slots()
        for req in self.requests.values():
            full, swa = req.outside_slots()
            full_out += full
            swa_out += swa
        fenced_full, fenced_swa = linker.quarantined_slots()
        inv.slot_conservation(
            tree,
            full_out,
            swa_out,
            quarantined_full=fenced_full,
            quarantined_swa=fenced_swa,
            nodes=nodes,
        )
        inv.no_concurrent_offloads(tree, nodes=nodes)
        inv.lock_balance(tree, self.lock_holders(), nodes=nodes)
        inv.nothing_in_flight_evicted(tree, linker)
        inv.stored_pages_landed(tree, self.ledger.acknowledged, nodes=nodes)
        # a MemoryStore's `contains` answers from the books `stored_keys` lists
        kv_keys = None
        if isinstance(self.backend, MemoryStore) and (self.check_stored or self.check_chains):
            kv_keys = frozenset(self.backend.stored_keys(PoolName.KV))
        if self.check_stored:
            inv.stored_pages_present(tree, self.store, kv_keys=kv_keys, nodes=nodes)
        if self.check_chains:
            held = self._held_now(kv_keys)
            inv.store_chains_whole(
                tree, held, stale=self._stale, restored=self._restored_links, nodes=nodes
            )
            # pages seen missing (in the same view of the store) under a node still marked
            # stored: a later re-store of a page after them (a link page) is no hole made
            # by capacity eviction
            for n in nodes:
                hashes = n.hashes if n.external_cache_stored else None
                if not hashes:
                    continue
                if kv_keys is not None:  # (the same view `held` reads, as one set)
                    self._stale.update(set(hashes).difference(kv_keys))
                else:
                    self._stale.update(h for h in hashes if not held(PoolName.KV, h))
        check = getattr(self.backend, "check_invariants", None)
        if callable(check):
            check()  # the backend's own books, when it keeps any
        rows = self._audit_rows
        inv.resident_kv_matches(
            tree,
            self.kv,
            lambda key, start: rows(key, start, False)[0],
            swa_kv=self.swa_kv,
            expected_swa=lambda key, start: rows(key, start, True)[0],
            nodes=nodes,
            expected_bytes=lambda key, start, swa: rows(key, start, swa)[1],
        )

    def assert_quiet(self) -> None:
        """Everything finished: no lock anywhere, nothing reserved or in flight — except
        what the linker's quarantine holds for a store that broke the protocol (its
        slots and locks are accounted for by the audit's conservation and lock balance;
        only the store's own signal releases them)."""
        linker = self.linker
        assert not self.locks, f"the harness still holds locks on {self.locks}"
        assert not linker.loads, f"loads left: {list(linker.loads.values())}"
        assert not linker.busy() and not linker.offloads
        fenced = [rec for rec in linker.quarantine.offloads if rec is not None]
        assert len(linker.locks_held()) == len(fenced), linker.locks_held()
        on_fenced = {n.id for rec in fenced for n in rec.ticket.anchor.path_from_root()}
        in_fence = {n.id for rec in fenced for n in rec.ticket.publish}
        locked = [n for n in self.tree.nodes() if n.lock_ref and n.id not in on_fenced]
        assert not locked, f"locks left on {locked}"
        offloading = [n for n in self.tree.nodes() if n.offloading and n.id not in in_fence]
        assert not offloading, f"nodes left offloading: {offloading}"
        self.audit()

    # -- inspection helpers ----------------------------------------------------------------
    def full_bytes(self, slots: torch.Tensor) -> torch.Tensor:
        return self.kv.read_pages(slots)

    def swa_bytes_of(self, full_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask of FULL slots with live SWA, the SWA bytes of those slots)."""
        assert isinstance(self.allocator, SWAAllocator) and self.swa_kv is not None
        sws = self.allocator.translate(full_slots)
        live = sws != 0
        return live, self.swa_kv.read_pages(sws[live])

    def evict_all(self) -> None:
        self.tree.evict(EvictParams(num_tokens=HUGE, swa_num_tokens=0))

    def stored_nodes(self) -> list[TreeNode]:
        return [n for n in self.tree.nodes() if n.external_cache_stored]
