"""`CheckedLinker`: the linker under test, every call checked at its own boundary.

It sits between SGLang 0.5.23's `UnifiedCacheLinkerWrapper` and the linker (SGLang's
wrapper caps the completions it pops, so it would hide an over-count) and raises
`LinkerViolation` at the first broken obligation:

- every call: it returns within ``bound_s`` (`BOUNDED_LIFECYCLE`), nothing escapes
  (`NO_ESCAPE`), the answer has its type and range (`ANSWERS`).
- `lookup`: claims only pages an accepted offload of this model submitted
  (`LOOKUP_TRUTHFUL`; `MODEL_ISOLATION` when only another model submitted them).
- `finish_layer_wise_loading` landed: every slot of every transfer of the batch holds
  the KV model's bytes, every layer (`LANDED_BYTES`); failed: fine unless every page
  of the batch was intact (`NOTHING_QUEUED`: something stale failed it).
- `start_layer_wise_loading` .. `finish_layer_wise_loading`: no slot outside the
  batch's own changes, and a layer the forward read right after ``wait_until``
  (`note_layer`) already held its bytes when the batch finishes as landed
  (`LANDED_BYTES`). `lookup` over pools that all need every page (ALL_PAGES) answers
  every shorter prefix of its longest (`ANSWERS`).
- `num_completed_offloads` <= accepted - popped (`COMPLETIONS_BOUNDED`); each pop is
  the oldest offload's result: an offload submitted while the backend was clean pops
  True (`COMPLETIONS_ORDERED`).
- `reset`: afterwards no completion is counted (`BOUNDED_LIFECYCLE`).

The facts it judges by live in a `Ledger` shared by every instance of a run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName

from unicache_fsm.integrations.linker_kit.kvmodel import KvModel
from unicache_fsm.integrations.linker_kit.ledger import Ledger
from unicache_fsm.integrations.linker_kit.obligations import (
    LinkerViolation,
    Obligation,
    Verdicts,
)
from unicache_fsm.integrations.sglang.interface import WrappingLinker

__all__ = ["CheckedLinker", "bounded"]

T = TypeVar("T")


def bounded(what: str, fn: Callable[[], T], seconds: float) -> T:
    """`fn()` in a daemon thread; `LinkerViolation` if it has not returned in `seconds`.
    What `fn` raises is raised here; a bare `BaseException` becomes a `NO_ESCAPE` violation."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    worker = threading.Thread(target=run, name=f"check-linker {what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise LinkerViolation(
            Obligation.BOUNDED_LIFECYCLE, f"{what} did not return within {seconds:g} s"
        )
    if "error" in box:
        error = box["error"]
        if isinstance(error, Exception):
            raise error
        # SystemExit, KeyboardInterrupt... raised by the linker's own code in that thread
        # (not this process's interrupt): an escape, and a verdict rather than an exit
        detail = f"{what} raised {type(error).__name__}: {error}".splitlines()[0]
        raise LinkerViolation(Obligation.NO_ESCAPE, detail) from error
    return box["value"]  # type: ignore[no-any-return]


@attrs.define
class _Offload:
    keys: tuple[str, ...]
    clean: bool  # submitted with no fault active and no write failure taken


@attrs.define
class _Load:
    rid: str
    transfers: list[tuple[Any, torch.Tensor, tuple[str, ...]]]  # pool, indices, keys


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class CheckedLinker(WrappingLinker):
    """The linker under test, checked on every call (module docstring)."""

    def __init__(
        self,
        linker: Any,
        *,
        model: KvModel,
        ledger: Ledger,
        verdicts: Verdicts,
        buffers: Mapping[Any, Any],
        faults: Any = None,
        bound_s: float = 10.0,
    ) -> None:
        self.linker = linker
        self.model = model
        self.ledger = ledger
        self.verdicts = verdicts
        self.buffers = dict(buffers)  # PoolName -> SGLang's K/V pool of that name
        self.faults = faults
        self.bound_s = bound_s
        self.page = 0  # set by the rig: tokens per page
        self._offloads: list[_Offload] = []
        self._queued: dict[str, _Load] = {}
        self._batches: dict[int, list[_Load]] = {}
        # batch -> the device pools as they were when it started, to find writes
        # outside its own slots; batch -> the first layer its forward read too early
        self._before: dict[int, dict[Any, list[torch.Tensor]]] = {}
        self._early: dict[int, str] = {}

    # -- delegation (the counter, pools and stream: `WrappingLinker`) -------------------

    def record_offload_ready(self) -> list[Any]:
        events: list[Any] = self._call("record_offload_ready", self.linker.record_offload_ready)
        return events

    def _call(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            out = bounded(name, lambda: fn(*args, **kwargs), self.bound_s)
        except LinkerViolation:
            raise
        except Exception as exc:
            detail = f"{name} raised {type(exc).__name__}: {exc}".splitlines()[0]
            raise LinkerViolation(Obligation.NO_ESCAPE, detail) from exc
        self.verdicts.checked(Obligation.NO_ESCAPE)
        return out

    def _answer(self, name: str, value: Any, ok: bool, want: str) -> None:
        if not ok:
            raise LinkerViolation(
                Obligation.ANSWERS, f"{name} answered {value!r}; 0.5.23 expects {want}"
            )
        self.verdicts.checked(Obligation.ANSWERS)

    # -- loads ----------------------------------------------------------------------------

    @staticmethod
    def _full_keys(transfers: list[Any]) -> tuple[str, ...]:
        for t in transfers:
            if t.name == PoolName.KV:
                return tuple(t.keys or ())
        return ()

    def lookup(self, rid: str, transfers: list[Any]) -> list[int]:
        keys = self._full_keys(transfers)
        found = self._call("lookup", self.linker.lookup, rid, transfers)
        ok = isinstance(found, list) and all(_is_int(p) and 1 <= p <= len(keys) for p in found)
        self._answer("lookup", found, ok, f"a list of page counts in 1..{len(keys)}")
        if found:
            claimed = keys[: max(found)]
            mine = self.ledger.submitted.get(self.model.model, set())
            for i, key in enumerate(claimed):
                if key in mine:
                    continue
                others = self.ledger.owners(key)
                if others:
                    raise LinkerViolation(
                        Obligation.MODEL_ISOLATION,
                        f"model {self.model.model!r}: lookup claims page {i} ({key[:12]}...) "
                        f"that only model {others[0]!r} offloaded",
                    )
                raise LinkerViolation(
                    Obligation.LOOKUP_TRUTHFUL,
                    f"lookup claims {max(found)} pages; page {i} ({key[:12]}...) was never "
                    "offloaded",
                )
            self.verdicts.checked(Obligation.LOOKUP_TRUTHFUL)
            sparse_ok = any(t.hit_policy == PoolHitPolicy.TRAILING_PAGES for t in transfers)
            missing = sorted(set(range(1, max(found) + 1)) - set(found))
            if missing and not sparse_ok:
                raise LinkerViolation(
                    Obligation.ANSWERS,
                    f"lookup answered {sorted(set(found))} for pools that all need every "
                    f"page (ALL_PAGES): the shorter prefixes {missing} are restorable too and "
                    "missing (0.5.23 intersects these sets across ranks)",
                )
            if len(self.ledger.submitted) > 1:
                self.verdicts.checked(Obligation.MODEL_ISOLATION)
        return found  # type: ignore[no-any-return]

    def load(self, rid: str, transfers: list[Any]) -> bool:
        queued = self._call("load", self.linker.load, rid, transfers)
        self._answer("load", queued, isinstance(queued, bool), "a bool")
        if queued:
            self._queued[rid] = _Load(
                rid,
                [
                    (t.name, t.device_indices.clone(), tuple(t.keys or ()))
                    for t in transfers
                    if t.device_indices is not None
                ],
            )
        return queued  # type: ignore[no-any-return]

    def start_layer_wise_loading(self) -> int:
        index = self._call("start_layer_wise_loading", self.linker.start_layer_wise_loading)
        self._answer("start_layer_wise_loading", index, _is_int(index), "an int")
        if self._queued:
            self._batches[index] = list(self._queued.values())
            self._queued.clear()
            self._before[index] = {
                pool: [b.clone() for b in (*buf.k_buffer, *buf.v_buffer)]
                for pool, buf in self.buffers.items()
            }
        return index  # type: ignore[no-any-return]

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        landed = self._call(
            "finish_layer_wise_loading", self.linker.finish_layer_wise_loading, counter_index
        )
        self._answer("finish_layer_wise_loading", landed, isinstance(landed, bool), "a bool")
        loads = self._batches.pop(counter_index, [])
        self._check_outside(counter_index, loads)
        early = self._early.pop(counter_index, None)
        if landed:
            for load in loads:
                self._check_bytes(load)
            if early is not None:
                raise LinkerViolation(Obligation.LANDED_BYTES, early)
        elif loads:
            keys = [k for load in loads for _, _, ks in load.transfers for k in ks]
            if self.ledger.intact(self.model.model, keys):
                raise LinkerViolation(
                    Obligation.NOTHING_QUEUED,
                    f"batch {counter_index} ({', '.join(load.rid for load in loads)}) failed "
                    "although every page it loads is intact: something stale is queued",
                )
            self.verdicts.checked(Obligation.NOTHING_QUEUED)
        return landed  # type: ignore[no-any-return]

    def expected(self, pool: Any, keys: tuple[str, ...], layer: int, kind: str) -> torch.Tensor:
        """The KV model's rows for the pages `keys` of `pool`'s `layer` (K or V)."""
        buf = self.buffers[pool]
        width = buf.k_buffer[0][0].numel()
        rows = []
        for key in keys:
            tokens = self.ledger.page_tokens[key]
            hashes = self.model.prefix_hashes(tokens)[-self.page :]
            rows.append(self.model.values(hashes, str(pool.value), layer, kind, width))
        return torch.cat(rows) if rows else torch.zeros(0, width)

    def _wrong_token(
        self, pool: Any, indices: torch.Tensor, keys: tuple[str, ...], layer: int, kind: str
    ) -> int | None:
        """The first token of `pool`'s `layer` (K or V) at `indices` that is not the
        KV model's, or None."""
        buf = self.buffers[pool]
        bufs = buf.k_buffer if kind == "k" else buf.v_buffer
        got = bufs[layer][indices.to(torch.int64)].reshape(indices.numel(), -1)
        want = self.expected(pool, keys, layer, kind)
        if torch.equal(got.to(torch.float32), want):
            return None
        return int((got.to(torch.float32) != want).any(dim=1).nonzero()[0])

    def _checkable(self, load: _Load) -> list[tuple[Any, torch.Tensor, tuple[str, ...]]]:
        """The transfers the kit can judge: a modelled pool and whole pages."""
        return [
            (pool, indices, keys)
            for pool, indices, keys in load.transfers
            if pool in self.buffers and indices.numel() == len(keys) * self.page
        ]

    def _check_bytes(self, load: _Load) -> None:
        for pool, indices, keys in self._checkable(load):
            for layer in range(self.buffers[pool].layer_num):
                for kind in ("k", "v"):
                    bad = self._wrong_token(pool, indices, keys, layer, kind)
                    if bad is not None:
                        raise LinkerViolation(
                            Obligation.LANDED_BYTES,
                            f"load of {load.rid!r} finished as landed, but pool {pool.value} "
                            f"layer {layer} {kind.upper()} of token {bad} (page "
                            f"{bad // self.page}) is not the model's",
                        )
            self.verdicts.checked(Obligation.LANDED_BYTES)

    def note_layer(self, index: int, pool: Any, layer: int) -> None:
        """The forward of batch `index` read `pool`'s `layer` right after the layer
        counter's ``wait_until`` returned for it: if the batch then finishes as landed,
        that layer must have been there already (noted here, judged at finish)."""
        if index in self._early:
            return
        for load in self._batches.get(index, []):
            for p, indices, keys in self._checkable(load):
                if p != pool:
                    continue
                for kind in ("k", "v"):
                    bad = self._wrong_token(pool, indices, keys, layer, kind)
                    if bad is not None:
                        self._early[index] = (
                            f"load of {load.rid!r}: wait_until returned for pool {pool.value} "
                            f"layer {layer} before it landed ({kind.upper()} of token {bad} was "
                            "not the model's when the forward read it)"
                        )
                        return

    def _check_outside(self, index: int, loads: list[_Load]) -> None:
        """Nothing outside the batch's own slots changed while it loaded."""
        before = self._before.pop(index, None)
        if before is None:
            return
        for pool, old in before.items():
            buf = self.buffers[pool]
            mine = [i for load in loads for p, i, _ in load.transfers if p == pool]
            outside = torch.ones(old[0].shape[0], dtype=torch.bool)
            for indices in mine:
                outside[indices.to(torch.int64)] = False
            for n, (was, now) in enumerate(zip(old, (*buf.k_buffer, *buf.v_buffer), strict=True)):
                changed = (was[outside] != now[outside]).reshape(int(outside.sum()), -1).any(1)
                if bool(changed.any()):
                    slot = int(outside.nonzero()[int(changed.nonzero()[0])])
                    raise LinkerViolation(
                        Obligation.LANDED_BYTES,
                        f"batch {index} wrote device slot {slot} of pool {pool.value} "
                        f"(layer {n % buf.layer_num} {'KV'[n // buf.layer_num]}), which none "
                        "of its loads was given",
                    )

    def cancel_queued_load(self, rid: str) -> bool:
        cancelled = self._call("cancel_queued_load", self.linker.cancel_queued_load, rid)
        self._answer("cancel_queued_load", cancelled, isinstance(cancelled, bool), "a bool")
        if cancelled:
            self._queued.pop(rid, None)
        return cancelled  # type: ignore[no-any-return]

    # -- offloads -----------------------------------------------------------------------

    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool:
        armed = self.ledger.write_fault_armed
        queued = self._call("offload", self.linker.offload, transfers, session_id=session_id)
        self._answer("offload", queued, isinstance(queued, bool), "a bool")
        took_fault = False
        if armed and self.faults is not None and not self.faults.write_failure_armed:
            self.ledger.write_fault_armed = False  # this offload's write took the fault
            took_fault = True
        if queued:
            keys = self._full_keys(transfers)
            self.ledger.submit(self.model.model, keys)
            clean = not took_fault and self.ledger.clean()
            self._offloads.append(_Offload(keys, clean))
        return queued  # type: ignore[no-any-return]

    def num_completed_offloads(self) -> int:
        n = self._call("num_completed_offloads", self.linker.num_completed_offloads)
        self._answer("num_completed_offloads", n, _is_int(n) and n >= 0, "an int >= 0")
        if n > len(self._offloads):
            raise LinkerViolation(
                Obligation.COMPLETIONS_BOUNDED,
                f"num_completed_offloads() = {n}, but only {len(self._offloads)} accepted "
                "offloads are outstanding",
            )
        self.verdicts.checked(Obligation.COMPLETIONS_BOUNDED)
        return n  # type: ignore[no-any-return]

    def pop_completed_offload(self) -> bool:
        if not self._offloads:
            raise LinkerViolation(
                Obligation.COMPLETIONS_BOUNDED, "a completion popped with no offload outstanding"
            )
        ok = self._call("pop_completed_offload", self.linker.pop_completed_offload)
        self._answer("pop_completed_offload", ok, isinstance(ok, bool), "a bool")
        head = self._offloads.pop(0)
        if head.clean and not ok:
            raise LinkerViolation(
                Obligation.COMPLETIONS_ORDERED,
                "an offload submitted with no fault active popped False: completions "
                "out of order (or a spurious failure)",
            )
        self.verdicts.checked(Obligation.COMPLETIONS_ORDERED)
        if ok:
            self.ledger.store(self.model.model, head.keys)
        return ok  # type: ignore[no-any-return]

    @property
    def outstanding_offloads(self) -> int:
        return len(self._offloads)

    # -- lifecycle ------------------------------------------------------------------------

    def _forget(self) -> None:
        self._offloads.clear()
        self._queued.clear()
        self._batches.clear()
        self._before.clear()
        self._early.clear()

    def reset(self) -> None:
        self._call("reset", self.linker.reset)
        self._forget()
        n = self._call("num_completed_offloads", self.linker.num_completed_offloads)
        if n != 0:
            raise LinkerViolation(
                Obligation.BOUNDED_LIFECYCLE,
                f"num_completed_offloads() = {n!r} right after reset (reset leaves "
                "completions in flight)",
            )
        self.verdicts.checked(Obligation.BOUNDED_LIFECYCLE)

    def close(self) -> None:
        self._call("close", self.linker.close)
        self._forget()
        self.verdicts.checked(Obligation.BOUNDED_LIFECYCLE)
