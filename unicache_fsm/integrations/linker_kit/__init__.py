"""The linker test kit: check any SGLang 0.5.23 linker as SGLang itself runs it.

What ``unicache-fsm check-linker`` runs, and what a linker author can import into a
test suite (re-exported from `unicache_fsm.testing` and
`unicache_fsm.integrations.sglang`). One concept per module, lowest first:

- `obligations` — the obligations (`Obligation`), `LinkerViolation`, `BadLinkerError`,
  the verdicts table's data (`Verdicts`). No SGLang.
- `kvmodel` — `KvModel`: every token's right K/V, a function of model and prefix. No SGLang.
- `ledger` — `Ledger`: what a run knows to be true of its pages. No SGLang.
- `faults` — `BackendFaults` (the optional fault interface a linker offers with
  ``backend_faults()``) and ready `DirectoryFaults` / `RedisFaults`. No SGLang.
- `build` — the config and class checks, and the linker built by 0.5.23's factory.
- `checked` — `CheckedLinker`: every call of the linker checked at its boundary.
- `rig` — `Rig`: one worker (SGLang's real `UnifiedRadixCache` on CPU) and the
  scheduler's steps.
- `session` — `Session`, `Step`, `replay`: a check run as a program of steps.
- `scenarios` — `SCENARIOS`: one named program per obligation.
- `machine` — `LinkerMachine` (Hypothesis) and `explore` (a wall-clock budget).
- `report` — the table, the failing program as a pytest file, the coverage diagrams.
- `check` — `check_linker`: the whole check. `cli` — the subcommand.
- `store_plugin` — `StorePlugin`: this project's `StoreLinker`, built by SGLang's factory.

Importing this package imports nothing; each name below loads its module on first use
(the SGLang ones raise `SglangUnavailableError` without SGLang 0.5.23).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "SCENARIOS",
    "BackendFaults",
    "BadLinkerError",
    "CheckedLinker",
    "DirectoryFaults",
    "KvModel",
    "LinkerMachine",
    "LinkerViolation",
    "Obligation",
    "RedisFaults",
    "Session",
    "Step",
    "StorePlugin",
    "Verdicts",
    "check_linker",
    "replay",
]

_HOME = {
    "SCENARIOS": "scenarios",
    "BackendFaults": "faults",
    "BadLinkerError": "obligations",
    "CheckedLinker": "checked",
    "DirectoryFaults": "faults",
    "KvModel": "kvmodel",
    "LinkerMachine": "machine",
    "LinkerViolation": "obligations",
    "Obligation": "obligations",
    "RedisFaults": "faults",
    "Session": "session",
    "Step": "session",
    "StorePlugin": "store_plugin",
    "Verdicts": "obligations",
    "check_linker": "check",
    "replay": "session",
}


def __getattr__(name: str) -> Any:
    """Each name is imported from its module on first use (module docstring)."""
    home = _HOME.get(name)
    if home is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    try:
        module = importlib.import_module(f"{__name__}.{home}")
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("sglang"):
            raise
        # the module needs SGLang: the integration's own check says what is missing
        importlib.import_module("unicache_fsm.integrations.sglang")
        raise
    value = getattr(module, name)
    globals()[name] = value
    return value
