"""MAMBA: recurrent state. The component exists so that the tree, its configuration
and the linker can name it; no configuration turns it on yet (`enabled` is False), so
its tree hooks are the base class's (it holds nothing on any node).

Its linker hooks raise `UnsupportedComponentError` naming the component: SGLang
0.5.23 keeps Mamba out of the external linker too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from unicache_fsm.pools.transfer import (
    ComponentType,
    ExternalLinkerLoadPhase,
    LinkerTransferPhase,
    PoolTransfer,
)
from unicache_fsm.tree.components.base import LoadContext, TreeComponent
from unicache_fsm.tree.errors import UnsupportedComponentError

if TYPE_CHECKING:
    from unicache_fsm.tree.node import TreeNode

__all__ = ["MambaComponent"]


class MambaComponent(TreeComponent):
    """Recurrent state: kept out of the external linker."""

    component_type = ComponentType.MAMBA
    evict_field = None

    def _refuse(self) -> UnsupportedComponentError:
        msg = (
            "the MAMBA component does not take part in the external linker (as in SGLang "
            "0.5.23); run the linker with FULL and SWA components only"
        )
        return UnsupportedComponentError(msg, component=self.component_type.name)

    def build_external_linker_transfer(
        self, phase: LinkerTransferPhase, node: TreeNode | None, keys: Sequence[str]
    ) -> PoolTransfer | None:
        raise self._refuse()

    def update_external_linker_load(
        self, phase: ExternalLinkerLoadPhase, transfer: PoolTransfer, ctx: LoadContext
    ) -> PoolTransfer | None:
        raise self._refuse()
