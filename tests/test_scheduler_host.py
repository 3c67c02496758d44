"""The host tier in the scheduler (`scheduler.host.HostPolicy`, ``simulate --host-tokens``):
host hits are the tokens the host really added to a request's prefix, and making room
on the host never undoes the backup it makes room for."""

from __future__ import annotations

import pytest
import torch

from unicache_fsm.pools.kv import KVPool


def test_host_policy_counts_tokens_a_partial_load_back_brought_back() -> None:
    """When the tree loads the first evicted node back and then runs short on the
    second, `RadixTree.load_back` returns False with the first node resident again: the
    policy's answer (the device prefix before) lets the caller count those tokens as
    host hits (they were once booked as device hits)."""
    from unicache_fsm.pools import PagedAllocator
    from unicache_fsm.pools.host import HostKVPool
    from unicache_fsm.scheduler.host import HostPolicy
    from unicache_fsm.tree import EvictParams, InsertParams, RadixTree, TreeConfig

    alloc = PagedAllocator(8, 1)
    tree = RadixTree(
        alloc,
        TreeConfig(),
        kv_pool=KVPool(8, 1, 1, 2),
        host_pool=HostKVPool(16, 1, 1, 2),
        host_allocator=PagedAllocator(16, 1),
    )

    def serve(key: tuple[int, ...]):
        m = tree.match_prefix(key)
        fresh = alloc.alloc(len(key) - m.prefix_len)
        assert fresh is not None
        value = torch.cat([m.device_indices, fresh])
        return tree.insert(InsertParams(key, value, prev_prefix_len=m.prefix_len))

    key = (1, 2, 3, 4, 5, 6, 7, 8)
    serve(key[:4])
    end = serve(key).last_device_node
    policy = HostPolicy(tree)
    assert policy.backup(end)
    tree.evict(EvictParams(num_tokens=8))  # both nodes now live on the host only
    other = serve((9, 9, 9, 9)).last_device_node
    tree.inc_lock_ref(other)  # half the device pool stays taken
    assert tree.match_prefix(key).prefix_len == 0
    before = policy.load_back(key, None)
    now = tree.match_prefix(key).prefix_len
    assert (before, now) == (0, 4)  # the first node came back, the second did not


def test_host_policy_never_drops_a_backup_on_the_path_it_is_backing_up() -> None:
    """Making room never drops the host copy of an ancestor of the node being backed up
    (it has no backed-up child: the new leaf is not backed up yet): that would grow the
    chain to copy beyond the room made and fail the backup, while dropping the copy of
    a resident node off the path (C) frees the room."""
    from unicache_fsm.pools import PagedAllocator
    from unicache_fsm.pools.host import HostKVPool
    from unicache_fsm.scheduler.host import HostPolicy
    from unicache_fsm.tree import InsertParams, RadixTree, TreeConfig

    alloc = PagedAllocator(32, 1)
    host_alloc = PagedAllocator(8, 1)
    tree = RadixTree(
        alloc,
        TreeConfig(),
        kv_pool=KVPool(32, 1, 1, 2),
        host_pool=HostKVPool(8, 1, 1, 2),
        host_allocator=host_alloc,
    )

    def serve(key: tuple[int, ...]):
        m = tree.match_prefix(key)
        fresh = alloc.alloc(len(key) - m.prefix_len)
        assert fresh is not None
        value = torch.cat([m.device_indices, fresh])
        return tree.insert(InsertParams(key, value, prev_prefix_len=m.prefix_len)).last_device_node

    policy = HostPolicy(tree)
    a = serve((1, 1, 1, 1))
    assert policy.backup(a)
    c = serve((2, 2, 2, 2))
    assert policy.backup(c) and host_alloc.available_size() == 0
    b = serve((1, 1, 1, 1, 3, 3, 3, 3))  # below A
    tree.match_prefix((2, 2, 2, 2))  # C is the most recently used
    assert policy.backup(b), "room existed (C's copy) but the backup of B failed"
    assert a.backuped and b.backuped


def test_simulate_host_hits_are_tokens_the_host_added_to_the_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`simulate` books ``min(HostPolicy.load_back(...), prefix_len)`` as host hits. With
    SWA, a node loaded back from the host has no live window (only FULL comes back), so
    the match cuts it off again: the prefix does not grow, yet the tokens are booked as
    host hits (and taken off the device hits). Host hits must never exceed what the
    prefix gained over the device prefix the request had before the load back."""
    from unicache_fsm.scheduler import host as host_mod
    from unicache_fsm.scheduler.simulation import SimConfig, Simulation
    from unicache_fsm.serving.system import System

    seen: dict[str, int] = {"before": -1, "gained": 0, "loaded_back": 0}
    load_back, begin = host_mod.HostPolicy.load_back, System.begin

    def spy_load_back(self, key, namespace):  # type: ignore[no-untyped-def]
        m = self.tree.match_prefix(key, namespace)
        seen["before"] = m.prefix_len
        seen["loaded_back"] += m.host_hit_length
        return load_back(self, key, namespace)

    def spy_begin(self, rid, key, **kw):  # type: ignore[no-untyped-def]
        req = begin(self, rid, key, **kw)
        if seen["before"] >= 0:
            seen["gained"] += max(0, req.prefix_len - seen["before"])
        seen["before"] = -1
        return req

    monkeypatch.setattr(host_mod.HostPolicy, "load_back", spy_load_back)
    monkeypatch.setattr(System, "begin", spy_begin)
    config = SimConfig(
        workload="agentic",
        requests=60,
        page_size=4,
        pool_tokens=1024,
        host_tokens=4096,
        swa_window=40,
        prompt_len=64,
        output_len=8,
        width=8,
        chunk_size=64,
        seed=5,
    )
    report = Simulation(config).run()
    assert report.host_hit_tokens == seen["gained"], (report.host_hit_tokens, seen["gained"])
    assert seen["loaded_back"] > seen["gained"]  # SWA: some loaded-back nodes extend nothing
