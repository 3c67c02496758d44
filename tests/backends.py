"""Every store backend, for tests that run one contract on all of them.

`BACKENDS` is the pytest params list ``memory``, ``file``, ``redis`` (redis skipped
where redis-server is missing, except under CI). `Backend(name)` makes fresh stores of
that backend (`make(capacity_pages=None)`) and removes what they left (`cleanup()`):
file stores live in fresh directories on tmpfs when the machine has one (the same
files, renames and fsync calls as on a disk, with cheap fsyncs: these tests run many
short programs), Redis stores in fresh namespaces on the session's server, flushed
afterwards. Load and offload faults are injected by `FaultyStore` around any of them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from redis_helpers import REDIS_SKIP, flush, open_store
from unicache_fsm.store.file import FileStore
from unicache_fsm.store.memory import MemoryStore
from unicache_fsm.store.protocol import ExternalStore

FAST_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("file", id="file"),
    pytest.param("redis", id="redis", marks=REDIS_SKIP),
]


class Backend:
    """Fresh stores of one backend, and their cleanup."""

    def __init__(self, name: str, *, background: bool = False) -> None:
        assert name in ("memory", "file", "redis"), name
        self.name = name
        self.background = background
        self.stores: list[ExternalStore] = []
        self.dirs: list[Path] = []

    def make(self, capacity_pages: int | None = None) -> ExternalStore:
        store: ExternalStore
        if self.name == "memory":
            store = MemoryStore(capacity_pages=capacity_pages, background=self.background)
        elif self.name == "file":
            directory = Path(tempfile.mkdtemp(prefix="unicache-fsm-", dir=FAST_DIR))
            self.dirs.append(directory)
            store = FileStore(directory, capacity_pages=capacity_pages, background=self.background)
        else:
            store = open_store(capacity_pages=capacity_pages, background=self.background)
        self.stores.append(store)
        return store

    def cleanup(self) -> None:
        for store in self.stores:
            store.close()
        self.stores.clear()
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)
        self.dirs.clear()
        if self.name == "redis":
            flush()
