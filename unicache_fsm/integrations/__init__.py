"""Integrations of the library with serving engines.

- `unicache_fsm.integrations.protocol` — the machines of SGLang 0.5.23's linker
  protocol (`specs/sglang_linker.toml`, `specs/sglang_load.toml`,
  `specs/sglang_offload.toml`) and `ProtocolMonitor`, which drives them from a record of
  the calls. It imports nothing of SGLang.
- `unicache_fsm.integrations.sglang` — `StoreLinker` and `ContractMonitor`, real
  subclasses of SGLang 0.5.23's `UnifiedCacheLinker`. Importing it without SGLang 0.5.23
  raises `SglangUnavailableError`.
- `unicache_fsm.integrations.vllm` — vLLM 0.33.0's KV-offloading contract: its machines,
  a monitor for any `OffloadingManager`, a model of vLLM's CPU manager, the stores as an
  `OffloadingSpec`, the conformance kit (docs/vllm.md). Importing it without vLLM 0.33.0
  raises `VllmUnavailableError`.
"""
