"""The SGLang linker kit, for linker authors' test suites: a re-export of
`unicache_fsm.integrations.linker_kit` (see there). Each name loads its module on first
use: `LinkerMachine`, `CheckedLinker` and `check_linker` need SGLang 0.5.23 (elsewhere
they raise `SglangUnavailableError`); the fault interface, the KV model and the
obligations do not.
"""

from __future__ import annotations

from typing import Any

from unicache_fsm.integrations import linker_kit

_NAMES = (
    "BackendFaults",
    "CheckedLinker",
    "DirectoryFaults",
    "KvModel",
    "LinkerMachine",
    "LinkerViolation",
    "Obligation",
    "RedisFaults",
    "check_linker",
)
__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    """Each name is loaded from the kit on first use (module docstring)."""
    if name not in _NAMES:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(linker_kit, name)
    globals()[name] = value
    return value
