"""SGLang's own per-layer K/V buffers, seen as the page device a store reads and writes.

SGLang 0.5.23's token-major pools (`MHATokenToKVPool`, and each half of an `SWAKVPool`)
hold one ``k_buffer[layer]`` and one ``v_buffer[layer]`` per layer, each
``[size + page_size, heads, head_dim]`` (row = slot). A store moves pages in its own
format: page = P rows x num_layers x width, K then V per layer. `LayerBuffers` gathers
a page's rows from every layer into that format on offload and scatters them back on
load, straight between SGLang's buffers and the store: it owns no tensor of its own but
each call's transient gather (one call's pages; the store sizes its calls to its
staging budget). It speaks the methods a store calls on a `KVPool`:

- `layout`, `name`, `page_size`, `num_layers`, `width`, `dtype`, `device`,
  `page_nbytes` — the facts (``layout.num_pages`` usable pages, page 0 never handed out);
- `pages_of(slots, what)` — page ids of whole-page `slots`, else a typed error naming
  `what` (the pools' own `SlotCodec`);
- `read_page_ids(pages, out=None)` -> ``[len(pages) * P, num_layers, width]``;
- `read_checksummed(pages, out=...)` -> each page's checksum: the read above with every
  page's `page_checksum` taken as it lands (the protocol's optional one-pass offload read);
- `write_checksummed(pages, data)` -> each page's checksum: `write_page_ids` of every
  layer with each page's `page_checksum` of `data` (the optional one-pass load write);
- `write_page_ids(pages, data, *, layers=None)` — every layer, or the layers of the
  slice `layers` (``data`` then holds those layers only; a strided view is fine), so a
  load lands layer by layer;
- `page_bytes()` — None: no page is one run of bytes here, so a store moves pages only
  through the two calls above.

**The gate.** SGLang frees a load's slots as soon as `finish_layer_wise_loading`
answered, and an offloaded node's slots once its verdict was popped; a store that is
slow, stuck or lying may still write or read them afterwards, when they hold another
request's KV. So every move passes a gate, checked and done under one lock:
`allow(access, pages)` opens pages for ``"write"`` (a load in flight) or ``"read"`` (an
offload SGLang has no verdict for), `revoke(access, pages)` closes them (a count per
page: two jobs may hold one page). A move that touches a closed page raises
`SlotsRevokedError` and moves nothing (the store fails that job); once `revoke`
returned, no move of those pages is under way or can start.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Literal

import numpy as np
import torch

from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.integrations.errors import LinkerConfigError
from unicache_fsm.pools.errors import DeviceMismatchError, TensorShapeError, TensorTypeError
from unicache_fsm.pools.kv import PAGE_BY_PAGE_BYTES
from unicache_fsm.pools.layout import PageLayout
from unicache_fsm.pools.slots import SlotCodec, preview
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.store.checksum import (
    PageBuffers,
    page_checksums,
)

__all__ = ["Access", "LayerBuffers", "SlotsRevokedError", "halves"]

Access = Literal["read", "write"]

#: SGLang's pool names -> this project's (the stores file pages under these)
POOLS = {"kv": PoolName.KV, "swa": PoolName.SWA}


class SlotsRevokedError(UnicacheFsmError, PermissionError):
    """A store moved pages that no job of it may touch now (module docstring, "the
    gate"): `pool`, `access` and the `pages` name them; nothing moved."""

    def __init__(self, msg: str, *, pool: str, access: str, pages: list[int]) -> None:
        self.pool = pool
        self.access = access
        self.pages = pages
        super().__init__(msg)


def halves(pools: Any) -> dict[PoolName, Any]:
    """SGLang's ``linker.pools`` -> the token-major pool serving each of our pools (the
    FULL and SWA halves of an `SWAKVPool`); `LinkerConfigError` for a pool not served."""
    out: dict[PoolName, Any] = {}
    for name, pool in pools.items():
        ours = POOLS.get(getattr(name, "value", name))
        if ours is None:
            msg = (
                f"pool {name!r} is not served by StoreLinker (it serves "
                f"{', '.join(POOLS)}); leave it out of pools"
            )
            raise LinkerConfigError(msg, argument="pools", value=name)
        half = "swa_kv_pool" if ours is PoolName.SWA else "full_kv_pool"
        out[ours] = getattr(pool, half, pool)  # an SWAKVPool holds both halves
    return out


def _layer_buffers(name: PoolName, kv: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    keys = list(getattr(kv, "k_buffer", None) or ())
    values = list(getattr(kv, "v_buffer", None) or ())
    if not keys or len(keys) != len(values):
        msg = (
            f"{name} pool {type(kv).__name__}: no per-layer k_buffer / v_buffer pair "
            "(StoreLinker serves SGLang's token-major MHA pools)"
        )
        raise LinkerConfigError(msg, argument="pools", value=type(kv).__name__)
    rows = kv.size + kv.page_size
    first = keys[0]
    for buf in keys + values:
        if buf.dim() < 2 or buf.shape[0] != rows or not buf.is_contiguous():
            msg = (
                f"{name} pool: a K/V buffer of shape {tuple(buf.shape)} is not token-major "
                f"and contiguous (rows = size + page_size = {rows}); StoreLinker serves "
                "the default KV cache layout only"
            )
            raise LinkerConfigError(msg, argument="pools", value=tuple(buf.shape))
        if buf.dtype != first.dtype or buf.device != first.device:
            msg = f"{name} pool: K/V buffers of several dtypes or devices: {buf.dtype} {buf.device}"
            raise LinkerConfigError(msg, argument="pools", value=str(buf.dtype))
    widths = {(k[0].numel(), v[0].numel()) for k, v in zip(keys, values, strict=True)}
    if len(widths) != 1:
        msg = f"{name} pool: layers of different K/V widths {sorted(widths)}"
        raise LinkerConfigError(msg, argument="pools", value=sorted(widths))
    return keys, values


class LayerBuffers:
    """One SGLang pool's K/V buffers as a store's page device (module docstring)."""

    def __init__(self, name: PoolName, kv: Any) -> None:
        keys, values = _layer_buffers(name, kv)
        self._layout = PageLayout(kv.size, kv.page_size, str(name.value))
        first = keys[0]
        self._device = first.device
        self._dtype = first.dtype
        self._codec = SlotCodec(self._layout, self._device)
        self._kw, self._vw = keys[0][0].numel(), values[0][0].numel()
        pages, p = self._layout.num_pages + 1, self._layout.page_size
        # each layer's buffer as one row per page (a view: SGLang's own memory)
        self._k = [k.view(pages, p * self._kw) for k in keys]
        self._v = [v.view(pages, p * self._vw) for v in values]
        self._page_nbytes = p * len(keys) * (self._kw + self._vw) * first.element_size()
        # on the host, each layer's page rows as uint8 NumPy views of SGLang's memory:
        # NumPy moves whole rows as blocks, where torch's CPU index kernels copy a bf16
        # row element by element (several times slower, more so on contended cores)
        self._host = (
            [
                (k.view(torch.uint8).numpy(), v.view(torch.uint8).numpy())
                for k, v in zip(self._k, self._v, strict=True)
            ]
            if self._device.type == "cpu"
            else None
        )
        # the same as one list of page-major buffers (K0, V0, K1, V1, ...: a token's
        # rows in page-format order) and each one's row bytes, checked once for every
        # gather and scatter
        row = first.element_size()
        self._moves = (
            PageBuffers(
                [b.reshape(-1) for pair in self._host for b in pair],
                [self._kw * row, self._vw * row] * len(keys),
                p,
            )
            if self._host is not None
            else None
        )
        self._host_bufs: list[tuple[Any, Any]] | None = None  # see `_host_rows`
        self._lock = threading.Lock()
        self._open: dict[str, Counter[int]] = {"read": Counter(), "write": Counter()}

    # -- facts --------------------------------------------------------------------------

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
        return len(self._k)

    @property
    def width(self) -> int:
        return self._kw + self._vw

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def page_nbytes(self) -> int:
        """Bytes of one page in the store's format (P rows x layers x width)."""
        return self._page_nbytes

    def buffer_nbytes(self) -> int:
        """Bytes of SGLang's buffers behind this pool (what a mirror would double)."""
        return sum(t.untyped_storage().nbytes() for t in [*self._k, *self._v])

    def page_bytes(self) -> None:
        """None: SGLang's per-layer buffers hold no page as one run of bytes, so a store
        moves pages only through `read_page_ids` / `write_page_ids` (and the gate)."""
        return None

    def __repr__(self) -> str:
        return (
            f"LayerBuffers({self.name!r}, pages={self._layout.num_pages}, "
            f"page_size={self.page_size}, layers={self.num_layers}, width={self.width}, "
            f"dtype={self.dtype}, device={str(self.device)!r})"
        )

    def pages_of(self, slots: object, what: str) -> torch.Tensor:
        """Page ids of whole-page `slots` (typed error naming `what`); nothing moves."""
        codec = self._codec
        return codec.to_pages(codec.check_index_tensor(slots, what), what)

    # -- the gate -----------------------------------------------------------------------

    def allow(self, access: Access, pages: torch.Tensor) -> None:
        """Open `pages` for one more job's `access`."""
        with self._lock:
            self._open[access].update(pages.tolist())

    def revoke(self, access: Access, pages: torch.Tensor) -> None:
        """Close `pages` for one job's `access`; returns once no move of them runs."""
        with self._lock:
            opened = self._open[access]
            for page in pages.tolist():
                left = opened.get(page, 0) - 1
                if left > 0:
                    opened[page] = left
                else:  # (`pop`, not `del`: a Counter's own __delitem__ is a Python call)
                    opened.pop(page, None)

    def opened(self, access: Access) -> int:
        """Pages open for `access` now (a page held by two jobs counts once)."""
        with self._lock:
            return len(self._open[access])

    def _check_open(self, access: Access, pages: list[int]) -> None:
        opened = self._open[access]
        closed = [p for p in pages if p not in opened]
        if closed:
            msg = (
                f"pool {self.name!r}: the store would {access} page(s) {preview(closed)}, "
                f"which no job of it may {access} now (SGLang may have reused them)"
            )
            raise SlotsRevokedError(msg, pool=self.name, access=access, pages=closed)

    # -- moves --------------------------------------------------------------------------

    def read_page_ids(
        self, pages: torch.Tensor, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The pages' bytes in the store's format, ``[len(pages) * P, layers, width]``."""
        n, p, kw = pages.numel(), self.page_size, self._kw
        shape = (n * p, self.num_layers, self.width)
        if out is None:
            out = torch.empty(shape, dtype=self._dtype, device=self._device)
        else:
            self._check_data(out, shape, "out")
        listed = pages.tolist()
        with self._lock:
            self._check_open("read", listed)
            if self._host is not None:  # CPU: whole runs of K or V rows, natively
                self._gather(out, listed, checksum=False)
                return out
            rows = out.view(n, p, self.num_layers, self.width)
            for layer, (k, v) in enumerate(zip(self._k, self._v, strict=True)):
                rows[:, :, layer, :kw] = k.index_select(0, pages).view(n, p, kw)
                rows[:, :, layer, kw:] = v.index_select(0, pages).view(n, p, self._vw)
        return out

    def read_checksummed(self, pages: torch.Tensor, *, out: torch.Tensor) -> list[int]:
        """`read_page_ids(pages, out=out)` and each page's `page_checksum`, in order: on
        the host each page is hashed right after it landed, while in cache (one pass
        over the bytes, where a read then a hash are two)."""
        n, p = pages.numel(), self.page_size
        self._check_data(out, (n * p, self.num_layers, self.width), "out")
        if self._host is None:
            self.read_page_ids(pages, out=out)
            return page_checksums(out.view(torch.uint8).view(n, -1).cpu())
        listed = pages.tolist()
        with self._lock:
            self._check_open("read", listed)
            return self._gather(out, listed, checksum=True)

    def _gather(self, out: torch.Tensor, pages: list[int], *, checksum: bool) -> list[int]:
        """The host gather of `pages` into `out` in one native call (under the lock),
        over torch's intra-op thread count as torch's own copies are: each page's
        checksum, or [] without."""
        assert self._moves is not None
        dst = out.view(torch.uint8).numpy()
        got = self._moves.gather(dst, pages, checksum=checksum, threads=torch.get_num_threads())
        return got or []

    def _scatter(self, data: torch.Tensor, pages: list[int], *, checksum: bool) -> list[int]:
        """The host scatter of contiguous page-format `data` into `pages`, every layer, in
        one native call (under the lock), as `_gather`: each page's checksum, or []."""
        assert self._moves is not None
        src = data.view(torch.uint8).numpy()
        got = self._moves.scatter(src, pages, checksum=checksum, threads=torch.get_num_threads())
        return got or []

    def _host_rows(self, data: Any, layers: int) -> tuple[Any, list[tuple[Any, Any]], bool]:
        """Host views for a move between page-format bytes `data` (uint8, ``layers``
        layers, a strided view too) and SGLang's buffers: `data` as ``[n, P, 2 * layers]``
        rows and each layer's K and V buffer as ``[pages, P]`` rows, one row (a token's
        K or V bytes) one NumPy element, when K and V rows have one size (a row then
        moves as one block copy; flag True); else `data` as ``[n, P, layers, width]``
        and the buffers as ``[pages, P, row]`` bytes (flag False)."""
        assert self._host is not None
        p = self.page_size
        hk0, hv0 = self._host[0]
        kb, vb = hk0.shape[1] // p, hv0.shape[1] // p
        if self._host_bufs is None:  # built once: the buffers never change
            if kb == vb:
                row = np.dtype((np.void, kb))
                self._host_bufs = [
                    (
                        hk.reshape(-1, p, kb).view(row)[..., 0],
                        hv.reshape(-1, p, kb).view(row)[..., 0],
                    )
                    for hk, hv in self._host
                ]
            else:
                self._host_bufs = [
                    (hk.reshape(-1, p, kb), hv.reshape(-1, p, vb)) for hk, hv in self._host
                ]
        if kb == vb:
            rows = data.reshape(-1, p, 2 * layers, kb).view(np.dtype((np.void, kb)))[..., 0]
            return rows, self._host_bufs, True
        return data.reshape(-1, p, layers, kb + vb), self._host_bufs, False

    def _per_page(self) -> bool:
        """Whether host moves go page by page: a page's K and V bytes per layer reach
        `PAGE_BY_PAGE_BYTES` (16 KiB). Measured (NumPy, 8 layers, 16 pages, 1 thread,
        loaded cores): page 16 with 2 KiB K rows, a per-page, per-layer copy (P rows into
        a strided destination) 7.1 GB/s against 2.5 for one fancy index per layer; page 1
        with 2 KiB rows, per page 1.5-2 GB/s against 5 (a Python step per small copy
        dominates), so small pages keep the fancy index."""
        assert self._host is not None
        hk, hv = self._host[0]
        return bool(min(hk.shape[1], hv.shape[1]) >= PAGE_BY_PAGE_BYTES)

    def _scatter_host(self, at: Any, data: Any, chosen: range) -> None:
        """`write_page_ids` on the host: `data` is the uint8 bytes of the layers `chosen`."""
        rows, bufs, paired = self._host_rows(data, len(chosen))
        for i, where in self._steps(at):
            for j, layer in enumerate(chosen):
                k, v = bufs[layer]
                if paired:
                    k[where] = rows[i, :, 2 * j]
                    v[where] = rows[i, :, 2 * j + 1]
                else:
                    kb = k.shape[-1]
                    k[where] = rows[i, :, j, :kb]
                    v[where] = rows[i, :, j, kb:]

    def _steps(self, at: Any) -> list[tuple[Any, Any]]:
        """(index into the page-format rows, index into the buffers) per copy: each page
        alone (an int) when `_per_page`, else all pages at once (a fancy index)."""
        if self._per_page():
            return list(enumerate(at.tolist()))
        return [(slice(None), at)]

    def write_page_ids(
        self, pages: torch.Tensor, data: torch.Tensor, *, layers: slice | None = None
    ) -> None:
        """Store `data` (``[len(pages) * P, len(layers), width]``, the store's format)
        into the pages, every layer or those of the slice `layers`."""
        n, p, kw = pages.numel(), self.page_size, self._kw
        chosen = range(self.num_layers) if layers is None else range(self.num_layers)[layers]
        self._check_data(data, (n * p, len(chosen), self.width), "data", contiguous=False)
        listed = pages.tolist()
        with self._lock:
            self._check_open("write", listed)
            if self._host is not None and layers is None and data.is_contiguous():
                # every layer from contiguous bytes: whole runs of K or V rows, natively
                self._scatter(data, listed, checksum=False)
                return
            if self._host is not None and n:  # CPU: NumPy copies whole K or V rows
                self._scatter_host(pages.numpy(), data.view(torch.uint8).numpy(), chosen)
                return
            rows = data.reshape(n, p, len(chosen), self.width)  # a strided view too
            for i, layer in enumerate(chosen):
                self._k[layer].index_copy_(0, pages, rows[:, :, i, :kw].reshape(n, p * kw))
                self._v[layer].index_copy_(0, pages, rows[:, :, i, kw:].reshape(n, -1))

    def write_checksummed(self, pages: torch.Tensor, data: torch.Tensor) -> list[int]:
        """`write_page_ids(pages, data)` (every layer) and each page's `page_checksum` of
        `data`, in order: on the host each page is hashed right before its rows are
        copied, which brings it into cache for them (one pass over the bytes, where a
        check then a write are two). The bytes land whatever their checksums: a caller
        that finds a mismatch fails the load (the slots are the load's own)."""
        n, p = pages.numel(), self.page_size
        self._check_data(data, (n * p, self.num_layers, self.width), "data")
        if self._host is None:
            self.write_page_ids(pages, data)
            return page_checksums(data.view(torch.uint8).view(n, -1).cpu())
        listed = pages.tolist()
        with self._lock:
            self._check_open("write", listed)
            return self._scatter(data, listed, checksum=True)

    def _check_data(
        self, data: object, shape: tuple[int, ...], what: str, *, contiguous: bool = True
    ) -> None:
        if not isinstance(data, torch.Tensor) or data.dtype != self._dtype:
            got = data.dtype if isinstance(data, torch.Tensor) else type(data)
            msg = f"pool {self.name!r}: {what} must be a {self._dtype} tensor, got {got}"
            raise TensorTypeError(msg, what=what, got=got, expected=self._dtype)
        if data.device != self._device:
            msg = f"pool {self.name!r}: {what} is on {data.device}, the buffers on {self._device}"
            raise DeviceMismatchError(msg, what=what, got=data.device, expected=self._device)
        if tuple(data.shape) != shape or (contiguous and not data.is_contiguous()):
            msg = (
                f"pool {self.name!r}: {what} has shape {tuple(data.shape)}, expected "
                f"{'a contiguous ' if contiguous else ''}{shape} ([slots, layers, width])"
            )
            raise TensorShapeError(msg, what=what, got=tuple(data.shape), expected=shape)
