"""Tree components: one module per kind of per-node data, each owning its pool, its
entry of every node's `data`, its residency region and its hooks (`base`).

- `base` — the protocol (`TreeComponent`), the contexts the hooks share
  (`InsertContext`, `LoadContext`) and `select_adopted_pages`.
- `full` — FULL, the backbone (`FullComponent`).
- `swa` — SWA, the sliding window (`SwaComponent`).
- `mamba` — MAMBA (`MambaComponent`): no tree behaviour yet; its linker hooks refuse.

`COMPONENT_CLASSES` lists them backbone first; `build_components(tree)` instantiates
those a tree's allocator and configuration turn on. Adding a component is a new
module here and one entry in `COMPONENT_CLASSES`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unicache_fsm.tree.components.base import (
    InsertContext,
    LoadContext,
    TreeComponent,
    select_adopted_pages,
)
from unicache_fsm.tree.components.full import FullComponent
from unicache_fsm.tree.components.mamba import MambaComponent
from unicache_fsm.tree.components.swa import SwaComponent

if TYPE_CHECKING:
    from unicache_fsm.tree.tree import RadixTree

__all__ = [
    "COMPONENT_CLASSES",
    "FullComponent",
    "InsertContext",
    "LoadContext",
    "MambaComponent",
    "SwaComponent",
    "TreeComponent",
    "build_components",
    "components_for",
    "select_adopted_pages",
]

#: every component class, the backbone first (the order hooks run in)
COMPONENT_CLASSES: tuple[type[TreeComponent], ...] = (FullComponent, SwaComponent, MambaComponent)


def build_components(tree: RadixTree) -> tuple[TreeComponent, ...]:
    """The components `tree`'s allocator and configuration turn on, backbone first."""
    return tuple(cls(tree) for cls in COMPONENT_CLASSES if cls.enabled(tree.allocator, tree.config))


def components_for(tree: RadixTree) -> tuple[TreeComponent, ...]:
    """The components that take part in the external linker for `tree`, FULL first."""
    return tree.components
