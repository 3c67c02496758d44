"""Embedding the external linker in your own scheduler loop (about 100 lines).

Two requests share a 128-token prefix. The first computes it and offloads it to the
embedded memory store; the device cache is then evicted (as memory pressure would);
the second request finds the prefix in the store, loads it, and gets the same KV
bytes back. Every load, offload and node residency change is a machine transition:
the loop below only calls plain methods.

Run: ``python examples/scheduler_loop.py``.
"""

from __future__ import annotations

import torch

from unicache_fsm.linker.linker import ExternalLinker
from unicache_fsm.pools import KVPool, PagedAllocator
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.tree import EvictParams, InsertParams, RadixTree, TreeConfig

P = 16  # page size
LAYERS, WIDTH = 4, 32


def forward(kv: KVPool, slots: torch.Tensor, tokens: tuple[int, ...], start: int) -> None:
    """Stand-in for the model: KV of each position derived from its token prefix."""
    running = torch.tensor(tokens, dtype=torch.float32).cumsum(0)[start:]
    grid = torch.arange(LAYERS * WIDTH, dtype=torch.float32).reshape(LAYERS, WIDTH)
    rows = torch.sin(running[:, None, None] * 0.001 * (grid + 1)).to(kv.dtype)
    padded = torch.zeros(slots.numel(), LAYERS, WIDTH, dtype=kv.dtype)
    padded[: rows.shape[0]] = rows
    kv.write_pages(slots, padded)


def serve(linker: ExternalLinker, kv: KVPool, rid: str, tokens: tuple[int, ...]) -> torch.Tensor:
    """One request through match -> load -> forward -> insert -> offload; its FULL slots."""
    tree, store, alloc = linker.tree, linker.store, linker.tree.allocator
    # 1. match: device prefix + LOOKUP of the rest in the store
    m = linker.match(rid, tokens)
    node, prefix, start = m.device.last_device_node, m.device.device_indices, m.device.prefix_len
    tree.inc_lock_ref(node)
    # 2. load what the store can restore (PREPARE reserves slots, COMMIT publishes them)
    if m.load is not None and linker.load_back(m.load):
        linker.start_loading()
        store.progress()  # a real store lands pages asynchronously, layer by layer
        for load in linker.finish_loads():
            if load.committed_ok and load.slots is not None and load.endpoint:
                tree.dec_lock_ref(node)  # COMMIT handed us a lock on the loaded path's end
                node, prefix, start = load.endpoint, load.slots, load.prefix_len
    # 3. compute the rest (allocating, evicting the shortfall first)
    need = -(-(len(tokens) - start) // P) * P
    if need > alloc.available_size():
        tree.evict(EvictParams(num_tokens=need - alloc.available_size()))
    own = alloc.alloc(need)
    assert own is not None, "pool too small"
    forward(kv, own, tokens, start)
    # 4. insert the whole pages; the tree adopts our slots and frees duplicates
    aligned = len(tokens) // P * P
    slots = torch.cat([prefix, own])
    result = tree.insert(InsertParams(tokens[:aligned], slots[:aligned], prev_prefix_len=start))
    if own.numel() > aligned - start:
        alloc.free(own[aligned - start :])  # the partial last page stays ours: free it
    # 5. write-through: offload the new chain, and complete what the store finished
    linker.offload_nodes(result.write_through)
    store.progress()
    linker.poll_offloads()
    tree.dec_lock_ref(node)
    return slots[:aligned]


def main() -> int:
    alloc = PagedAllocator(1024, P)
    kv = KVPool(1024, P, LAYERS, WIDTH)
    tree = RadixTree(alloc, TreeConfig(write_through_threshold=1), kv_pool=kv)
    store = MemoryStore()
    store.attach({PoolName.KV: kv})
    linker = ExternalLinker(tree, store)

    shared = tuple(range(1000, 1128))  # 128 tokens = 8 pages
    first = serve(linker, kv, "req-a", (*shared, 7, 8, 9))
    bytes_a = kv.read_pages(first[:128]).clone()

    tree.evict(EvictParams(num_tokens=10**9))  # memory pressure: the device copy is gone
    second = serve(linker, kv, "req-b", (*shared, 40, 41))
    bytes_b = kv.read_pages(second[:128])

    tree.check()
    same = torch.equal(bytes_a, bytes_b)
    print(f"loaded from the store: {linker.stats.pages_loaded} pages; KV identical: {same}")
    print(f"linker stats: {linker.describe()}")
    return 0 if same and linker.stats.loads_committed == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
