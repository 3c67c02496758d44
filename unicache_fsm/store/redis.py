"""A store of pages in Redis (or Valkey): `RedisStore(url)`, through redis-py.

`RedisStore(url="redis://127.0.0.1:6379/0", *, namespace="default",
capacity_pages=None, background=True, history=256, staging_bytes=64 MiB,
timeout=5.0)` implements every
primitive of `unicache_fsm.store.protocol`; queues, completions, the worker and capacity
eviction from chain ends are `unicache_fsm.store.base.BaseStore`'s; checked loads,
checksummed write-once offloads, and learning and forgetting pages other clients wrote
or the server evicted are `unicache_fsm.store.shared.SharedStore`'s. What Redis adds:

- One key per page, ``unicache:<namespace>:<pool>:<page key>``; its value is the
  `pageformat` header (key, parent, pool, length, checksum) followed by the page's
  bytes, so a value is checked on its own and never half of a page (a SET is atomic).
  Use one namespace per model and KV layout.
- Pipelined: one round trip of EXISTS per LOOKUP / `load` / `contains` (per pool), of
  ``SET NX`` per offloaded transfer (write-once: an existing key is left as it is), of
  GET per loaded transfer, of DEL per `evict`; SETs and GETs take one round trip per
  `PIPELINE_BYTES` (64 MiB) of values. An offload's SETs are framed here and sent
  through the client's connection as separate buffers (header, then the page straight
  from the pool), so no page is copied into a joined value on the way; the server sees
  ordinary ``SET key value NX`` commands.
- Loads and offloads run off the caller's thread by default (``background=True``); their
  completions come through the protocol as for every store.
- A value under a page key that is not one whole page of this format (torn, foreign,
  of another type: a list, a hash, a set) is unreadable: its load fails and the page is
  deleted with the chain stored after it, like a torn one, so LOOKUP stops offering it
  and a later offload stores the prefix again.
- Server-side eviction (``maxmemory`` with an LRU policy) is store-side eviction: LOOKUP
  asks the server, so it stops reporting evicted pages (and the linker's
  `verify_stored` demotes their nodes); a load of an evicted page fails its batch.
- A lost connection is a fault of the calls in flight: `lookup`, `load`, `contains`
  and `evict` raise `StoreFaultError`; a running offload completes False, a running load
  batch fails. The client reconnects by itself on the next call (one immediate retry,
  then the fault), and values are checked, so nothing stale or partial is ever served.
- Opening pings the server: one that does not answer within `timeout` (nothing
  listening, a wrong password, not Redis) is refused at once with
  `StoreUnavailableError` naming the URL. `timeout` bounds every wait on the server
  (above 0, at most a day); a URL's ``?socket_timeout=`` or ``?socket_connect_timeout=``
  replaces it and is bounded alike (`StoreConfigError` naming the URL otherwise).
- `client` is the `redis.Redis` in use; `close()` releases its connections.

redis-py is an optional dependency (``pip install unicache-fsm[redis]``); without it the
constructor raises `StoreConfigError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.base import check_seconds
from unicache_fsm.store.checksum import page_checksum
from unicache_fsm.store.errors import (
    StoreConfigError,
    StoreFaultError,
    StoreUnavailableError,
)
from unicache_fsm.store.pageformat import HEADER_SIZE, decode_header
from unicache_fsm.store.shared import PageRead, PageWrite, SharedStore, TornPage
from unicache_fsm.store.staging import DEFAULT_STAGING_BYTES

if TYPE_CHECKING:
    import redis as redis_py

__all__ = ["KEY_PREFIX", "PIPELINE_BYTES", "RedisStore"]

KEY_PREFIX = "unicache"
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PIPELINE_BYTES = 64 << 20  # one pipeline carries at most this much page data
T = TypeVar("T")


def _set_nx_frames(
    name: str, header: bytes, payload: memoryview
) -> tuple[bytes, memoryview, bytes]:
    """``SET name <header + payload> NX`` in the Redis protocol (RESP) as three buffers:
    the command up to and including the header, the payload itself (sent from where it
    lies, say the KV pool: no joined copy of the page), and the rest. The server sees one
    ordinary SET of one value."""
    key = name.encode("ascii")
    length = len(header) + payload.nbytes
    head = b"*4\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s" % (len(key), key, length, header)
    return head, payload, b"\r\n$2\r\nNX\r\n"


class RedisStore(SharedStore):
    """Pages in Redis; see the module docstring."""

    worker_name = "unicache-redis-store"

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        namespace: str = "default",
        capacity_pages: int | None = None,
        background: bool = True,
        history: int = 256,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(
            capacity_pages=capacity_pages,
            background=background,
            history=history,
            staging_bytes=staging_bytes,
        )
        given: object = url
        if not isinstance(given, str):
            msg = f"url must be a Redis URL string (redis://HOST:PORT[/DB]), got {url!r}"
            raise StoreConfigError(msg, argument="url", value=url)
        if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
            msg = f"namespace must match [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}, got {namespace!r}"
            raise StoreConfigError(msg, argument="namespace", value=namespace)
        timeout = check_seconds("timeout", timeout)
        try:
            import redis as redis_py
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            msg = "RedisStore needs redis-py: pip install 'unicache-fsm[redis]'"
            raise StoreConfigError(msg, argument="url", value=url) from exc
        try:
            self.client: redis_py.Redis = redis_py.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 1),
            )
        except (ValueError, TypeError) as exc:
            msg = f"not a Redis URL (redis://HOST:PORT[/DB], rediss://, unix://): {url!r}"
            raise StoreConfigError(msg, argument="url", value=url) from exc
        # a URL's own ``?socket_timeout=`` / ``?socket_connect_timeout=`` replace `timeout`:
        # they are bounded alike (an endless or overflowing one would hang or crash a call)
        settings = self.client.connection_pool.connection_kwargs
        for option in ("socket_timeout", "socket_connect_timeout"):
            try:
                check_seconds(option, settings.get(option))
            except StoreConfigError as exc:
                self.client.close()
                msg = f"url {url!r}: {exc}"
                raise StoreConfigError(msg, argument="url", value=url) from None
        self._errors: tuple[type[BaseException], ...] = (redis_py.RedisError, OSError)
        self._reply_error: type[Exception] = redis_py.ResponseError
        self.url = url
        self.namespace = namespace
        self._prefix = f"{KEY_PREFIX}:{namespace}:"
        self._reach()
        self.start_worker()

    def _reach(self) -> None:
        """Refuse a server that does not answer now (`StoreUnavailableError`, one line
        naming the URL): a store that cannot be reached is refused when it is opened,
        not discovered as one failed call after another."""
        unreachable: tuple[type[BaseException], ...] = (*self._errors, ValueError)
        try:
            self.client.ping()
        except unreachable as exc:
            self.client.close()
            cause = " ".join(str(exc).split()) or type(exc).__name__
            msg = f"cannot reach the Redis server at {self.url}: {cause}"
            raise StoreUnavailableError(msg, argument="url", value=self.url) from exc

    def __repr__(self) -> str:
        return (
            f"RedisStore({self.url!r}, namespace={self.namespace!r}, "
            f"capacity_pages={self.capacity_pages!r}, background={self.background!r})"
        )

    def key_of(self, pool: PoolName, key: str) -> str:
        """The Redis key of page (`pool`, `key`)."""
        return f"{self._prefix}{pool.value}:{key}"

    # -- the medium --------------------------------------------------------------------

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        """Run `fn`; a Redis or socket failure becomes a `StoreFaultError` of `operation`."""
        try:
            return fn()
        except self._errors as exc:
            msg = f"{operation}: the Redis server at {self.url} failed: {exc}"
            raise StoreFaultError(msg, operation=operation) from exc

    def _pipelined(
        self, commands: Sequence[tuple[Any, ...]], *, raise_on_error: bool = True
    ) -> list[Any]:
        """The replies to `commands`, sent in one round trip; with ``raise_on_error=False``
        an error reply is returned in its command's place (an exception instance)."""
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        return list(pipe.execute(raise_on_error=raise_on_error))

    def medium_exists(self, pool: PoolName, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        commands = [("EXISTS", self.key_of(pool, k)) for k in keys]
        answers = self._call("lookup", lambda: self._pipelined(commands))
        return [bool(a) for a in answers]

    def medium_write(self, pool: PoolName, pages: Sequence[PageWrite]) -> None:
        frames: list[bytes | memoryview] = []
        tail = b""  # the previous command's end, sent with the next one's start
        count = size = 0
        for key, header, payload in pages:
            head, body, end = _set_nx_frames(self.key_of(pool, key), header, payload)
            frames += [tail + head, body]
            tail = end
            count += 1
            size += len(header) + payload.nbytes
            if size >= PIPELINE_BYTES:
                self._send_sets([*frames, tail], count)
                frames, tail, count, size = [], b"", 0, 0
        if count:
            self._send_sets([*frames, tail], count)

    def _send_sets(self, frames: list[bytes | memoryview], count: int) -> None:
        """Send `count` framed commands in one round trip and read every reply (the first
        error reply is raised once all are read, so the connection stays in step)."""
        pool = self.client.connection_pool
        conn = pool.get_connection()

        def round_trip() -> Exception | None:
            conn.send_packed_command(frames)  # type: ignore[no-untyped-call]
            first: Exception | None = None
            for _ in range(count):
                try:
                    conn.read_response()
                except self._reply_error as exc:  # an error reply; the others still come
                    first = first or exc
            return first

        def failed(_: BaseException) -> None:
            conn.disconnect()  # type: ignore[no-untyped-call]  # the retry reconnects

        try:
            error = conn.retry.call_with_retry(round_trip, failed)
        finally:
            pool.release(conn)
        if error is not None:
            raise error

    def medium_read(
        self, pool: PoolName, keys: Sequence[str], rows: Sequence[memoryview]
    ) -> list[PageRead | None]:
        nbytes = len(rows[0]) if rows else 0
        per_chunk = max(1, PIPELINE_BYTES // max(1, nbytes))
        reads: list[PageRead | None] = []
        for start in range(0, len(keys), per_chunk):
            chunk = keys[start : start + per_chunk]
            commands = [("GET", self.key_of(pool, k)) for k in chunk]
            values = self._call("load", partial(self._pipelined, commands, raise_on_error=False))
            for row, key, value in zip(
                rows[start : start + len(chunk)], chunk, values, strict=True
            ):
                if value is None:
                    reads.append(None)
                    continue
                if isinstance(value, self._reply_error):
                    if str(value).startswith("WRONGTYPE"):  # a list, a hash...: unreadable
                        raise TornPage(key)
                    msg = f"load: the Redis server at {self.url} refused GET {key}: {value}"
                    raise StoreFaultError(msg, operation="load") from value
                if not isinstance(value, bytes):
                    raise TornPage(key)
                record = decode_header(value)
                if record is None or len(value) != HEADER_SIZE + nbytes:
                    raise TornPage(key)
                row[:] = memoryview(value)[HEADER_SIZE:]
                reads.append((record, page_checksum(row)))
        return reads

    def medium_erase(self, pool: PoolName, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        commands = [("DEL", self.key_of(pool, k)) for k in keys]
        answers = self._call("evict", lambda: self._pipelined(commands))
        return sum(int(a) for a in answers)

    def backend_release(self) -> None:
        self.client.close()
