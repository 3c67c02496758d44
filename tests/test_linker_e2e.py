"""The linker end to end, byte for byte: compute, offload, evict, LOOKUP, load, COMMIT.

FULL-only and FULL+SWA, page sizes 1 and 16, with the compiled and the reference
executors driving the load and offload machines. Every step is followed by the
harness's audit (tree check, slot conservation, locks, stored pages, node bytes).
"""

from __future__ import annotations

import pytest
import torch

from unicache_fsm.hashing import namespace_seed, page_hashes
from unicache_fsm.linker.load import ExternalLoad
from unicache_fsm.pools.transfer import ComponentType, PoolName, PoolTransfer
from unicache_fsm.testing.system import System, kv_bytes
from unicache_fsm.tree import EvictParams, ExecutorKind

FULL = ComponentType.FULL

SYSTEMS = [
    pytest.param(p, swa, id=f"P{p}-{'swa' if swa else 'full'}")
    for p in (1, 16)
    for swa in (False, True)
]


def slots_of(t: PoolTransfer) -> torch.Tensor:
    assert t.device_indices is not None
    return t.device_indices


def key_of(pages: int, p: int, base: int = 100) -> tuple[int, ...]:
    return tuple(range(base, base + pages * p))


def check_swa_window(s: System, load: ExternalLoad) -> None:
    """The loaded request's trailing window has live SWA, and every live SWA slot of its
    prefix holds the right bytes."""
    assert load.slots is not None
    live, got = s.swa_bytes_of(load.slots)
    n = load.prefix_len
    assert bool(live[max(0, n - s.window) :].all()), "the last window has no live SWA"
    assert torch.equal(got, kv_bytes(load.key, 0, swa=True)[live])


@pytest.mark.parametrize(("p", "swa"), SYSTEMS)
def test_offload_evict_load_commit_byte_for_byte(p: int, swa: bool) -> None:
    s = System.build(p, swa=swa)
    x = key_of(8, p)
    a = s.compute("A", x)
    s.audit()
    assert a.slots is not None and a.offload is not None
    assert a.offload.state == "published"
    assert all(n.external_cache_stored for n in s.tree.nodes())
    a_offloads = s.linker.stats.offloads_submitted  # one per node (SGLang 0.5.23)
    assert a_offloads == len(list(s.tree.nodes()))
    a_full = s.full_bytes(a.slots).clone()
    if swa:
        a_live, a_swa = s.swa_bytes_of(a.slots)
        a_swa = a_swa.clone()
    s.evict_all()
    s.audit()
    assert not list(s.tree.nodes()), "the tree still holds A's nodes"

    b = s.begin("B", (*x, 1, 2, 3))
    assert b.match is not None and b.load is not None
    assert b.match.device.prefix_len == 0
    assert b.match.external_hit_len == len(x)
    assert b.prepared and b.load.state == "prepared.queued"
    s.audit()
    assert s.linker.start_loading() >= 0
    assert b.load.state == "prepared.loading"
    s.audit()
    s.store.progress()
    ended = s.linker.finish_loads()
    assert ended == [b.load] and b.load.state == "committed"
    load = b.load
    assert load.slots is not None and load.slots.numel() == len(x)
    assert torch.equal(s.full_bytes(load.slots), a_full), "B's KV differs from A's"
    if swa:
        live, got = s.swa_bytes_of(load.slots)
        assert torch.equal(live, a_live) and torch.equal(got, a_swa)
        check_swa_window(s, load)
    kv = [t for t in load.committed if t.name is PoolName.KV]
    assert len(kv) == 1 and kv[0].num_pages == 8
    assert kv[0].keys == load.tail_hashes
    assert s.linker.stats.pages_loaded == 8 and s.linker.stats.pages_duplicate == 0
    assert all(n.external_cache_stored for n in s.tree.nodes()), "the loaded path is stored"
    s.audit()
    s.complete(b)
    assert b.outcome == "committed"
    # the loaded path is stored: B's own insert offloads only what B computed past it
    if b.offload is not None:
        assert all(n.start >= len(x) for n in b.offload.ticket.publish)
    past_x = [n for n in s.tree.nodes() if n.start >= len(x)]
    assert s.linker.stats.offloads_submitted == a_offloads + len(past_x)
    s.audit()
    # a third request now hits the device, not the store
    c = s.begin("C", x)
    assert c.match is not None and c.match.device.prefix_len == len(x) and c.load is None
    s.complete(c)
    s.assert_quiet()
    assert s.linker.stats.loads_committed == 1 and not s.linker.stats.loads_aborted


@pytest.mark.parametrize(("p", "swa"), SYSTEMS)
def test_partial_device_hit_resumes_the_chain(p: int, swa: bool) -> None:
    s = System.build(p, swa=swa)
    x = key_of(8, p)
    s.compute("A1", x[: 4 * p])
    a = s.compute("A2", x)
    assert a.last_node is not None
    tail_node_hashes = [
        h for n in a.last_node.path_from_root() if n.end > 4 * p for h in n.hashes or ()
    ]
    assert len(tail_node_hashes) == 4
    s.tree.evict(EvictParams(num_tokens=4 * p))
    s.audit()
    assert sum(len(n.key) for n in s.tree.nodes()) == 4 * p

    b = s.begin("B", x)
    assert b.match is not None and b.load is not None
    device = b.match.device
    assert device.prefix_len == 4 * p
    anchor_hash = device.last_device_node.last_hash()
    assert b.load.tail_hashes == tuple(page_hashes(x[4 * p :], p, anchor_hash))
    assert list(b.load.tail_hashes) == tail_node_hashes
    assert b.match.external_hit_len == 4 * p
    s.drive()
    assert b.load.state == "committed" and b.load.slots is not None
    assert torch.equal(b.load.slots[: 4 * p], device.device_indices)
    assert torch.equal(s.full_bytes(b.load.slots), kv_bytes(x, 0))
    if swa:
        check_swa_window(s, b.load)
    assert s.linker.stats.pages_loaded == 4
    s.complete(b)
    s.assert_quiet()


@pytest.mark.parametrize("p", [1, 16])
def test_swa_tail_shorter_than_the_window(p: int) -> None:
    """A one-page tail: the SWA window reaches back into the device prefix."""
    s = System.build(p, swa=True, window_pages=2)
    x = key_of(7, p)
    s.compute("A1", x[: 6 * p])
    s.compute("A2", x)
    s.tree.evict(EvictParams(num_tokens=p))
    b = s.begin("B", x)
    assert b.match is not None and b.load is not None
    assert b.match.device.prefix_len == 6 * p and b.match.external_hit_len == p
    swa_transfer = next(t for t in b.load.transfers if t.name is PoolName.SWA)
    assert swa_transfer.num_pages == 1
    s.drive()
    assert b.load.state == "committed"
    check_swa_window(s, b.load)
    s.complete(b)
    s.assert_quiet()


@pytest.mark.parametrize("swa", [False, True])
def test_namespace_separates_tenants(swa: bool) -> None:
    p = 4
    s = System.build(p, swa=swa)
    x = key_of(4, p)
    tenant_a, tenant_b = namespace_seed("tenant-a"), namespace_seed("tenant-b")
    s.compute("A", x, namespace=tenant_a)
    s.evict_all()
    other = s.begin("B", x, namespace=tenant_b)
    assert other.load is None, "a page hash seeded by another namespace must not hit"
    s.complete(other)
    same = s.serve("C", x, namespace=tenant_a)
    assert same.outcome == "committed"
    s.evict_all()
    s.assert_quiet()


def scenario(p: int, swa: bool, executor: ExecutorKind) -> dict[str, object]:
    """Compute, evict, load with a partial concurrent insert; a summary to compare."""
    s = System.build(p, swa=swa, executor=executor, tree_executor=executor)
    x = key_of(8, p)
    s.compute("A", x)
    s.evict_all()
    b = s.begin("B", x)
    s.compute("C", x[: 3 * p])
    s.drive()
    assert b.load is not None
    load = b.load
    s.complete(b)
    s.assert_quiet()
    assert load.slots is not None
    return {
        "state": load.state,
        "slots": load.slots.tolist(),
        "committed": [(t.name, t.keys, slots_of(t).tolist()) for t in load.committed],
        "stats": s.linker.describe(),
        "tree": sorted(
            (n.start, n.end, n.residency, None if n.slots(FULL) is None else n.slots(FULL).tolist())
            for n in s.tree.nodes()
        ),
        "free": s.allocator.free_page_ids().tolist(),
        "bytes": s.full_bytes(load.slots).tolist(),
    }


@pytest.mark.parametrize(("p", "swa"), SYSTEMS)
def test_reference_executor_gives_the_same_results(p: int, swa: bool) -> None:
    compiled = scenario(p, swa, ExecutorKind.COMPILED)
    reference = scenario(p, swa, ExecutorKind.REFERENCE)
    assert compiled["state"] == "committed"
    assert compiled == reference
