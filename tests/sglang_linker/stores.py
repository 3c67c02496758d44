"""The stores every SGLang flow runs on: memory, file (a fresh directory), Redis (the
session's real redis-server, a fresh namespace)."""

from __future__ import annotations

import uuid
from pathlib import Path

STORES = ("memory", "file", "redis")


def make_store(kind: str, tmp_path: Path) -> object:
    if kind == "memory":
        from unicache_fsm.store import MemoryStore

        return MemoryStore()
    if kind == "file":
        from unicache_fsm.store import FileStore

        return FileStore(tmp_path / f"store-{uuid.uuid4().hex[:8]}")
    from redis_helpers import fresh_namespace, shared_server
    from unicache_fsm.store import RedisStore

    return RedisStore(shared_server().url, namespace=fresh_namespace())
