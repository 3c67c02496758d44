"""The unified radix tree over page-aligned token keys.

Lifecycle primitives (each validates its input first and changes nothing on a typed
error). This module holds the walk — match, insert, split; the rest of `RadixTree`
is written one concept per module: `locks`, `eviction`, `host` (the host tier),
`offload` (offload tickets), over the shared fields of `state`.

- `match_prefix(key, namespace)` — the device prefix of `key` (whole pages): its
  length, its backbone slots and the last device node; splits a node where the key
  diverges inside it; refreshes LRU on the path. Each component may cut the prefix
  back (`TreeComponent.cut_match`: SWA keeps it only where a live window lies behind
  its end). Beyond the device prefix, host-backed evicted nodes count as a host hit.
- `insert(InsertParams) -> InsertResult` — walk root to leaf: on a device node each
  component keeps the tree's data or takes the caller's (`overlap`; the caller's
  duplicates past `prev_prefix_len` are freed); an evicted node and a new leaf take
  the caller's slots (`adopt`). Every adoption is recorded with
  `record_adopted_range`. Non-chunked inserts count hits and return the
  write-through chain.
- `split(node, k)` — cut a node at a page boundary; the new parent takes the first
  `k` tokens, each component's first `k` slots and the first hashes, and copies the
  residency (stored, offloading with its ticket, backup, component regions), hit
  count and locks.
- `inc_lock_ref` / `dec_lock_ref` (`locks`); `evict`, `evictable_leaf` (`eviction`);
  `offload_chain`, `begin_offload`, `finish_offload`, `mark_stored_path`, `demote`
  (`offload`); `backup`, `load_back`, `drop_backup`, `evict_host` (`host`).
- `path_slots(node, stop)` — the tree's canonical backbone slots of a span.
- `check()` — see `tree.audit`.

The tree core names no component: every per-component decision is a hook of
`tree.components` (FULL, the backbone, first). Residency changes only by firing
`node_residency` triggers through the executor; a trigger the spec does not allow
raises `IllegalTransitionError`.

Not thread-safe: one scheduler thread owns the tree.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Mapping, Sequence

import attrs
import torch

from unicache_fsm import hashing
from unicache_fsm.pools.host import HostKVPool
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.swa import SWAAllocator
from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.tree.components import InsertContext, TreeComponent, build_components
from unicache_fsm.tree.errors import (
    InsertParamsError,
    SlotTensorError,
    TreeError,
    ValueLengthError,
)
from unicache_fsm.tree.host import HostTier
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.offload import Offloads
from unicache_fsm.tree.params import InsertParams, InsertResult, MatchResult, as_key
from unicache_fsm.tree.residency import (
    BACKED_UP,
    EVICTED,
    OFFLOADING,
    RESIDENT,
    STORED,
    ExecutorKind,
    Residency,
    ResidencyTrigger,
)
from unicache_fsm.tree.walk import (
    TokenKey,
    check_aligned,
    pack_key,
    packed_common_len,
)

__all__ = ["RadixTree", "TreeConfig"]

T = ResidencyTrigger
#: how much older than its child a match stamps each ancestor (a tick is 1)
ANCESTOR_STEP = 1e-5


def _check_kept(ranges: Sequence[tuple[int, int]], bound: int, p: int) -> None:
    """`InsertParams.swa_kept_ranges`: whole pages, non-empty, sorted, disjoint, inside
    ``[0, swa_evicted_seqlen]`` (`InsertParamsError` / `UnalignedKeyError` naming one)."""
    last = 0
    for a, b in ranges:
        if not last <= a < b <= bound:
            msg = (
                f"swa_kept_ranges has ({a}, {b}): each range must be non-empty, after the "
                f"one before it (which ends at {last}) and end by swa_evicted_seqlen {bound}"
            )
            raise InsertParamsError(msg, what="swa_kept_ranges", value=a)
        for v in (a, b):
            if v % p:
                check_aligned("swa_kept_ranges", v, p)
        last = b


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


class RadixTree(HostTier, Offloads):
    """The unified radix tree: page-aligned token keys mapped to KV slots, one node per
    shared span, each node's residency a `node_residency` machine.

    Built over an allocator (`PagedAllocator`, or `SWAAllocator` for FULL + SWA) and a
    `TreeConfig`; optionally a device `KVPool` and a host tier (`host_pool`,
    `host_allocator`). Every primitive (listed in the module docstring, in call order)
    validates its input first and changes nothing when it raises a typed `TreeError`;
    residency moves only by legal triggers (`IllegalTransitionError` otherwise). The
    tree owns every slot it holds and frees it on eviction; a caller's slots become the
    tree's only when `insert` adopts them. One scheduler thread owns it (not
    thread-safe).
    """

    def __init__(
        self,
        allocator: PagedAllocator | SWAAllocator,
        config: TreeConfig | None = None,
        *,
        kv_pool: KVPool | None = None,
        host_pool: HostKVPool | None = None,
        host_allocator: PagedAllocator | None = None,
    ) -> None:
        self.config = config or TreeConfig()
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.device = allocator.device
        self.kv_pool = kv_pool
        self.host_pool = host_pool
        self.host_allocator = host_allocator
        self.evict_heap = []
        self.node_count = 0
        # (a tree's instance dict holds 29 keys: 28 set here, `ticket_ids` at the first
        # offload. CPython 3.11 shares instance dict keys only below 30; at 30 every
        # `self.x` of the tree became a generic dict lookup: +4 M instructions measured
        # in a simulate run. Add an attribute only in place of another.)
        self.residency = Residency(self.config.executor, on_fire=self.note_evictable)
        self.node_ids = itertools.count(1)
        self.clock = 0
        self._empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self.root = TreeNode(id=0, key=(), start=0, parent=None)
        self.residency.initialize(self.root)
        self.components = build_components(self)
        self.backbone = self.components[0]
        self.backbone_type = self.backbone.component_type
        self.lock_hooks = self._overriding("lock")
        self.held_locks = {}
        self._match_end_hooks = self._overriding("after_match")
        self._cut_hooks = self._overriding("cut_match")
        self._insert_end_hooks = self._overriding("after_insert")
        self._overlap_order = tuple(reversed(self.components))
        # an insert's duplicates are slices of its checked tail: only FULL frees them
        self._prevalidated_frees = (
            self.config.check_slots
            and type(allocator) is PagedAllocator
            and len(self.components) == 1
        )
        # keys are packed once (u32 when hashing: the hash input; int64 otherwise) and
        # compared packed; the last key packed is kept, so a match then an insert of
        # the same key object (a scheduler's step) packs it once
        self.key_format = "I" if self.config.hash_pages else "q"
        self.key_width = 4 if self.config.hash_pages else 8
        self._packed_key: tuple[int, ...] | None = None
        self._packed = b""

    # -- helpers -----------------------------------------------------------------------
    def _overriding(self, hook: str) -> tuple[TreeComponent, ...]:
        """The components whose `hook` does something (the base's is a no-op)."""
        base = getattr(TreeComponent, hook)
        return tuple(c for c in self.components if getattr(type(c), hook) is not base)

    def _pack(self, key: tuple[int, ...]) -> bytes:
        """`key` packed (`walk.pack_key`); a typed error, nothing changed, on a bad token."""
        if key is not self._packed_key:
            if type(key) is TokenKey:  # packed when the request built it
                self._packed = key.packed(self.key_format)
            else:
                self._packed = pack_key(key, self.key_format)
            self._packed_key = key
        return self._packed

    # -- match -------------------------------------------------------------------------
    def match_prefix(
        self, key: Sequence[int] | torch.Tensor, namespace: str | None = None
    ) -> MatchResult:
        if type(key) is not tuple and type(key) is not TokenKey:
            key = as_key(key)
        packed = self._packed if key is self._packed_key else self._pack(key)
        width = self.key_width
        bk = self.backbone_type
        p = self.page_size
        usable = len(key) // p * p
        node, pos = self.root, 0
        path: list[TreeNode] = []
        child: TreeNode | None = None
        stride = p * width
        while pos < usable:
            at = pos * width  # the child's filing key (`walk.child_key`): its first page
            page = packed[at : at + stride]
            child = node.children.get(page if node.parent is not None else (namespace, page))
            if child is None or child.residency not in RESIDENT:
                break
            # the whole child matches (`packed_common_len`'s first test, inline: a child
            # ends on a page boundary, so one inside the key ends by `usable`) or a part
            m = len(child.key)
            if not packed.startswith(child.packed, at):
                m = packed_common_len(child, packed, pos, usable, p, width)
                child = self.split(child, m)
            path.append(child)
            node, pos = child, pos + m
            child = None
        # the host hit: backed-up evicted nodes on from the child the device walk
        # stopped at (none when it found no child or used up the key)
        host_len, host_node = 0, None
        hpos = pos
        while child is not None and child.residency in EVICTED and child.residency in BACKED_UP:
            m = packed_common_len(child, packed, hpos, usable, p, width)
            if m < len(child.key):
                break  # a partial host hit would need a split of an evicted node; skip it
            host_len, host_node, hpos = host_len + m, child, hpos + m
            if hpos >= usable:
                break
            at = hpos * width
            child = child.children.get(packed[at : at + stride])
        if self._cut_hooks:
            walked = len(path)
            for c in self._cut_hooks:
                keep = c.cut_match(path)
                if keep < len(path):
                    path = path[:keep]
            if len(path) < walked:  # the host hit no longer continues the device prefix
                host_len, host_node = 0, None
        if not path:
            for c in self._match_end_hooks:
                c.after_match(self.root)
            return MatchResult(0, self.root, bk, self.device, host_len, host_node)
        # the kept end node is used now; each ancestor a hair older (it stays behind
        # its child in LRU order, ahead of everything used before)
        self.clock += 1
        stamp = float(self.clock)
        for n in reversed(path):
            n.last_access = stamp
            stamp -= ANCESTOR_STEP
        for c in self._match_end_hooks:
            c.after_match(path[-1])
        self.note_evictable(path[-1])  # its ancestors lead to it: none is a leaf
        end = path[-1]
        return MatchResult(end.start + len(end.key), end, bk, self.device, host_len, host_node)

    # -- insert ------------------------------------------------------------------------
    def _check_insert(self, params: InsertParams) -> array[int] | None:
        """Validate an insert (a typed error, nothing changed); return, when checked
        (`TreeConfig.check_slots`), the page ids of the caller's slots from
        `prev_prefix_len` on (the tail the tree may take)."""
        key, value = params.key, params.value
        n, p = len(key), self.page_size
        if n % p:
            check_aligned("key length", n, p)
        if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.dim() != 1:
            got = getattr(value, "dtype", type(value).__name__)
            msg = f"insert value must be a 1-D int64 slot tensor, got {got}"
            raise SlotTensorError(msg, what="value", got=got)
        if value.device != self.device:
            msg = f"insert value is on {value.device}, the tree's pools are on {self.device}"
            raise SlotTensorError(msg, what="value", got=value.device)
        if value.numel() != n:
            msg = (
                f"insert value has {value.numel()} slots for a key of {n} tokens; "
                "pass one slot per key token"
            )
            raise ValueLengthError(msg, key_len=n, value_len=int(value.numel()))
        prev, swa = params.prev_prefix_len, params.swa_evicted_seqlen
        if not (0 <= prev <= n and 0 <= swa <= n) or prev % p or swa % p:
            for what, v in (("prev_prefix_len", prev), ("swa_evicted_seqlen", swa)):
                if not 0 <= v <= n:
                    msg = f"{what} = {v} is outside the key [0, {n}]"
                    raise InsertParamsError(msg, what=what, value=v)
                if v % p:
                    check_aligned(what, v, p)
        if params.swa_kept_ranges:
            _check_kept(params.swa_kept_ranges, swa, p)
        # the slots the tree may take must be the caller's: whole, allocated pages
        tail_pages = None
        if self.config.check_slots:  # checked once; the components reuse the page ids
            tail_pages = self.allocator.live_page_array(value, "insert value", prev)
        if key is not self._packed_key:
            self._pack(key)  # token errors must come before any change
        if params.namespace is not None and self.config.hash_pages:
            hashing.check_prior(params.namespace)
        for c in self.components:
            c.check_insert(params, tail_pages)
        return tail_pages

    def insert(self, params: InsertParams) -> InsertResult:
        tail_pages = self._check_insert(params)
        key, value, ns = params.key, params.value, params.namespace
        packed = self._packed if key is self._packed_key else self._pack(key)
        width = self.key_width
        n, p = len(key), self.page_size
        result = InsertResult(adopted_ranges={} if params.track_adopted_ranges else None)
        ctx = InsertContext(params, value, result, tail_pages)
        components, overlap_order = self.components, self._overlap_order
        walked: list[TreeNode] = []
        node, pos = self.root, 0
        stride = p * width
        while pos < n:
            at = pos * width  # the child's filing key (`walk.child_key`): its first page
            page = packed[at : at + stride]
            child = node.children.get(page if node.parent is not None else (ns, page))
            if child is None:
                break
            self.clock += 1
            child.last_access = self.clock
            m = len(child.key)  # the whole child matches, or a part (as in `match_prefix`)
            if not packed.startswith(child.packed, at):
                m = packed_common_len(child, packed, pos, n, p, width)
                child = self.split(child, m)
            end = pos + m
            if child.residency in EVICTED:
                self.residency.fire(child, T.UNEVICT)
                for c in components:
                    child = c.adopt(child, ctx, new_leaf=False)
            else:
                ctx.settled = False
                for c in overlap_order:
                    child = c.overlap(child, ctx)
            walked.append(child)
            node, pos = child, end
        result.prefix_len = pos
        if pos < n:
            own = packed[pos * width :] if pos else packed
            # the new leaf's raw page digests (`TreeNode.digest_bytes`), chained on its
            # parent's last digest (the namespace's seed at the root; none below a
            # parent without digests)
            digests = None
            if self.config.hash_pages:
                if node.parent is None:
                    digests = hashing.page_digest_bytes(own, p, hashing.prior_digest(ns))
                elif node.digest_bytes:
                    digests = hashing.page_digest_bytes(own, p, node.digest_bytes[-32:])
            leaf = TreeNode(
                id=next(self.node_ids),
                key=key[pos:],
                start=pos,
                parent=node,
                namespace=ns,
                digest_bytes=digests,
                packed=own,
                last_access=self.clock + 1,
            )
            self.clock += 1
            self.residency.initialize(leaf)
            self.link(leaf)
            for c in components:
                leaf = c.adopt(leaf, ctx, new_leaf=True)
            walked.append(leaf)
            node = leaf
        result.last_device_node = node
        if node.parent is not None:
            for c in self._insert_end_hooks:
                c.after_insert(node)
        to_free = ctx.to_free
        if to_free and self._prevalidated_frees:
            # FULL alone over a plain allocator: every duplicate is a span of the tail
            # the check validated before the walk (whole, distinct, allocated pages),
            # so release those pages without validating them twice (at P > 1 by the
            # page ids the check returned: no slice of the caller's tensor)
            allocator = self.allocator
            assert isinstance(allocator, PagedAllocator) and tail_pages is not None
            spans = [e for e in to_free if isinstance(e, tuple)]
            assert len(spans) == len(to_free), "FULL alone frees spans of its value"
            if p == 1:
                cut = [value[s:e] for s, e in spans]
                allocator.release_pages(cut[0] if len(cut) == 1 else torch.cat(cut))
            else:
                prev = params.prev_prefix_len
                ids = [k for s, e in spans for k in tail_pages[(s - prev) // p : (e - prev) // p]]
                allocator.release_page_ids(ids)
        elif to_free:  # the caller's slots the tree did not take (with any peers)
            parts = [
                t
                for e in to_free
                if (t := value[e[0] : e[1]] if isinstance(e, tuple) else e).numel()
            ]
            if parts:
                self.allocator.free(parts[0] if len(parts) == 1 else torch.cat(parts))
        if not params.chunked:
            if self.config.write_through_threshold is None:  # only the counts
                for hit in walked:
                    if hit.residency in RESIDENT:
                        hit.hit_count += 1
            else:
                self._count_hits(walked, result)
        if walked:  # new stamps; only the last node walked can be a leaf (each other
            self.note_evictable(walked[-1])  # one has the next below it; splits noted theirs)
        return result

    def _count_hits(self, walked: list[TreeNode], result: InsertResult) -> None:
        """Count a hit on every device node walked; the write-through list merges the
        chains of every node that reached the threshold (root first, each node once)."""
        threshold = self.config.write_through_threshold
        if threshold is None:  # no write-through: only the counts
            for node in walked:
                if node.residency in RESIDENT:
                    node.hit_count += 1
            return
        chosen: dict[int, TreeNode] = {}
        for node in walked:
            if node.residency in RESIDENT:
                node.hit_count += 1
                if (
                    node.hit_count >= threshold
                    and node.digest_bytes is not None
                    and node.residency not in STORED
                    and node.residency not in OFFLOADING
                    and node.id not in chosen
                ):
                    for n in self.offload_chain(node):
                        chosen[n.id] = n
        result.write_through = sorted(chosen.values(), key=lambda n: n.start)

    # -- split -------------------------------------------------------------------------
    def split(self, node: TreeNode, k: int) -> TreeNode:
        """Cut `node` after `k` tokens (a page multiple, 0 < k < len); return the new parent."""
        self.check_in_tree(node, "split")
        check_aligned("split position", k, self.page_size)
        if not 0 < k < len(node.key) or node.parent is None:
            msg = f"cannot split node {node.id} of {len(node.key)} tokens at {k}"
            raise TreeError(msg)
        parent = node.parent
        pages = k // self.page_size
        top = TreeNode(
            id=next(self.node_ids),
            key=node.key[:k],
            start=node.start,
            parent=parent,
            namespace=node.namespace,
            host=None if node.host is None else node.host[:k],
            digest_bytes=None if node.digest_bytes is None else node.digest_bytes[: 32 * pages],
            packed=node.packed[: k * self.key_width],
            lock_ref=node.lock_ref,
            hit_count=node.hit_count,
            last_access=node.last_access,
        )
        self.residency.initialize(top, like=node)
        for c in self.components:
            c.split(top, node, k)
        top.last_access = self.tick()  # a split counts as a use of both halves,
        node.last_access = self.tick()  # the suffix the most recent
        ticket = node.pending_offload
        if ticket is not None:
            top.pending_offload = ticket
            ticket.publish.insert(ticket.publish.index(node), top)
        self.link(top)  # filed under the same first page: it replaces `node` there
        node.key = node.key[k:]
        node.start += k
        if node.host is not None:
            node.host = node.host[k:]
        if node.digest_bytes is not None:
            node.digest_bytes = node.digest_bytes[32 * pages :]
        node.packed = node.packed[k * self.key_width :]
        node.parent = top
        self.link(node)
        self.note_evictable(node)  # new stamps; `top` has `node` below it
        return top

    def path_slots(self, node: TreeNode, stop: TreeNode | None = None) -> torch.Tensor:
        """Backbone slots of the nodes below `stop` (default: the root) down to `node`,
        root first: the tree's canonical slots for that span of the key."""
        bk = self.backbone_type
        parts: list[torch.Tensor] = []
        n: TreeNode | None = node
        while n is not None and n is not stop and n.parent is not None:
            slots = n.data.get(bk)
            assert slots is not None, f"node {n.id} on the path has no backbone slots"
            parts.append(slots)
            n = n.parent
        parts.reverse()
        return torch.cat(parts) if parts else self._empty

    # -- audit -------------------------------------------------------------------------
    def check(
        self,
        outside: Mapping[ComponentType, Sequence[torch.Tensor]] | None = None,
        *,
        nodes: Sequence[TreeNode] | None = None,
    ) -> None:
        """Audit the whole tree; raise `TreeConsistencyError` listing every finding.

        `outside` holds, per component, slots legitimately held outside the tree
        (requests' private KV, reserved loads); with them, slot conservation is exact.
        `nodes`, where given, is ``list(self.nodes())`` taken by the caller for this
        same audit with nothing changed since (one walk serves a caller's other checks
        too); by default the audit lists them itself.
        """
        from unicache_fsm.tree.audit import audit

        audit(self, outside, nodes)
