"""`MemoryStoreMachine`: the store machine over the embedded `MemoryStore` (the kit's
reference subclass, and the example of one)."""

from __future__ import annotations

from typing import ClassVar

from hypothesis.stateful import invariant

from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.testing.store_machine.devices import DeviceFault
from unicache_fsm.testing.store_machine.machine import StoreMachine


class MemoryStoreMachine(StoreMachine):
    """The reference subclass: the embedded `MemoryStore`, with `capacity_pages` small
    enough that it evicts on its own (so it is not lossless); corruption flips a stored
    page's first 8 bytes through `MemoryStore.stored_bytes`."""

    capacity_pages: ClassVar[int | None] = 24
    background: ClassVar[bool] = False
    device_faults = True

    def make_store(self) -> ExternalStore:
        return MemoryStore(capacity_pages=self.capacity_pages, background=self.background)

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        assert isinstance(store, MemoryStore)
        view = store.stored_bytes(pool, key)
        assert view is not None, "corrupt_page checks contains() first"
        view[:8] ^= 0xFF

    @invariant()
    def no_swallowed_error(self) -> None:
        store = self.store
        assert isinstance(store, MemoryStore)
        error = store.last_error
        assert error is None or isinstance(error, DeviceFault), f"the store swallowed {error!r}"
