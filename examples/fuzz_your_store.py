"""Fuzz your own store with the kit: ``python examples/fuzz_your_store.py [--leaky]``.

`MemoryStore` stands in for your backend. `LeakyStore` plants a realistic bug, an
off-by-one in `evict`: the last page it is asked to drop stays, still offered by
`lookup` and `contains`.
`check_store` runs the kit's two machines on it (the store alone, then inside the whole
system); exit 0 when the store passes, 1 with the first failure.
"""

import sys

from unicache_fsm import MemoryStore
from unicache_fsm.testing import check_store


class LeakyStore(MemoryStore):
    def evict(self, keys, pool=None):  # type: ignore[no-untyped-def]
        return super().evict(keys[:-1], pool)  # the bug: keys[:-1]


if __name__ == "__main__":
    failure = check_store(LeakyStore if "--leaky" in sys.argv else MemoryStore, examples=100)
    print(failure or "the store passed both machines (100 programs each)")
    sys.exit(1 if failure else 0)
