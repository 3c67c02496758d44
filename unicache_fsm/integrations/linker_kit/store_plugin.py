"""`StorePlugin`: the name earlier launch configs gave this project's `StoreLinker`.

`StoreLinker` takes SGLang 0.5.23's plug-in constructor itself now
(``linker_module_path`` ``unicache_fsm.integrations.sglang``, ``linker``
``StoreLinker``; docs/sglang.md); this name builds the very same class, so a config
written for it keeps working.
"""

from __future__ import annotations

from unicache_fsm.integrations.sglang import StoreLinker

__all__ = ["StorePlugin"]

StorePlugin = StoreLinker
