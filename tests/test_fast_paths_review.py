"""Regressions found reviewing the performance change (issue 16, sixth pass): behaviour that a cut
changed at a public boundary, checked against what it was before the cut."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import torch

from unicache_fsm.pools.layout import PageLayout
from unicache_fsm.pools.transfer import ComponentType, LinkerTransferPhase, PoolTransfer
from unicache_fsm.serving.system import System
from unicache_fsm.tree.components.base import TreeComponent
from unicache_fsm.tree.components.full import FullComponent

FULL = ComponentType.FULL


@pytest.mark.parametrize(("size", "page_size"), [(0, 1), (8, 2), (64, 16)])
def test_page_layout_fields_are_its_constructor_arguments(size: int, page_size: int) -> None:
    """Caching `num_pages` / `num_slots` must not make them attrs fields: `asdict`,
    `fields` and a round trip through the constructor see the three arguments alone."""
    layout = PageLayout(size, page_size, "pool")
    assert [f.name for f in attrs.fields(PageLayout)] == ["size", "page_size", "name"]
    assert attrs.asdict(layout) == {"size": size, "page_size": page_size, "name": "pool"}
    assert PageLayout(**attrs.asdict(layout)) == layout
    assert attrs.astuple(layout) == (size, page_size, "pool")


@pytest.mark.parametrize(
    "remake",
    [
        lambda x: x,
        copy.copy,
        copy.deepcopy,
        lambda x: pickle.loads(pickle.dumps(x)),
        lambda x: attrs.evolve(x, size=x.size * 2),
    ],
    ids=["same", "copy", "deepcopy", "pickle", "evolve"],
)
def test_page_layout_derived_values_follow_size_and_page_size(remake: object) -> None:
    layout = remake(PageLayout(8, 2))  # type: ignore[operator]
    assert layout.num_pages == layout.size // layout.page_size
    assert layout.num_slots == layout.size + layout.page_size
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        layout.num_pages = 1


def _full_component_and_node(page_size: int) -> tuple[Any, Any]:
    """A system's FULL component and one node of its tree holding slots and hashes."""
    sys_ = System.build(page_size)
    sys_.serve("a", list(range(100, 100 + 4 * page_size)))
    (node,) = [n for n in sys_.tree.nodes() if n.parent is not None]
    (full,) = [c for c in sys_.tree.components if isinstance(c, FullComponent)]
    assert node.hashes and node.data.get(FULL) is not None
    return full, node


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("linked", [False, True])
def test_offload_of_one_node_honours_a_subclass_transfer_hook(page_size: int, linked: bool) -> None:
    """`FullComponent.build_external_linker_offload` builds a one-node chain's transfer
    itself; a subclass that overrides the documented per-node hook,
    `build_external_linker_transfer`, must still be the one asked (as it is for longer
    chains, and as the linker asked it for every node before the shortcut)."""
    full, node = _full_component_and_node(page_size)
    asked: list[object] = []

    class Withholding(FullComponent):
        def build_external_linker_transfer(
            self, phase: LinkerTransferPhase, node: Any, keys: Sequence[str]
        ) -> PoolTransfer | None:
            asked.append(node)
            return None  # this component offloads nothing

    full.__class__ = Withholding
    link = (torch.arange(page_size, 2 * page_size), "e" * 64) if linked else None
    assert full.build_external_linker_offload([node], link) is None
    assert asked == [node]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("linked", [False, True])
def test_offload_of_one_node_is_the_merge_of_its_transfer(page_size: int, linked: bool) -> None:
    full, node = _full_component_and_node(page_size)
    link = (torch.arange(page_size, 2 * page_size), "e" * 64) if linked else None
    got = full.build_external_linker_offload([node], link)
    want = TreeComponent.build_external_linker_offload(full, [node], link)
    assert got is not None and want is not None
    assert got == want  # name, keys, hit policy
    assert got.device_indices is not None and want.device_indices is not None
    assert torch.equal(got.device_indices, want.device_indices)
