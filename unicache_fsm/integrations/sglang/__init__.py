"""SGLang 0.5.23's `UnifiedRadixCache` served by this project's stores, and watched.

Importing this package needs SGLang 0.5.23 (``sglang`` importable, version 0.5.23);
anything else raises `SglangUnavailableError` saying why. Both linkers are built by
SGLang's own factory from its launch flags (``docs/sglang.md``)::

    --enable-unified-cache-external-linker
    --unified-cache-external-linker-backend dynamic
    --unified-cache-external-linker-config '{"linker": "StoreLinker",
        "linker_module_path": "unicache_fsm.integrations.sglang",
        "linker_extra_config": {"store": "file:/var/cache/kv", "namespace": "team-a"}}'

One concept per module, lowest first:

- `settings` — `StoreLinkerSettings` / `MonitorSettings`: ``linker_extra_config``
  validated as SGLang validates its own config (unknown keys named, wrong types refused:
  `LinkerConfigError`, one line).
- `identity` — `ModelIdentity`: the model, page size, dtype, every layer's K/V shape,
  the component set and the rank, digested into the store namespace, so two models or
  layouts never read each other's pages whatever namespace string the operator gives.
- `buffers` — `LayerBuffers`: SGLang's per-layer ``k_buffer`` / ``v_buffer`` of one pool
  seen as the store's page device (page = P rows x layers x width, K then V per layer),
  with a gate: the store writes only slots of a load in flight and reads only slots of an
  offload SGLang has no verdict for yet.
- `fence` — `Fence`: slots a misbehaving store may still touch, never handed to it again.
- `counter` — `LayerCounter`: 0.5.23's `LayerWiseLoadCounter` whose waits drive the
  store's per-layer progress, bounded in time.
- `linker` — `StoreLinker`: the plug-in (``StoreLinker(server_args, params, *,
  components, extra_config, forward_stream)``) and ``StoreLinker.from_store(store,
  pools)`` for a store built by hand.
- `monitor` — `ContractMonitor`: any linker, built by SGLang's factory from ``wrap``,
  checked call by call (``mode`` ``record`` in a deployment: violations logged and
  counted, never raised); ``ContractMonitor.around(linker)`` wraps one built by hand.
- `interface` — what 0.5.23's factory and cache call on a linker, checked on a class
  before it is built.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from unicache_fsm.integrations.errors import SglangUnavailableError

SGLANG_VERSION = "0.5.23"


def _check_sglang_version() -> None:
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        msg = (
            "unicache_fsm.integrations.sglang needs SGLang 0.5.23, and sglang is not "
            "importable in this Python (bash scripts/sglang_env.sh builds a virtualenv "
            "that holds it next to this project)"
        )
        raise SglangUnavailableError(msg) from None
    if version != SGLANG_VERSION:
        msg = (
            f"unicache_fsm.integrations.sglang speaks SGLang {SGLANG_VERSION}'s linker "
            f"protocol; this Python has sglang {version}"
        )
        raise SglangUnavailableError(msg)


_check_sglang_version()
try:
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (  # noqa: F401
        LayerWiseLoadCounter,
        UnifiedCacheLinker,
    )
except Exception as exc:  # any failure of SGLang's import means: no SGLang here
    msg = f"importing SGLang {SGLANG_VERSION}'s UnifiedCacheLinker failed: {exc!r}"
    raise SglangUnavailableError(msg) from exc

from unicache_fsm.integrations.sglang.identity import ModelIdentity  # noqa: E402
from unicache_fsm.integrations.sglang.linker import StoreLinker  # noqa: E402
from unicache_fsm.integrations.sglang.monitor import ContractMonitor  # noqa: E402
from unicache_fsm.integrations.sglang.settings import (  # noqa: E402
    MonitorSettings,
    StoreLinkerSettings,
)

__all__ = [
    "SGLANG_VERSION",
    "ContractMonitor",
    "ModelIdentity",
    "MonitorSettings",
    "StoreLinker",
    "StoreLinkerSettings",
]

# The linker test kit (check any linker, as `unicache-fsm check-linker` does), loaded on
# first use: the kit itself imports this package.
_KIT = ("CheckedLinker", "LinkerMachine", "StorePlugin", "check_linker")


def __getattr__(name: str) -> Any:
    if name not in _KIT:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    from unicache_fsm.integrations import linker_kit

    return getattr(linker_kit, name)
