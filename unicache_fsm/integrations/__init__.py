"""Integrations of the library with serving engines.

- `unicache_fsm.integrations.protocol` — the machines of SGLang 0.5.23's linker
  protocol (`specs/sglang_linker.toml`, `specs/sglang_load.toml`,
  `specs/sglang_offload.toml`) and `ProtocolMonitor`, which drives them from a record of
  the calls. It imports nothing of SGLang.
- `unicache_fsm.integrations.sglang` — `StoreLinker` and `ContractMonitor`, real
  subclasses of SGLang 0.5.23's `UnifiedCacheLinker`. Importing it without SGLang 0.5.23
  raises `SglangUnavailableError`.
"""
