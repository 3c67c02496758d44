"""Hypothesis state machines over `RadixTree`, beside a plain dict-of-pages model.

One machine, six test classes: P in {1, 4, 16}, FULL only (`PagedAllocator`) and
FULL + SWA (`SWAAllocator`, `TreeConfig(sliding_window_size=...)`).

The model is what a reader of docs/contract.md expects the tree to hold, page by page:
`pages[(namespace, token prefix up to the page's end)] = FULL slots of that page` for
every page inserted and not evicted since, plus the pages stored / offloading, the
walk hit counts, and every outstanding lock (requests, explicit locks, offload
tickets). Eviction is the one place the tree decides (LRU): the model follows it by
diffing, after checking that nothing locked or in flight went and enough was freed.

Requests behave like a scheduler's: `start_request` matches a key, locks the last
device node, allocates fresh FULL slots for the rest (evicting the shortfall; in SWA
mode also SWA slots, mapped with `set_full_to_swa_mapping`, and frees the SWA of the
fresh tokens below a chosen `swa_evicted_seqlen`); `finish_request` inserts with
`prev_prefix_len` = the matched length and unlocks; `abort_request` frees what it
allocated. Other rules interleave between the two halves of a request.

Before each insert the expected outcome is computed from the model and docs/contract.md:
`prefix_len` (leading pages present), the adopted ranges (absent pages; in SWA mode
also pages of an SWA tombstone at or above both the request's boundary and its
`prev_prefix_len`, FULL only if that node is unlocked), the fate of every caller slot
(adopted or free) and of every replaced tree slot (free).

Invariants after every step: `tree.check({FULL: requests' slots, SWA: ...})`;
the tree's pages and slots equal the model's; each node's lock_ref equals the number of
outstanding locks whose path crosses it; stored / offloading per page equal the
model's; hit counts equal the model's (FULL only; the SWA split-off lower halves are
not walked, so there they may only lag).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable

import attrs
import pytest
import torch
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from tree_strategies import (
    PageKey,
    build_key,
    in_tree,
    key_patterns,
    namespaces,
    node_page_keys,
    page_keys,
    ranges_of,
    slots,
    tree_pages,
    tree_snapshot,
)
from unicache_fsm.pools import PagedAllocator, SWAAllocator
from unicache_fsm.tree import (
    ComponentType,
    EvictParams,
    InsertParams,
    InsertParamsError,
    LockUnderflowError,
    MatchResult,
    NodeStateError,
    OffloadTicket,
    RadixTree,
    SlotTensorError,
    TreeConfig,
    TreeError,
    TreeNode,
    UnalignedKeyError,
    ValueLengthError,
)

FULL, SWA = ComponentType.FULL, ComponentType.SWA
FULL_PAGES = 40
SWA_PAGES = 24
MAX_PAGES = 6
# sliding_window_size per page size: windows of 3 tokens (P=1), 2 pages (P=4, P=16)
# whose token window is not a page multiple (6 -> 8, 20 -> 32).
SLIDING_WINDOW = {1: 3, 4: 6, 16: 20}
# A request's SWA boundary in pages: mostly low, so that tokens stay in the window.
BOUNDS = st.sampled_from((0, 0, 0, 1, 1, 2, 3, MAX_PAGES))


@attrs.define(eq=False)
class Request:
    """A request between its match and its insert: it owns `fresh` (FULL, for tokens
    ``[prefix_len, len(key))``) and `fresh_swa` (SWA, for ``[max(prefix_len, swa_bound),
    len(key))``), and holds a lock on `node`."""

    rid: int
    key: tuple[int, ...]
    namespace: str | None
    prefix_len: int
    swa_bound: int
    prefix: tuple[int, ...]
    fresh: tuple[int, ...]
    fresh_swa: tuple[int, ...]
    node: TreeNode = attrs.field(repr=False)


@attrs.define(eq=False)
class Lock:
    lid: int
    node_id: int
    node: TreeNode = attrs.field(repr=False)


class TreeMachine(RuleBasedStateMachine):
    page_size = 1
    swa = False

    requests = Bundle("requests")
    nodes = Bundle("nodes")
    locks = Bundle("locks")
    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        p = self.page_size
        self.threshold = 1 if self.swa else 2
        self.alloc: PagedAllocator | SWAAllocator
        if self.swa:
            self.alloc = SWAAllocator(FULL_PAGES * p, SWA_PAGES * p, p)
            self.sw = SLIDING_WINDOW[p]
            config = TreeConfig(sliding_window_size=self.sw, write_through_threshold=self.threshold)
        else:
            self.alloc = PagedAllocator(FULL_PAGES * p, p)
            self.sw = 0
            config = TreeConfig(write_through_threshold=self.threshold)
        self.tree = RadixTree(self.alloc, config)
        self.model: dict[PageKey, tuple[int, ...]] = {}
        self.stored: set[PageKey] = set()
        self.offloading: dict[int, set[PageKey]] = {}
        self.hits: collections.Counter[PageKey] = collections.Counter()
        self.anchors: dict[tuple[str, int], TreeNode] = {}
        self.live: dict[int, Request] = {}
        self.ids = itertools.count()

    # -- model helpers -----------------------------------------------------------------
    def _in_flight(self) -> set[PageKey]:
        return set().union(*self.offloading.values()) if self.offloading else set()

    def _expected_locks(self) -> collections.Counter[int]:
        counts: collections.Counter[int] = collections.Counter()
        for node in self.anchors.values():
            for n in node.path_from_root():
                counts[n.id] += 1
        return counts

    def _swa_pinned(self) -> set[int]:
        """Ids of the nodes every SWA lock surely pins: for each lock anchor, the nodes
        overlapping the last `sliding_window_size` tokens of its path (a lock's window
        may reach further back, after splits; never less)."""
        pinned: set[int] = set()
        for node in self.anchors.values():
            lo = node.end - self.sw
            for n in node.path_from_root():
                if n.end > lo:
                    pinned.add(n.id)
        return pinned

    def _present_pages(self, pks: list[PageKey]) -> int:
        n = 0
        for pk in pks:
            if pk not in self.model:
                break
            n += 1
        return n

    def _snapshot_refused(
        self, call: Callable[..., object], error: type[Exception], *args: object
    ) -> None:
        """`call(*args)` raises exactly `error` and changes nothing observable."""
        before = tree_snapshot(self.tree)
        with pytest.raises(error) as info:
            call(*args)
        assert type(info.value) is error, f"expected {error.__name__}, got {info.value!r}"
        assert tree_snapshot(self.tree) == before, "a refused call changed the tree"

    def _free_full_pages(self) -> set[int]:
        return set(self.alloc.free_page_ids().tolist())

    def _free_swa_pages(self) -> set[int]:
        assert isinstance(self.alloc, SWAAllocator)
        return set(self.alloc.swa_free_page_ids().tolist())

    # -- match -------------------------------------------------------------------------
    def _check_match(self, key: tuple[int, ...], ns: str | None, m: MatchResult) -> None:
        p = self.page_size
        pks = page_keys(ns, key, p)
        longest = self._present_pages(pks)
        length = m.prefix_len
        assert length % p == 0, f"match returned {length} tokens, not whole pages"
        assert length <= longest * p, f"match returned {length} > present {longest * p}"
        expected = [s for pk in pks[: length // p] for s in self.model[pk]]
        assert m.device_indices.tolist() == expected, "match slots differ from the adopted ones"
        assert m.host_hit_length == 0 and m.last_host_node is None
        tp = tree_pages(self.tree)
        if length == 0:
            assert m.last_device_node is self.tree.root
        else:
            info = tp[pks[length // p - 1]]
            assert info.node is m.last_device_node and info.last_of_node(p)
        if not self.swa:
            assert length == longest * p, f"match returned {length}, longest present {longest * p}"
            return
        # SWA: the longest node end b <= longest on the path whose last `sw` tokens
        # (all of [0, b) when shorter) have live SWA data.
        live = [tp[pk].node.slots(SWA) is not None for pk in pks[:longest]]
        best = 0
        for b in range(1, longest + 1):
            if not tp[pks[b - 1]].last_of_node(p):
                continue
            lo = max(0, b * p - self.sw) // p
            if all(live[lo:b]):
                best = b
        assert length == best * p, f"SWA match returned {length}, expected {best * p}"
        if best < longest:
            event("match: cut back to a live SWA window")

    @rule(target=nodes, pattern=key_patterns(MAX_PAGES), ns=namespaces, tail=st.integers(0, 3))
    def match(self, pattern: list[int], ns: str | None, tail: int) -> object:
        key = build_key(pattern, self.page_size)
        partial = (9,) * min(tail, self.page_size - 1)  # a partial page is never matched
        m = self.tree.match_prefix(key + partial, ns)
        self._check_match(key, ns, m)
        return m.last_device_node if m.prefix_len else multiple()

    # -- eviction ----------------------------------------------------------------------
    def _evict(self, params: EvictParams) -> None:
        tree, p = self.tree, self.page_size
        before = tree_pages(tree)
        had_swa = {pk: info.node.slots(SWA) is not None for pk, info in before.items()}
        locks = self._expected_locks()
        in_flight = self._in_flight()
        nodes = list(tree.nodes())
        evictable = sum(len(n.key) for n in nodes if locks[n.id] == 0)
        live_swa_unlocked = sum(
            len(n.key) for n in nodes if n.slots(SWA) is not None and locks[n.id] == 0
        )
        pinned = self._swa_pinned() if self.swa else set()
        locked_live_swa = [n for n in nodes if n.slots(SWA) is not None and n.id in pinned]
        avail = self.alloc.available_size()
        swa_avail = self.alloc.available_swa_size() if isinstance(self.alloc, SWAAllocator) else 0
        result = tree.evict(params)
        if result.num_tokens:
            event("evict: FULL pages evicted")
        if result.swa_num_tokens:
            event("evict: SWA tombstoned")
        after = tree_pages(tree)
        assert set(after) <= set(before), "eviction created pages"
        removed = set(before) - set(after)
        for pk in removed:
            node = before[pk].node
            assert locks[node.id] == 0, f"evicted locked {node!r}"
            assert pk not in in_flight, f"evicted {node!r} with an offload in flight"
        assert result.num_tokens == len(removed) * p
        assert self.alloc.available_size() - avail == result.num_tokens
        assert result.num_tokens >= min(params.num_tokens, evictable)
        if isinstance(self.alloc, SWAAllocator):
            swa_of_removed = sum(p for pk in removed if had_swa[pk])
            assert result.swa_num_tokens >= min(params.swa_num_tokens, live_swa_unlocked)
            assert result.swa_num_tokens >= swa_of_removed  # counted, whoever freed it
            for n in locked_live_swa:
                assert n.slots(SWA) is not None, f"SWA eviction tombstoned locked {n!r}"
            delta = self.alloc.available_swa_size() - swa_avail
            assert delta == result.swa_num_tokens
        else:
            assert result.swa_num_tokens == 0
        for pk in removed:
            del self.model[pk]
            self.stored.discard(pk)
            self.hits.pop(pk, None)

    @rule(num_pages=st.integers(1, 12), swa=st.booleans())
    def evict(self, num_pages: int, swa: bool) -> None:
        tokens = num_pages * self.page_size
        if swa and self.swa:
            self._evict(EvictParams(swa_num_tokens=tokens))
        else:
            self._evict(EvictParams(num_tokens=tokens))

    # -- requests: match -> lock -> alloc -> insert -> unlock --------------------------
    def _alloc_full(self, need: int) -> torch.Tensor | None:
        got = self.alloc.alloc(need)
        if got is None:
            self._evict(EvictParams(num_tokens=need - self.alloc.available_size()))
            got = self.alloc.alloc(need)
        return got

    def _alloc_swa(self, need: int) -> torch.Tensor | None:
        assert isinstance(self.alloc, SWAAllocator)
        got = self.alloc.alloc_swa(need)
        if got is None:
            self._evict(EvictParams(swa_num_tokens=need - self.alloc.available_swa_size()))
            got = self.alloc.alloc_swa(need)
        return got

    def _unlock_anchor(self, handle: tuple[str, int]) -> None:
        node = self.anchors.pop(handle)
        self.tree.dec_lock_ref(node)

    @rule(target=requests, pattern=key_patterns(MAX_PAGES), ns=namespaces, bound_pages=BOUNDS)
    def start_request(self, pattern: list[int], ns: str | None, bound_pages: int) -> object:
        req = self._start(pattern, ns, bound_pages)
        return multiple() if req is None else req

    def _start(self, pattern: list[int], ns: str | None, bound_pages: int) -> Request | None:
        return self._start_key(build_key(pattern, self.page_size), ns, bound_pages)

    def _start_key(self, key: tuple[int, ...], ns: str | None, bound_pages: int) -> Request | None:
        p = self.page_size
        m = self.tree.match_prefix(key, ns)
        self._check_match(key, ns, m)
        rid = next(self.ids)
        self.tree.inc_lock_ref(m.last_device_node)
        self.anchors[("request", rid)] = m.last_device_node
        n, matched = len(key), m.prefix_len
        fresh = self._alloc_full(n - matched)
        if fresh is None:
            self._unlock_anchor(("request", rid))
            return None
        bound = min(bound_pages * p, n)
        fresh_swa: tuple[int, ...] = ()
        if isinstance(self.alloc, SWAAllocator):
            swa_all = self._alloc_swa(n - matched)
            if swa_all is None:
                self.alloc.free(fresh)
                self._unlock_anchor(("request", rid))
                return None
            self.alloc.set_full_to_swa_mapping(fresh, swa_all)
            drop = max(0, bound - matched)  # fresh tokens below the boundary lose SWA
            if drop:
                self.alloc.free_swa(swa_all[:drop])
            fresh_swa = tuple(swa_all[drop:].tolist())
        req = Request(
            rid,
            key,
            ns,
            matched,
            bound,
            tuple(m.device_indices.tolist()),
            tuple(fresh.tolist()),
            fresh_swa,
            m.last_device_node,
        )
        self.live[rid] = req
        return req

    @rule(req=consumes(requests))
    def abort_request(self, req: Request) -> None:
        del self.live[req.rid]
        self.alloc.free(slots(req.fresh))  # the combined free also frees the mapped SWA
        p = self.page_size
        free = self._free_full_pages()
        assert all(s // p in free for s in req.fresh)
        if self.swa:
            swa_free = self._free_swa_pages()
            assert all(s // p in swa_free for s in req.fresh_swa)
        self._unlock_anchor(("request", req.rid))

    @rule(target=tickets, req=consumes(requests), chunked=st.booleans(), offload=st.booleans())
    def finish_request(self, req: Request, chunked: bool, offload: bool) -> object:
        chain = self._finish(req, chunked)
        return self._begin_offload(chain) if offload and chain else multiple()

    @rule(
        target=nodes,
        pattern=key_patterns(MAX_PAGES),
        ns=namespaces,
        bound_pages=BOUNDS,
        chunked=st.booleans(),
    )
    def serve(self, pattern: list[int], ns: str | None, bound_pages: int, chunked: bool) -> object:
        """A whole request in one step: match, lock, alloc, insert, unlock."""
        req = self._start(pattern, ns, bound_pages)
        if req is None:
            return multiple()
        self._finish(req, chunked)
        node = tree_pages(self.tree)[page_keys(req.namespace, req.key, self.page_size)[-1]].node
        return node

    @rule(
        target=nodes,
        req=requests,
        keep_pages=st.integers(1, MAX_PAGES),
        more=st.lists(st.sampled_from((0, 1, 2)), max_size=2),
        bound_pages=BOUNDS,
    )
    def race(self, req: Request, keep_pages: int, more: list[int], bound_pages: int) -> object:
        """Serve another request for (a prefix of) a live request's key, as concurrent
        identical prompts do: the live request's insert then meets its duplicates."""
        p = self.page_size
        key = req.key[: keep_pages * p] + build_key(more, p)
        got = self._start_key(key, req.namespace, bound_pages)
        if got is None:
            return multiple()
        self._finish(got, chunked=False)
        return tree_pages(self.tree)[page_keys(got.namespace, got.key, p)[-1]].node

    @initialize(
        target=nodes,
        requests=st.lists(st.tuples(key_patterns(MAX_PAGES), namespaces, BOUNDS), max_size=4),
    )
    def seed(self, requests: list[tuple[list[int], str | None, int]]) -> object:
        out = []
        for pattern, ns, bound_pages in requests:
            req = self._start(pattern, ns, bound_pages)
            if req is not None:
                self._finish(req, chunked=False)
                out.append(req)
        pages = tree_pages(self.tree)
        p = self.page_size
        return multiple(*(pages[page_keys(r.namespace, r.key, p)[-1]].node for r in out))

    def _finish(self, req: Request, chunked: bool) -> list[TreeNode]:
        """Insert the request's key, check everything, unlock; return the write-through."""
        tree, p = self.tree, self.page_size
        key, ns, prev = req.key, req.namespace, req.prefix_len
        bound = req.swa_bound if self.swa else 0
        pks = page_keys(ns, key, p)
        # The request's prefix is locked, so the tree still holds exactly those slots.
        assert [s for pk in pks[: prev // p] for s in self.model[pk]] == list(req.prefix)
        value_list = list(req.prefix) + list(req.fresh)
        tp = tree_pages(tree)
        present = self._present_pages(pks)
        full_adopt: list[bool] = []
        swa_adopt: list[bool] = []
        replaced: list[int] = []  # tree FULL slots the insert must free
        for j, pk in enumerate(pks):
            start = j * p
            if start < prev:
                fa = sa = False
            elif j >= present:
                fa, sa = True, self.swa and start >= bound
            else:
                node = tp[pk].node
                # a tombstone takes the caller's SWA from max(its start, the request's
                # boundary, prev_prefix_len) on: page by page, start >= bound here
                tomb = self.swa and node.slots(SWA) is None and start >= bound
                fa, sa = tomb and node.lock_ref == 0, tomb
                if fa:
                    replaced.extend(self.model[pk])
            full_adopt.append(fa)
            swa_adopt.append(sa)
        expected = {FULL: ranges_of(full_adopt, p), SWA: ranges_of(swa_adopt, p)}
        expected = {c: r for c, r in expected.items() if r}
        if replaced:
            event("insert: unlocked SWA tombstone takes the caller's FULL and SWA")
        if any(sa and not fa for sa, fa in zip(swa_adopt, full_adopt, strict=True)):
            event("insert: locked SWA tombstone takes the caller's SWA only")
        if present * p > prev:
            event("insert: caller duplicates past prev_prefix_len")

        result = tree.insert(
            InsertParams(
                key,
                slots(value_list),
                prev_prefix_len=prev,
                swa_evicted_seqlen=req.swa_bound,
                chunked=chunked,
                track_adopted_ranges=True,
                namespace=ns,
            )
        )
        del self.live[req.rid]
        assert result.prefix_len == present * p
        assert result.adopted_ranges == expected, (result.adopted_ranges, expected)
        after = tree_pages(tree)
        last = after[pks[-1]]
        assert result.last_device_node is last.node and last.last_of_node(p)

        # Fate of every slot the request owned, and of every tree slot replaced.
        free = self._free_full_pages()
        for j in range(prev // p, len(pks)):
            page = value_list[j * p] // p
            assert (page not in free) == full_adopt[j], f"caller FULL page {page} at {j}"
        assert all(s // p in free for s in replaced), "a replaced tombstone FULL page leaked"
        if self.swa:
            swa_free = self._free_swa_pages()
            first = max(prev, bound) // p
            for i, j in enumerate(range(first, len(pks))):
                page = req.fresh_swa[i * p] // p
                assert (page not in swa_free) == swa_adopt[j], f"caller SWA page {page} at {j}"
                if swa_adopt[j]:
                    node, idx = after[pks[j]].node, after[pks[j]].index
                    assert node.slots(SWA) is not None
                    got = node.slots(SWA)[idx * p : (idx + 1) * p].tolist()
                    assert got == list(req.fresh_swa[i * p : (i + 1) * p])
        for j, pk in enumerate(pks):
            if full_adopt[j]:
                self.model[pk] = tuple(value_list[j * p : (j + 1) * p])
        self._unlock_anchor(("request", req.rid))

        # Hit counting and the write-through chain.
        if chunked:
            assert result.write_through == []
        else:
            for pk in pks:
                self.hits[pk] += 1
            self._check_write_through(pks, result.write_through)
        if result.write_through:
            event("insert: write-through chain")
        return result.write_through

    def _check_write_through(self, pks: list[PageKey], chain: list[TreeNode]) -> None:
        """The write-through list merges the chain of every eligible node, root first:
        each chain runs up from the node to the first stored/offloading page."""
        p = self.page_size
        busy = self.stored | self._in_flight()
        for earlier, later in itertools.pairwise(chain):
            assert earlier.end <= later.start, "write-through list is not root-first"
            up = later.parent
            while up is not None and up is not earlier:
                up = up.parent
            assert up is earlier, "write-through nodes are not on one path"
        for i, node in enumerate(chain):
            assert not node.external_cache_stored and not node.offloading
            if i == 0 or node.parent is not chain[i - 1]:  # a chain starts here
                top = node.parent
                assert top is not None
                assert top is self.tree.root or top.external_cache_stored or top.offloading
        if chain:
            assert chain[-1].hit_count >= self.threshold
        if self.swa:
            return
        wanted: set[int] = set()
        for d, pk in enumerate(pks):
            if self.hits[pk] >= self.threshold and pk not in busy:
                c = d
                while c > 0 and pks[c - 1] not in busy:
                    c -= 1
                wanted.update(range(c, d + 1))
        got = [pk for node in chain for pk in node_page_keys(node, p)]
        assert got == [pks[i] for i in sorted(wanted)], "write-through covers the wrong pages"

    # -- bad inserts: typed error, nothing changed ---------------------------------------
    @rule(req=requests, kind=st.sampled_from(["key", "length", "dtype", "2d", "prev"]))
    def bad_insert(self, req: Request, kind: str) -> None:
        p = self.page_size
        key, value = req.key, slots(list(req.prefix) + list(req.fresh))
        prev = req.prefix_len
        error: type[Exception]
        if kind == "key":
            if p == 1:
                return  # every length is whole pages
            key, error = (*key, 1), UnalignedKeyError
            value = torch.cat([value, value[-1:]])
        elif kind == "length":
            value, error = value[:-1], ValueLengthError
        elif kind == "dtype":
            value, error = value.to(torch.int32), SlotTensorError
        elif kind == "2d":
            value, error = value.view(1, -1), SlotTensorError
        else:
            if p == 1:
                return
            prev = prev + 1
            error = InsertParamsError if prev > len(key) else UnalignedKeyError
        params = InsertParams(key, value, prev_prefix_len=prev, namespace=req.namespace)
        self._snapshot_refused(self.tree.insert, error, params)

    # -- split -------------------------------------------------------------------------
    @rule(target=nodes, node=nodes, k_pages=st.integers(0, MAX_PAGES), off=st.integers(0, 3))
    def split(self, node: TreeNode, k_pages: int, off: int) -> object:
        p = self.page_size
        if not in_tree(node):  # a deleted node: the tree refuses and changes nothing
            self._snapshot_refused(self.tree.split, NodeStateError, node, p)
            return multiple()
        k = k_pages * p + (1 if p > 1 and off == 0 else 0)
        if k % p:
            self._snapshot_refused(self.tree.split, UnalignedKeyError, node, k)
            return multiple()
        if not 0 < k < len(node.key):
            self._snapshot_refused(self.tree.split, TreeError, node, k)
            return multiple()
        old_key, old_start, old_parent = node.key, node.start, node.parent
        old_full = node.slots(FULL).tolist() if node.slots(FULL) is not None else None
        old_swa = node.slots(SWA).tolist() if node.slots(SWA) is not None else None
        old_hashes = list(node.hashes) if node.hashes is not None else None
        old = (node.residency, node.hit_count, node.lock_ref, node.pending_offload)
        ticket = node.pending_offload
        top = self.tree.split(node, k)
        assert top.parent is old_parent and node.parent is top
        assert top.key + node.key == old_key and len(top.key) == k
        assert (top.start, node.start) == (old_start, old_start + k)
        if old_full is None:
            assert top.slots(FULL) is None and node.slots(FULL) is None
        else:
            assert top.slots(FULL) is not None and node.slots(FULL) is not None
            assert top.slots(FULL).tolist() + node.slots(FULL).tolist() == old_full
        if old_swa is None:
            assert top.slots(SWA) is None and node.slots(SWA) is None
        else:
            assert top.slots(SWA) is not None and node.slots(SWA) is not None
            assert top.slots(SWA).tolist() + node.slots(SWA).tolist() == old_swa
        if old_hashes is None:
            assert top.hashes is None and node.hashes is None
        else:
            assert top.hashes is not None and node.hashes is not None
            assert top.hashes + node.hashes == old_hashes
            assert len(top.hashes) == k // p
        assert (node.residency, node.hit_count, node.lock_ref, node.pending_offload) == old
        assert (top.residency, top.hit_count, top.lock_ref, top.pending_offload) == old
        if ticket is not None:
            event("split: while offloading")
            i = ticket.publish.index(node)
            assert i > 0 and ticket.publish[i - 1] is top
        return top

    # -- locks -------------------------------------------------------------------------
    @rule(target=locks, node=nodes)
    def lock(self, node: TreeNode) -> object:
        if not in_tree(node):
            self._snapshot_refused(self.tree.inc_lock_ref, NodeStateError, node)
            return multiple()
        self.tree.inc_lock_ref(node)
        lid = next(self.ids)
        self.anchors[("lock", lid)] = node
        return Lock(lid, node.id, node)

    @rule(lock=consumes(locks))
    def unlock(self, lock: Lock) -> None:
        self._unlock_anchor(("lock", lock.lid))

    @rule(node=nodes)
    def unlock_unlocked(self, node: TreeNode) -> None:
        if in_tree(node) and self._expected_locks()[node.id] == 0:
            self._snapshot_refused(self.tree.dec_lock_ref, LockUnderflowError, node)

    # -- external store residency ------------------------------------------------------
    def _begin_offload(self, chain: list[TreeNode]) -> OffloadTicket:
        ticket = self.tree.begin_offload(chain)
        assert ticket.anchor is chain[-1] and ticket.publish == chain
        pages = {pk for node in chain for pk in node_page_keys(node, self.page_size)}
        assert not pages & (self.stored | self._in_flight())
        self.offloading[ticket.id] = pages
        self.anchors[("ticket", ticket.id)] = ticket.anchor
        return ticket

    @rule(target=tickets, node=nodes)
    def offload_start(self, node: TreeNode) -> object:
        if not in_tree(node):
            self._snapshot_refused(self.tree.begin_offload, NodeStateError, [node])
            return multiple()
        chain = self.tree.offload_chain(node)
        busy = self.stored | self._in_flight()
        mine = set(node_page_keys(node, self.page_size))
        if mine & busy:
            assert chain == []
            # offloading a stored (or offloading) node is refused
            self._snapshot_refused(self.tree.begin_offload, NodeStateError, [node])
            return multiple()
        assert chain and chain[-1] is node
        for parent, child in itertools.pairwise(chain):
            assert child.parent is parent
        top = chain[0].parent
        assert top is not None
        assert top is self.tree.root or top.external_cache_stored or top.offloading
        return self._begin_offload(chain)

    @rule(ticket=consumes(tickets), success=st.booleans())
    def offload_finish(self, ticket: OffloadTicket, success: bool) -> None:
        pages = self.offloading.pop(ticket.id)
        if len(ticket.publish) > 1:
            event("offload_finish: several nodes")
        self.tree.finish_offload(ticket, success)
        del self.anchors[("ticket", ticket.id)]
        got = {pk for node in ticket.publish for pk in node_page_keys(node, self.page_size)}
        assert got == pages, "the publish list does not cover the offloaded pages exactly"
        for node in ticket.publish:
            assert node.pending_offload is None and not node.offloading
            assert node.external_cache_stored == success
        if success:
            self.stored |= pages
        with pytest.raises(TreeError):
            self.tree.finish_offload(ticket, success)

    @rule(node=nodes, up=st.integers(0, MAX_PAGES))
    def mark_stored(self, node: TreeNode, up: int) -> None:
        if not in_tree(node):
            return
        path = [self.tree.root, *node.path_from_root()]
        anchor = path[max(0, len(path) - 1 - up)]
        busy = self.stored | self._in_flight()
        expected = []
        n: TreeNode | None = node
        while n is not anchor:
            assert n is not None
            if not set(node_page_keys(n, self.page_size)) & busy:
                expected.append(n)
            n = n.parent
        marked = self.tree.mark_stored_path(node, anchor)
        if marked:
            event("mark_stored_path: marked nodes")
        assert marked == expected
        for m in marked:
            self.stored |= set(node_page_keys(m, self.page_size))

    @rule(node=nodes, other=nodes)
    def mark_stored_not_ancestor(self, node: TreeNode, other: TreeNode) -> None:
        if not (in_tree(node) and in_tree(other)):
            return
        if other is node or other in node.path_from_root():
            return
        self._snapshot_refused(self.tree.mark_stored_path, NodeStateError, node, other)

    @rule(node=nodes)
    def demote(self, node: TreeNode) -> None:
        if not in_tree(node):
            return
        mine = set(node_page_keys(node, self.page_size))
        was_stored = bool(mine & self.stored)
        assert self.tree.demote(node) == was_stored
        self.stored -= mine

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def tree_is_consistent(self) -> None:
        outside_full = [slots(r.fresh) for r in self.live.values()]
        outside_swa = [slots(r.fresh_swa) for r in self.live.values()]
        self.tree.check({FULL: outside_full, SWA: outside_swa})

    @invariant()
    def tree_matches_model(self) -> None:
        tp = tree_pages(self.tree)
        assert {pk: info.slots for pk, info in tp.items()} == self.model
        locks = self._expected_locks()
        for node in self.tree.nodes():
            assert node.lock_ref == locks[node.id], f"{node!r}: expected {locks[node.id]}"
        in_flight = self._in_flight()
        for pk, info in tp.items():
            node = info.node
            assert node.external_cache_stored == (pk in self.stored), f"{node!r} stored"
            assert node.offloading == (pk in in_flight), f"{node!r} offloading"
            if self.swa:
                assert node.hit_count <= self.hits[pk], f"{node!r} hit count"
            else:
                assert node.hit_count == self.hits[pk], f"{node!r} hit count"


def _machine(page_size: int, swa: bool, max_examples: int, steps: int) -> type:
    name = f"TreeMachineP{page_size}{'Swa' if swa else 'Full'}"
    cls = type(name, (TreeMachine,), {"page_size": page_size, "swa": swa})
    case = cls.TestCase
    case.settings = settings(
        max_examples=max(5, settings.default.max_examples * max_examples // 100),
        stateful_step_count=steps,
        deadline=None,
    )
    return case


# Scaled from the active profile (tests/conftest.py); the numbers are for "ci", where
# the six classes take about a minute together on 2 cores.
TestTreeP1Full = _machine(1, False, 100, 80)
TestTreeP4Full = _machine(4, False, 100, 80)
TestTreeP16Full = _machine(16, False, 80, 80)
TestTreeP1Swa = _machine(1, True, 100, 80)
TestTreeP4Swa = _machine(4, True, 100, 80)
TestTreeP16Swa = _machine(16, True, 80, 80)
