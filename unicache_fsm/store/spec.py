"""Choosing a store backend by a one-line spec (the CLI's ``--store``).

`open_store(spec, *, namespace="default", capacity_pages=None, staging_bytes=64 MiB)`
-> a fresh, unattached `ExternalStore` (`staging_bytes`: its bound on host bytes in
transit, `unicache_fsm.store.staging`):

- ``memory`` — the embedded `MemoryStore` (nothing shared, nothing survives the process);
- ``file:DIR`` — a `FileStore` on directory DIR (created if missing), shared by every
  process that opens it;
- ``redis://HOST:PORT[/DB]`` (also ``rediss://``, ``unix://PATH``) — a `RedisStore` on
  that server, shared by every client in the same namespace.

Anything else is a `StoreConfigError` naming the spec and the accepted forms.
`store_loses_pages(store)` says whether a store may drop pages on its own (a capacity,
or a server that evicts or restarts): then "every stored node's pages are in the store"
is not an invariant of the system using it.
"""

from __future__ import annotations

from unicache_fsm.store.errors import StoreConfigError
from unicache_fsm.store.file import FileStore
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import ExternalStore
from unicache_fsm.store.staging import DEFAULT_STAGING_BYTES

__all__ = ["FORMS", "open_store", "store_loses_pages"]

FORMS = "memory, file:DIR or redis://HOST:PORT"


def open_store(
    spec: str,
    *,
    namespace: str = "default",
    capacity_pages: int | None = None,
    staging_bytes: int = DEFAULT_STAGING_BYTES,
) -> ExternalStore:
    """A fresh store for `spec`; see the module docstring."""
    given: object = spec
    if not isinstance(given, str):
        msg = f"a store spec is a string ({FORMS}), got {type(given).__name__}"
        raise StoreConfigError(msg, argument="store", value=spec)
    if spec == "memory":
        return MemoryStore(capacity_pages=capacity_pages, staging_bytes=staging_bytes)
    if spec.startswith("file:"):
        directory = spec[len("file:") :]
        if not directory:
            msg = f"--store {spec!r}: name the directory, e.g. file:/var/cache/unicache"
            raise StoreConfigError(msg, argument="store", value=spec)
        return FileStore(
            directory,
            namespace=namespace,
            capacity_pages=capacity_pages,
            staging_bytes=staging_bytes,
        )
    if spec.startswith(("redis://", "rediss://", "unix://")):
        from unicache_fsm.store.redis import RedisStore

        return RedisStore(
            spec, namespace=namespace, capacity_pages=capacity_pages, staging_bytes=staging_bytes
        )
    msg = f"--store {spec!r} is not a store; use {FORMS}"
    raise StoreConfigError(msg, argument="store", value=spec)


def store_loses_pages(store: ExternalStore) -> bool:
    """Whether `store` may drop pages on its own (see the module docstring)."""
    if isinstance(store, (MemoryStore, FileStore)):
        return store.capacity_pages is not None
    return True
