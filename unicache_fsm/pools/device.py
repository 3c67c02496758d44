"""The page-device protocol: what a store needs of the memory it moves KV pages through.

A store reads device pages on OFFLOAD and writes stored pages into reserved slots on
LOAD. It does not care how the device keeps them (`KVPool`'s one row per token, or
SGLang's per-layer K and V buffers): it sees every page in *the store's page format*,
P token rows x `num_layers` x `width` elements of `dtype`, each layer's K then V in
`width`, rows in slot order. ``page_nbytes == P * num_layers * width * itemsize``.

Members (all read-only facts but the three moves), with their contracts:

- `layout` (`PageLayout`), `page_size` (P), `num_layers`, `width`, `dtype`,
  `device` (`torch.device`), `page_nbytes`, `name` — the page format and where slot
  and data tensors must live. They never change while a store is attached.
- `pages_of(slots, what) -> Tensor` — the page ids (1-D int64, on `device`) of a slot
  tensor of whole pages, in order; a typed `PoolError` naming `what` otherwise.
  Nothing is read or changed.
- `read_page_ids(pages, *, out=None) -> Tensor` — the pages' bytes in page format,
  ``[len(pages) * P, num_layers, width]`` of `dtype` on `device`; `out` (contiguous,
  that shape) is filled and returned when given. A page may repeat.
- `write_page_ids(pages, data, *, layers=None)` — store `data` into the pages, each
  named once. ``layers=None``: every layer, `data` is ``[len(pages) * P, num_layers,
  width]``. A `slice` of layers (step 1, inside ``0..num_layers``): only those layers'
  K and V are written, `data` is ``[len(pages) * P, len(layers), width]`` (a strided
  view of a page-format buffer is fine); the other layers of those slots are left as
  they were. Bad data raises a typed error before any byte moves. `data` is only
  read, never written, during the call or after it: a store may hand its stored pages
  themselves (the memory store loads straight from its rows), not a copy.
- `page_bytes()` — the pages as the rows of a ``[num_pages + 1, page_nbytes]`` uint8
  NumPy array over the device's own memory (row = page id, no copy), or None when the
  host cannot view the memory in place (a GPU, per-layer buffers). A store then moves
  bytes only through `read_page_ids` / `write_page_ids`.

Two optional members (one that is absent or None is not offered), which a store uses
where a host device has them (each reads or
writes and checksums a page in one pass, while the page is in cache, where a move and
a hash are two passes over memory); both answer the store's checksum of each page, in
order (`unicache_fsm.store.checksum.page_checksum`, XXH3-64 of the page's bytes in page
format). A store checks the answer's form (a list of one int per page) and trusts its
values no more than the bytes: a wrong value fails a later load's verification, or
this one's (where the store's own copy of the page still checks out, the page stays
and the load fails with `StoreFaultError` naming the device).

- `read_checksummed(pages, *, out) -> list[int]` — `read_page_ids(pages, out=out)`
  (`out` required) and the checksums of the pages as read.
- `write_checksummed(pages, data) -> list[int]` — `write_page_ids(pages, data)` (every
  layer; `data` contiguous) and the checksums of `data`'s pages. The bytes land
  whatever their checksums: a store that finds a mismatch fails the load, whose
  reserved slots are its own.

SGLang's per-layer buffers (`unicache_fsm.integrations.sglang.buffers.LayerBuffers`)
offer both.

`PageDevice` is a runtime-checkable `typing.Protocol` (presence of members only);
`check_page_device(obj, what)` also names every missing member and refuses a device
whose page format does not add up, with `PageDeviceError`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from unicache_fsm.pools.errors import PoolConfigError
from unicache_fsm.pools.layout import PageLayout

__all__ = [
    "PAGE_DEVICE_MEMBERS",
    "PageDevice",
    "PageDeviceError",
    "check_page_device",
    "layer_slice",
]

#: every member a store uses, in the order the module docstring lists them
PAGE_DEVICE_MEMBERS = (
    "layout",
    "page_size",
    "num_layers",
    "width",
    "dtype",
    "device",
    "page_nbytes",
    "name",
    "pages_of",
    "read_page_ids",
    "write_page_ids",
    "page_bytes",
)


class PageDeviceError(PoolConfigError):
    """An object offered as a page device lacks members or has an inconsistent format."""


@runtime_checkable
class PageDevice(Protocol):
    """Memory a store moves KV pages through; see the module docstring."""

    @property
    def layout(self) -> PageLayout: ...

    @property
    def page_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def width(self) -> int: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def page_nbytes(self) -> int: ...

    @property
    def name(self) -> str: ...

    def pages_of(self, slots: object, what: str) -> torch.Tensor: ...

    def read_page_ids(
        self, pages: torch.Tensor, *, out: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def write_page_ids(
        self, pages: torch.Tensor, data: torch.Tensor, *, layers: slice | None = None
    ) -> None: ...

    def page_bytes(self) -> Any: ...


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _has(obj: object, member: str) -> bool:
    """Whether `obj` has `member` (a property that raises counts as missing)."""
    try:
        getattr(obj, member)
    except Exception:
        return False
    return True


def check_page_device(obj: object, what: str) -> PageDevice:
    """`obj` as a `PageDevice`, else `PageDeviceError` naming `what` and every missing
    member, or the fact that does not add up (counts that are not ints >= 1, a dtype or
    device of the wrong type, a layout of another page size, `page_nbytes` other than
    ``P * num_layers * width * itemsize``)."""
    missing = [m for m in PAGE_DEVICE_MEMBERS if not _has(obj, m)]
    if missing:
        msg = (
            f"{what}: {type(obj).__name__} is not a page device; it lacks "
            f"{', '.join(missing)} (see unicache_fsm.pools.device)"
        )
        raise PageDeviceError(msg, argument=what, value=obj)
    device: Any = obj
    for member in ("page_size", "num_layers", "width", "page_nbytes"):
        value = getattr(device, member)
        if not _is_int(value) or value < 1:
            msg = f"{what}: page device {member} must be an int >= 1, got {value!r}"
            raise PageDeviceError(msg, argument=what, value=obj)
    if not isinstance(device.dtype, torch.dtype) or not isinstance(device.device, torch.device):
        msg = (
            f"{what}: page device dtype must be a torch.dtype and device a torch.device, "
            f"got {device.dtype!r} and {device.device!r}"
        )
        raise PageDeviceError(msg, argument=what, value=obj)
    layout = device.layout
    if not isinstance(layout, PageLayout) or layout.page_size != device.page_size:
        msg = f"{what}: page device layout must be a PageLayout of page_size {device.page_size}"
        raise PageDeviceError(msg, argument=what, value=obj)
    itemsize = torch.empty((), dtype=device.dtype).element_size()
    expected = device.page_size * device.num_layers * device.width * itemsize
    if device.page_nbytes != expected:
        msg = (
            f"{what}: page device page_nbytes is {device.page_nbytes}, but P x layers x "
            f"width x itemsize is {expected}"
        )
        raise PageDeviceError(msg, argument=what, value=obj)
    return device  # type: ignore[no-any-return]


def layer_slice(layers: object, num_layers: int, what: str) -> tuple[int, int]:
    """The (start, stop) of a `write_page_ids` ``layers`` argument: None is every layer;
    a `slice` of step 1 inside ``0..num_layers`` with at least one layer; anything else
    `PageDeviceError` naming `what`."""
    if layers is None:
        return 0, num_layers
    if isinstance(layers, slice) and layers.step in (None, 1):
        start, stop, _ = layers.indices(num_layers)
        ends_ok = all(e is None or _is_int(e) for e in (layers.start, layers.stop))
        inside = (layers.start is None or layers.start >= 0) and (
            layers.stop is None or layers.stop <= num_layers
        )
        if ends_ok and inside and start < stop:
            return start, stop
    msg = (
        f"{what}: layers must be None (all) or a slice of step 1 inside 0..{num_layers} "
        f"with at least one layer, got {layers!r}"
    )
    raise PageDeviceError(msg, argument="layers", value=layers)
