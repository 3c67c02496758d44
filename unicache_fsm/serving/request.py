"""`Request`: one request as a serving system drives it, from lookup to release.

Who owns which slots: the prefix a request reuses is tree-owned and pinned by the lock
the request holds on `lock` (the deepest node of that prefix; None for the root,
which needs no lock); a committed load hands its request the lock COMMIT took on
``load.endpoint``. `own_slots` / `own_swa` are the request's private FULL / SWA slots
while it computes positions ``[prefix_len, prefix_len + own_slots.numel())``, until
an insert hands them to the tree or the request frees what is left; the audits count
them as held outside the tree.

`Outcome` says how a request got its KV.
"""

from __future__ import annotations

import enum

import attrs
import torch

from unicache_fsm.linker.linker import LinkerMatch
from unicache_fsm.linker.load import ExternalLoad
from unicache_fsm.linker.offload import PendingOffload
from unicache_fsm.tree.node import TreeNode

__all__ = ["Outcome", "Request"]


class Outcome(str, enum.Enum):
    """How a request got its KV."""

    COMMITTED = "committed"  # from its committed external load
    ABORTED = "aborted"  # its load aborted: it recomputed the tail
    MISS = "miss"  # no external hit: it computed the tail
    COMPUTED = "computed"  # computed without any lookup


@attrs.define(eq=False)
class Request:
    """One request (fields filled as it goes)."""

    rid: str
    key: tuple[int, ...]  # every token the request will hold (prompt, then output)
    namespace: str | None = None
    match: LinkerMatch | None = None
    lock: TreeNode | None = None  # the node this request's own lock is on
    load: ExternalLoad | None = None
    prepared: bool = False
    outcome: Outcome | None = None
    prefix_len: int = 0  # positions whose KV is in tree-owned slots (`prefix_slots`)
    prefix_slots: torch.Tensor | None = None
    own_slots: torch.Tensor | None = None  # private FULL slots past the prefix
    own_swa: torch.Tensor | None = None  # live SWA slots, aligned with own_slots' tail
    slots: torch.Tensor | None = None  # FULL slots of the page-aligned key, when done
    last_node: TreeNode | None = None
    offload: PendingOffload | None = None

    def outside_slots(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The FULL and SWA slots this request holds outside the tree."""
        full = [self.own_slots] if self.own_slots is not None else []
        swa = [self.own_swa] if self.own_swa is not None else []
        return full, swa
