"""`StorePlugin`: this project's `StoreLinker`, built the way SGLang 0.5.23 builds a linker.

Until `StoreLinker` takes SGLang's plug-in constructor itself, this adapter does:
``StorePlugin(server_args, params, *, components, extra_config, forward_stream)``
opens the store ``extra_config["store"]`` names (``memory``, ``file:DIR``,
``redis://HOST:PORT/DB``; `unicache_fsm.store.open_store`) under the namespace
``extra_config["namespace"]`` (default ``default``) joined with a digest of the model
path -- so two models under one namespace string never share pages -- and serves the
cache's KV pool (and, for an `SWAKVPool`, its SWA half). Launch JSON::

    {"linker": "StorePlugin",
     "linker_module_path": "unicache_fsm.integrations.linker_kit.store_plugin",
     "linker_extra_config": {"store": "file:/var/cache/unicache", "namespace": "team-a"}}
"""

from __future__ import annotations

import hashlib
from typing import Any

from sglang.srt.mem_cache.hicache_storage import PoolName

from unicache_fsm.integrations.errors import LinkerConfigError
from unicache_fsm.integrations.sglang import StoreLinker
from unicache_fsm.store.spec import open_store

__all__ = ["StorePlugin"]


class StorePlugin(StoreLinker):
    """`StoreLinker` behind SGLang's plug-in constructor (module docstring)."""

    def __init__(
        self,
        server_args: Any,
        params: Any,
        *,
        components: Any,
        extra_config: dict[str, Any],
        forward_stream: Any = None,
    ) -> None:
        spec = extra_config.get("store", "memory")
        namespace = extra_config.get("namespace", "default")
        if not isinstance(spec, str) or not isinstance(namespace, str):
            msg = f"linker_extra_config: store and namespace are strings, got {extra_config!r}"
            raise LinkerConfigError(msg, argument="extra_config", value=extra_config)
        model = hashlib.sha256(str(server_args.model_path).encode()).hexdigest()[:16]
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        pools: dict[Any, object] = {PoolName.KV: kvcache}
        if hasattr(kvcache, "swa_kv_pool"):
            pools[PoolName.SWA] = kvcache
        super().__init__(open_store(spec, namespace=f"{namespace}-{model}"), pools)
        self.forward_stream = forward_stream
