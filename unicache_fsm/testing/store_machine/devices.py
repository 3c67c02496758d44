"""The device side of the store machine: the pools a store reads and writes, the bytes
the machine puts there, and what it checks there.

- `BreakablePool` — a CPU `KVPool` whose next store write can be made to fail
  (`DeviceFault`, the `break_device` rule), and that can hide its memory from the host.
- `Part` — one pool's share of a transfer the machine hands the store: keys and slots.
- `Devices` — the machine's pools and allocators (`open`), and per page:
  `source` (slots holding the page's *truth* bytes, a fixed function of pool and key,
  for an offload), `destination` (slots holding `POISON`, for a load), `free` (slots
  given back, holding `FREED` until allocated again); the checks `wrong_page` (a part's
  slots hold its truth bytes), `wrong_layers` (its first layers do) and `check_freed`
  (no freed slot was written since); `arm` / `mend` a device fault.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.transfer import PoolHitPolicy, PoolName, PoolTransfer

Ident = tuple[PoolName, str]
"""A page: its pool and its key."""

POISON = 2048.0
"""Written into every load destination first; truth bytes are integers in (-1000, 1000)."""

FREED = -4096.0
"""Written into every slot the machine frees (a popped completion's, a refused job's): a
store that still writes into slots it gave back shows there."""

_TRUTH_BOUND = 1000
_POOL_INDEX = {name: i for i, name in enumerate(PoolName)}


class DeviceFault(UnicacheFsmError, RuntimeError):
    """A store's write into the machine's pools failed on purpose (`break_device`)."""


class BreakablePool(KVPool):
    """A KVPool whose store writes can be made to fail: with `fail_after` = n, the
    write after n more raises `DeviceFault` (then it is disarmed). The machine's own
    writes (`write_pages`) neither count nor fail. With `host_view` False it hides its
    memory from the host, as a GPU or SGLang's per-layer buffers do."""

    __slots__ = ("fail_after", "host_view")

    def __init__(self, *args: object, host_view: bool = True, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fail_after: int | None = None
        self.host_view = host_view

    def page_bytes(self) -> Any:
        """The pool's pages in place, or None when the machine hides them (`host_view`
        False: stores then move bytes only through reads and per-layer writes)."""
        return super().page_bytes() if self.host_view else None

    def write_page_ids(
        self, pages: torch.Tensor, data: torch.Tensor, *, layers: slice | None = None
    ) -> None:
        left = self.fail_after
        if left is not None:
            self.fail_after = left - 1 if left else None
            if not left:
                msg = f"pool {self.name!r}: the device write failed (break_device)"
                raise DeviceFault(msg)
        super().write_page_ids(pages, data, layers=layers)

    def write_pages(self, slots: torch.Tensor, data: torch.Tensor) -> None:
        armed, self.fail_after = self.fail_after, None
        try:
            super().write_pages(slots, data)
        finally:
            self.fail_after = armed


@attrs.define(eq=False)
class Part:
    """One pool's share of a test transfer: its keys and the device slots they use."""

    pool: PoolName
    keys: tuple[str, ...]
    slots: torch.Tensor = attrs.field(repr=False)


class Devices:
    """The machine's pools, what it wrote into them, and the checks of their bytes.

    Empty until `open`; `allocators`, `pools` and `freed` are filled in place (the
    machine's `allocators`, `kv_pools` and `freed` are these very dicts)."""

    def __init__(self) -> None:
        self.page_size = 0
        self.num_layers = 0
        self.allocators: dict[PoolName, PagedAllocator] = {}
        self.pools: dict[PoolName, BreakablePool] = {}
        # pages the machine freed, by pool: first slot -> why (kept until allocated again),
        # and their slots as one tensor (rebuilt only after a change: checked every step)
        self.freed: dict[PoolName, dict[int, str]] = {}
        self._freed_slots: dict[PoolName, torch.Tensor] = {}
        self._truth_pages: dict[Ident, torch.Tensor] = {}
        self._width = 0
        self.armed = False  # a device fault was armed, and no progress() or reset() since

    def open(
        self,
        names: tuple[PoolName, ...],
        pool_pages: int,
        page_size: int,
        *,
        num_layers: int,
        width: int,
        host_view: bool,
    ) -> None:
        """Build a pool of `pool_pages` pages of `page_size` tokens for each name."""
        self.page_size, self.num_layers, self._width = page_size, num_layers, width
        self.allocators.clear()
        self.allocators.update(
            (name, PagedAllocator(pool_pages * page_size, page_size, name=name.value))
            for name in names
        )
        self.pools.clear()
        self.pools.update(
            (
                name,
                BreakablePool(
                    alloc.size, page_size, num_layers, width, name=alloc.name, host_view=host_view
                ),
            )
            for name, alloc in self.allocators.items()
        )

    # -- device faults -------------------------------------------------------------------

    def arm(self, pool: PoolName, after: int) -> None:
        """The store's write into `pool` after `after` more fails (if the pool is attached)."""
        self.armed = True
        if pool in self.pools:
            self.pools[pool].fail_after = after

    def mend(self) -> None:
        """Disarm every pool (what `progress()` and `reset()` do to a device fault)."""
        self.armed = False
        for pool in self.pools.values():
            pool.fail_after = None

    # -- slots ---------------------------------------------------------------------------

    def has_room(self, pages: int) -> bool:
        """Whether every pool can still give `pages` pages."""
        need = pages * self.page_size
        return all(alloc.available_size() >= need for alloc in self.allocators.values())

    @staticmethod
    def transfers(parts: tuple[Part, ...]) -> list[PoolTransfer]:
        """The transfers `parts` make: KV all pages, every other pool its trailing pages."""
        return [
            PoolTransfer(
                part.pool,
                part.slots,
                part.keys,
                PoolHitPolicy.ALL_PAGES
                if part.pool is PoolName.KV
                else PoolHitPolicy.TRAILING_PAGES,
            )
            for part in parts
        ]

    def alloc(self, pool: PoolName, pages: int) -> torch.Tensor:
        """`pages` pages' slots of `pool` (no longer freed)."""
        slots = self.allocators[pool].alloc(pages * self.page_size)
        assert slots is not None, "the _has_room precondition keeps a chain's worth free"
        freed = self.freed.get(pool)
        if freed:
            for first in slots[:: self.page_size].tolist():
                freed.pop(first, None)
            self._freed_slots.pop(pool, None)
        return slots

    def free(self, parts: tuple[Part, ...], why: str) -> None:
        """Give `parts`' slots back, marked `FREED` (checked by `check_freed`)."""
        for part in parts:
            self.pools[part.pool].fill_pages(part.slots, FREED)
            self.allocators[part.pool].free(part.slots)
            freed = self.freed.setdefault(part.pool, {})
            for first in part.slots[:: self.page_size].tolist():
                freed[first] = why
            self._freed_slots.pop(part.pool, None)

    def truth(self, ident: Ident) -> torch.Tensor:
        """The bytes of page `ident`: integers in (-1000, 1000), fixed by pool and key."""
        page = self._truth_pages.get(ident)
        if page is None:
            pool, key = ident
            gen = torch.Generator().manual_seed(int(key[:15], 16) * 4 + _POOL_INDEX[pool])
            shape = (self.page_size, self.num_layers, self._width)
            values = torch.randint(-_TRUTH_BOUND + 1, _TRUTH_BOUND, shape, generator=gen)
            page = self._truth_pages[ident] = values.to(self.pools[pool].dtype)
        return page

    def source(self, pool: PoolName, keys: tuple[str, ...]) -> Part:
        """Fresh slots of `pool` holding `keys`' truth bytes (an offload's source)."""
        slots = self.alloc(pool, len(keys))
        self.pools[pool].write_pages(slots, torch.cat([self.truth((pool, k)) for k in keys]))
        return Part(pool, keys, slots)

    def destination(self, pool: PoolName, keys: tuple[str, ...]) -> Part:
        """Fresh slots of `pool` holding `POISON` (a load's destination)."""
        slots = self.alloc(pool, len(keys))
        kv = self.pools[pool]
        poison = torch.full((slots.numel(), kv.num_layers, kv.width), POISON, dtype=kv.dtype)
        kv.write_pages(slots, poison)
        return Part(pool, keys, slots)

    # -- checks --------------------------------------------------------------------------

    def wrong_page(self, part: Part) -> str | None:
        """None when `part`'s slots hold its truth bytes, else which page is wrong, how."""
        n, p = len(part.keys), self.page_size
        got = self.pools[part.pool].read_pages(part.slots).view(n, p, -1)
        want = torch.stack([self.truth((part.pool, k)) for k in part.keys]).view(n, p, -1)
        same = (got == want).flatten(1).all(1)
        if bool(same.all()):
            return None
        i = int((~same).nonzero()[0, 0])
        where = f"{i} (key {part.keys[i][:12]}...)"
        page = got[i]
        if bool((page == POISON).all()):
            return f"{where} still holds the poison: the store never wrote it"
        twins = [j for j in range(n) if bool((page == want[j]).all())]
        if twins:
            return f"{where} holds the bytes of page {twins[0]} of the same transfer"
        for other in self.pools:
            theirs = self.truth((other, part.keys[i])).view(p, -1)
            if other is not part.pool and bool((page == theirs).all()):
                return f"{where} holds this key's {other.value} page"
        return f"{where} holds bytes that are not this page's"

    def wrong_layers(self, part: Part, layers: int) -> str | None:
        """None when the first `layers` layers of `part`'s slots hold its truth bytes,
        else which page and layer is wrong."""
        n, p = len(part.keys), self.page_size
        got = self.pools[part.pool].read_pages(part.slots).view(n, p, self.num_layers, -1)
        want = torch.stack([self.truth((part.pool, k)) for k in part.keys])
        same = (got[:, :, :layers] == want[:, :, :layers]).all(3).all(1)  # [page, layer]
        if bool(same.all()):
            return None
        page, layer = (int(i) for i in (~same).nonzero()[0])
        poisoned = bool((got[page, :, layer] == POISON).all())
        how = "still holds the poison: not written yet" if poisoned else "holds other bytes"
        return f"page {page} (key {part.keys[page][:12]}...) layer {layer} {how}"

    def check_freed(self) -> None:
        """Every slot freed (and not allocated since) still holds `FREED`."""
        p = self.page_size
        for pool, pages in self.freed.items():
            if not pages:
                continue
            slots = self._freed_slots.get(pool)
            if slots is None:
                firsts = torch.tensor(sorted(pages), dtype=torch.int64)
                slots = self._freed_slots[pool] = (firsts[:, None] + torch.arange(p)).flatten()
            rows = self.pools[pool].read_pages(slots).view(len(pages), -1)
            touched = ~(rows == FREED).all(1)
            if bool(touched.any()):
                first = int(slots[int(touched.nonzero()[0, 0]) * p])
                raise AssertionError(
                    f"{pool.value} slots {first}..{first + p - 1} were written after the "
                    f"machine freed them ({pages[first]}): the store still writes into "
                    "slots it gave back (its completion, or its count of completions, ran "
                    "ahead of its work)"
                )
