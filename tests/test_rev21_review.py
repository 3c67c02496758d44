"""Regressions found reviewing the performance change (integ21): behaviour that a cut
changed at a public boundary, checked against what it was before the cut."""

from __future__ import annotations

import copy
import pickle

import attrs
import pytest

from unicache_fsm.pools.layout import PageLayout


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
