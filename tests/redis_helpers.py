"""One real `redis-server` for the whole test session, started on first use.

The Redis tests need the server installed (CI's script installs it: ``apt-get install -y
redis-server``). Where it is missing, `REDIS_SKIP` skips those tests locally; under CI
(``CI`` set) nothing is skipped and a missing server fails them.
"""

from __future__ import annotations

import atexit
import os
import uuid

import pytest

from unicache_fsm.store.redis import RedisStore
from unicache_fsm.testing.redis_server import RedisServer, available

REDIS_SKIP = pytest.mark.skipif(
    not available() and not os.environ.get("CI"),
    reason="redis-server is not installed (apt-get install -y redis-server)",
)

_server: RedisServer | None = None


def shared_server() -> RedisServer:
    """The session's server (started, or restarted after a test killed it)."""
    global _server
    if _server is None:
        _server = RedisServer()
        _server.start()
        atexit.register(_server.stop)
    elif not _server.running:
        _server.restart()
    return _server


def fresh_namespace() -> str:
    return f"t-{uuid.uuid4().hex[:16]}"


def open_store(**options: object) -> RedisStore:
    """A RedisStore on the shared server, in a namespace of its own."""
    return RedisStore(shared_server().url, namespace=fresh_namespace(), **options)  # type: ignore[arg-type]


def flush() -> None:
    """Drop every key of the shared server (between Hypothesis programs)."""
    server = shared_server()
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        client.flushdb()
    finally:
        client.close()
