"""``linker_extra_config``, validated the way SGLang 0.5.23 validates its own linker config.

SGLang's `UnifiedCacheLinkerConfig.from_dict` checks ``linker`` / ``linker_module_path``
and that ``linker_extra_config`` is an object, then hands that object, deep-copied, to
the plug-in. What is inside is the plug-in's to check, at construction: a mistake found
there stops the worker at start with one line, never at the first request.

- `StoreLinkerSettings.parse(extra)` — `StoreLinker`'s keys:

  ============== ========================== ==============================================
  key            type (default)             meaning
  ============== ========================== ==============================================
  store          str (``"memory"``)         ``memory``, ``file:DIR``, ``redis://HOST:PORT[/DB]``
  namespace      str (``"default"``)        the operator's namespace; the model identity's
                                            digest is appended (`identity`)
  staging_bytes  int (64 MiB)               host staging bound for one move of pages
  trace          str (none)                 JSONL trace of the store's job machines
  load_timeout_s number (30)                longest wait for a load batch to land
  capacity_pages int (none)                 the store's page capacity
  ============== ========================== ==============================================

- `MonitorSettings.parse(extra)` — `ContractMonitor`'s keys: ``wrap`` (required: the
  wrapped linker's ``{"linker", "linker_module_path", "linker_extra_config"}``, or
  ``{"backend": "mooncake" | "mori", "config": {...}}`` for a built-in one), ``mode``
  (``"record"``, the default, or ``"raise"``), ``trace`` (a JSONL path) and
  ``summary_every_s`` (60: how often the counts go to the log).

Anything else is a `LinkerConfigError` naming the key (``argument`` is
``linker_extra_config.KEY``) and what it accepts; nothing is opened before every key is
valid. JSON has no integer/float split that Python keeps, so a count must be an
``int`` (``true`` is not one) and a duration any finite number.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from unicache_fsm.integrations.errors import LinkerConfigError

__all__ = [
    "BUILT_IN_BACKENDS",
    "DEFAULT_LOAD_TIMEOUT_S",
    "DEFAULT_STAGING_BYTES",
    "MonitorSettings",
    "StoreLinkerSettings",
]

FLAG = "--unified-cache-external-linker-config"

#: the operator's part of a store namespace: the file store's namespace rule
#: (``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``) less the ``-`` and 16 hex digits appended
NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,46}")

#: SGLang 0.5.23's built-in linker backends (``wrap: {"backend": ...}``)
BUILT_IN_BACKENDS = ("mooncake", "mori")

MONITOR_MODES = ("record", "raise")

DEFAULT_STAGING_BYTES = 64 << 20
DEFAULT_LOAD_TIMEOUT_S = 30.0

_MAX_STAGING = 1 << 40
_MAX_WAIT_S = 3600.0


def _refuse(key: str, value: object, wants: str) -> LinkerConfigError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    msg = f"{FLAG}: linker_extra_config.{key} must be {wants}, got {shown}"
    return LinkerConfigError(msg, argument=f"linker_extra_config.{key}", value=value)


def _object(extra: object, known: tuple[str, ...]) -> dict[str, Any]:
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        msg = f"{FLAG}: linker_extra_config must be a JSON object, got {type(extra).__name__}"
        raise LinkerConfigError(msg, argument="linker_extra_config", value=extra)
    unknown = sorted(str(k) for k in extra if k not in known)
    if unknown:
        msg = (
            f"{FLAG}: linker_extra_config: unknown keys {unknown} "
            f"(this linker takes {', '.join(known)})"
        )
        raise LinkerConfigError(msg, argument="linker_extra_config", value=unknown)
    return dict(extra)


def _text(given: dict[str, Any], key: str, default: str | None) -> str | None:
    value = given.get(key, default)
    if value is None and default is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _refuse(key, value, "a non-empty string")
    return value


def _count(given: dict[str, Any], key: str, default: int | None, top: int) -> int | None:
    value = given.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise _refuse(key, value, f"an integer from 1 to {top}")
    return value


def _seconds(given: dict[str, Any], key: str, default: float) -> float:
    value = given.get(key, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 < value <= _MAX_WAIT_S:
        raise _refuse(key, value, f"a number of seconds above 0 and at most {_MAX_WAIT_S:g}")
    return float(value)


@attrs.frozen
class StoreLinkerSettings:
    """`StoreLinker`'s ``linker_extra_config``, valid (module docstring)."""

    store: str = "memory"
    namespace: str = "default"
    staging_bytes: int = DEFAULT_STAGING_BYTES
    trace: str | None = None
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    capacity_pages: int | None = None

    KEYS = ("store", "namespace", "staging_bytes", "trace", "load_timeout_s", "capacity_pages")

    @classmethod
    def parse(cls, extra: object) -> StoreLinkerSettings:
        given = _object(extra, cls.KEYS)
        namespace = _text(given, "namespace", "default")
        assert namespace is not None
        if not NAMESPACE.fullmatch(namespace):
            wants = "1 to 47 of [A-Za-z0-9_.-], starting with a letter or digit"
            raise _refuse("namespace", namespace, wants)
        store = _text(given, "store", "memory")
        assert store is not None
        staging = _count(given, "staging_bytes", DEFAULT_STAGING_BYTES, _MAX_STAGING)
        assert staging is not None
        return cls(
            store=store,
            namespace=namespace,
            staging_bytes=staging,
            trace=_text(given, "trace", None),
            load_timeout_s=_seconds(given, "load_timeout_s", DEFAULT_LOAD_TIMEOUT_S),
            capacity_pages=_count(given, "capacity_pages", None, 1 << 40),
        )


@attrs.frozen
class MonitorSettings:
    """`ContractMonitor`'s ``linker_extra_config``, valid (module docstring).

    `backend` is ``"dynamic"`` with `config` the wrapped linker's launch JSON, or a
    built-in backend's name with `config` its extra config."""

    backend: str
    config: dict[str, Any] = attrs.field(eq=False)
    mode: str = "record"
    trace: str | None = None
    summary_every_s: float = 60.0

    KEYS = ("wrap", "mode", "trace", "summary_every_s")

    @classmethod
    def parse(cls, extra: object) -> MonitorSettings:
        given = _object(extra, cls.KEYS)
        wrap = given.get("wrap")
        if not isinstance(wrap, Mapping):
            wants = (
                'an object: the wrapped linker\'s {"linker", "linker_module_path", '
                '"linker_extra_config"}, or {"backend": "mooncake"|"mori", "config": {...}}'
            )
            raise _refuse("wrap", wrap, wants)
        if "backend" in wrap:
            backend = wrap["backend"]
            unknown = sorted(str(k) for k in wrap if k not in ("backend", "config"))
            if unknown:
                raise _refuse("wrap", unknown, 'only "backend" and "config" beside a backend')
            if backend not in BUILT_IN_BACKENDS:
                raise _refuse("wrap.backend", backend, f"one of {', '.join(BUILT_IN_BACKENDS)}")
            config = wrap.get("config", {})
            if not isinstance(config, Mapping):
                raise _refuse("wrap.config", config, "a JSON object")
        else:
            backend, config = "dynamic", wrap
        mode = given.get("mode", "record")
        if mode not in MONITOR_MODES:
            raise _refuse("mode", mode, " or ".join(repr(m) for m in MONITOR_MODES))
        return cls(
            backend=backend,
            config=dict(config),
            mode=mode,
            trace=_text(given, "trace", None),
            summary_every_s=_seconds(given, "summary_every_s", 60.0),
        )
