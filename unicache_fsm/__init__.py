"""unicache_fsm: explicit finite state machines for the external-cache contract.

The front door: the names a serving engineer needs, importable from here, each loaded
on first use (so ``import unicache_fsm`` and the commands that never touch a tensor do
not import torch).

- the tree: `RadixTree`, `TreeConfig`, `InsertParams`, `EvictParams`;
- the pools: `PagedAllocator`, `SWAAllocator`, `KVPool`;
- the linker: `ExternalLinker`, `LinkerConfig`, `SingleRank` (one rank; see
  `unicache_fsm.linker` for rank groups);
- the stores: `ExternalStore` (the protocol), `MemoryStore`, `FileStore`, `RedisStore`
  (needs the ``redis`` extra), `open_store("memory" | "file:DIR" | "redis://...")`;
- the engine: `load_spec`, `bundled_spec`, `CompiledExecutor`, `ReferenceExecutor`;
- `UnicacheFsmError`, the root of every error the library raises (the hierarchy is
  drawn in `unicache_fsm.fsm.errors`).

The subpackages hold the rest (`unicache_fsm.fsm`, `.pools`, `.tree`, `.linker`,
`.store`, `.scheduler`, `.testing`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_HOME = {
    "CompiledExecutor": "unicache_fsm.fsm",
    "ReferenceExecutor": "unicache_fsm.fsm",
    "UnicacheFsmError": "unicache_fsm.fsm",
    "bundled_spec": "unicache_fsm.fsm",
    "load_spec": "unicache_fsm.fsm",
    "KVPool": "unicache_fsm.pools.kv",
    "PagedAllocator": "unicache_fsm.pools.paged",
    "SWAAllocator": "unicache_fsm.pools.swa",
    "EvictParams": "unicache_fsm.tree",
    "InsertParams": "unicache_fsm.tree",
    "RadixTree": "unicache_fsm.tree",
    "TreeConfig": "unicache_fsm.tree",
    "ExternalLinker": "unicache_fsm.linker.linker",
    "LinkerConfig": "unicache_fsm.linker.linker",
    "SingleRank": "unicache_fsm.linker.ranks",
    "ExternalStore": "unicache_fsm.store",
    "FileStore": "unicache_fsm.store",
    "MemoryStore": "unicache_fsm.store",
    "RedisStore": "unicache_fsm.store",
    "open_store": "unicache_fsm.store",
}

__all__ = [
    "CompiledExecutor",
    "EvictParams",
    "ExternalLinker",
    "ExternalStore",
    "FileStore",
    "InsertParams",
    "KVPool",
    "LinkerConfig",
    "MemoryStore",
    "PagedAllocator",
    "RadixTree",
    "RedisStore",
    "ReferenceExecutor",
    "SWAAllocator",
    "SingleRank",
    "TreeConfig",
    "UnicacheFsmError",
    "__version__",
    "bundled_spec",
    "load_spec",
    "open_store",
]

if TYPE_CHECKING:
    from unicache_fsm.fsm import (
        CompiledExecutor,
        ReferenceExecutor,
        UnicacheFsmError,
        bundled_spec,
        load_spec,
    )
    from unicache_fsm.linker.linker import ExternalLinker, LinkerConfig
    from unicache_fsm.linker.ranks import SingleRank
    from unicache_fsm.pools.kv import KVPool
    from unicache_fsm.pools.paged import PagedAllocator
    from unicache_fsm.pools.swa import SWAAllocator
    from unicache_fsm.store import ExternalStore, FileStore, MemoryStore, RedisStore, open_store
    from unicache_fsm.tree import EvictParams, InsertParams, RadixTree, TreeConfig


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
