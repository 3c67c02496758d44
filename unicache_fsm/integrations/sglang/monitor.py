"""`ContractMonitor`: any SGLang 0.5.23 linker, every call checked against its protocol.

Switched on by configuration, around the linker a deployment already runs::

    --unified-cache-external-linker-config '{"linker": "ContractMonitor",
        "linker_module_path": "unicache_fsm.integrations.sglang",
        "linker_extra_config": {"wrap": {"linker": "MyLinker",
            "linker_module_path": "my_pkg.linker", "linker_extra_config": {...}},
            "mode": "record", "trace": "/var/log/linker.jsonl"}}'

(``settings.MonitorSettings``; ``wrap`` may also name a built-in backend:
``{"backend": "mooncake", "config": {...}}``). The constructor validates ``wrap`` with
0.5.23's own `UnifiedCacheLinkerConfig.from_dict`, checks the wrapped class's methods
and signatures against 0.5.23's (`interface.problems`: one `LinkerConfigError` line
naming what is missing), and builds it through 0.5.23's `create_unified_cache_linker`
with the very arguments it was given. ``ContractMonitor.around(linker, mode=...,
trace=...)`` wraps a linker built by hand.

Each call drives `unicache_fsm.integrations.protocol.ProtocolMonitor`: an illegal call
order or answer is a `ProtocolViolation` carrying that load's or offload's history.

- ``mode="record"`` (a deployment's): the violation is logged and counted and the call
  goes through; nothing of the monitor's own ever raises into SGLang's scheduler (which
  has no handler there: an exception kills the worker), and what the wrapped linker
  does and answers is unchanged — its own exceptions pass through untouched, counted.
- ``mode="raise"`` (tests): the violation is raised before the wrapped linker is called.

Every answer is returned as the wrapped linker gave it (never coerced). `counts()` holds
loads (queued, landed, failed), offloads (accepted, stored, failed), bytes loaded and
offloaded (slots moved times the pool's bytes per token, every layer's K and V),
violations and exceptions of the wrapped linker; a summary line goes to the
``unicache_fsm.integrations.sglang.monitor`` logger every ``summary_every_s`` seconds
(checked on each call) and at `close`. With `trace` the protocol machines' transitions
go to that JSONL file — per rank when the deployment has more than one
(`identity.Placement.per_rank`), as every rank is launched with the same JSON
(``unicache-fsm check-trace`` accepts each); `coverage()` /
`save_coverage(path)` give what ``unicache-fsm diagram --coverage`` draws.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sglang.srt.mem_cache.unified_cache.linker_config import UnifiedCacheLinkerConfig
from sglang.srt.mem_cache.unified_cache.linker_factory import create_unified_cache_linker

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.integrations.errors import LinkerConfigError
from unicache_fsm.integrations.protocol import MonitorConfigError, ProtocolMonitor
from unicache_fsm.integrations.sglang.buffers import halves
from unicache_fsm.integrations.sglang.identity import Placement
from unicache_fsm.integrations.sglang.interface import WrappingLinker, problems
from unicache_fsm.integrations.sglang.settings import MonitorSettings

__all__ = ["BUILT_IN_CLASSES", "ContractMonitor"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: 0.5.23's built-in backends -> (module, class) the factory builds
BUILT_IN_CLASSES = {
    "mooncake": (
        "sglang.srt.mem_cache.storage.mooncake_store.mooncake_direct_linker",
        "MooncakeDirectLinker",
    ),
    "mori": ("sglang.srt.mem_cache.storage.umbp.umbp_direct_linker", "UMBPDirectLinker"),
}


def _wrapped_class(settings: MonitorSettings) -> tuple[str, type]:
    """The wrapped linker's class, checked as 0.5.23 will call it (`LinkerConfigError`)."""
    what = "linker_extra_config.wrap"
    if settings.backend == "dynamic":
        try:
            parsed = UnifiedCacheLinkerConfig.from_dict(settings.config)
        except ValueError as exc:
            msg = f"{what}: SGLang 0.5.23 refuses it: {exc}"
            raise LinkerConfigError(msg, argument=what, value=settings.config) from None
        module_name, name = parsed.linker_module_path, parsed.linker
    else:
        module_name, name = BUILT_IN_CLASSES[settings.backend]
    where = f"{module_name}.{name}"
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # its own dependencies missing, or its code failed
        msg = f"{what}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        raise LinkerConfigError(msg.splitlines()[0], argument=what, value=where) from None
    cls = getattr(module, name, None)
    found = problems(cls) if cls is not None else [f"module {module_name!r} has no {name!r}"]
    if found:
        msg = f"{what}: {where} cannot run under SGLang 0.5.23: {'; '.join(found)}"
        raise LinkerConfigError(msg, argument=what, value=where)
    assert isinstance(cls, type)
    return where, cls


def _bytes_per_token(pools: Any) -> dict[str, int]:
    """Each served pool's bytes per token slot, every layer's K and V (pools whose
    buffers cannot be read count nothing)."""
    out = {}
    try:
        served = halves(pools)
    except Exception:  # a pool this project does not know: its bytes are not counted
        return {}
    for name, kv in served.items():
        try:
            out[str(name.value)] = sum(
                b[0].numel() * b.element_size() for b in [*kv.k_buffer, *kv.v_buffer]
            )
        except Exception:  # not a token-major pool
            continue
    return out


class ContractMonitor(WrappingLinker):
    """Any `UnifiedCacheLinker`, every call checked (module docstring)."""

    def __init__(
        self,
        server_args: Any,
        params: Any,
        *,
        components: Any,
        extra_config: Mapping[str, Any] | None,
        forward_stream: Any = None,
    ) -> None:
        settings = MonitorSettings.parse(extra_config)
        where, _ = _wrapped_class(settings)
        trace = settings.trace
        if trace is not None:  # every rank is launched with the one path
            trace = Placement.of(params).per_rank(trace)
        config = settings.config
        if settings.backend == "dynamic":
            config = dict(config)
        try:
            linker = create_unified_cache_linker(
                server_args,
                params,
                backend=settings.backend,
                config=config,
                components=components,
                forward_stream=forward_stream,
            )
        except Exception as exc:  # its own constructor refused its config, or failed
            msg = f"linker_extra_config.wrap: building {where} raised {type(exc).__name__}: {exc}"
            raise LinkerConfigError(
                msg.splitlines()[0], argument="linker_extra_config.wrap", value=where
            ) from exc
        missing = [a for a in ("layer_done_counter", "pools") if not hasattr(linker, a)]
        if missing:
            msg = f"linker_extra_config.wrap: {where} built without {', '.join(missing)}"
            raise LinkerConfigError(msg, argument="linker_extra_config.wrap", value=where)
        try:
            self._setup(linker, settings.mode, trace, settings.summary_every_s)
        except (OSError, MonitorConfigError) as exc:  # a trace it cannot write
            try:
                linker.close()  # nothing left open
            except Exception:
                logger.exception("ContractMonitor: closing the wrapped linker failed")
            msg = f"linker_extra_config.trace {trace!r} cannot be written: {exc}".splitlines()[0]
            raise LinkerConfigError(
                msg, argument="linker_extra_config.trace", value=trace
            ) from None

    @classmethod
    def around(
        cls,
        linker: Any,
        *,
        mode: str = "raise",
        trace: str | Path | None = None,
        summary_every_s: float = 60.0,
    ) -> ContractMonitor:
        """A monitor around `linker`, built by hand (module docstring)."""
        self = cls.__new__(cls)
        self._setup(linker, mode, trace, summary_every_s)
        return self

    def _setup(
        self, linker: Any, mode: str, trace: str | Path | None, summary_every_s: float
    ) -> None:
        self.linker = linker
        self.monitor = ProtocolMonitor(mode=mode, trace=trace)
        self.mode = mode
        self.summary_every_s = summary_every_s
        self._counts: Counter[str] = Counter()
        self._per_token: dict[str, int] | None = None
        self._load_bytes: dict[str, int] = {}  # rid -> bytes, queued
        self._batch_bytes: dict[int, tuple[int, int]] = {}  # started batch -> (loads, bytes)
        self._offload_bytes: deque[int] = deque()  # accepted, not popped
        self._last_summary = time.monotonic()

    # -- bookkeeping (never raises in record mode) ---------------------------------------

    def _watch(self, hook: Callable[..., _T], *args: Any) -> _T | None:
        """Run one monitor hook: in raise mode as is; in record mode an error of the
        monitor's own is logged and counted, never raised into SGLang."""
        if self.mode == "raise":
            return hook(*args)
        try:
            return hook(*args)
        except Exception:
            self._counts["monitor_errors"] += 1
            logger.exception("ContractMonitor: the monitor itself failed; the call goes on")
            return None

    def _bytes(self, transfers: Any) -> int:
        if self._per_token is None:
            self._per_token = _bytes_per_token(self.linker.pools)
        per = self._per_token
        total = 0
        for t in transfers or ():
            idx = getattr(t, "device_indices", None)
            name = str(getattr(t.name, "value", t.name))
            if idx is not None and name in per:
                total += int(idx.numel()) * per[name]
        return total

    def _raised(self, call: str) -> None:
        self._counts["linker_exceptions"] += 1
        logger.error("ContractMonitor: the wrapped linker's %s raised", call, exc_info=True)

    def counts(self) -> dict[str, int]:
        """What the operator's log line holds (module docstring)."""
        out = dict(self._counts)
        out["violations"] = self.monitor.violation_count
        return out

    def summary(self) -> str:
        c = self.counts()
        keys = (
            "loads_queued",
            "loads_landed",
            "loads_failed",
            "offloads_accepted",
            "offloads_stored",
            "offloads_failed",
            "bytes_loaded",
            "bytes_offloaded",
            "violations",
            "linker_exceptions",
        )
        return "ContractMonitor: " + " ".join(f"{k}={c.get(k, 0)}" for k in keys)

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last_summary >= self.summary_every_s:
            self._last_summary = now
            logger.info("%s", self.summary())

    # -- what SGLang reads (the counter, pools and stream: `WrappingLinker`) ---------------

    def record_offload_ready(self) -> list[Any]:
        events: list[Any] = self.linker.record_offload_ready()
        return events

    def coverage(self) -> Coverage:
        return self.monitor.coverage()

    def save_coverage(self, path: str | Path) -> None:
        self.monitor.coverage().save(path)

    # -- the calls --------------------------------------------------------------------------

    def _call(self, name: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except BaseException:
            self._raised(name)
            raise

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        self._watch(self.monitor.before_lookup, rid)
        found: list[int] = self._call("lookup", lambda: self.linker.lookup(rid, transfers))
        self._watch(self._tick)
        return found

    def load(self, rid: str, transfers: list[Any]) -> bool:
        self._watch(self.monitor.before_load, rid)
        try:
            queued: bool = self._call("load", lambda: self.linker.load(rid, transfers))
        except BaseException:
            self._watch(self.monitor.after_load, rid, False)
            raise
        self._watch(self.monitor.after_load, rid, queued)
        self._watch(self._loaded, rid, transfers, queued)
        return queued

    def _loaded(self, rid: str, transfers: Any, queued: object) -> None:
        if queued is True:
            self._counts["loads_queued"] += 1
            self._load_bytes[rid] = self._bytes(transfers)
        self._tick()

    def start_layer_wise_loading(self) -> int:
        self._watch(self.monitor.before_start)
        index: int = self._call("start_layer_wise_loading", self.linker.start_layer_wise_loading)
        self._watch(self.monitor.after_start, index)
        self._watch(self._started, index)
        return index

    def _started(self, index: object) -> None:
        if isinstance(index, int) and self._load_bytes:
            self._batch_bytes[index] = (len(self._load_bytes), sum(self._load_bytes.values()))
        self._load_bytes.clear()

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        self._watch(self.monitor.before_finish, counter_index)
        landed: bool = self._call(
            "finish_layer_wise_loading",
            lambda: self.linker.finish_layer_wise_loading(counter_index),
        )
        self._watch(self.monitor.after_finish, counter_index, landed)
        self._watch(self._finished, counter_index, landed)
        return landed

    def _finished(self, index: int, landed: object) -> None:
        loads, moved = self._batch_bytes.pop(index, (0, 0))
        self._counts["loads_landed" if landed is True else "loads_failed"] += loads
        if landed is True:
            self._counts["bytes_loaded"] += moved
        self._tick()

    def cancel_queued_load(self, rid: str) -> bool:
        self._watch(self.monitor.before_cancel, rid)
        cancelled: bool = self._call(
            "cancel_queued_load", lambda: self.linker.cancel_queued_load(rid)
        )
        self._watch(self.monitor.after_cancel, rid, cancelled)
        if cancelled is True:
            self._load_bytes.pop(rid, None)
        return cancelled

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        self._watch(self.monitor.before_offload)
        pages = len(transfers[0].keys or ()) if transfers else 0
        try:
            queued: bool = self._call(
                "offload", lambda: self.linker.offload(transfers, session_id=session_id)
            )
        except BaseException:
            self._watch(self.monitor.after_offload, False, pages)
            raise
        self._watch(self.monitor.after_offload, queued, pages)
        self._watch(self._offloaded, transfers, queued)
        return queued

    def _offloaded(self, transfers: Any, queued: object) -> None:
        if queued is True:
            self._counts["offloads_accepted"] += 1
            self._offload_bytes.append(self._bytes(transfers))
        self._tick()

    def num_completed_offloads(self) -> int:
        self._watch(self.monitor.before_count)
        n: int = self._call("num_completed_offloads", self.linker.num_completed_offloads)
        self._watch(self.monitor.after_count, n)
        return n

    def pop_completed_offload(self) -> bool:
        self._watch(self.monitor.before_pop)
        ok: bool = self._call("pop_completed_offload", self.linker.pop_completed_offload)
        self._watch(self.monitor.after_pop, ok)
        self._watch(self._popped, ok)
        return ok

    def _popped(self, ok: object) -> None:
        moved = self._offload_bytes.popleft() if self._offload_bytes else 0
        self._counts["offloads_stored" if ok is True else "offloads_failed"] += 1
        if ok is True:
            self._counts["bytes_offloaded"] += moved
        self._tick()

    def reset(self) -> None:
        self._watch(self.monitor.before_reset)
        self._call("reset", self.linker.reset)
        self._watch(self.monitor.after_reset)
        self._load_bytes.clear()
        self._batch_bytes.clear()
        self._offload_bytes.clear()

    def close(self) -> None:
        self._watch(self.monitor.before_close)
        try:
            self._call("close", self.linker.close)
        finally:
            self._watch(self.monitor.after_close)
            self._watch(self.monitor.close_trace)
            logger.info("%s", self.summary())
