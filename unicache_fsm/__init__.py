"""unicache_fsm: explicit finite state machines for the external-cache contract.

The front door: every name the examples and docs use, importable from here, each
loaded on first use (so ``import unicache_fsm`` and the commands that never touch a
tensor do not import torch). The fuzzing kit is its own namespace,
`unicache_fsm.testing`.

- the engine: `load_spec`, `parse_spec`, `bundled_spec`, `bundled_machines`,
  `CompiledExecutor`, `ReferenceExecutor` (both `Executor`s), `MachineBuilder`; errors
  `IllegalTransitionError` (a trigger not allowed from the state) and
  `GuardRejectedError` (allowed, vetoed by a guard);
- diagrams and traces: `render_mermaid`, `render_image`, `DiagramFormat`,
  `TraceRecorder`, `read_trace`, `check_trace`, `spec_lookup`;
- the tree: `RadixTree`, `TreeConfig`, `InsertParams`, `EvictParams`;
- the pools: `PagedAllocator`, `SWAAllocator`, `KVPool`, `PoolName`;
- the linker: `ExternalLinker`, `LinkerConfig`, `SingleRank` (one rank; see
  `unicache_fsm.linker` for rank groups);
- the stores: `ExternalStore` (the protocol), `MemoryStore`, `FileStore`, `RedisStore`
  (needs the ``redis`` extra), `open_store("memory" | "file:DIR" | "redis://...")`;
- a serving system in one object: `System` (pools, tree, store, linker wired; a
  request's `begin` / `drive` / `complete`), as ``unicache-fsm simulate`` runs it;
- `UnicacheFsmError`, the root of every error the library raises (the hierarchy is
  drawn in `unicache_fsm.fsm.errors`).

`dir(unicache_fsm)` lists exactly `__all__`.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

#: public name -> the module that defines it
_HOME = {
    "CompiledExecutor": "unicache_fsm.fsm",
    "Executor": "unicache_fsm.fsm",
    "GuardRejectedError": "unicache_fsm.fsm",
    "IllegalTransitionError": "unicache_fsm.fsm",
    "MachineBuilder": "unicache_fsm.fsm",
    "ReferenceExecutor": "unicache_fsm.fsm",
    "UnicacheFsmError": "unicache_fsm.fsm",
    "bundled_machines": "unicache_fsm.fsm",
    "bundled_spec": "unicache_fsm.fsm",
    "load_spec": "unicache_fsm.fsm",
    "parse_spec": "unicache_fsm.fsm",
    "DiagramFormat": "unicache_fsm.fsm.diagram",
    "render_image": "unicache_fsm.fsm.diagram",
    "render_mermaid": "unicache_fsm.fsm.diagram",
    "TraceRecorder": "unicache_fsm.fsm.trace",
    "check_trace": "unicache_fsm.fsm.conformance",
    "read_trace": "unicache_fsm.fsm.conformance",
    "spec_lookup": "unicache_fsm.fsm.conformance",
    "KVPool": "unicache_fsm.pools.kv",
    "PagedAllocator": "unicache_fsm.pools.paged",
    "SWAAllocator": "unicache_fsm.pools.swa",
    "PoolName": "unicache_fsm.pools.transfer",
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
    "System": "unicache_fsm.serving.system",
}

#: exactly the names of `_HOME` and `__version__` (tests/test_public_api.py locks both)
__all__ = [
    "CompiledExecutor",
    "DiagramFormat",
    "EvictParams",
    "Executor",
    "ExternalLinker",
    "ExternalStore",
    "FileStore",
    "GuardRejectedError",
    "IllegalTransitionError",
    "InsertParams",
    "KVPool",
    "LinkerConfig",
    "MachineBuilder",
    "MemoryStore",
    "PagedAllocator",
    "PoolName",
    "RadixTree",
    "RedisStore",
    "ReferenceExecutor",
    "SWAAllocator",
    "SingleRank",
    "System",
    "TraceRecorder",
    "TreeConfig",
    "UnicacheFsmError",
    "__version__",
    "bundled_machines",
    "bundled_spec",
    "check_trace",
    "load_spec",
    "open_store",
    "parse_spec",
    "read_trace",
    "render_image",
    "render_mermaid",
    "spec_lookup",
]

if _typing.TYPE_CHECKING:
    from unicache_fsm.fsm import (
        CompiledExecutor,
        Executor,
        GuardRejectedError,
        IllegalTransitionError,
        MachineBuilder,
        ReferenceExecutor,
        UnicacheFsmError,
        bundled_machines,
        bundled_spec,
        load_spec,
        parse_spec,
    )
    from unicache_fsm.fsm.conformance import check_trace, read_trace, spec_lookup
    from unicache_fsm.fsm.diagram import DiagramFormat, render_image, render_mermaid
    from unicache_fsm.fsm.trace import TraceRecorder
    from unicache_fsm.linker.linker import ExternalLinker, LinkerConfig
    from unicache_fsm.linker.ranks import SingleRank
    from unicache_fsm.pools.kv import KVPool
    from unicache_fsm.pools.paged import PagedAllocator
    from unicache_fsm.pools.swa import SWAAllocator
    from unicache_fsm.pools.transfer import PoolName
    from unicache_fsm.serving.system import System
    from unicache_fsm.store import ExternalStore, FileStore, MemoryStore, RedisStore, open_store
    from unicache_fsm.tree import EvictParams, InsertParams, RadixTree, TreeConfig


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return list(__all__)
