"""What SGLang 0.5.23's factory and cache call on a linker, checked on a class before it
is built.

`create_unified_cache_linker` refuses a class that is not a concrete `UnifiedCacheLinker`
subclass, then calls ``cls(server_args, params, components=..., extra_config=...,
forward_stream=...)``; the cache's `UnifiedCacheLinkerWrapper` then calls each method in
`CALLS` with the arguments listed there (``offload(transfers, session_id=...)`` among
them). A class whose constructor or a method cannot take those arguments builds, and
fails in the middle of serving; `problems(cls)` names every such mismatch before
anything runs (an empty list: none found).
"""

from __future__ import annotations

import inspect
from typing import Any

from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

__all__ = ["CALLS", "CONSTRUCTOR_KEYWORDS", "WrappingLinker", "problems"]

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


def _refusal(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin or C method: nothing to say before it runs
    try:
        sig.bind(None, *args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


def _shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = ["rid" if a == "rid" else "index" if isinstance(a, int) else "transfers" for a in args]
    parts += [f"{k}=..." for k in kwargs]
    return f"({', '.join(parts)})"


def problems(cls: object) -> list[str]:
    """Every way `cls` cannot run under 0.5.23 (module docstring), one phrase each."""
    if not inspect.isclass(cls) or not issubclass(cls, UnifiedCacheLinker):
        return ["not a subclass of SGLang 0.5.23's UnifiedCacheLinker"]
    found = []
    abstract = sorted(getattr(cls, "__abstractmethods__", ()))
    if abstract:
        found.append(f"abstract, missing {', '.join(abstract)}")
    refused = _refusal(cls.__init__, (None, None), dict.fromkeys(CONSTRUCTOR_KEYWORDS))
    if refused:
        found.append(
            "its constructor cannot take (server_args, params, components=..., "
            f"extra_config=..., forward_stream=...): {refused}"
        )
    for name, (args, kwargs) in CALLS.items():
        if name in abstract:
            continue
        method = getattr(cls, name, None)
        if method is None:
            found.append(f"no method {name}")
            continue
        refused = _refusal(method, args, kwargs)
        if refused:
            found.append(f"{name}{_shape(args, kwargs)} fails: {refused}")
    return found


class WrappingLinker(UnifiedCacheLinker):  # type: ignore[misc]
    """A linker that wraps another (`self.linker`): the attributes SGLang reads of a
    linker besides `CALLS` (`layer_done_counter`, `pools`, `forward_stream`) are the
    wrapped linker's, read at each access, so SGLang waits on the counter and reads the
    pools the wrapped linker really uses."""

    linker: Any

    @property
    def layer_done_counter(self) -> Any:
        return self.linker.layer_done_counter

    @property
    def pools(self) -> dict[Any, object]:
        pools: dict[Any, object] = self.linker.pools
        return pools

    @property
    def forward_stream(self) -> Any:
        return getattr(self.linker, "forward_stream", None)
