"""The errors of the SGLang integration (all under `UnicacheFsmError`).

- `SglangUnavailableError` — ``unicache_fsm.integrations.sglang`` was imported where
  SGLang 0.5.23 cannot be imported (not installed, another version, or its import
  failed); the message says which and what to do. An `ImportError` too.
- `VllmUnavailableError` — ``unicache_fsm.integrations.vllm`` was imported where vLLM
  0.33.0 cannot be imported (not installed, another version, or its import failed); the
  message says which and what to do. An `ImportError` too.
- `LinkerConfigError` — a `StoreLinker` or `ContractMonitor` cannot be built as asked:
  a ``linker_extra_config`` key that is unknown, of the wrong type or out of range, a
  store that cannot be opened or reached, a wrapped linker that cannot run under SGLang
  0.5.23, pools it cannot serve (an unknown pool name, a KV layout that is not
  token-major); `argument` and `value` name the culprit, the message is one line.
- `UnknownBatchError` — `finish_layer_wise_loading` got an index that no
  `start_layer_wise_loading` returned (or one already finished); nothing changed.
"""

from __future__ import annotations

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = [
    "LinkerConfigError",
    "SglangUnavailableError",
    "UnknownBatchError",
    "VllmUnavailableError",
]


class SglangUnavailableError(UnicacheFsmError, ImportError):
    """SGLang 0.5.23 cannot be imported in this Python (the message says why)."""


class VllmUnavailableError(UnicacheFsmError, ImportError):
    """vLLM 0.33.0 cannot be imported in this Python (the message says why)."""


class LinkerConfigError(UnicacheFsmError, ValueError):
    """A `StoreLinker` argument it cannot serve; `argument` and `value` name it."""

    def __init__(self, msg: str, *, argument: str, value: object) -> None:
        self.argument = argument
        self.value = value
        super().__init__(msg)


class UnknownBatchError(UnicacheFsmError, LookupError):
    """A layer-wise loading index that is not started or already finished."""

    def __init__(self, msg: str, *, index: object, started: tuple[int, ...]) -> None:
        self.index = index
        self.started = started
        super().__init__(msg)
