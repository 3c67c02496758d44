"""The harness itself: it catches planted differences, its oracle reproduces a worked
example of 0.5.23, and a reused oracle cache starts every program clean."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from conformance.behaviours import BEHAVIOURS
from conformance.harness import Divergence, run_program
from conformance.model import Evict, Insert, Lock, Match, Pool, Unlock, config_named, key_tokens
from conformance.project_side import ProjectSide
from conformance.sides import TokenRow


def _sglang(name: str) -> Any:
    from conformance.sglang_side import SglangSide

    return SglangSide(config_named(name))


class _EvictsOneMore(ProjectSide):
    def evict(self, full: int, swa: int) -> tuple[int, int]:
        got = super().evict(full, swa)
        return got[0] + 1, got[1]


class _ForgetsStored(ProjectSide):
    """Reports the first token as stored (nothing is offloaded in full-p4)."""

    def rows(self) -> list[TokenRow]:
        rows = super().rows()
        return [attrs.evolve(r, stored=True) if k == 0 else r for k, r in enumerate(rows)]


class _KeepsTheDuplicate(ProjectSide):
    """Reports the caller's slot instead of the tree's for the first token."""

    def rows(self) -> list[TokenRow]:
        rows = super().rows()
        if rows and rows[0].full is not None:
            rows[0] = attrs.evolve(rows[0], full=rows[0].full + 1)
        return rows


@pytest.mark.parametrize(
    ("side", "observable"),
    [
        (_EvictsOneMore, "evict.freed"),
        (_ForgetsStored, "tree.stored"),
        (_KeepsTheDuplicate, "tree.full_slot"),
    ],
)
def test_a_planted_difference_is_caught(side: type[ProjectSide], observable: str) -> None:
    config = config_named("full-p4")
    program = (Insert((0, 1)), Insert((0, 2)), Evict(full=1))
    with pytest.raises(Divergence, match=rf"\[{observable}\]") as caught:
        run_program(config, program, _sglang("full-p4"), side(config))
    report = str(caught.value)
    assert "program = (" in report and "Insert(pages=(0, 1)" in report  # replayable


def test_the_oracle_reproduces_worked_example_e1() -> None:
    side = _sglang("full-p4")
    side.start()
    total = side.available(Pool.FULL)
    full, _ = side.alloc(8)
    out = side.insert(key_tokens((0, 1), 4), full, 0, 0)
    assert (out.prefix_len, out.adopted) == (0, {Pool.FULL: ((0, 8),)})
    full, _ = side.alloc(12)
    out = side.insert(key_tokens((0, 1, 2), 4), full, 0, 0)
    assert (out.prefix_len, out.adopted) == (8, {Pool.FULL: ((8, 12),)})
    assert side.available(Pool.FULL) == total - 12  # the 8 duplicates were freed
    assert side.match(key_tokens((0, 1, 2), 4, extra=2)).prefix_len == 12
    assert side.evict(1, 0) == (4, 0)
    assert side.match(key_tokens((0, 1, 2), 4)).prefix_len == 8


def test_a_reused_oracle_cache_starts_every_program_clean() -> None:
    config = config_named("swa8-p4")
    program = (
        Insert((0, 1, 2, 0)),
        Lock((0, 1)),
        Insert((1, 2), swa_evicted_pages=1),
        Match((0, 1, 2)),
        Evict(full=4, swa=4),
        Unlock(0),
    )
    sglang = _sglang("swa8-p4")
    traces = []
    for _ in range(2):
        try:
            h = run_program(config, program, sglang, ProjectSide(config))
            traces.append(h.trace)
        except Divergence as exc:  # today's tree may differ; the oracle's part must not
            traces.append(str(exc).split("trace (0.5.23 results):")[1].split("program:")[0])
        run_program(
            config_named("full-p1"),
            BEHAVIOURS[0].program[:2],
            _sglang("full-p1"),
            ProjectSide(config_named("full-p1")),
        )
    assert traces[0] == traces[1]
