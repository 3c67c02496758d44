"""KV data pools: the real KV bytes of every token slot, moved a page at a time.

- `KVPool(size, page_size, num_layers, width, dtype=torch.float16, device="cpu")`:
  a zero-filled tensor ``data`` of shape ``[num_slots, num_layers, width]`` on `device`
  (``num_slots = size + P``; row s holds slot s). Built to match an allocator with
  `KVPool.for_allocator(allocator, num_layers, width, dtype=...)`.
- `read_pages(slots, out=None)` -> ``[len(slots), num_layers, width]`` copy of the
  pages' rows, in the order given. `out` (contiguous, same shape) is filled and
  returned: reuse one on hot paths, since a fresh multi-MiB CPU tensor page-faults.
- `write_pages(slots, data)`: store ``data`` (same shape, the pool's dtype and device)
  into the pages' rows. A page named twice is refused (the result would be undefined);
  data that is a view of the pool itself is written as it was before the call.
- `fill_pages(slots, value)`: set every element of whole pages `slots` to `value` (a
  page may repeat: every copy gets the same value).
- `read_page_ids(pages, out=None)` / `write_page_ids(pages, data, *, layers=None)` —
  the same moves for slots validated before: `pages` as `pages_of(slots, what)`
  returned them (a store validates a transfer once, when it accepts it, and moves its
  bytes later). `layers` (a `slice` of layers) writes only those layers of the pages,
  from ``[len(pages) * P, len(layers), width]`` data (see `unicache_fsm.pools.device`).
- `page_bytes()` — a CPU pool's pages as uint8 NumPy rows over its own memory (the
  host tier and the stores copy large pages in place through it); None for a pool on
  another device.

A `KVPool` is a `PageDevice` (`unicache_fsm.pools.device`): its rows are the store's
page format.

`slots` are whole pages of the pool's usable range (pages 1 .. num_pages), as an
allocator hands them out; reads may repeat a page. Both calls gather or scatter whole
pages (``P * num_layers * width`` contiguous elements each) with one `index_select` /
`index_copy_`, except on a CPU pool: pages of at least `PAGE_BY_PAGE_BYTES` (16 KiB)
are read and written page by page (one memcpy each, and one Python step per 16 KiB
costs little), and `write_pages` writes smaller ones with one NumPy row assignment
(both several times faster than the scatter kernel, which moves a row element by
element; the gather kernel is slower too, and more so when its threads contend). Bad
slots or data raise typed errors from `pools.errors` before any byte moves.

The default dtype is float16 (what most served KV caches hold); any torch dtype works.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from unicache_fsm.pools.device import layer_slice
from unicache_fsm.pools.errors import (
    DeviceMismatchError,
    DuplicatePagesError,
    PoolConfigError,
    TensorShapeError,
    TensorTypeError,
)
from unicache_fsm.pools.layout import PageLayout, resolve_device
from unicache_fsm.pools.paged import PagedAllocator
from unicache_fsm.pools.slots import SlotCodec, preview

#: CPU pages at least this large are copied one memcpy per page (a Python step per page
#: then costs little next to the bytes; smaller pages move faster in one torch op).
PAGE_BY_PAGE_BYTES = 16 << 10

#: dtypes whose CPU tensors NumPy can view (others fill through torch)
_NUMPY_DTYPES = frozenset(
    {torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16}
    | {torch.int32, torch.int64}
)

__all__ = ["PAGE_BY_PAGE_BYTES", "KVPool"]


class KVPool:
    """Per-slot KV bytes on one device, read and written whole pages at a time."""

    __slots__ = (
        "_codec",
        "_data",
        "_device",
        "_layout",
        "_num_layers",
        "_page_nbytes",
        "_row_bytes",
        "_rows",
        "_width",
    )

    def __init__(
        self,
        size: int,
        page_size: int,
        num_layers: int,
        width: int,
        *,
        dtype: torch.dtype = torch.float16,
        device: str | torch.device = "cpu",
        name: str = "kv",
        pin_memory: bool = False,
    ) -> None:
        self._layout = PageLayout(size, page_size, name)
        for argument, value in (("num_layers", num_layers), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"pool {name!r}: {argument} must be an int >= 1, got {value!r}"
                raise PoolConfigError(msg, argument=argument, value=value)
        dtype_arg: object = dtype
        if not isinstance(dtype_arg, torch.dtype):
            msg = f"pool {name!r}: dtype must be a torch.dtype, got {dtype!r}"
            raise PoolConfigError(msg, argument="dtype", value=dtype)
        self._device = resolve_device(device)
        if pin_memory and self._device.type != "cpu":
            msg = f"pool {name!r}: pin_memory applies to CPU pools only, not {self._device}"
            raise PoolConfigError(msg, argument="pin_memory", value=pin_memory)
        self._num_layers = num_layers
        self._width = width
        self._codec = SlotCodec(self._layout, self._device)
        shape = (self._layout.num_slots, num_layers, width)
        self._data = torch.zeros(shape, dtype=dtype, device=self._device, pin_memory=pin_memory)
        # The same storage seen as [page, P * layers * width]: one flat row per page, so
        # a page moves as one contiguous block in a single gather/scatter (2-D rows are
        # also what torch's CPU index kernels copy fastest).
        self._rows = self._data.view(self._layout.num_pages + 1, -1)
        self._page_nbytes = self._rows[0].nbytes
        # a CPU pool's rows as uint8 NumPy rows, made once (the storage never changes)
        self._row_bytes = (
            self._rows.view(torch.uint8).numpy() if self._device.type == "cpu" else None
        )

    @classmethod
    def for_allocator(
        cls,
        allocator: PagedAllocator,
        num_layers: int,
        width: int,
        *,
        dtype: torch.dtype = torch.float16,
    ) -> KVPool:
        """A pool slot-for-slot with `allocator` (same size, P, device and name)."""
        return cls(
            allocator.size,
            allocator.page_size,
            num_layers,
            width,
            dtype=dtype,
            device=allocator.device,
            name=allocator.name,
        )

    def __getstate__(self) -> dict[str, Any]:
        """The pool's fields but its NumPy view of the rows: a copy (``copy.deepcopy``,
        pickle) rebuilds that view over its own rows (`__setstate__`), since a copied
        array would be memory of its own, not a view of the copy's pages."""
        names = {n for c in type(self).__mro__ for n in getattr(c, "__slots__", ())}
        return {n: getattr(self, n) for n in names - {"_row_bytes"} if hasattr(self, n)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        cpu = self._device.type == "cpu"
        self._row_bytes = self._rows.view(torch.uint8).numpy() if cpu else None

    # -- read-only facts ---------------------------------------------------------------

    @property
    def layout(self) -> PageLayout:
        return self._layout

    @property
    def name(self) -> str:
        return self._layout.name

    @property
    def page_size(self) -> int:
        return self._layout.page_size

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def width(self) -> int:
        return self._width

    @property
    def dtype(self) -> torch.dtype:
        return self._data.dtype

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def data(self) -> torch.Tensor:
        """The live ``[num_slots, num_layers, width]`` tensor (kernels index it by slot)."""
        return self._data

    @property
    def page_nbytes(self) -> int:
        """Bytes of one page (P slots x layers x width)."""
        return self._page_nbytes

    def page_bytes(self) -> Any:
        """The CPU pool's pages as the rows of a ``[num_pages + 1, page_nbytes]`` uint8
        NumPy array over the pool's own memory (no copy; row = page id); None for a
        pool on another device (the host cannot view it in place)."""
        return self._row_bytes

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self._layout.size}, page_size={self.page_size}, "
            f"num_layers={self._num_layers}, width={self._width}, dtype={self.dtype}, "
            f"device={str(self._device)!r}, name={self.name!r})"
        )

    # -- primitives --------------------------------------------------------------------

    def read_pages(self, slots: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of whole pages `slots`, ``[len(slots), num_layers, width]``."""
        return self.read_page_ids(self.pages_of(slots, "slots to read"), out=out)

    def write_pages(self, slots: torch.Tensor, data: torch.Tensor) -> None:
        """Store `data` (``[len(slots), num_layers, width]``) into whole pages `slots`."""
        what = "slots to write"
        codec = self._codec
        t = codec.check_index_tensor(slots, what)
        # decoded once; ids the native decode answered are known to be distinct (it
        # refuses a repeated page), others are counted (`has_duplicates`)
        pages, distinct = codec.to_pages_once(t, what)
        if distinct or not SlotCodec.has_duplicates(pages):
            self.write_page_ids(pages, data)
            return
        dup = SlotCodec.duplicate_pages(pages)
        msg = (
            f"pool {self.name!r}: slots to write name page(s) {preview(dup)} more than once; "
            "which copy lands would be undefined, so pass each page once"
        )
        raise DuplicatePagesError(msg, pool=self.name, pages=dup)

    def fill_pages(self, slots: torch.Tensor, value: float) -> None:
        """Set every element of whole pages `slots` to `value` (checked as `read_pages`
        checks its slots; on a CPU pool one NumPy fill of the rows, no source tensor)."""
        pages = self.pages_of(slots, "slots to fill")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            msg = f"pool {self.name!r}: fill value must be a number, got {value!r}"
            raise TensorTypeError(msg, what="value", got=type(value), expected=self.dtype)
        if self._device.type == "cpu" and self.dtype in _NUMPY_DTYPES:
            self._rows.numpy()[pages.numpy()] = value
        else:
            self._rows.index_fill_(0, pages, value)

    def read_page_ids(
        self, pages: torch.Tensor, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`read_pages` of slots already validated: `pages` are their page ids as
        `pages_of` returned them (a store validates a transfer's slots once, when it
        accepts the transfer, and moves its bytes later by page id)."""
        n = pages.numel() * self.page_size
        if out is not None:
            self._check_data(out, n, "out")
            if not out.is_contiguous():
                msg = (
                    f"pool {self.name!r}: out must be contiguous (pages land as whole "
                    "blocks); pass a fresh tensor, or none to get one"
                )
                raise TensorShapeError(
                    msg, what="out", got=tuple(out.shape), expected=tuple(out.shape)
                )
        if self._device.type == "cpu" and self.page_nbytes >= PAGE_BY_PAGE_BYTES:
            # large CPU pages: one memcpy per page (index_select's kernel is slower, and
            # several times so when its threads contend on shared cores)
            if out is None:
                out = torch.empty((n, self._num_layers, self._width), dtype=self.dtype)
            src = self.page_bytes()
            dst = out.view(pages.numel(), self._rows.shape[1]).view(torch.uint8).numpy()
            for i, page in enumerate(pages.tolist()):
                dst[i] = src[page]
            return out
        if out is not None:
            torch.index_select(
                self._rows, 0, pages, out=out.view(pages.numel(), self._rows.shape[1])
            )
            return out
        rows = self._rows.index_select(0, pages)
        return rows.view(n, self._num_layers, self._width)

    def write_page_ids(
        self, pages: torch.Tensor, data: torch.Tensor, *, layers: slice | None = None
    ) -> None:
        """`write_pages` into slots already validated: `pages` are their page ids as
        `pages_of` returned them, each page once (see `read_page_ids`). `layers` (a
        slice of step 1) writes only those layers' columns of the pages, from data of
        shape ``[len(pages) * P, len(layers), width]``; the other layers stay."""
        n = pages.numel()
        if layers is not None:
            start, stop = layer_slice(layers, self._num_layers, f"pool {self.name!r}")
            if (start, stop) != (0, self._num_layers):
                self._write_layers(pages, data, start, stop)
                return
        self._check_data(data, n * self.page_size, "data")
        if data.is_conj() or data.is_neg():  # lazy bits a byte or NumPy view cannot carry
            data = data.resolve_conj().resolve_neg()
        dst = self._row_bytes
        if dst is not None and data.dtype in _NUMPY_DTYPES and not data.requires_grad:
            # a CPU pool (and so CPU data, checked): the rows move through NumPy views
            # of both, with no torch call per write
            if n == 0:
                return
            src = np.ascontiguousarray(data.numpy().reshape(n, -1)).view(np.uint8)
            self._put_rows(pages, src, dst)
            return
        # reshape is a view for contiguous data (the common case), a copy otherwise.
        rows = data.reshape(n, self._rows.shape[1])
        if rows.untyped_storage().data_ptr() == self._rows.untyped_storage().data_ptr():
            rows = rows.clone()  # a view of this pool: write what it held before the call
        if self._device.type == "cpu" and rows.device.type == "cpu":
            self._put_rows(pages, rows.contiguous().view(torch.uint8).numpy(), self.page_bytes())
            return
        self._rows.index_copy_(0, pages, rows)

    def _write_layers(self, pages: torch.Tensor, data: torch.Tensor, start: int, stop: int) -> None:
        """Layers ``start:stop`` of pages `pages` from `data` (checked here). A CPU pool
        takes them through NumPy views of both sides (one strided copy of whole K/V
        rows; torch's `index_copy_` into a strided view moves element by element, some
        40x slower for small pages)."""
        n, p, width = pages.numel(), self.page_size, self._width
        self._check_data(data, n * p, "data", stop - start)
        if n == 0:
            return
        if data.untyped_storage().data_ptr() == self._data.untyped_storage().data_ptr():
            data = data.clone()  # a view of this pool: write what it held before the call
        if data.is_conj() or data.is_neg():  # lazy bits a NumPy view cannot carry
            data = data.resolve_conj().resolve_neg()
        by_page = self._data.view(self._layout.num_pages + 1, p, self._num_layers, width)
        layers = data.view(n, p, stop - start, width) if data.is_contiguous() else None
        if self._row_bytes is not None and data.dtype in _NUMPY_DTYPES and not data.requires_grad:
            src = data.numpy().reshape(n, p, stop - start, width)
            by_page.numpy()[pages.numpy(), :, start:stop] = src
            return
        if layers is None:
            layers = data.reshape(n, p, stop - start, width)
        by_page[:, :, start:stop].index_copy_(0, pages, layers)

    def _put_rows(self, pages: torch.Tensor, src: Any, dst: Any) -> None:
        """Copy uint8 NumPy rows `src` into rows `pages` of `dst` (this pool's bytes); a
        `src` over the pool's own memory lands what it held before the call."""
        if self.page_nbytes >= PAGE_BY_PAGE_BYTES:
            if np.may_share_memory(src, dst):  # the pool's memory, not a torch view
                src = src.copy()  # of it (`page_bytes` wrapped): what it held before
            # large CPU pages: one memcpy per page beats index_copy_'s scatter kernel
            for i, page in enumerate(pages.tolist()):
                dst[page] = src[i]
        else:
            # smaller ones: one NumPy row assignment (whole rows copied as blocks;
            # index_copy_'s kernel moves them element by element, ~4x slower)
            dst[pages.numpy()] = src

    # -- internals ---------------------------------------------------------------------

    def pages_of(self, slots: object, what: str) -> torch.Tensor:
        """Page ids of `slots` (whole pages of this pool, else a typed error naming
        `what`); nothing is read or changed."""
        codec = self._codec
        return codec.to_pages(codec.check_index_tensor(slots, what), what)

    def _check_data(
        self, data: object, num_slots: int, what: str, num_layers: int | None = None
    ) -> None:
        layers = self._num_layers if num_layers is None else num_layers
        expected = (num_slots, layers, self._width)
        if not isinstance(data, torch.Tensor):
            msg = (
                f"pool {self.name!r}: {what} must be a torch.Tensor of shape {expected} and "
                f"dtype {self.dtype}, got {type(data).__name__}"
            )
            raise TensorTypeError(msg, what=what, got=type(data), expected=self.dtype)
        if data.dtype != self.dtype:
            msg = (
                f"pool {self.name!r}: {what} has dtype {data.dtype} but the pool holds "
                f"{self.dtype}; convert with .to({self.dtype})"
            )
            raise TensorTypeError(msg, what=what, got=data.dtype, expected=self.dtype)
        if data.device != self._device:
            msg = (
                f"pool {self.name!r}: {what} is on {data.device} but the pool lives on "
                f"{self._device}; move it with .to({str(self._device)!r})"
            )
            raise DeviceMismatchError(msg, what=what, got=data.device, expected=self._device)
        if tuple(data.shape) != expected:
            msg = (
                f"pool {self.name!r}: {what} has shape {tuple(data.shape)}, expected "
                f"{expected} ([slots, layers, width] for {num_slots} slots)"
            )
            raise TensorShapeError(msg, what=what, got=tuple(data.shape), expected=expected)
