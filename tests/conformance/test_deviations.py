"""Each named deviation (`deviations.py`, docs/deviations.md) pinned by its own test: the
project's deliberate behaviour, next to what SGLang 0.5.23 does instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from conformance.deviations import DEVIATIONS
from conformance.model import Pool, config_named, key_tokens
from conformance.project_side import ProjectSide
from unicache_fsm.pools.transfer import ExternalLinkerLoadPhase
from unicache_fsm.testing.system import System
from unicache_fsm.tree import ComponentType, InsertParams, InsertResult, UnalignedKeyError


def _sglang(config_name: str):  # type: ignore[no-untyped-def]
    from conformance.sglang_side import SglangSide

    side = SglangSide(config_named(config_name))
    side.start()
    return side


ROOT = Path(__file__).resolve().parents[2]


def test_every_deviation_is_documented_and_pinned() -> None:
    docs = (ROOT / "docs" / "deviations.md").read_text(encoding="utf-8")
    sections = {s.split(" ", 1)[0]: s for s in docs.split("\n## ")[1:]}
    for d in DEVIATIONS.values():
        path, _, test = d.pinned_by.partition("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^def {test}\(", source, re.M), f"{d.name}: {d.pinned_by} is missing"
        assert d.doc_id in sections, f"{d.name}: docs/deviations.md has no section {d.doc_id}"
        section = sections[d.doc_id]
        assert f"`{d.name}`" in section, f"{d.doc_id} does not name {d.name}"
        assert f"`{d.pinned_by}`" in section, f"{d.doc_id} does not name {d.pinned_by}"


def test_commit_phase_is_the_projects_own() -> None:
    from conformance.sglang_side import load_sglang

    sg = load_sglang()
    assert "COMMIT" not in sg.ExternalLinkerLoadPhase.__members__
    assert set(sg.ExternalLinkerLoadPhase.__members__) == {"PREPARE", "ABORT"}
    # The project's COMMIT keeps only the pages the tree adopted: a concurrent insert
    # of the first page while the load of two pages is in flight leaves one page to
    # adopt and one duplicate, which COMMIT frees.
    assert ExternalLinkerLoadPhase.COMMIT.name == "COMMIT"
    s = System.build(4)
    key = tuple(range(100, 108))
    s.compute("A", key)
    s.evict_all()
    b = s.begin("B", key)
    assert b.load is not None and b.prepared
    s.compute("C", key[:4], settle=True)
    s.linker.start_loading()
    s.store.progress()
    assert s.linker.finish_loads() == [b.load]
    assert b.load.state == "committed"
    assert (s.linker.stats.pages_loaded, s.linker.stats.pages_duplicate) == (1, 1)
    s.audit()


def _tombstone_then_prev_inside(side, tokens_a, tokens_b):  # type: ignore[no-untyped-def]
    """A 16-token key whose first 8 tokens are an SWA tombstone, then a request that
    matched it, reuses the tree's slots for 4 tokens and inserts 20 (prev 4)."""
    full, _ = side.alloc(16)
    side.release_swa(full[:8])
    side.insert(tokens_a, full, 0, 8)
    m = side.match(tokens_b)
    assert m.prefix_len == 16
    tree_part = torch.tensor(m.indices[:4], dtype=torch.int64)
    fresh, _ = side.alloc(16)
    out = side.insert(tokens_b, torch.cat([tree_part, fresh]), 4, 0)
    return out, set(m.indices[:4])


def test_swa_tombstone_readopt_is_a_bug_of_0_5_23_only() -> None:
    tokens_a = key_tokens((0, 1, 2, 0), 4)
    tokens_b = key_tokens((0, 1, 2, 0, 1), 4)
    sglang = _sglang("swa8-p4")
    out, tree_owned = _tombstone_then_prev_inside(sglang, tokens_a, tokens_b)
    held = {row.full for row in sglang.rows() if row.full is not None}
    on_free_list = held & sglang.free_full_slots()
    assert on_free_list and on_free_list <= tree_owned  # 0.5.23: tree slots also free
    assert min(s for s, _ in out.adopted[Pool.FULL]) < 4  # it re-adopted below prev

    project = ProjectSide(config_named("swa8-p4"))
    out, tree_owned = _tombstone_then_prev_inside(project, tokens_a, tokens_b)
    assert all(s >= 4 for ranges in out.adopted.values() for s, _ in ranges)
    assert project.audit() is None
    free = project.allocator.free_page_ids().tolist()
    held_pages = {row.full // 4 for row in project.rows() if row.full is not None}
    assert not held_pages & set(free)
    assert {row.full for row in project.rows()[:4]} == tree_owned  # still the tree's


def test_adopted_ranges_order_is_normalised() -> None:
    from conformance.harness import normalise_ranges
    from conformance.sglang_side import load_sglang

    sg = load_sglang()
    theirs = sg.InsertResult(prefix_len=0, adopted_ranges={})
    ours = InsertResult(adopted_ranges={})
    for start, end in ((8, 12), (0, 4)):
        theirs.record_adopted_range(sg.ComponentType.FULL, start, end)
        ours.record_adopted_range(ComponentType.FULL, start, end)
    assert ours.adopted_ranges == {ComponentType.FULL: [(0, 4), (8, 12)]}
    # 0.5.23 merges into the last range whenever the new one starts at or before its
    # end: out of order, it even covers tokens 4..8 that nobody adopted.
    assert theirs.adopted_ranges == {sg.ComponentType.FULL: [(0, 12)]}
    assert normalise_ranges(((0, 4), (4, 8), (10, 12), (8, 9))) == ((0, 9), (10, 12))


def test_unaligned_insert_is_refused() -> None:
    tokens = key_tokens((0, 1), 4, extra=2)  # 10 tokens at page size 4
    project = ProjectSide(config_named("full-p4"))
    full, _ = project.alloc(12)
    free = project.available(Pool.FULL)
    with pytest.raises(UnalignedKeyError):
        project.tree.insert(InsertParams(key=tuple(tokens), value=full[:10]))
    assert project.rows() == [] and project.available(Pool.FULL) == free

    sglang = _sglang("full-p4")
    full, _ = sglang.alloc(12)
    free = sglang.available(Pool.FULL)
    out = sglang.insert(tokens, full[:10], 0, 0)
    assert out.prefix_len == 0 and out.adopted == {Pool.FULL: ((0, 8),)}
    assert len(sglang.rows()) == 8 and sglang.available(Pool.FULL) == free
