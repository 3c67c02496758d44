"""vLLM 0.33.0's KV-offloading contract (``vllm/v1/kv_offload/``) on this project's engine.

Importing this package needs vLLM 0.33.0 (``vllm`` importable, version 0.33.0);
anything else raises `VllmUnavailableError` saying why (``bash scripts/vllm_env.sh``
builds a virtualenv that holds it next to this project). One concept per module:

- `machines` — the contract's four machines (`specs/vllm_manager.toml`,
  `vllm_block.toml`, `vllm_request.toml`, `vllm_transfer.toml`): their enums (generated
  from the specs, `unicache_fsm.spec_enums`) and `OffloadingProtocol`, which drives them
  from a record of the calls.
- `monitor` — `MonitoredManager` / `MonitoredWorker`: any `OffloadingManager` /
  `OffloadingWorker`, every call checked against those machines (raise or record).
- `model` — `ModelManager`: the project's executable model of vLLM's CPU manager with
  its LRU and ARC policies, the other side of the differential suite.
- `spec` — `StoreOffloadingSpec`: the project's stores (memory, file, Redis) as an
  out-of-tree `OffloadingSpec`, chosen by ``spec_name`` / ``spec_module_path``.
- `kit` — `check_offloading_spec`: given an `OffloadingSpec` config, runs seeded
  programs through the monitor and reports which of vLLM's obligations it breaks.
"""

from __future__ import annotations

import importlib.metadata

from unicache_fsm.integrations.errors import VllmUnavailableError

VLLM_VERSION = "0.33.0"


def _check_vllm() -> None:
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        msg = (
            "unicache_fsm.integrations.vllm needs vLLM 0.33.0, and vllm is not importable "
            "in this Python (bash scripts/vllm_env.sh builds a virtualenv that holds it "
            "next to this project)"
        )
        raise VllmUnavailableError(msg) from None
    if version != VLLM_VERSION:
        msg = (
            f"unicache_fsm.integrations.vllm speaks vLLM {VLLM_VERSION}'s offloading "
            f"contract; this Python has vllm {version}"
        )
        raise VllmUnavailableError(msg)
    try:
        import vllm.v1.kv_offload.base  # noqa: F401
    except Exception as exc:  # any failure of vLLM's import means: no vLLM here
        msg = f"importing vLLM {VLLM_VERSION}'s kv_offload.base failed: {exc!r}"
        raise VllmUnavailableError(msg) from exc


_check_vllm()

from unicache_fsm.integrations.vllm.machines import (  # noqa: E402
    OffloadingProtocol,
    OffloadingViolation,
    WrongAnswerError,
)
from unicache_fsm.integrations.vllm.monitor import MonitoredManager, MonitoredWorker  # noqa: E402

__all__ = [
    "VLLM_VERSION",
    "MonitoredManager",
    "MonitoredWorker",
    "OffloadingProtocol",
    "OffloadingViolation",
    "VllmUnavailableError",
    "WrongAnswerError",
]
