"""The unified radix tree over page-aligned token keys.

Lifecycle primitives (each validates its input first and changes nothing on a typed
error):

- `match_prefix(key, namespace)` — the device prefix of `key` (whole pages): its
  length, its FULL slots and the last device node; splits a node where the key
  diverges inside it; refreshes LRU on the path. With SWA, the prefix is cut back to
  the last node end that has a live SWA window (or live SWA from the root) behind it.
  Beyond the device prefix, host-backed evicted nodes count as a host hit.
- `insert(InsertParams) -> InsertResult` — walk root to leaf: device nodes keep
  their slots and the caller's duplicates past `prev_prefix_len` are freed (with any
  SWA slots they still map to); evicted nodes are
  unevicted with the caller's slots; an SWA tombstone in the caller's window takes the
  caller's SWA (and FULL, unless locked); a new leaf takes the caller's slots. Every
  adoption is recorded with `record_adopted_range`. Non-chunked inserts count hits and
  return the write-through chain.
- `split(node, k)` — cut a node at a page boundary; the new parent takes the first
  `k` tokens, slots and hashes and copies the residency (stored, offloading with its
  ticket, backup), hit count and locks.
- `evict(EvictParams)` — LRU over unlocked device leaves that have nothing in flight;
  a backed-up leaf keeps its host copy (evicted), any other leaf is deleted. SWA
  eviction tombstones the SWA data of unlocked nodes, LRU first.
- `inc_lock_ref(node)` / `dec_lock_ref(node)` — lock / unlock the path root→node.
- `offload_chain(node)`, `begin_offload(chain)`, `finish_offload(ticket, success)`,
  `mark_stored_path(endpoint, anchor)`, `demote(node)` — the external-store side of
  residency (see `tree.offload`).
- `backup(node)`, `load_back(node)`, `drop_backup(node)`, `evict_host(num_tokens)` —
  the optional host tier (needs a device `KVPool`, a `HostKVPool` and its allocator).
- `check()` — see `tree.audit`.

Residency changes only by firing `node_residency` triggers through the executor; a
trigger the spec does not allow raises `IllegalTransitionError`.

Not thread-safe: one scheduler thread owns the tree.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import torch

from unicache_fsm import hashing
from unicache_fsm.pools.host import HostKVPool
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.tree.errors import (
    InsertParamsError,
    LockUnderflowError,
    NodeStateError,
    SlotTensorError,
    TreeError,
    UnalignedKeyError,
    ValueLengthError,
)
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.offload import OffloadTicket
from unicache_fsm.tree.params import (
    ComponentType,
    EvictParams,
    EvictResult,
    InsertParams,
    InsertResult,
    MatchResult,
    _as_key,
)
from unicache_fsm.tree.residency import (
    BACKING_UP,
    ExecutorKind,
    Residency,
    ResidencyTrigger,
)

__all__ = ["RadixTree", "TreeConfig"]

T = ResidencyTrigger
FULL, SWA = ComponentType.FULL, ComponentType.SWA


@attrs.frozen
class TreeConfig:
    """How a tree behaves.

    `sliding_window_size` (tokens) turns the SWA component on; it needs an
    `SWAAllocator`. `write_through_threshold`: offload a node once a non-chunked insert
    walk has hit it that many times (1 in linker mode; None: never). `hash_pages`:
    compute page hashes on node creation (needed for external stores). `check_slots`:
    verify before each insert that the slots the tree may take are whole, allocated
    pages (one allocator gather, ~25 µs; a typed error instead of a corrupted tree when
    a caller passes foreign slots — turn off only on a trusted hot path).
    """

    sliding_window_size: int | None = None
    write_through_threshold: int | None = None
    hash_pages: bool = True
    executor: ExecutorKind = ExecutorKind.COMPILED
    check_slots: bool = True


class RadixTree:
    """See the module docstring."""

    def __init__(
        self,
        allocator: PagedAllocator | SWAAllocator,
        config: TreeConfig | None = None,
        *,
        kv_pool: KVPool | None = None,
        host_pool: HostKVPool | None = None,
        host_allocator: PagedAllocator | None = None,
    ) -> None:
        self.config = config = config or TreeConfig()
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.swa_enabled = isinstance(allocator, SWAAllocator)
        if self.swa_enabled != (config.sliding_window_size is not None):
            msg = (
                "the SWA component needs both an SWAAllocator and sliding_window_size; got "
                f"{type(allocator).__name__} and sliding_window_size="
                f"{config.sliding_window_size!r}"
            )
            raise TreeError(msg)
        sw = config.sliding_window_size or 0
        self.sliding_window_size = sw
        self.window = math.ceil(sw / self.page_size) * self.page_size
        self.kv_pool = kv_pool
        self.host_pool = host_pool
        self.host_allocator = host_allocator
        self.residency = Residency(config.executor)
        self._fire = self.residency.fire
        self._ids = itertools.count(1)
        self._tickets = itertools.count(1)
        self._clock = 0
        self.device = allocator.device
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self.root = TreeNode(id=0, key=(), start=0, parent=None)
        self.residency.initialize(self.root)

    # -- helpers -----------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _child_key(self, parent: TreeNode, key: tuple[int, ...], pos: int, ns: str | None) -> Any:
        page = key[pos : pos + self.page_size]
        return (ns, page) if parent.parent is None else page

    def _common(self, node_key: tuple[int, ...], key: tuple[int, ...], pos: int, end: int) -> int:
        """Length of the page-aligned common prefix of `node_key` and `key[pos:end]`.

        The first page is known to match (it selected the child).
        """
        n = len(node_key)
        if end - pos >= n and key[pos : pos + n] == node_key:
            return n
        p = self.page_size
        lo, hi = 1, min(n, end - pos) // p  # pages; lo pages are known to match
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if key[pos : pos + mid * p] == node_key[: mid * p]:
                lo = mid
            else:
                hi = mid - 1
        return lo * p

    def _check_aligned(self, what: str, value: int) -> None:
        if value % self.page_size:
            msg = (
                f"{what} = {value} is not a multiple of the page size {self.page_size}; "
                "the tree holds whole pages only"
            )
            raise UnalignedKeyError(msg, what=what, value=value, page_size=self.page_size)

    def _hashes_for(
        self, parent: TreeNode, key: tuple[int, ...], ns: str | None
    ) -> list[str] | None:
        if not self.config.hash_pages:
            return None
        if parent.parent is None:
            prior = ns
        else:
            if parent.hashes is None:
                return None
            prior = parent.last_hash()
        return hashing.page_hashes(key, self.page_size, prior)

    def _translate(self, full: torch.Tensor) -> torch.Tensor:
        assert isinstance(self.allocator, SWAAllocator)
        return self.allocator.translate(full)

    def nodes(self) -> Iterator[TreeNode]:
        """Every node below the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # -- match -------------------------------------------------------------------------
    def match_prefix(
        self, key: Sequence[int] | torch.Tensor, namespace: str | None = None
    ) -> MatchResult:
        key = _as_key(key)
        p = self.page_size
        usable = len(key) // p * p
        node, pos, tick = self.root, 0, self._tick()
        path: list[TreeNode] = []
        while pos < usable:
            child = node.children.get(self._child_key(node, key, pos, namespace))
            if child is None or not child.device_resident:
                break
            m = self._common(child.key, key, pos, usable)
            if m < len(child.key):
                child = self.split(child, m)
            child.last_access = tick
            path.append(child)
            node, pos = child, pos + m
        host_len, host_node = 0, None
        probe, hpos = node, pos
        while hpos < usable:
            child = probe.children.get(self._child_key(probe, key, hpos, namespace))
            if child is None or not (child.evicted and child.backuped):
                break
            m = self._common(child.key, key, hpos, usable)
            if m < len(child.key):
                break  # a partial host hit would need a split of an evicted node; skip it
            host_len, host_node, probe, hpos = host_len + m, child, child, hpos + m
        if self.swa_enabled:
            walked = len(path)
            path = self._cut_to_swa_window(path)
            if len(path) < walked:  # the host hit no longer continues the device prefix
                host_len, host_node = 0, None
        if not path:
            return MatchResult(self._empty, self.root, host_len, host_node)
        full: list[torch.Tensor] = []
        for n in path:
            assert n.full is not None
            full.append(n.full)
        indices = full[0].clone() if len(full) == 1 else torch.cat(full)  # never the tree's own
        return MatchResult(indices, path[-1], host_len, host_node)

    def _cut_to_swa_window(self, path: list[TreeNode]) -> list[TreeNode]:
        """The longest prefix of `path` ending where a live SWA window lies behind it."""
        run_start = 0  # start of the current run of live SWA
        best = 0
        for i, node in enumerate(path):
            if node.swa is None:
                run_start = node.end
                continue
            if run_start == 0 or node.end - run_start >= self.sliding_window_size:
                best = i + 1
        return path[:best]

    # -- insert ------------------------------------------------------------------------
    def _check_insert(self, params: InsertParams) -> None:
        key, value = params.key, params.value
        self._check_aligned("key length", len(key))
        if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.dim() != 1:
            got = getattr(value, "dtype", type(value).__name__)
            msg = f"insert value must be a 1-D int64 slot tensor, got {got}"
            raise SlotTensorError(msg, what="value", got=got)
        if value.device != self.device:
            msg = f"insert value is on {value.device}, the tree's pools are on {self.device}"
            raise SlotTensorError(msg, what="value", got=value.device)
        if value.numel() != len(key):
            msg = (
                f"insert value has {value.numel()} slots for a key of {len(key)} tokens; "
                "pass one FULL slot per key token"
            )
            raise ValueLengthError(msg, key_len=len(key), value_len=int(value.numel()))
        for what, v in (
            ("prev_prefix_len", params.prev_prefix_len),
            ("swa_evicted_seqlen", params.swa_evicted_seqlen),
        ):
            if not 0 <= v <= len(key):
                msg = f"{what} = {v} is outside the key [0, {len(key)}]"
                raise InsertParamsError(msg, what=what, value=v)
            self._check_aligned(what, v)
        # the slots the tree may take must be the caller's: whole, allocated pages
        if self.config.check_slots:
            self.allocator.check_live(value[params.prev_prefix_len :], "insert value")
        if self.config.hash_pages:  # hashing errors must come before any change
            hashing.check_tokens(key)
            hashing.check_prior(params.namespace)

    def insert(self, params: InsertParams) -> InsertResult:
        self._check_insert(params)
        key, value, ns = params.key, params.value, params.namespace
        n, prev = len(key), params.prev_prefix_len
        swa_bound = params.swa_evicted_seqlen if self.swa_enabled else 0
        result = InsertResult(adopted_ranges={} if params.track_adopted_ranges else None)
        to_free: list[torch.Tensor] = []
        walked: list[TreeNode] = []
        node, pos, tick = self.root, 0, self._tick()
        while pos < n:
            child = node.children.get(self._child_key(node, key, pos, ns))
            if child is None:
                break
            m = self._common(child.key, key, pos, n)
            if m < len(child.key):
                child = self.split(child, m)
            end = pos + m
            if child.evicted:
                child = self._unevict(child, value[pos:end], swa_bound, result)
            else:
                child = self._overlap(child, value, prev, swa_bound, result, to_free)
            child.last_access = tick
            walked.append(child)
            node, pos = child, end
        result.prefix_len = pos
        if pos < n:
            node = self._new_leaf(node, key[pos:], value[pos:], ns, swa_bound, result, tick)
            walked.append(node)
        result.last_device_node = node
        self._free(to_free)
        if not params.chunked:
            self._count_hits(walked, result)
        return result

    def _free(self, to_free: list[torch.Tensor]) -> None:
        """Free FULL slots the tree does not keep, with any SWA they still map to.

        One combined free covers every case of the insert: the caller's duplicates
        below its SWA boundary no longer map to SWA, those above free their SWA with
        them, and a replaced tombstone FULL maps to nothing.
        """
        parts = [t for t in to_free if t.numel()]
        if parts:
            self.allocator.free(parts[0] if len(parts) == 1 else torch.cat(parts))

    def _unevict(
        self, node: TreeNode, seg: torch.Tensor, swa_bound: int, result: InsertResult
    ) -> TreeNode:
        """An evicted node on the insert path takes the caller's slots."""
        node.full = seg.clone()  # never a view of the caller's tensor
        self._fire(node, T.UNEVICT)
        result.record_adopted_range(FULL, node.start, node.end)
        if self.swa_enabled:
            node = self._set_new_swa(node, swa_bound, result)
        return node

    def _set_new_swa(self, node: TreeNode, swa_bound: int, result: InsertResult) -> TreeNode:
        """Give a node that just took caller FULL slots its SWA: live at/above the
        request's boundary, tombstone below it (splitting at the boundary).

        Caller SWA slots still mapped below the boundary are freed here, so a tombstone
        never keeps a mapping (the contract leaves that case open; we settle it).
        """
        assert isinstance(self.allocator, SWAAllocator)
        if swa_bound >= node.end:
            assert node.full is not None
            self.allocator.free_mapped_swa(node.full)
            node.swa = None
            return node
        if swa_bound > node.start:
            lower = self.split(node, swa_bound - node.start)
            assert lower.full is not None
            self.allocator.free_mapped_swa(lower.full)
            lower.swa = None
        assert node.full is not None
        node.swa = self._translate(node.full)
        result.record_adopted_range(SWA, node.start, node.end)
        return node

    def _overlap(
        self,
        node: TreeNode,
        value: torch.Tensor,
        prev: int,
        swa_bound: int,
        result: InsertResult,
        to_free: list[torch.Tensor],
    ) -> TreeNode:
        """A device node on the insert path keeps its slots; the caller's copies go."""
        start, end = node.start, node.end
        dup_start = max(start, prev)
        if dup_start >= end:
            return node  # every caller slot here came from the tree itself
        if self.swa_enabled and node.swa is None and swa_bound < end and prev <= start:
            if swa_bound > start:  # the part below the request's window stays a tombstone
                to_free.append(value[start:swa_bound])
                self.split(node, swa_bound - start)
            seg = value[node.start : end]
            swa_slots = self._translate(seg)
            if node.lock_ref == 0:
                assert node.full is not None
                to_free.append(node.full)  # a tombstone's FULL maps to no SWA
                node.full, node.swa = seg.clone(), swa_slots
                result.record_adopted_range(FULL, node.start, end)
            else:  # locked: keep its FULL, pair the caller's SWA with it
                assert node.full is not None and isinstance(self.allocator, SWAAllocator)
                self.allocator.set_full_to_swa_mapping(node.full, swa_slots)
                node.swa = swa_slots
                to_free.append(seg)  # re-mapping above left it without SWA
            result.record_adopted_range(SWA, node.start, end)
            return node
        to_free.append(value[dup_start:end])
        return node

    def _new_leaf(
        self,
        parent: TreeNode,
        key: tuple[int, ...],
        value: torch.Tensor,
        ns: str | None,
        swa_bound: int,
        result: InsertResult,
        tick: int,
    ) -> TreeNode:
        leaf = TreeNode(
            id=next(self._ids),
            key=key,
            start=parent.end,
            parent=parent,
            namespace=ns,
            full=value.clone(),
            hashes=self._hashes_for(parent, key, ns),
            last_access=tick,
        )
        self.residency.initialize(leaf)
        parent.children[self._child_key(parent, key, 0, ns)] = leaf
        result.record_adopted_range(FULL, leaf.start, leaf.end)
        if self.swa_enabled:
            leaf = self._set_new_swa(leaf, swa_bound, result)
        return leaf

    def _count_hits(self, walked: list[TreeNode], result: InsertResult) -> None:
        """Count a hit on every device node walked; the write-through list merges the
        chains of every node that reached the threshold (root first, each node once)."""
        threshold = self.config.write_through_threshold
        chosen: dict[int, TreeNode] = {}
        for node in walked:
            if node.device_resident:
                node.hit_count += 1
                if (
                    threshold is not None
                    and node.hit_count >= threshold
                    and node.hashes is not None
                    and not node.external_cache_stored
                    and not node.offloading
                    and node.id not in chosen
                ):
                    for n in self.offload_chain(node):
                        chosen[n.id] = n
        result.write_through = sorted(chosen.values(), key=lambda n: n.start)

    # -- split -------------------------------------------------------------------------
    def split(self, node: TreeNode, k: int) -> TreeNode:
        """Cut `node` after `k` tokens (a page multiple, 0 < k < len); return the new parent."""
        self._check_in_tree(node, "split")
        self._check_aligned("split position", k)
        if not 0 < k < len(node.key) or node.parent is None:
            msg = f"cannot split node {node.id} of {len(node.key)} tokens at {k}"
            raise TreeError(msg)
        parent = node.parent
        pages = k // self.page_size
        top = TreeNode(
            id=next(self._ids),
            key=node.key[:k],
            start=node.start,
            parent=parent,
            namespace=node.namespace,
            full=None if node.full is None else node.full[:k],
            swa=None if node.swa is None else node.swa[:k],
            host=None if node.host is None else node.host[:k],
            hashes=None if node.hashes is None else node.hashes[:pages],
            lock_ref=node.lock_ref,
            hit_count=node.hit_count,
            last_access=node.last_access,
        )
        self.residency.initialize(top, like=node)
        ticket = node.pending_offload
        if ticket is not None:
            top.pending_offload = ticket
            ticket.publish.insert(ticket.publish.index(node), top)
        node.key = node.key[k:]
        node.start += k
        if node.full is not None:
            node.full = node.full[k:]
        if node.swa is not None:
            node.swa = node.swa[k:]
        if node.host is not None:
            node.host = node.host[k:]
        if node.hashes is not None:
            node.hashes = node.hashes[pages:]
        parent.children[self._child_key(parent, top.key, 0, top.namespace)] = top
        top.children[self._child_key(top, node.key, 0, node.namespace)] = node
        node.parent = top
        return top

    def path_slots(self, node: TreeNode, stop: TreeNode | None = None) -> torch.Tensor:
        """FULL slots of the nodes below `stop` (default: the root) down to `node`, root
        first: the tree's canonical slots for that span of the key."""
        parts: list[torch.Tensor] = []
        n: TreeNode | None = node
        while n is not None and n is not stop and n.parent is not None:
            assert n.full is not None, f"node {n.id} on the path has no FULL slots"
            parts.append(n.full)
            n = n.parent
        parts.reverse()
        return torch.cat(parts) if parts else self._empty

    # -- locks -------------------------------------------------------------------------
    def _check_in_tree(self, node: TreeNode, what: str) -> None:
        if node is not self.root and not (node.device_resident or node.evicted):
            msg = f"cannot {what} node {node.id}: it is not in the tree ({node.residency})"
            raise NodeStateError(msg, node_id=node.id, state=node.residency)

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock every node on the path root→`node` (the root is never locked)."""
        self._check_in_tree(node, "lock")
        while node.parent is not None:
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Release one lock on the path root→`node`; raises if it holds none."""
        self._check_in_tree(node, "unlock")
        path = node.path_from_root()
        for n in path:
            if n.lock_ref <= 0:
                msg = (
                    f"cannot unlock node {node.id}: node {n.id} on its path holds no lock "
                    "(unlock exactly once per inc_lock_ref, on the same node)"
                )
                raise LockUnderflowError(msg, node_id=n.id)
        for n in path:
            n.lock_ref -= 1

    # -- eviction ----------------------------------------------------------------------
    def _evictable_leaf(self, node: TreeNode) -> bool:
        return (
            node.parent is not None
            and node.device_resident
            and node.lock_ref == 0
            and not node.offloading
            and node.residency not in BACKING_UP
            and not any(c.device_resident for c in node.children.values())
        )

    def evict(self, params: EvictParams) -> EvictResult:
        freed = self._evict_full(params.num_tokens) if params.num_tokens > 0 else 0
        freed_swa = (
            self._evict_swa(params.swa_num_tokens)
            if params.swa_num_tokens > 0 and self.swa_enabled
            else 0
        )
        return EvictResult(freed, freed_swa)

    def _evict_full(self, num_tokens: int) -> int:
        heap = [(n.last_access, n.id, n) for n in self.nodes() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if not self._evictable_leaf(node):
                continue
            parent = node.parent
            freed += self._evict_node(node)
            if parent is not None and self._evictable_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def _evict_node(self, node: TreeNode) -> int:
        slots = node.full
        assert slots is not None and node.parent is not None
        if node.backuped:
            self._fire(node, T.EVICT)
            node.full = node.swa = None
        else:
            assert not node.children, "a node with host-backed children is backed up"
            self._fire(node, T.DELETE)
            del node.parent.children[self._child_key(node.parent, node.key, 0, node.namespace)]
        self.allocator.free(slots)
        return int(slots.numel())

    def _evict_swa(self, num_tokens: int) -> int:
        assert isinstance(self.allocator, SWAAllocator)
        candidates = sorted(
            (n for n in self.nodes() if n.swa is not None and n.lock_ref == 0 and not n.offloading),
            key=lambda n: (n.last_access, n.id),
        )
        freed = 0
        for node in candidates:
            if freed >= num_tokens:
                break
            assert node.full is not None and node.swa is not None
            self.allocator.free_mapped_swa(node.full)
            freed += int(node.swa.numel())
            node.swa = None
        return freed

    # -- external store residency ------------------------------------------------------
    def offload_chain(self, node: TreeNode) -> list[TreeNode]:
        """`node` and its ancestors up to the first stored/offloading/backed-up one, root first."""
        chain: list[TreeNode] = []
        n: TreeNode | None = node
        while n is not None and n.parent is not None:
            if n.external_cache_stored or n.offloading or n.backuped:
                break
            chain.append(n)
            n = n.parent
        chain.reverse()
        return chain

    @staticmethod
    def _is_ancestor(anc: TreeNode, node: TreeNode) -> bool:
        n = node.parent
        while n is not None:
            if n is anc:
                return True
            n = n.parent
        return False

    def begin_offload(self, chain: Sequence[TreeNode]) -> OffloadTicket:
        """Move a root-first chain to offloading and lock it; see `tree.offload`."""
        if not chain:
            msg = "cannot offload an empty chain"
            raise TreeError(msg)
        for i, node in enumerate(chain):
            problem = None
            if not node.device_resident:
                problem = "it is not device-resident"
            elif node.hashes is None:
                problem = "it has no page hashes (the tree was built with hash_pages=False)"
            elif node.external_cache_stored or node.offloading:
                problem = "it is already stored or offloading"
            elif i and not self._is_ancestor(chain[i - 1], node):
                problem = f"it is not below node {chain[i - 1].id} (chains go root first)"
            if problem:
                msg = f"cannot offload node {node.id}: {problem}"
                raise NodeStateError(msg, node_id=node.id, state=node.residency)
        ticket = OffloadTicket(id=next(self._tickets), anchor=chain[-1], publish=list(chain))
        for node in chain:
            self._fire(node, T.START_OFFLOAD)
            node.pending_offload = ticket
        self.inc_lock_ref(ticket.anchor)
        return ticket

    def finish_offload(self, ticket: OffloadTicket, success: bool) -> None:
        """Publish (success) or roll back (failure) every node of the ticket; unlock once."""
        if ticket.finished:
            msg = f"offload ticket {ticket.id} is already finished"
            raise TreeError(msg)
        trigger = T.OFFLOAD_SUCCEEDED if success else T.OFFLOAD_FAILED
        for node in ticket.publish:
            self._fire(node, trigger)
            node.pending_offload = None
        self.dec_lock_ref(ticket.anchor)
        ticket.finished = True

    def mark_stored_path(self, endpoint: TreeNode, anchor: TreeNode) -> list[TreeNode]:
        """Mark every node from `endpoint` up to (excluding) `anchor` stored.

        Nodes already stored, or with an offload in flight (whose verdict decides), are
        left as they are. Returns the nodes marked.
        """
        path: list[TreeNode] = []
        n: TreeNode | None = endpoint
        while n is not anchor:
            if n is None or n.parent is None:
                msg = f"node {anchor.id} is not an ancestor of node {endpoint.id}"
                raise NodeStateError(msg, node_id=anchor.id, state=anchor.residency)
            path.append(n)
            n = n.parent
        marked = []
        for node in path:
            if node.device_resident and not node.external_cache_stored and not node.offloading:
                self._fire(node, T.MARK_STORED)
                marked.append(node)
        return marked

    def demote(self, node: TreeNode) -> bool:
        """A stored node whose pages the store lost becomes unstored (eligible again)."""
        if not node.external_cache_stored:
            return False
        self._fire(node, T.DEMOTE)
        return True

    # -- host tier ---------------------------------------------------------------------
    def _host_parts(self) -> tuple[KVPool, HostKVPool, PagedAllocator]:
        if self.kv_pool is None or self.host_pool is None or self.host_allocator is None:
            msg = "the host tier needs kv_pool, host_pool and host_allocator"
            raise TreeError(msg)
        return self.kv_pool, self.host_pool, self.host_allocator

    def backup(self, node: TreeNode) -> bool:
        """Back up `node` and its un-backed ancestors to the host, root first.

        Returns False (that node's backup failed, nothing else changed for it) when the
        host pool is short.
        """
        kv, host, host_alloc = self._host_parts()
        chain = [n for n in node.path_from_root() if not n.backuped]
        for n in chain:
            if not n.device_resident or n.residency in BACKING_UP:
                msg = f"cannot back up node {n.id} now"
                raise NodeStateError(msg, node_id=n.id, state=n.residency)
        for n in chain:
            self._fire(n, T.START_BACKUP)
            slots = host_alloc.alloc(len(n.key))
            if slots is None:
                self._fire(n, T.BACKUP_FAILED)
                return False
            assert n.full is not None
            host.backup_from(kv, n.full, slots)
            n.host = slots
            self._fire(n, T.BACKUP_SUCCEEDED)
        return True

    def load_back(self, node: TreeNode) -> bool:
        """Copy the host backups of the evicted nodes on the path to `node` back to the
        device (evicting the shortfall first). False if the device pool stays short."""
        kv, host, _ = self._host_parts()
        self.inc_lock_ref(node)  # making room must not evict what this loads back
        try:
            for n in node.path_from_root():
                if not n.evicted:
                    continue
                need = len(n.key)
                short = need - self.allocator.available_size()
                if short > 0:
                    self.evict(EvictParams(num_tokens=short))
                slots = self.allocator.alloc(need)
                if slots is None:
                    return False
                assert n.host is not None
                host.restore_to(kv, n.host, slots)
                n.full, n.swa = slots, None
                n.last_access = self._tick()
                self._fire(n, T.LOAD_BACK)
        finally:
            self.dec_lock_ref(node)
        return True

    def drop_backup(self, node: TreeNode) -> None:
        """Free a resident node's host copy (its children must hold none)."""
        _, _, host_alloc = self._host_parts()
        if any(c.backuped for c in node.children.values()):
            msg = f"cannot drop the backup of node {node.id}: its children are backed up"
            raise NodeStateError(msg, node_id=node.id, state=node.residency)
        self._fire(node, T.DROP_BACKUP)
        assert node.host is not None
        host_alloc.free(node.host)
        node.host = None

    def evict_host(self, num_tokens: int) -> int:
        """Delete LRU evicted leaves (host copy only) to free host slots."""
        _, _, host_alloc = self._host_parts()

        def leaf(n: TreeNode) -> bool:
            return n.evicted and n.lock_ref == 0 and not n.children

        heap = [(n.last_access, n.id, n) for n in self.nodes() if leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, n = heapq.heappop(heap)
            parent = n.parent
            assert parent is not None and n.host is not None
            self._fire(n, T.DELETE)
            del parent.children[self._child_key(parent, n.key, 0, n.namespace)]
            host_alloc.free(n.host)
            freed += int(n.host.numel())
            if parent.parent is not None and leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    # -- audit -------------------------------------------------------------------------
    def check(
        self,
        *,
        outside_full: Sequence[torch.Tensor] = (),
        outside_swa: Sequence[torch.Tensor] = (),
    ) -> None:
        """Audit the whole tree; raise `TreeConsistencyError` listing every finding.

        `outside_full` / `outside_swa` are slots legitimately held outside the tree
        (requests' private KV, reserved loads); with them, slot conservation is exact.
        """
        from unicache_fsm.tree.audit import audit

        audit(self, outside_full=outside_full, outside_swa=outside_swa)
