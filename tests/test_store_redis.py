"""`RedisStore` against a real `redis-server` on loopback: the whole store contract, the
public store machine, then what only a server has — clients sharing it, server-side
eviction (maxmemory + LRU), and the server killed and restarted under the store."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
import torch
from hypothesis import settings
from hypothesis.stateful import invariant

from redis_helpers import REDIS_SKIP, flush, fresh_namespace, open_store, shared_server
from test_store_file import as_version
from test_store_file_special import THIRD, prefix_recomputes_once
from test_store_memory import (
    KV,
    LargeRig,
    Rig,
    StoreContract,
    StoreFactory,
    drain,
    kv_lookup,
    load_now,
)
from unicache_fsm.hashing import page_hashes
from unicache_fsm.pools import KVPool, PagedAllocator
from unicache_fsm.pools.transfer import PoolName, PoolTransfer
from unicache_fsm.scheduler import SimConfig, Simulation
from unicache_fsm.store import (
    ExternalStore,
    LoadBatchResult,
    StoreConfigError,
    StoreFaultError,
    StoreUnavailableError,
)
from unicache_fsm.store import open_store as store_from_spec
from unicache_fsm.store.pageformat import HEADER_SIZE
from unicache_fsm.store.redis import RedisStore
from unicache_fsm.testing.redis_server import RedisServer
from unicache_fsm.testing.store_machine import StoreMachine
from unicache_fsm.testing.system import System

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


class TestRedisStoreLargePages(TestRedisStore):
    """The contract again with 128 KiB pages: these are copied straight into their
    reserved slots and checked there, not through the staging buffer."""

    failed_load_leaves_slots = False

    @pytest.fixture
    def rig(self) -> Rig:
        return LargeRig()


# -- the public store machine -----------------------------------------------------------------


class RedisStoreMachine(StoreMachine):
    """A bounded RedisStore (it evicts on its own); corruption flips a value's byte."""

    capacity_pages: ClassVar[int | None] = 24
    background: ClassVar[bool] = True

    def make_store(self) -> ExternalStore:
        return open_store(capacity_pages=self.capacity_pages, background=self.background)

    def corrupt(self, store: ExternalStore, pool: PoolName, key: str) -> None:
        """Flip a byte of the page's value, if it is still there: the store works in the
        background, so between the machine's `contains` and this call a load may have
        read the page corrupt (an earlier flip) and deleted it, or an offload evicted it."""
        assert isinstance(store, RedisStore)
        name = store.key_of(pool, key)
        value = store.client.get(name)
        if value is not None:
            damaged = bytearray(value)
            damaged[HEADER_SIZE] ^= 0xFF
            store.client.set(name, bytes(damaged), xx=True)  # xx: never re-create it

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
# a variant of the machine above: a third of the profile's programs
TestSyncRedisStoreMachine.settings = settings(
    settings.default, max_examples=max(10, settings.default.max_examples // 3)
)


# -- what only a server has ----------------------------------------------------------------------


def _offload(store: RedisStore, rig: Rig, n: int) -> tuple[list[str], torch.Tensor]:
    keys, src = rig.chain(n), rig.fill(KV, n)
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    return keys, src


def test_two_clients_in_one_namespace_share_pages() -> None:
    rig = Rig()
    a = open_store()
    b = RedisStore(shared_server().url, namespace=a.namespace)
    other = RedisStore(shared_server().url, namespace=a.namespace + "-other")
    for store in (a, b, other):
        store.attach(rig.pools)
    keys, src = _offload(a, rig, 3)
    assert b.lookup("r", kv_lookup(keys)) == [1, 2, 3]
    assert other.lookup("r", kv_lookup(keys)) == []  # namespaces are isolated
    dst = rig.alloc(KV, 3)
    assert load_now(b, "r", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    assert b.evict([keys[2]]) == 1
    assert a.lookup("r", kv_lookup(keys)) == [1, 2]
    a.check_invariants()
    for store in (a, b, other):
        store.close()
    flush()


def test_server_side_eviction_is_store_side_eviction() -> None:
    """A server with maxmemory and allkeys-lru drops pages on its own: LOOKUP stops
    reporting them, what it reports loads byte-exact, and the books follow."""
    with RedisServer(maxmemory=3 << 20) as server:
        pool = KVPool(256 * 4, 4, 2, 4096)  # 64 KiB pages
        pages = PagedAllocator(256 * 4, 4)
        store = RedisStore(server.url, background=False)
        store.attach({KV: pool})
        gen = torch.Generator().manual_seed(3)
        chains = []
        for c in range(12):  # 12 chains x 8 pages x 64 KiB = 6 MiB > 3 MiB
            keys = page_hashes(list(range(c * 1000, c * 1000 + 32)), 4)
            src = pages.alloc(32)
            assert src is not None
            pool.write_pages(src, torch.randn((32, 2, 4096), generator=gen).half())
            assert store.offload([PoolTransfer(KV, src, keys)])
            store.progress()
            assert store.pop_completed_offload()
            chains.append((keys, src))
        found = [store.lookup(f"r{i}", kv_lookup(keys)) for i, (keys, _) in enumerate(chains)]
        assert sum(len(f) for f in found) < 12 * 8, "the server evicted nothing"
        assert found[-1] == list(range(1, 9)), "the newest chain should have survived"
        for (keys, src), boundaries in zip(chains, found, strict=True):
            if not boundaries:
                continue
            n = boundaries[-1]
            dst = pages.alloc(n * 4)
            assert dst is not None
            # the server may evict more meanwhile (a GET's reply buffers count against
            # maxmemory): then the load is refused, or fails, as the protocol allows
            if store.load("x", [PoolTransfer(KV, dst, keys[:n])]):
                store.start_loading()
                store.progress()
                if store.pop_completed_load().success:
                    assert torch.equal(pool.read_pages(dst), pool.read_pages(src[: n * 4]))
            pages.free(dst)
        store.check_invariants()
        info = redis.Redis.from_url(server.url).info("stats")
        assert int(info["evicted_keys"]) > 0
        present = sum(store.contains(KV, k) for keys, _ in chains for k in keys)
        assert store.num_pages == present  # the books forgot what the server dropped
        store.close()


def test_an_offload_the_server_refuses_fails_and_the_connection_stays_in_step() -> None:
    """A server that refuses writes (maxmemory, ``noeviction``) answers some SETs of an
    offload with an error: the offload completes False, publishes nothing it did not
    store, and the store's next calls (on the same connection) get their own answers."""
    with RedisServer(maxmemory=3 << 20, policy="noeviction") as server:
        pool = KVPool(256 * 4, 4, 2, 4096)  # 64 KiB pages
        pages = PagedAllocator(256 * 4, 4)
        store = RedisStore(server.url, background=False)
        store.attach({KV: pool})
        gen = torch.Generator().manual_seed(4)
        small = page_hashes(list(range(8)), 4)
        kept = pages.alloc(8)
        assert kept is not None
        pool.write_pages(kept, torch.randn((8, 2, 4096), generator=gen).half())
        assert store.offload([PoolTransfer(KV, kept, small)])
        store.progress()
        assert store.pop_completed_offload()
        keys = page_hashes(list(range(1000, 1000 + 4 * 96)), 4)  # 96 x 64 KiB = 6 MiB
        src = pages.alloc(4 * 96)
        assert src is not None
        pool.write_pages(src, torch.randn((4 * 96, 2, 4096), generator=gen).half())
        assert store.offload([PoolTransfer(KV, src, keys)])
        store.progress()
        assert store.pop_completed_offload() is False
        assert isinstance(store.last_error, redis.ResponseError)
        assert "maxmemory" in str(store.last_error)
        assert store.lookup("a", kv_lookup(small)) == [1, 2]  # one answer per call
        dst = pages.alloc(8)
        assert dst is not None
        assert load_now(store, "a", [PoolTransfer(KV, dst, small)])
        assert torch.equal(pool.read_pages(dst), pool.read_pages(kept))
        stored = store.lookup("b", kv_lookup(keys))  # what did land is whole
        if stored:
            n = stored[-1]
            back = pages.alloc(4 * n)
            assert back is not None
            assert load_now(store, "b", [PoolTransfer(KV, back, keys[:n])])
            assert torch.equal(pool.read_pages(back), pool.read_pages(src[: 4 * n]))
        store.check_invariants()
        store.close()


def test_server_eviction_demotes_stored_nodes_in_the_system() -> None:
    """The linker's verify_stored demotes a node whose pages the server evicted."""
    with RedisServer(maxmemory=2 << 20) as server:
        s = System.build(4, store_factory=lambda: RedisStore(server.url, background=False))
        s.check_stored = False
        key = tuple(range(100, 124))
        req = s.compute("a", key)
        assert req.offload is not None and req.offload.state == "published"
        stored = s.stored_nodes()
        assert stored
        filler = redis.Redis.from_url(server.url)
        for i in range(64):  # another client's data pushes the pages out (LRU)
            filler.set(f"filler:{i}", b"x" * (64 << 10))
        filler.close()
        for node in stored:
            s.linker.verify_stored(node)
        assert not s.stored_nodes(), "stored nodes whose pages were evicted must be demoted"
        s.evict_all()
        again = s.serve("b", key)  # a miss now: computed, not loaded
        assert again.outcome in ("computed", "miss")
        s.audit()
        s.store.close()


def test_server_killed_and_restarted_under_the_store() -> None:
    """While the server is down every call is a fault of its own; after a restart the
    store reconnects by itself; nothing stale or partial is ever served."""
    rig = Rig()
    with RedisServer() as server:
        store = RedisStore(server.url, background=False)
        store.attach(rig.pools)
        keys, src = _offload(store, rig, 3)
        dst = rig.alloc(KV, 3)
        assert store.load("queued", [PoolTransfer(KV, dst, keys)])
        server.kill()
        with pytest.raises(StoreFaultError):
            store.lookup("r", kv_lookup(keys))
        with pytest.raises(StoreFaultError):
            store.load("r2", [PoolTransfer(KV, rig.alloc(KV, 3), keys)])
        with pytest.raises(StoreFaultError):
            store.evict(keys)
        assert store.offload([PoolTransfer(KV, rig.fill(KV, 2), rig.chain(2))])
        before = rig.read(KV, dst).clone()
        batch = store.start_loading()
        store.progress()
        loads, offloads = drain(store)
        assert loads == [LoadBatchResult(batch, ("queued",), False)] and offloads == [False]
        assert torch.equal(rig.read(KV, dst), before)
        assert store.last_error is not None
        server.restart()  # no persistence: the restarted server holds nothing
        assert store.lookup("r", kv_lookup(keys)) == []
        assert store.num_pages == 0  # the books forgot the lost pages
        keys, src = _offload(store, rig, 3)
        assert load_now(store, "again", [PoolTransfer(KV, dst, keys)])
        assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
        store.close()


def test_simulation_completes_when_the_server_is_killed_and_restarted() -> None:
    """`simulate --store redis://...` with the server SIGKILLed mid-run and restarted:
    every request is served, every committed load matches recompute, and loads from the
    store resume after the restart."""
    with RedisServer() as server:
        sim = Simulation(SimConfig(requests=240, pool_tokens=4096, store=server.url, audit_every=1))
        committed: dict[str, int] = {}

        def chaos(done: int, total: int) -> None:
            if done >= total // 3 and not committed:
                server.kill()
                committed["at kill"] = sim.linker.stats.loads_committed
            elif len(committed) == 1 and done >= total // 2:
                server.restart()
                committed["at restart"] = sim.linker.stats.loads_committed

        report = sim.run(progress=chaos)
        assert list(committed) == ["at kill", "at restart"]
        assert report.requests_served == 240
        assert report.offloads_failed > 0 and sim.linker.stats.lookup_faults > 0  # felt
        assert report.loads_committed > committed["at restart"] > 0  # and recovered from
        assert report.loads_verified == report.loads_committed
        assert report.loads_mismatched == 0


def test_bad_arguments_are_typed_errors() -> None:
    url = shared_server().url
    for bad in ("", "a:b", "../x", 3):
        with pytest.raises(StoreConfigError) as info:
            RedisStore(url, namespace=bad)  # type: ignore[arg-type]
        assert info.value.argument == "namespace"
    with pytest.raises(StoreConfigError, match="Redis URL"):
        RedisStore("http://localhost:1")
    with pytest.raises(StoreConfigError):
        RedisStore(url, timeout=0)
    with pytest.raises(StoreConfigError):
        RedisStore(url, capacity_pages=0)


def test_wrong_typed_arguments_are_typed_errors_naming_them() -> None:
    """Regression: `RedisStore(42)` raised `AttributeError` from deep in redis-py."""
    url = shared_server().url
    for argument, options in [
        ("url", {"url": 42}),
        ("url", {"url": None}),
        ("url", {"url": b"redis://127.0.0.1:6379"}),
        ("timeout", {"url": url, "timeout": "5"}),
        ("background", {"url": url, "background": "no"}),
        ("history", {"url": url, "history": 1.5}),
    ]:
        with pytest.raises(StoreConfigError) as info:
            RedisStore(**options)  # type: ignore[arg-type]
        assert info.value.argument == argument, options


def _unavailable(url: str, **options: Any) -> StoreUnavailableError:
    with pytest.raises(StoreUnavailableError) as info:
        RedisStore(url, **options)
    error = info.value
    assert isinstance(error, StoreConfigError) and error.argument == "url"
    assert error.value == url and url in str(error)
    assert len(str(error).splitlines()) == 1
    return error


def test_a_server_that_is_not_listening_is_refused_at_open() -> None:
    """Regression: the store opened, and every later call failed one by one."""
    server = RedisServer()
    server.start()
    url = server.url
    server.stop()  # the port is free now: nothing listens there
    _unavailable(url)
    with pytest.raises(StoreUnavailableError, match="cannot reach the Redis server"):
        store_from_spec(url)  # the CLI's --store redis://...


def test_a_peer_that_never_answers_is_refused_at_open_within_the_timeout() -> None:
    """Something listens but never speaks Redis: opening gives up after `timeout`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
        _unavailable(url, timeout=0.5)


def test_foreign_values_under_our_keys_are_never_served() -> None:
    """Garbage, a truncated value and another page's whole value, each under a page's
    key: LOOKUP sees a key, but the load fails with nothing written, and the value is
    deleted so it is never offered again."""
    rig = Rig()
    store = open_store(background=False)
    store.attach(rig.pools)
    keys, _ = _offload(store, rig, 4)
    client = store.client
    other = client.get(store.key_of(KV, keys[0]))
    assert other is not None
    client.set(store.key_of(KV, keys[1]), b"garbage")
    client.set(store.key_of(KV, keys[2]), other[:-1])
    client.set(store.key_of(KV, keys[3]), other)  # a whole page, but not this key's
    for i in (3, 2, 1):  # chain end first: a bad page also drops the chain after it
        dst = rig.alloc(KV, 1)
        before = rig.read(KV, dst).clone()
        assert store.contains(KV, keys[i])
        assert not load_now(store, f"r{i}", [PoolTransfer(KV, dst, keys[i : i + 1])])
        assert torch.equal(rig.read(KV, dst), before)
        assert not store.contains(KV, keys[i])
    assert store.lookup("r", kv_lookup(keys)) == [1]
    store.check_invariants()
    store.close()
    flush()


def _other_type(client: redis.Redis, name: str, kind: str) -> None:
    """Replace the value at `name` by a value of another Redis type."""
    client.delete(name)
    if kind == "list":
        client.rpush(name, b"x")
    elif kind == "hash":
        client.hset(name, "field", b"x")
    elif kind == "set":
        client.sadd(name, b"x")
    else:
        client.zadd(name, {b"x": 1.0})


OTHER_TYPES = ["list", "hash", "set", "zset"]


@pytest.mark.parametrize("kind", OTHER_TYPES)
def test_a_value_of_another_type_is_an_unreadable_page_dropped_with_its_chain(kind: str) -> None:
    """Regression: a list or hash under a page key was offered, its load failed
    (WRONGTYPE), it stayed, and write-once offloads never replaced it: every request for
    the prefix loaded, failed and recomputed, forever."""
    rig = Rig()
    store = open_store(background=False)
    store.attach(rig.pools)
    keys, src = _offload(store, rig, 4)
    _other_type(store.client, store.key_of(KV, keys[1]), kind)
    assert store.lookup("r", kv_lookup(keys)) == [1, 2, 3, 4]  # a key exists: offered once
    dst = rig.alloc(KV, 4)
    before = rig.read(KV, dst).clone()
    assert not load_now(store, "r", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), before)
    assert store.lookup("r", kv_lookup(keys)) == [1]
    assert [store.client.exists(store.key_of(KV, k)) for k in keys] == [1, 0, 0, 0]
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    assert load_now(store, "again", [PoolTransfer(KV, dst, keys)])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src))
    store.check_invariants()
    store.close()
    flush()


@pytest.mark.parametrize("kind", ["list", "hash"])
def test_a_prefix_with_a_value_of_another_type_recomputes_once_then_loads(
    kind: str, tmp_path: Path
) -> None:
    """End to end on the real server: systems sharing a namespace (as processes would)."""
    namespace = fresh_namespace()

    def make() -> RedisStore:
        return RedisStore(shared_server().url, namespace=namespace, background=False)

    def poison(store: ExternalStore) -> None:
        assert isinstance(store, RedisStore)
        _other_type(store.client, store.key_of(KV, THIRD), kind)

    prefix_recomputes_once(make, poison, tmp_path)
    flush()


def test_values_of_the_old_format_version_are_never_served() -> None:
    """A value another client wrote as format version 1 (whose checksum was another
    function), otherwise intact: the load fails with nothing written and the value is
    deleted; the page before it still loads."""
    rig = Rig()
    store = open_store(background=False)
    store.attach(rig.pools)
    keys, src = _offload(store, rig, 3)
    name = store.key_of(KV, keys[2])
    value = store.client.get(name)
    assert value is not None
    store.client.set(name, as_version(value, 1), xx=True)
    dst = rig.alloc(KV, 1)
    before = rig.read(KV, dst).clone()
    assert store.contains(KV, keys[2])
    assert not load_now(store, "r", [PoolTransfer(KV, dst, keys[2:])])
    assert torch.equal(rig.read(KV, dst), before)
    assert not store.contains(KV, keys[2]) and store.client.get(name) is None
    assert load_now(store, "r", [PoolTransfer(KV, dst, keys[1:2])])
    assert torch.equal(rig.read(KV, dst), rig.read(KV, src[Rig.P : 2 * Rig.P]))
    store.close()
    flush()


def test_a_page_evicted_while_its_offload_runs_is_written_again_next_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (found by the background machine): an evict between an offload's
    write and its bookkeeping left the books claiming a page the server lacked, and the
    next offload of that page skipped it yet completed True."""
    rig = Rig()
    store = open_store(background=False)
    store.attach(rig.pools)
    keys, src = rig.chain(2), rig.fill(KV, 2)
    write = RedisStore.medium_write

    def write_then_evict(self: RedisStore, pool: PoolName, pages: Any) -> None:
        write(self, pool, pages)
        self.evict([key for key, _, _ in pages])  # another thread, in the window

    monkeypatch.setattr(RedisStore, "medium_write", write_then_evict)
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    monkeypatch.undo()
    assert store.offload([PoolTransfer(KV, src, keys)])
    store.progress()
    assert drain(store)[1] == [True]
    assert store.contains(KV, keys[0]) and store.contains(KV, keys[1])
    store.close()
    flush()
