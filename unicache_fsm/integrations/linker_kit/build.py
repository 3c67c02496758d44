"""The linker under test, built exactly as SGLang 0.5.23 builds it.

- `parse_config(text)` — the operator's ``--unified-cache-external-linker-config``:
  JSON text, or ``@FILE`` holding it; checked by 0.5.23's own
  `UnifiedCacheLinkerConfig.from_dict`. Anything wrong: `BadLinkerError`, one line.
- `linker_class(config)` — imports ``linker_module_path`` and takes ``linker``, then
  checks, before anything runs, what 0.5.23's factory and cache will call: a class, a
  subclass of `UnifiedCacheLinker`, not abstract, a constructor that accepts
  ``(server_args, params, *, components, extra_config, forward_stream)`` and methods
  that accept the arguments 0.5.23 passes (``offload(transfers, session_id=...)`` among
  them). Every problem in one `BadLinkerError` line, naming what is missing.
- `server_args(config, model, page)` — the `ServerArgs` of a worker launched with
  ``--enable-unified-cache-external-linker --unified-cache-external-linker-backend
  dynamic --unified-cache-external-linker-config CONFIG``; `build_linker(...)` publishes
  them as the scheduler's runtime context and calls 0.5.23's
  `create_unified_cache_linker` (backend ``dynamic``) with the cache's `CacheInitParams`.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from sglang.srt.mem_cache.unified_cache.linker_config import UnifiedCacheLinkerConfig
from sglang.srt.mem_cache.unified_cache.linker_factory import create_unified_cache_linker
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from unicache_fsm.integrations.linker_kit.obligations import BadLinkerError
from unicache_fsm.integrations.sglang.interface import problems

__all__ = ["build_linker", "linker_class", "parse_config", "server_args"]


def parse_config(text: str) -> dict[str, Any]:
    """The operator's linker JSON (or ``@FILE``), validated by 0.5.23 (module docstring)."""
    source = "the linker config"
    if text.startswith("@"):
        path = Path(text[1:])
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            msg = f"cannot read the linker config {str(path)!r}: {exc.strerror or exc}"
            raise BadLinkerError(msg) from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"{source} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        raise BadLinkerError(msg) from None
    try:
        UnifiedCacheLinkerConfig.from_dict(config)
    except ValueError as exc:
        msg = f"{source}: SGLang 0.5.23 refuses it: {exc}"
        raise BadLinkerError(msg) from None
    return dict(config)


def linker_class(config: dict[str, Any]) -> type:
    """The configured class, checked as 0.5.23 will call it (module docstring)."""
    parsed = UnifiedCacheLinkerConfig.from_dict(config)
    where = f"{parsed.linker_module_path}.{parsed.linker}"
    try:
        module = importlib.import_module(parsed.linker_module_path)
    except ImportError as exc:
        msg = f"{where}: cannot import module {parsed.linker_module_path!r}: {exc}"
        raise BadLinkerError(msg) from None
    except (Exception, SystemExit) as exc:  # the module's own code ran, and failed
        msg = f"{where}: importing {parsed.linker_module_path!r} raised {type(exc).__name__}: {exc}"
        raise BadLinkerError(msg) from None
    cls = getattr(module, parsed.linker, None)
    if cls is None:
        msg = f"{where}: module {parsed.linker_module_path!r} has no attribute {parsed.linker!r}"
        raise BadLinkerError(msg)
    if not inspect.isclass(cls) or not issubclass(cls, UnifiedCacheLinker):
        msg = f"{where} is not a subclass of SGLang 0.5.23's UnifiedCacheLinker"
        raise BadLinkerError(msg)
    found = problems(cls)
    if found:
        msg = f"{where} cannot run under SGLang 0.5.23: {'; '.join(found)}"
        raise BadLinkerError(msg)
    return cls


def server_args(config: dict[str, Any], model: str, page: int) -> ServerArgs:
    """A worker's `ServerArgs` with the dynamic linker `config` (module docstring)."""
    return ServerArgs(
        model_path=model,
        page_size=page,
        enable_unified_cache_external_linker=True,
        unified_cache_external_linker_backend="dynamic",
        unified_cache_external_linker_config=config,
    )


def build_linker(
    config: dict[str, Any], params: Any, components: set[Any], *, model: str, page: int
) -> Any:
    """0.5.23's factory, called as its cache registry calls it (module docstring)."""
    args = server_args(config, model, page)
    set_global_server_args_for_scheduler(args)
    return create_unified_cache_linker(
        args,
        params,
        backend="dynamic",
        config=config,
        components=set(components),
        forward_stream=None,
    )
