"""A request in the reference scheduler, from admission to release.

Who owns which slots: `prefix_slots` are tree-owned (the request holds a lock on
`lock_node`, which pins them); `own_slots` / `own_swa` are the request's private
FULL / SWA slots for positions ``[prefix_len, prefix_len + own_slots.numel())``,
until an insert hands them to the tree or the release frees what is left.
"""

from __future__ import annotations

import attrs
import torch

from unicache_fsm.linker.load import ExternalLoad
from unicache_fsm.scheduler.workloads import RequestSpec
from unicache_fsm.tree.node import TreeNode

__all__ = ["Request"]


@attrs.define(slots=True, eq=False)
class Request:
    spec: RequestSpec
    tokens: tuple[int, ...]
    lock_node: TreeNode
    prefix_len: int
    prefix_slots: torch.Tensor
    own_slots: torch.Tensor | None = None
    own_swa: torch.Tensor | None = None  # live SWA slots, aligned with the tail of own_slots
    swa_bound: int = 0  # positions below it hold no request-owned SWA
    computed: int = 0  # prompt positions whose KV this request computed
    load: ExternalLoad | None = None

    @property
    def rid(self) -> str:
        return self.spec.rid

    def outside_slots(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        full = [self.own_slots] if self.own_slots is not None else []
        swa = [self.own_swa] if self.own_swa is not None else []
        return full, swa
