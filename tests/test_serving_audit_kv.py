"""`resident_kv_matches`: the batched comparison finds what comparing node by node finds,
and still names the first culprit."""

from __future__ import annotations

import pytest

from unicache_fsm.pools.transfer import ComponentType
from unicache_fsm.serving import invariants as inv
from unicache_fsm.serving.kv import same_kv
from unicache_fsm.serving.system import System


def _node_by_node(s: System) -> str | None:
    """The first bad node as the per-node definition finds it ("FULL id" / "SWA id")."""
    for n in s.tree.nodes():
        full, swa = n.slots(ComponentType.FULL), n.slots(ComponentType.SWA)
        if not n.device_resident or full is None:
            continue
        if not same_kv(s.kv.read_pages(full), s.expected(n.key, n.start)):
            return f"FULL {n.id}"
        if (
            swa is not None
            and s.swa_kv is not None
            and not same_kv(s.swa_kv.read_pages(swa), s.expected(n.key, n.start, swa=True))
        ):
            return f"SWA {n.id}"
    return None


def _audit_kv(s: System) -> str | None:
    try:
        inv.resident_kv_matches(
            s.tree,
            s.kv,
            s.expected,
            swa_kv=s.swa_kv,
            expected_swa=lambda key, start: s.expected(key, start, swa=True),
        )
    except inv.InvariantViolation as exc:
        kind = "SWA" if "SWA bytes" in str(exc) else "FULL"
        node = str(exc).split("node ")[1].split(" ")[0]
        return f"{kind} {node}"
    return None


@pytest.mark.parametrize("swa", [False, True])
def test_batched_audit_names_the_same_culprit(swa: bool) -> None:
    s = System.build(4, swa=swa, full_pages=64, swa_pages=64)
    for i, pages in enumerate((3, 5, 2, 6)):
        key = tuple(range(100 * i, 100 * i + pages * 4))
        s.compute(f"c{i}", key)
        s.compute(f"d{i}", (*key[:8], 7, 7, 7, 7))  # a split: more nodes
    nodes = [
        n for n in s.tree.nodes() if n.device_resident and n.slots(ComponentType.FULL) is not None
    ]
    assert len(nodes) >= 6
    assert _audit_kv(s) is None and _node_by_node(s) is None
    pools = [(ComponentType.FULL, s.kv)] + ([(ComponentType.SWA, s.swa_kv)] if swa else [])
    for victim in (nodes[0], nodes[len(nodes) // 2], nodes[-1]):
        for component, pool in pools:
            slots = victim.slots(component)
            if slots is None or pool is None:
                continue
            row = slots[-1:]  # the last slot of its last page
            kept = pool.data[row].clone()
            pool.data[row] = 1999.0
            found = _audit_kv(s)
            assert found is not None and found == _node_by_node(s)
            pool.data[row] = kept
            assert _audit_kv(s) is None
