"""The search's alphabet: every operation enabled in a state (`enabled_ops`).

Per request, its `begin` (LOOKUP: match and lock the device prefix), `load_back` (LOAD +
PREPARE), `release` (the request goes away mid-load) and `complete` (use the committed
load or recompute, insert, offload write-through); per request key, `compute` (insert
computed KV, offload write-through); the linker's `start` (a load batch), the store's
`progress`, `finish` (land/commit/abort loads), `poll` (offload completions); `evict` of
one FULL (and one SWA) page; `store_evict` of a stored node's last page and `store_lose`
of a loading page (each followed by the LOOKUP that demotes what the store lost);
`reset`; and with a host tier `backup` and `host_load`. Each store fault of the `Scope`
that applies to an operation's calls adds its variant (`variants.fault_variants`); the
wild faults' variants are made while the search runs (`variants.wild_variants`). An
operation that the tiny pools cannot serve (the harness cannot allocate) is refused when
it runs (`Refused`), so not enabled there.

Scope options add operations (each off by default, so a scope without them keeps its
states): ``unpinned``, per request a `begin` that leaves its matched prefix unpinned
until its LOAD (what other operations do to the prefix in that gap, the LOAD must
notice); ``corrupt``, per stored node a `corrupt` of its last KV page in the store;
``unrelated``, a `compute u` of a one-page key whose first page no request shares, not
offloaded (another prefix that takes the slots evictions free). Operations are listed in
a fixed order (requests by number, nodes by their path's tokens), so a search is
deterministic.
"""

from __future__ import annotations

from typing import Any

from unicache_fsm.linker.load import LoadState
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.serving.system import System
from unicache_fsm.testing.explore.faults import (
    BATCH_FAULTS,
    LOAD_FAULTS,
    LOOKUP_FAULTS,
    OFFLOAD_FAULTS,
    PROGRESS_FAULTS,
)
from unicache_fsm.testing.explore.helpers import path_key
from unicache_fsm.testing.explore.operations import Op, named_requests
from unicache_fsm.testing.explore.scope import EXTRA_TOKEN, Scope
from unicache_fsm.testing.explore.variants import fault_variants, punched


def enabled_ops(ns: dict[str, Any], scope: Scope) -> list[Op]:
    """Every operation the search may take from the state in `ns` (see the module docstring)."""
    s: System = ns["s"]
    lk = s.linker
    ops: list[Op] = []
    for i, req in named_requests(ns, scope):
        key = scope.key(i)
        compute = Op(f"compute {i}", f"s.compute('c{i}', {key}, settle=False)")
        ops += fault_variants(compute, OFFLOAD_FAULTS, scope)
        if req is None:
            begin = Op(f"begin {i}", f"r{i} = s.begin('r{i}', {(*key, EXTRA_TOKEN)}, load=False)")
            ops += fault_variants(begin, LOOKUP_FAULTS, scope)
            if scope.unpinned:  # nothing pins the matched prefix until the LOAD
                code = f"r{i} = s.begin('r{i}', {(*key, EXTRA_TOKEN)}, load=False, lock=False)"
                ops += fault_variants(Op(f"begin {i} unpinned", code), LOOKUP_FAULTS, scope)
            continue
        if req.rid not in s.requests:
            continue  # completed
        load = req.load
        if load is not None and load.state == LoadState.IDLE and not req.prepared:
            lb = Op(f"load_back {i}", f"r{i}.prepared = s.linker.load_back(r{i}.load)")
            ops += fault_variants(lb, LOAD_FAULTS, scope)
        if load is not None and load.in_flight and load.abort_pending is None:
            ops.append(Op(f"release {i}", f"s.linker.release_request('r{i}')"))
            ops.append(
                Op(
                    f"store_lose {i}",
                    f"s.store.evict([r{i}.load.tail_hashes[-1]]){punched(scope)}\nreverify(s)",
                )
            )
        if load is None or not load.in_flight:
            complete = Op(f"complete {i}", f"s.complete(r{i}, settle=False)")
            ops += fault_variants(complete, OFFLOAD_FAULTS, scope)
    if any(ld.state == LoadState.QUEUED for ld in lk.loads.values()):
        ops += fault_variants(Op("start", "s.linker.start_loading()"), BATCH_FAULTS, scope)
    if s.in_flight():
        ops += fault_variants(Op("progress", "s.store.progress()"), PROGRESS_FAULTS, scope)
        ops.append(Op("finish", "s.finish_loads()\nreverify(s)"))
    if lk.offloads:
        ops.append(Op("poll", "s.linker.poll_offloads()\nreverify(s)"))
    if scope.unrelated:  # another prefix, not offloaded: it takes what evictions freed
        ops.append(Op("compute u", f"s.compute('cu', {scope.unrelated_key}, offload=False)"))
    p = scope.page_size
    ops.append(Op("evict", f"s.tree.evict(EvictParams(num_tokens={p}))"))
    if scope.swa:
        ops.append(Op("evict_swa", f"s.tree.evict(EvictParams(swa_num_tokens={p}))"))
    for node in sorted(s.stored_nodes(), key=path_key):
        path = path_key(node)
        last = f"node_at(s, {path}).hashes[-1]"
        ops.append(
            Op(
                f"store_evict {list(path)}",
                f"s.store.evict([{last}]){punched(scope)}\nreverify(s)",
            )
        )
        if scope.corrupt and node.hashes and s.memory.contains(PoolName.KV, node.hashes[-1]):
            ops.append(Op(f"corrupt {list(path)}", f"corrupt(s, {last})"))
    if lk.busy() or lk.loads:
        ops.append(Op("reset", "s.linker.reset()"))
    if scope.host_pages:
        for node in sorted(s.tree.nodes(), key=path_key):
            if node is s.tree.root:
                continue
            path = path_key(node)
            if node.device_resident and not node.backuped and not node.offloading:
                ops.append(Op(f"backup {list(path)}", f"s.tree.backup(node_at(s, {path}))"))
            if node.evicted and node.backuped:
                ops.append(Op(f"host_load {list(path)}", f"s.tree.load_back(node_at(s, {path}))"))
    return ops
