"""Bounded host staging and layer-major writes: how a store moves a batch's bytes.

Bytes in transit between a page device and a store's medium sit in host staging
buffers. Every store bounds them by its `staging_bytes` option:

- `DEFAULT_STAGING_BYTES` (64 MiB) — the default budget.
- `check_staging_bytes(value)` — the budget as an int >= 1 (bytes), else
  `StoreConfigError` naming ``staging_bytes``.
- `chunks(count, page_nbytes, budget)` — ``range`` pieces of ``0..count`` of at most
  ``budget // page_nbytes`` pages each (at least one page: a page larger than the whole
  budget still moves, one page at a time, so the bound is then one page).
- `StagedTransfer(pool, device, pages, data)` — one transfer of a load batch whose
  pages were read and verified into a staging buffer: `data` is
  ``[len(pages) * P, num_layers, width]`` in page format.
- `read_staged(device, pages, buf)` — the device's pages `pages` read into `buf`
  (``[n, page_nbytes]`` uint8, host), through `read_page_ids` (with ``out=`` a view of
  `buf` when the device lives on the host); an answer of another shape or dtype is a
  `StoreFaultError` naming the device (nothing is trusted from it).
- `read_checksummed(device, pages, buf) -> list[int]` — `read_staged`, and each page's
  `page_checksum` (as read, in order). A host device with the protocol's optional
  `read_checksummed` reads and hashes in one pass; its answer must be a list (a
  `list` itself, copied: what is checked is what is used) of one int in
  ``0 .. 2**64 - 1`` per page, else `StoreFaultError` naming the device (a wrong value
  is no worse than wrong bytes: a load of that page then fails its verification).
  Otherwise the pages are read, then hashed.
- `written_checksums(device, pages, data) -> list[int]` — the protocol's optional
  `write_checksummed`: `data` (page format, every layer) written into `pages` and each
  page's checksum as written, the answer checked as `read_checksummed`'s is.
- `as_pages(buf, device)` — staged page bytes (``[n, page_nbytes]`` uint8, host) as
  page-format data of `device` (``[n * P, num_layers, width]`` of its dtype), copied
  to the device's memory when that is not the host's.
- `write_layer_major(parts, landed)` — write verified transfers layer by layer: layer 0
  of every transfer, then layer 1, ...; after each layer, ``landed(counts)`` with, for
  every pool of the batch, how many leading layers are now in every slot of it (a pool
  with fewer layers than another is complete once its last layer landed). A device the
  host views in place (`page_bytes()` answers, a CPU `KVPool`) takes each transfer with
  every layer in one write, first, counted complete once written: it is the host's
  own memory, so there is no copy to overlap with, and one write of whole rows is
  several times faster than one strided write per layer. A device write that raises
  stops the writing there: the layers reported so far stay true.

A load batch whose verified pages fit the budget at once is staged whole and written
layer-major, so `loaded_layers` shows real per-layer progress. A larger batch moves
chunk by chunk (each chunk read, verified and written with every layer), and its
progress jumps from 0 to every layer when the batch completes: a chunk written in full
gives no layer that is in *every* slot of the batch.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence

import attrs
import torch

from unicache_fsm.pools.device import PageDevice
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.checksum import page_checksums
from unicache_fsm.store.errors import StoreConfigError, StoreFaultError

__all__ = [
    "DEFAULT_STAGING_BYTES",
    "StagedTransfer",
    "as_pages",
    "check_staging_bytes",
    "chunks",
    "read_checksummed",
    "read_staged",
    "write_layer_major",
    "written_checksums",
]

#: the default bound on host bytes in transit per load batch or offload
DEFAULT_STAGING_BYTES = 64 << 20


def check_staging_bytes(value: object) -> int:
    """`value` as a staging budget in bytes (an int >= 1), else `StoreConfigError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"staging_bytes must be an int >= 1 (bytes of host staging), got {value!r}"
        raise StoreConfigError(msg, argument="staging_bytes", value=value)
    return value


def chunks(count: int, page_nbytes: int, budget: int) -> list[range]:
    """``0..count`` in pieces of at most ``max(1, budget // page_nbytes)`` pages."""
    step = max(1, budget // max(1, page_nbytes))
    return [range(i, min(i + step, count)) for i in range(0, count, step)]


def as_pages(buf: torch.Tensor, device: PageDevice) -> torch.Tensor:
    """Staged page bytes as page-format data of `device`; see the module docstring."""
    data = buf.view(device.dtype).view(-1, device.num_layers, device.width)
    return data if device.device.type == "cpu" else data.to(device.device)


def read_staged(device: PageDevice, pages: torch.Tensor, buf: torch.Tensor) -> None:
    """Read `pages` of `device` into `buf`; see the module docstring."""
    n, p = pages.numel(), device.page_size
    shape = (n * p, device.num_layers, device.width)
    out = buf.view(device.dtype).view(shape) if device.device.type == "cpu" else None
    got: object = device.read_page_ids(pages, out=out)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape or got.dtype != device.dtype:
        what = f"{type(got).__name__} {getattr(got, 'shape', '')} {getattr(got, 'dtype', '')}"
        msg = (
            f"offload: page device {device.name!r} answered read_page_ids with {what}; "
            f"expected a {device.dtype} tensor of shape {shape}"
        )
        raise StoreFaultError(msg, operation="offload")
    if out is None or got.data_ptr() != out.data_ptr():
        buf.copy_(got.contiguous().view(torch.uint8).reshape(buf.shape).to(buf.device))


def read_checksummed(device: PageDevice, pages: torch.Tensor, buf: torch.Tensor) -> list[int]:
    """`read_staged` and each page's checksum; see the module docstring."""
    reader = getattr(device, "read_checksummed", None)
    if reader is None or device.device.type != "cpu":
        read_staged(device, pages, buf)
        return page_checksums(buf)
    n = pages.numel()
    out = buf.view(device.dtype).view(n * device.page_size, device.num_layers, device.width)
    got: object = reader(pages, out=out)
    return _checked_sums(device, "offload", "read_checksummed", got, n)


def written_checksums(device: PageDevice, pages: torch.Tensor, data: torch.Tensor) -> list[int]:
    """The device's `write_checksummed(pages, data)`, its answer checked; see the module
    docstring."""
    got: object = device.write_checksummed(pages, data)  # type: ignore[attr-defined]
    return _checked_sums(device, "load", "write_checksummed", got, pages.numel())


def _checked_sums(device: PageDevice, operation: str, call: str, got: object, n: int) -> list[int]:
    """A copy of `got` when it is a list of `n` checksums (ints in ``0 .. 2**64 - 1``),
    else `StoreFaultError`. A list exactly, copied before it is checked: what is
    checked is what is used, whatever the device does with its list later (a subclass
    could answer indexing and iteration differently)."""
    sums = got.copy() if type(got) is list else None
    if (
        sums is None
        or len(sums) != n
        # (one C-level pass per test: each type is int itself, by identity, where a set
        # of the types would compare and hash them; then their range)
        or (
            n
            and (
                not all(map(operator.is_, map(type, sums), itertools.repeat(int)))
                or min(sums) < 0
                or max(sums) >= 1 << 64
            )
        )
    ):
        shown = repr(got)[:80]
        msg = (
            f"{operation}: page device {device.name!r} answered {call} with {shown}; "
            f"expected {n} checksum(s), one int in 0 .. 2**64 - 1 per page"
        )
        raise StoreFaultError(msg, operation=operation)
    return sums


@attrs.frozen
class StagedTransfer:
    """One verified transfer of a load batch, staged in page format (see the module)."""

    pool: PoolName
    device: PageDevice = attrs.field(eq=False, repr=False)
    pages: torch.Tensor = attrs.field(eq=False, repr=False)
    data: torch.Tensor = attrs.field(eq=False, repr=False)


def write_layer_major(
    parts: Sequence[StagedTransfer], landed: Callable[[dict[PoolName, int]], None]
) -> None:
    """Write `parts` layer by layer, reporting each layer after it landed everywhere;
    see the module docstring (devices the host views in place take every layer at once)."""
    layers = {p.pool: p.device.num_layers for p in parts}
    whole = {p.pool for p in parts if p.device.page_bytes() is not None}
    for part in parts:
        if part.pool in whole:
            part.device.write_page_ids(part.pages, part.data)
    if whole:
        landed({pool: layers[pool] for pool in whole})
    stepped = [p for p in parts if p.pool not in whole]
    for layer in range(max((p.device.num_layers for p in stepped), default=0)):
        for part in stepped:
            if layer < part.device.num_layers:
                one = slice(layer, layer + 1)
                data = part.data[:, one]
                if data.device != part.device.device:  # host staging, device memory
                    data = data.to(part.device.device)
                part.device.write_page_ids(part.pages, data, layers=one)
        landed({p.pool: min(layer + 1, p.device.num_layers) for p in stepped})
