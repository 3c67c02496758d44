"""Attached pools and the validation of LOAD / OFFLOAD requests against them.

Every store validates a request completely before it queues anything, the same way:

- `AttachedPools(pools)` — the page devices a store was attached to, by `PoolName`;
  each must satisfy `unicache_fsm.pools.device.PageDevice` (a `KVPool`, or SGLang's
  buffers behind an adapter; `PageDeviceError`, a `StoreConfigError`, naming the pool
  and what it lacks otherwise), all of one page size P (`StoreConfigError` otherwise). Its
  `page_size`, `names` and `pool(name, operation)` (`UnknownPoolError` for a pool
  that is not attached, naming the attached ones).
- `check_data_transfers(transfers, phase)` -> tuple of `CheckedTransfer`: at least one
  transfer, one per pool, every pool attached, keys valid page hashes
  (`InvalidPageKeyError`), `device_indices` present (`StoreTransferError`), a 1-D int64
  tensor on the pool's device of whole pages inside the pool (the pool errors
  `TensorTypeError`, `DeviceMismatchError`, `TensorShapeError`, `ForeignSlotsError`,
  `UnalignedSlotsError`), ``len(indices) == len(keys) * P`` (`LengthMismatchError`);
  for LOAD, no page named twice (`DuplicatePagesError`: the write would be undefined).
- `CheckedTransfer(pool, keys, slots, pages, device)` — one validated transfer: its pool
  name, keys, slot tensor, the page id of each key's page (same order) and the attached
  page device it moves (the very object given to `attach`: a job's transfers say whose
  memory it moves, whatever wraps the store).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs
import torch

from unicache_fsm.pools.device import PageDevice, PageDeviceError, check_page_device
from unicache_fsm.pools.errors import DuplicatePagesError
from unicache_fsm.pools.slots import SlotCodec, preview
from unicache_fsm.pools.transfer import (
    LinkerTransferPhase,
    PoolName,
    PoolTransfer,
    check_page_keys,
)
from unicache_fsm.store.errors import StoreConfigError, StoreTransferError, UnknownPoolError

__all__ = ["AttachedPools", "CheckedTransfer"]

#: each phase's name, and each (phase name, pool)'s description of its slots, as the
#: checks below spell them (formatted once here, not on every request that passes)
_OPS = {phase: phase.value for phase in LinkerTransferPhase}
_WHAT = {
    (phase.value, name): f"{phase.value} {name} device_indices"
    for phase in LinkerTransferPhase
    for name in PoolName
}


@attrs.frozen
class CheckedTransfer:
    """A validated LOAD/OFFLOAD transfer: `pages[i]` is the device page of `keys[i]`;
    `device` is the attached page device of `pool` it moves."""

    pool: PoolName
    keys: tuple[str, ...]
    slots: torch.Tensor = attrs.field(eq=False, repr=False)
    pages: torch.Tensor = attrs.field(eq=False, repr=False)
    device: PageDevice = attrs.field(eq=False, repr=False)


class AttachedPools:
    """The pools a store reads from and writes into, with one slot codec per pool."""

    __slots__ = ("_codecs", "_page_size", "_pools")

    def __init__(self, pools: Mapping[PoolName, PageDevice]) -> None:
        checked: dict[PoolName, PageDevice] = {}
        pairs: Iterable[tuple[object, object]] = pools.items()
        for name, pool in pairs:
            if not isinstance(name, PoolName):
                msg = f"attach: pool names must be PoolName members, got {name!r}"
                raise StoreConfigError(msg, argument="pools", value=name)
            try:
                checked[name] = check_page_device(pool, f"attach: pool {name}")
            except PageDeviceError as exc:
                raise StoreConfigError(str(exc), argument="pools", value=pool) from exc
        sizes = {name: pool.page_size for name, pool in checked.items()}
        if len(set(sizes.values())) > 1:
            listed = ", ".join(f"{n}={p}" for n, p in sizes.items())
            msg = (
                f"attach: pools have different page sizes ({listed}); a page hash names one "
                "page of P tokens in every pool, so build all pools with the same page_size"
            )
            raise StoreConfigError(msg, argument="pools", value=sizes)
        self._pools = checked
        self._page_size = next(iter(sizes.values()), 0)
        self._codecs = {n: SlotCodec(p.layout, p.device) for n, p in checked.items()}

    @property
    def page_size(self) -> int:
        """P, or 0 when no pool is attached."""
        return self._page_size

    @property
    def names(self) -> tuple[PoolName, ...]:
        return tuple(self._pools)

    def items(self) -> list[tuple[PoolName, PageDevice]]:
        return list(self._pools.items())

    def pool(self, name: object, operation: str) -> PageDevice:
        """The attached pool called `name`, else `UnknownPoolError`."""
        pool = self._pools.get(name) if isinstance(name, PoolName) else None
        if pool is None:
            attached = tuple(str(n) for n in self._pools)
            msg = (
                f"{operation}: pool {name!s} is not attached to this store (attached: "
                f"{', '.join(attached) or 'none'}); call attach() with it first"
            )
            raise UnknownPoolError(msg, pool=name, attached=attached)
        return pool

    def check_data_transfers(
        self, transfers: Sequence[PoolTransfer], phase: LinkerTransferPhase
    ) -> tuple[CheckedTransfer, ...]:
        """Validate a LOAD or OFFLOAD request; see the module docstring."""
        op = _OPS.get(phase) or phase.value
        if isinstance(transfers, PoolTransfer) or not transfers:
            msg = f"{op}: pass a non-empty sequence of PoolTransfer objects, got {transfers!r}"
            raise StoreTransferError(msg, pool=None)
        out: list[CheckedTransfer] = []
        seen: set[PoolName] = set()
        pools, codecs, page_size = self._pools, self._codecs, self._page_size
        items: Sequence[object] = transfers
        for t in items:
            if not isinstance(t, PoolTransfer):
                msg = f"{op}: transfers must be PoolTransfer objects, got {type(t).__name__}"
                raise StoreTransferError(msg, pool=None)
            name = t.name
            if name in seen:
                msg = f"{op}: pool {name} is named twice; pass one transfer per pool"
                raise StoreTransferError(msg, pool=name)
            seen.add(name)
            pool = pools.get(name) if isinstance(name, PoolName) else None
            if pool is None:
                pool = self.pool(name, op)  # (raises UnknownPoolError naming it)
            keys = check_page_keys(t.keys)
            indices = t.device_indices
            if indices is None:
                msg = (
                    f"{op}: the {name} transfer has no device_indices; a {op} moves bytes "
                    "between device slots and the store, so pass the slots of its pages"
                )
                raise StoreTransferError(msg, pool=name)
            codec = codecs[name]
            what = _WHAT.get((op, name)) or f"{op} {name} device_indices"
            slots = codec.check_index_tensor(indices, what)
            if slots.numel() != len(keys) * page_size:
                t.check_page_size(page_size)  # (raises LengthMismatchError naming both)
            pages, once = codec.to_pages_once(slots, what)
            if phase is LinkerTransferPhase.LOAD and not once and SlotCodec.has_duplicates(pages):
                dup = SlotCodec.duplicate_pages(pages)
                msg = (
                    f"{op}: the {name} transfer names page(s) {preview(dup)} more than once; "
                    "which copy lands would be undefined, so pass each page once"
                )
                raise DuplicatePagesError(msg, pool=pool.name, pages=dup)
            out.append(CheckedTransfer(name, keys, slots, pages, pool))
        return tuple(out)
