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

__all__ = ["build_linker", "linker_class", "parse_config", "server_args"]

#: each method 0.5.23 calls -> (positional args, keyword args) it passes
CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "lookup": (("rid", []), {}),
    "load": (("rid", []), {}),
    "start_layer_wise_loading": ((), {}),
    "finish_layer_wise_loading": ((0,), {}),
    "cancel_queued_load": (("rid",), {}),
    "offload": (([],), {"session_id": None}),
    "num_completed_offloads": ((), {}),
    "pop_completed_offload": ((), {}),
    "reset": ((), {}),
    "close": ((), {}),
    "record_offload_ready": ((), {}),
}

CONSTRUCTOR_KEYWORDS = ("components", "extra_config", "forward_stream")


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


def _refusals(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin or C method: nothing to say before it runs
    try:
        sig.bind(None, *args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


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
    problems = []
    abstract = sorted(getattr(cls, "__abstractmethods__", ()))
    if abstract:
        problems.append(f"abstract, missing {', '.join(abstract)}")
    init_args = (None, None)
    init_kwargs = {name: None for name in CONSTRUCTOR_KEYWORDS}
    refused = _refusals(cls.__init__, init_args, init_kwargs)
    if refused:
        problems.append(
            "its constructor cannot take (server_args, params, components=..., "
            f"extra_config=..., forward_stream=...): {refused}"
        )
    for name, (args, kwargs) in CALLS.items():
        if name in abstract:
            continue
        refused = _refusals(getattr(cls, name), args, kwargs)
        if refused:
            problems.append(f"{name}{_shape(args, kwargs)} fails: {refused}")
    if problems:
        msg = f"{where} cannot run under SGLang 0.5.23: {'; '.join(problems)}"
        raise BadLinkerError(msg)
    return cls


def _shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = ["rid" if a == "rid" else "index" if isinstance(a, int) else "transfers" for a in args]
    parts += [f"{k}=..." for k in kwargs]
    return f"({', '.join(parts)})"


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
