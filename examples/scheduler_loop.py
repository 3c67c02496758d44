"""Embed the load machine in your own loop: ``python examples/scheduler_loop.py``.

`System` wires the pools, the radix tree, a store and the linker. Each request is
three calls, the way a scheduler step drives it: `begin` (match the device prefix,
LOOKUP the rest in the store, LOAD + PREPARE a hit), `drive` (the store lands the pages;
COMMIT or ABORT), `complete` (compute what is left, insert, offload). Request "b" shares
"a"'s 128-token prefix; after the device cache is evicted it loads that prefix back
from the store instead of computing it. Exit 0 when exactly that load committed.
"""

import sys

from unicache_fsm import EvictParams, System

system = System.build(page_size=16)
shared = tuple(range(1000, 1128))  # 8 pages both requests share
for rid, tail in (("a", (7, 8, 9)), ("b", (40, 41))):
    req = system.begin(rid, (*shared, *tail))  # LOOKUP, LOAD + PREPARE
    system.drive()  # the store lands the pages: COMMIT (or ABORT: recompute)
    system.complete(req)  # compute the rest, insert, offload the new pages
    loaded = system.linker.stats.pages_loaded
    print(f"request {rid}: {req.outcome and req.outcome.value}, {loaded} pages loaded so far")
    system.tree.evict(EvictParams(num_tokens=10**9))  # memory pressure
system.audit()  # every invariant: slots, locks, stored pages, KV bytes
sys.exit(0 if system.linker.stats.loads_committed == 1 else 1)
