"""LOOKUP: what the store can restore past a request's device prefix, and whether a
stored path is still there.

`match` takes the tree's device prefix, then LOOKUPs the whole pages past it: tail
hashes chained from the last device page (or the namespace, for a tail from the root),
one LOOKUP transfer per component, the store's restorable boundaries intersected across
ranks (0/1 mask, MIN). A hit creates an idle `ExternalLoad` held for the request; a
failing store is a miss, never an error. `verify_stored` LOOKUPs a stored path and
demotes the nodes whose KV pages the store lost (a failed LOOKUP is no evidence of loss).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from unicache_fsm import hashing
from unicache_fsm.linker.aborting import Aborting
from unicache_fsm.linker.load import ExternalLoad
from unicache_fsm.linker.ranks import intersect_restorable
from unicache_fsm.pools.transfer import LinkerTransferPhase
from unicache_fsm.tree.node import TreeNode
from unicache_fsm.tree.params import MatchResult

__all__ = ["LinkerMatch", "Matching"]

LOOKUP = LinkerTransferPhase.LOOKUP


def _token_key(key: Sequence[int] | torch.Tensor) -> tuple[int, ...]:
    """A request key as a tuple of tokens (what `ExternalLoad.key` holds)."""
    if isinstance(key, tuple):
        return key
    if isinstance(key, torch.Tensor):
        return tuple(key.tolist())
    return tuple(key)


@attrs.frozen
class LinkerMatch:
    """The device prefix, and the external load when the store can restore more."""

    device: MatchResult
    load: ExternalLoad | None = None

    @property
    def external_hit_len(self) -> int:
        return 0 if self.load is None else self.load.prefix_len - self.load.device_hit_len


class Matching(Aborting):
    """`match` and `verify_stored` (collective calls: the restorable prefix is agreed
    across ranks before the tree or the request changes).

    Contract: a load is created only for whole pages every rank's store can restore,
    hashed from the device prefix's last page; a request matched again first releases
    its previous load; `verify_stored` demotes only nodes whose KV pages every rank's
    store agreed are gone.
    """

    def match(
        self, rid: str, key: Sequence[int] | torch.Tensor, namespace: str | None = None
    ) -> LinkerMatch:
        """Device prefix plus, when the store can restore more, an idle load for `rid`."""
        if rid in self.loads:
            self.release_request(rid)
        key = _token_key(key)
        device = self.tree.match_prefix(key, namespace)
        p = self.page_size
        hit = device.prefix_len
        tail_pages = (len(key) - hit) // p
        if tail_pages == 0:
            return LinkerMatch(device)
        if hit > 0:
            prior = device.last_device_node.last_hash()
            if prior is None:  # a tail hashed without its anchor would hash as a head
                return LinkerMatch(device)
        else:
            prior = namespace
        hashes = hashing.page_hashes(key[hit : hit + tail_pages * p], p, prior)
        transfers = [
            c.build_external_linker_transfer(LOOKUP, None, hashes) for c in self.components
        ]
        assert all(t is not None for t in transfers)
        self.stats.lookups += 1
        found = self.calls.lookup(rid, [t for t in transfers if t is not None], tail_pages)
        # a failing store is a miss, never an error for the request (on this rank; the
        # intersection makes it a miss on every rank)
        hit_pages = intersect_restorable(self.group, found or [], tail_pages)
        if hit_pages == 0:
            return LinkerMatch(device)
        self.stats.hit_pages += hit_pages
        load = ExternalLoad(
            rid=rid,
            key=key[: hit + hit_pages * p],
            namespace=namespace,
            anchor=device.last_device_node,
            device_prefix=device.device_indices,
            tail_hashes=tuple(hashes[:hit_pages]),
        )
        self.load_machine.initialize(load)
        self.loads[rid] = load
        return LinkerMatch(device, load)

    def verify_stored(self, node: TreeNode) -> int:
        """LOOKUP the stored path root→`node`; demote nodes whose pages are gone.

        Returns how many nodes were demoted (they become eligible for offload again).
        `stored` is about FULL (KV) pages: a lost SWA window only narrows what LOOKUP
        restores, and re-offloading a node whose SWA is tombstoned could not bring it
        back, so SWA losses demote nothing. A failed LOOKUP is no evidence of loss.
        """
        path = node.path_from_root()
        if not path or any(n.hashes is None for n in path):
            return 0
        keys = [k for n in path for k in (n.hashes or ())]
        transfer = self.components[0].build_external_linker_transfer(LOOKUP, None, keys)
        assert transfer is not None
        found = self.calls.lookup(f"verify-{node.id}", [transfer], len(keys))
        if found is None:  # cannot tell: no evidence of loss, but stay in the collective
            found = list(range(1, len(keys) + 1))
        present = intersect_restorable(self.group, found, len(keys)) * self.page_size
        demoted = 0
        for n in path:
            if n.end > present and self.tree.demote(n):
                demoted += 1
        self.stats.nodes_demoted += demoted
        return demoted
